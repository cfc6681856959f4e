// SPDX-License-Identifier: BSD-3-Clause
// oktopk-bench's measurement of one method (a sparse allreduce, or the bare MPI_Allreduce of
// --mpi-baseline): per call a barrier, the timed reduce, then the bookkeeping of that call.
#include "measure.hpp"

#include "common/gradient_types.hpp"

#include <oktopk/oracle.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace oktopk::bench {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size();
  return m % 2 == 1 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
}

double max_bytes(const oktopk::PhaseTraffic& t) {
  return static_cast<double>(std::max(t.bytes_sent, t.bytes_received));
}

double max_between_nodes_bytes(const oktopk::PhaseTraffic& t) {
  return static_cast<double>(std::max(t.bytes_sent_between_nodes, t.bytes_received_between_nodes));
}

/// One phase of one call on this rank.
struct PhaseSample {
  double seconds = 0.0;
  double bytes = 0.0;
  double between_nodes_bytes = 0.0;
};

using PhaseLog = std::vector<std::map<std::string, PhaseSample>>;

/// Collective: the union of the phase names of all ranks, then per phase and iteration the max
/// over ranks of time, bytes and bytes between nodes.
std::vector<PhaseRow> aggregate_phases(const oktopk::Communicator& world, const PhaseLog& log) {
  const int P = world.size();
  std::set<std::string> local;
  for (const auto& iteration : log) {
    for (const auto& entry : iteration) local.insert(entry.first);
  }
  std::string joined;
  for (const auto& name : local) joined += name + '\n';
  const auto length = static_cast<std::int64_t>(joined.size());
  std::vector<std::int64_t> lengths(P);
  world.allgather(&length, 1, lengths.data());
  std::vector<int> counts(P), displacements(P);
  std::int64_t total = 0;
  for (int r = 0; r < P; ++r) {
    counts[r] = static_cast<int>(lengths[r]);
    displacements[r] = static_cast<int>(total);
    total += lengths[r];
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  world.allgatherv(joined.data(), length, all.data(), counts.data(), displacements.data());
  std::set<std::string> names;
  std::istringstream lines(all);
  for (std::string name; std::getline(lines, name);) names.insert(name);

  const std::size_t iters = log.size();
  std::vector<double> seconds(names.size() * iters, 0.0), bytes(names.size() * iters, 0.0),
      between(names.size() * iters, 0.0);
  std::size_t p = 0;
  for (const auto& name : names) {
    for (std::size_t j = 0; j < iters; ++j) {
      const auto found = log[j].find(name);
      if (found != log[j].end()) {
        seconds[p * iters + j] = found->second.seconds;
        bytes[p * iters + j] = found->second.bytes;
        between[p * iters + j] = found->second.between_nodes_bytes;
      }
    }
    ++p;
  }
  world.allreduce_in_place(seconds.data(), static_cast<std::int64_t>(seconds.size()), MPI_MAX);
  world.allreduce_in_place(bytes.data(), static_cast<std::int64_t>(bytes.size()), MPI_MAX);
  world.allreduce_in_place(between.data(), static_cast<std::int64_t>(between.size()), MPI_MAX);
  std::vector<PhaseRow> rows;
  p = 0;
  for (const auto& name : names) {
    PhaseRow row;
    row.name = name;
    row.seconds = median({seconds.begin() + p * iters, seconds.begin() + (p + 1) * iters});
    for (std::size_t j = 0; j < iters; ++j) {
      row.bytes += bytes[p * iters + j];
      row.between_nodes_bytes += between[p * iters + j];
    }
    row.bytes /= static_cast<double>(iters);
    row.between_nodes_bytes /= static_cast<double>(iters);
    rows.push_back(row);
    ++p;
  }
  return rows;
}

template <class Value>
using ValuesOf = Kokkos::View<Value*, Exec::memory_space>;

/// out = 0 but at the entries' indices, where it holds their values.
template <class Value>
void scatter_entries(const Exec& exec,
                     const oktopk::SparseResult<Exec::memory_space, Value>& entries,
                     const ValuesOf<Value>& out) {
  Kokkos::deep_copy(exec, out, Value{});
  const auto indices = entries.indices;
  const auto values = entries.values;
  Kokkos::parallel_for(
      "oktopk::bench::scatter_entries",
      Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(exec, 0, entries.size),
      KOKKOS_LAMBDA(std::int64_t j) { out(indices(j)) = values(j); });
}

/// The View a Value handle reduces: for float the draws' own, else a vector of its own that
/// round_draws fills.
template <class Value>
auto gradient_for(const Vector& draws) {
  if constexpr (std::is_same_v<Value, float>) {
    return draws;
  } else {
    return ValuesOf<Value>("oktopk::bench::grad", draws.extent(0));
  }
}

/// grad = the float draws stored as Values: rounded into a 16-bit type, exact into double.
template <class Value>
void round_draws(const Exec& exec, const Vector& draws, const ValuesOf<Value>& grad) {
  Kokkos::parallel_for(
      "oktopk::bench::round_draws",
      Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(exec, 0, grad.extent(0)),
      KOKKOS_LAMBDA(std::int64_t i) { grad(i) = oktopk::apps::value_from_float<Value>(draws(i)); });
}

/// The non-zeros of out.
template <class Value>
std::int64_t count_nonzeros(const Exec& exec, const ValuesOf<Value>& out) {
  std::int64_t count = 0;
  Kokkos::parallel_reduce(
      "oktopk::bench::nnz",
      Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(exec, 0, out.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t i, std::int64_t& sum) {
        sum += oktopk::apps::number_of(out(i)) != 0 ? 1 : 0;
      },
      count);
  return count;
}

/// out = every rank's shard (`shards`: the P + 1 boundaries), gathered: a reduce_scatter's
/// whole result, for the oracle, which also checks that every rank holds the same output.
template <class Value>
void gather_shards(const Exec& exec, const oktopk::Communicator& world,
                   const std::vector<std::int64_t>& shards, const ValuesOf<Value>& shard,
                   const ValuesOf<Value>& out) {
  const int P = world.size();
  std::vector<int> counts(static_cast<std::size_t>(P));
  std::vector<int> displacements(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r) {
    counts[static_cast<std::size_t>(r)] = static_cast<int>(shards[static_cast<std::size_t>(r) + 1] -
                                                           shards[static_cast<std::size_t>(r)]);
    displacements[static_cast<std::size_t>(r)] =
        static_cast<int>(shards[static_cast<std::size_t>(r)]);
  }
  auto mine = Kokkos::create_mirror_view(shard);
  auto all = Kokkos::create_mirror_view(out);
  Kokkos::deep_copy(exec, mine, shard);
  exec.fence();
  world.allgatherv(mine.data(), static_cast<std::int64_t>(mine.extent(0)), all.data(),
                   counts.data(), displacements.data());
  Kokkos::deep_copy(exec, out, all);
  exec.fence();
}

/// acc = residual + grad, in the handle's arithmetic type: the method's input as it computes it.
template <class Value, class Arithmetic>
void form_input(const Exec& exec,
                const Kokkos::View<const Arithmetic*, Exec::memory_space>& residual,
                const ValuesOf<Value>& grad,
                const Kokkos::View<Arithmetic*, Exec::memory_space>& acc) {
  Kokkos::parallel_for(
      "oktopk::bench::acc",
      Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(exec, 0, acc.extent(0)),
      KOKKOS_LAMBDA(std::int64_t i) { acc(i) = residual(i) + oktopk::apps::number_of(grad(i)); });
}

/// run_algorithm for gradients of type Value.
template <class Value>
Result run_typed(const Exec& exec, const oktopk::Communicator& world, const Args& args,
                 oktopk::Algorithm algorithm, GradientSource& source, Progress& progress,
                 Trace& trace) {
  using Handle = oktopk::SparseAllreduce<Exec, Value>;
  using Arithmetic = typename Handle::arithmetic_type;
  using Reals = typename Handle::residual_vector_type;
  const int P = world.size();
  const auto n = static_cast<std::size_t>(args.n);
  // The handle gets its own duplicate, so the benchmark's own calls never mix with its traffic.
  oktopk::Communicator comm(MPI_COMM_WORLD);
  const auto handle = oktopk::make_sparse_allreduce<Exec, Value>(exec, algorithm, comm, args.n,
                                                                 args.options, args.layout);
  Vector draws("oktopk::bench::draws", n);
  const ValuesOf<Value> grad = gradient_for<Value>(draws);
  ValuesOf<Value> out("oktopk::bench::out", n);
  Reals acc, expected, slack;
  if (args.check) {
    acc = Reals("oktopk::bench::acc", n);
    expected = Reals("oktopk::bench::expected", n);
    slack = Reals("oktopk::bench::slack", n);
  }
  const std::int64_t calls = args.warmup + args.iters;
  const auto iters = static_cast<std::size_t>(args.iters);
  std::vector<double> seconds(iters, 0.0);
  double bytes_sum = 0.0;
  double between_nodes_bytes_sum = 0.0;
  double bytes_call_max = 0.0;
  double nnz_sum = 0.0;
  PhaseLog phase_log(args.phases ? iters : 0);
  Result result;
  result.algo = oktopk::to_string(algorithm);
  result.k = handle->k();
  typename Handle::sparse_result_type entries;  // --sparse-result
  // --reduce-scatter: this rank's equal shard.
  const std::vector<std::int64_t> shards = oktopk::equal_shard_offsets(args.n, P);
  const std::int64_t shard_begin = shards[static_cast<std::size_t>(world.rank())];
  const std::int64_t shard_end = shards[static_cast<std::size_t>(world.rank()) + 1];
  ValuesOf<Value> shard(
      "oktopk::bench::shard",
      args.reduce_scatter ? static_cast<std::size_t>(shard_end - shard_begin) : 0);

  for (std::int64_t call = 0; call < calls; ++call) {
    source.fill(exec, call, draws);
    if constexpr (!std::is_same_v<Value, float>) round_draws<Value>(exec, draws, grad);
    const bool timed = call >= args.warmup;
    if (timed && args.check) {
      form_input<Value, Arithmetic>(exec, handle->residual(), grad, acc);
    }
    exec.fence();
    // The log only in the timed calls: the warm-up's messages would be kept and dropped unread.
    if (trace.enabled()) comm.set_message_log(timed);
    world.barrier();
    // MPI's clock: under SMPI the simulated time (a wall clock there counts every rank).
    const double start = MPI_Wtime();
    if (args.sparse_result) {
      handle->reduce_sparse(exec, grad, entries);
    } else if (args.reduce_scatter) {
      handle->reduce_scatter(exec, grad, shard);
    } else {
      handle->reduce(exec, grad, out);
    }
    exec.fence();
    const double elapsed = MPI_Wtime() - start;
    if (args.sparse_result) {
      // The output the oracle and the counts read, untimed.
      scatter_entries<Value>(exec, entries, out);
    }
    if (args.reduce_scatter && timed && args.check)
      gather_shards<Value>(exec, world, shards, shard, out);
    if (timed) {
      const auto j = static_cast<std::size_t>(call - args.warmup);
      const oktopk::ReduceStats& stats = handle->stats();
      seconds[j] = elapsed;
      bytes_sum += max_bytes(stats.total_traffic());
      between_nodes_bytes_sum += max_between_nodes_bytes(stats.total_traffic());
      bytes_call_max =
          std::max(bytes_call_max, static_cast<double>(max_bytes(stats.total_traffic())));
      trace.add_call(result.algo, call - args.warmup, comm);
      // A shard's non-zeros, summed over the ranks: the whole result's.
      nnz_sum += static_cast<double>(args.reduce_scatter ? count_nonzeros<Value>(exec, shard)
                                                         : count_nonzeros<Value>(exec, out));
      if (args.phases) {
        for (const auto& [name, phase] : stats.phases) {
          phase_log[j][name] = {phase.seconds, max_bytes(phase.traffic),
                                max_between_nodes_bytes(phase.traffic)};
        }
      }
      if (args.check) {
        constexpr double tolerance = oktopk::default_oracle_tolerance;
        oktopk::expected_result(exec, *handle, acc, expected, tolerance, slack);
        result.wrong += oktopk::count_mismatches(exec, *handle, expected, out, tolerance, slack);
      }
    }
    progress.tick(call, calls);
  }

  world.allreduce_in_place(seconds.data(), static_cast<std::int64_t>(iters), MPI_MAX);
  result.time_med = median(seconds);
  result.time_max = *std::max_element(seconds.begin(), seconds.end());
  const double mine = bytes_sum / static_cast<double>(iters);
  result.bytes_avg = mine;
  result.bytes_max = mine;
  world.allreduce_in_place(&result.bytes_avg, 1, MPI_SUM);
  result.bytes_avg /= P;
  world.allreduce_in_place(&result.bytes_max, 1, MPI_MAX);
  result.bytes_call_max = bytes_call_max;
  world.allreduce_in_place(&result.bytes_call_max, 1, MPI_MAX);
  result.between_nodes_bytes_max = between_nodes_bytes_sum / static_cast<double>(iters);
  world.allreduce_in_place(&result.between_nodes_bytes_max, 1, MPI_MAX);
  result.nnz_avg = nnz_sum / static_cast<double>(iters);
  result.nnz =
      args.reduce_scatter ? count_nonzeros<Value>(exec, shard) : count_nonzeros<Value>(exec, out);
  if (args.reduce_scatter) {
    world.allreduce_in_place(&result.nnz_avg, 1, MPI_SUM);
    world.allreduce_in_place(&result.nnz, 1, MPI_SUM);
  }
  if (args.phases) result.phases = aggregate_phases(world, phase_log);
  trace.flush();
  return result;
}

/// run_mpi_baseline for gradients of type Value (float or double: MPI's own types).
template <class Value>
Result run_mpi_typed(const Exec& exec, const oktopk::Communicator& world, const Args& args,
                     GradientSource& source, Progress& progress, Trace& trace) {
  const auto n = static_cast<std::size_t>(args.n);
  // On the nodes the methods' handles find, so that its traffic splits as theirs does.
  oktopk::Communicator comm =
      oktopk::Communicator(MPI_COMM_WORLD)
          .with_nodes(oktopk::NodeTopology::find(world, args.options.node_size).node_of_rank());
  Vector draws("oktopk::bench::draws", n);
  const ValuesOf<Value> grad = gradient_for<Value>(draws);
  Kokkos::View<Value*, Kokkos::HostSpace> send("oktopk::bench::mpi_send", n);
  const int P = world.size();
  if (args.reduce_scatter && args.n % P != 0) {
    throw UsageError("--mpi-baseline with --reduce-scatter needs P to divide --n (" +
                     std::to_string(args.n) + " on " + std::to_string(P) + " ranks)");
  }
  const std::size_t received = args.reduce_scatter ? n / static_cast<std::size_t>(P) : n;
  Kokkos::View<Value*, Kokkos::HostSpace> receive("oktopk::bench::mpi_receive", received);
  const std::int64_t calls = args.warmup + args.iters;
  const auto iters = static_cast<std::size_t>(args.iters);
  std::vector<double> seconds(iters, 0.0);
  double bytes_sum = 0.0;
  double between_nodes_bytes_sum = 0.0;
  Result result;
  result.algo = args.reduce_scatter ? "mpi_reduce_scatter_block" : "mpi_allreduce";
  result.unchecked = true;
  result.k = std::min<std::int64_t>(
      args.n, static_cast<std::int64_t>(std::floor(args.density * static_cast<double>(args.n))));
  for (std::int64_t call = 0; call < calls; ++call) {
    source.fill(exec, call, draws);
    if constexpr (!std::is_same_v<Value, float>) round_draws<Value>(exec, draws, grad);
    Kokkos::deep_copy(exec, send, grad);
    exec.fence();
    comm.reset_traffic();
    if (trace.enabled()) comm.set_message_log(call >= args.warmup);
    world.barrier();
    const double start = MPI_Wtime();
    if (args.reduce_scatter) {
      comm.reduce_scatter_block(send.data(), receive.data(), args.n / P, MPI_SUM);
    } else {
      comm.allreduce(send.data(), receive.data(), args.n, MPI_SUM);
    }
    const double elapsed = MPI_Wtime() - start;
    if (call >= args.warmup) {
      seconds[static_cast<std::size_t>(call - args.warmup)] = elapsed;
      bytes_sum += max_bytes(comm.total_traffic());
      between_nodes_bytes_sum += max_between_nodes_bytes(comm.total_traffic());
      trace.add_call(result.algo, call - args.warmup, comm);
    }
    progress.tick(call, calls);
  }
  world.allreduce_in_place(seconds.data(), static_cast<std::int64_t>(iters), MPI_MAX);
  result.time_med = median(seconds);
  result.time_max = *std::max_element(seconds.begin(), seconds.end());
  result.bytes_avg = result.bytes_max = bytes_sum / static_cast<double>(iters);
  world.allreduce_in_place(&result.bytes_avg, 1, MPI_SUM);
  result.bytes_avg /= world.size();
  world.allreduce_in_place(&result.bytes_max, 1, MPI_MAX);
  result.bytes_call_max = result.bytes_max;  // the same bytes every call
  result.between_nodes_bytes_max = between_nodes_bytes_sum / static_cast<double>(iters);
  world.allreduce_in_place(&result.between_nodes_bytes_max, 1, MPI_MAX);
  for (std::size_t i = 0; i < received; ++i) result.nnz += receive(i) != Value{0} ? 1 : 0;
  if (args.reduce_scatter) world.allreduce_in_place(&result.nnz, 1, MPI_SUM);
  result.nnz_avg = static_cast<double>(result.nnz);
  trace.flush();
  return result;
}

}  // namespace

Result run_algorithm(const Exec& exec, const oktopk::Communicator& world, const Args& args,
                     oktopk::Algorithm algorithm, GradientSource& source, Progress& progress,
                     Trace& trace) {
  return oktopk::apps::with_dtype(args.dtype, [&](auto value) {
    return run_typed<decltype(value)>(exec, world, args, algorithm, source, progress, trace);
  });
}

Result run_mpi_baseline(const Exec& exec, const oktopk::Communicator& world, const Args& args,
                        GradientSource& source, Progress& progress, Trace& trace) {
  // parse() takes --mpi-baseline with float32 and float64 only.
  return args.dtype == "float64" ? run_mpi_typed<double>(exec, world, args, source, progress, trace)
                                 : run_mpi_typed<float>(exec, world, args, source, progress, trace);
}

}  // namespace oktopk::bench
