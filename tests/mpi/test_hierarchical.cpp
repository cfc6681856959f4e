// SPDX-License-Identifier: BSD-3-Clause
// The hierarchical mode (Options::hierarchical) against its definition: on each shard, the
// flat method over the node sums of the ranks' inputs, divided by P. A host oracle rebuilds
// every output entry from all ranks' inputs and the thresholds the method reported on each
// shard; the library's oracle (expected_result) is held to the same outputs. Nodes are forced
// (node_size) into every size that divides P, 1 and P included, and found from shared memory
// (one node here); lengths that the node size does not divide, and shorter than it. Then the
// sparse result, checkpoints, double gradients, the refusals, and rejected calls that leave
// the handle as it was.
#include "mpi/method_checks.hpp"
#include "mpi/mpi_test_utils.hpp"

#include <oktopk/any_space.hpp>

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace oktopk::test;  // NOLINT(google-build-using-namespace)
using oktopk::Algorithm;
using oktopk::Options;

constexpr Algorithm kMethods[] = {Algorithm::Dense, Algorithm::TopkA, Algorithm::TopkDSA,
                                  Algorithm::GaussianK, Algorithm::OkTopk};

/// The node sizes to force at this P: every divisor of P.
std::vector<int> node_sizes() {
  std::vector<int> sizes;
  for (int L = 1; L <= world_size(); ++L) {
    if (world_size() % L == 0) sizes.push_back(L);
  }
  return sizes;
}

Options hierarchical_options(std::int64_t node_size) {
  return Options()
      .set_density(0.05)
      .set_warmup_iterations(1)
      .set_threshold_period(3)
      .set_hierarchical(true)
      .set_node_size(node_size);
}

std::int64_t shard_begin(std::int64_t n, int L, int s) { return s * n / L; }

/// acc(j) += grad(j) for j < n, on Exec. Outside the tests: CUDA 11's nvcc takes no device
/// lambda in a private member function, which a test's body is.
template <class Acc, class Grad>
void add_into(const Acc& acc, const Grad& grad, std::int64_t n) {
  Kokkos::parallel_for(
      Kokkos::RangePolicy<Exec>(0, n), KOKKOS_LAMBDA(std::int64_t j) { acc(j) += grad(j); });
}

/// Collective. The hierarchical output and residual from the definition, on the host, for a
/// call whose stats and inputs `c` holds, with nodes of L consecutive ranks. Entries whose
/// selection sits on a threshold (either answer is right) are skipped.
void expect_hierarchical_oracle(Algorithm algorithm, const Call& c, int L) {
  const int P = world_size();
  const int N = P / L;
  const auto n = static_cast<std::int64_t>(c.acc.size());
  const std::vector<float> all_acc = gather_all(c.acc);
  std::vector<float> local_thresholds(static_cast<std::size_t>(P));
  std::vector<float> global_thresholds(static_cast<std::size_t>(P));
  MPI_Allgather(&c.stats.local_threshold, 1, MPI_FLOAT, local_thresholds.data(), 1, MPI_FLOAT,
                MPI_COMM_WORLD);
  MPI_Allgather(&c.stats.global_threshold, 1, MPI_FLOAT, global_thresholds.data(), 1, MPI_FLOAT,
                MPI_COMM_WORLD);
  // Every test gradient's sums are exact: node sums and their sums in any order.
  auto node_acc = [&](int node, std::int64_t j) {
    float sum = 0.0f;
    for (int r = node * L; r < (node + 1) * L; ++r) {
      sum += all_acc[static_cast<std::size_t>(r * n + j)];
    }
    return sum;
  };
  const bool dense = c.stats.dense || algorithm == Algorithm::Dense;
  const int local = world_rank() % L;
  const int my_node = world_rank() / L;
  Diff out_diff;
  Diff residual_diff;
  std::int64_t skipped = 0;
  for (int s = 0; s < L; ++s) {
    for (std::int64_t j = shard_begin(n, L, s); j < shard_begin(n, L, s + 1); ++j) {
      float R = 0.0f;
      bool borderline = false;
      bool sent_here = false;  // this rank's node contributed entry j
      for (int m = 0; m < N; ++m) {
        const float a = node_acc(m, j);
        const float lt = local_thresholds[static_cast<std::size_t>(m * L + s)];
        // A zero is worth the same either way.
        if (!dense && a != 0.0f && std::fabs(a) == lt) borderline = true;
        if (dense || std::fabs(a) > lt) {
          R += a;
          if (m == my_node) sent_here = true;
        }
      }
      const float gt = global_thresholds[static_cast<std::size_t>(s)];
      if (!dense && R != 0.0f && std::fabs(R) == gt) borderline = true;
      const bool kept = dense || std::fabs(R) > gt;
      const auto at = static_cast<std::size_t>(j);
      if (borderline) {
        ++skipped;
        continue;
      }
      const float expected = kept ? R / static_cast<float>(N) / static_cast<float>(L) : 0.0f;
      if (!same_value_bits(expected, c.out[at])) out_diff.note(at, expected, c.out[at]);
      if (s == local && !dense) {
        const float left = sent_here && kept ? 0.0f : node_acc(my_node, j);
        if (!same_value_bits(left, c.residual_after[at])) {
          residual_diff.note(at, left, c.residual_after[at]);
        }
      }
    }
  }
  for (std::int64_t j = 0; j < n; ++j) {
    const auto at = static_cast<std::size_t>(j);
    const bool mine = j >= shard_begin(n, L, local) && j < shard_begin(n, L, local + 1);
    if ((dense || !mine) && c.residual_after[at] != 0.0f) {
      residual_diff.note(at, 0.0f, c.residual_after[at]);
    }
  }
  EXPECT_EQ(out_diff.count, 0) << "out vs the method over node sums / P: " << out_diff;
  EXPECT_EQ(residual_diff.count, 0) << "residual vs the node sum left unsent: " << residual_diff;
  EXPECT_LE(skipped, n / 10) << "too many entries on a threshold for the check to mean much";
}

/// Collective. The library's oracle agrees with the call's output.
void expect_library_oracle(Runner& runner, const Call& c) {
  Exec exec;
  const auto n = c.acc.size();
  const Vector acc = to_device(c.acc, "test::acc");
  const Vector out = to_device(c.out, "test::out");
  Vector expected("test::expected", n);
  Vector slack("test::slack", n);
  oktopk::expected_result(exec, runner.handle(), acc, expected, oktopk::default_oracle_tolerance,
                          slack);
  EXPECT_EQ(oktopk::count_mismatches(exec, runner.handle(), expected, out,
                                     oktopk::default_oracle_tolerance, slack),
            0);
}

TEST(Hierarchical, IsTheMethodOverNodeSumsOnEveryShard) {
  for (const int L : node_sizes()) {
    for (const Algorithm algorithm : kMethods) {
      // 1001 is a multiple of no node size here but 1; 3 leaves some shards empty for L > 3.
      for (const std::int64_t n : {std::int64_t{1001}, std::int64_t{3}}) {
        SCOPED_TRACE(std::string(oktopk::to_string(algorithm)) + ", node_size " +
                     std::to_string(L) + ", n " + std::to_string(n));
        Runner runner(algorithm, n, hierarchical_options(L));
        EXPECT_EQ(runner.handle().node_topology().local_size(), L);
        for (int call = 0; call < 4; ++call) {
          const Call c = runner.reduce(make_gradient(Dist::Uniform, 7, world_rank(), call, n));
          check_common(runner, c);
          expect_hierarchical_oracle(algorithm, c, L);
          expect_library_oracle(runner, c);
        }
      }
    }
  }
}

TEST(Hierarchical, FindsTheNodeFromSharedMemory) {
  // Under one mpiexec on one machine: one node of every rank, the method among one rank.
  for (const Algorithm algorithm : {Algorithm::TopkA, Algorithm::OkTopk}) {
    SCOPED_TRACE(oktopk::to_string(algorithm));
    Runner runner(algorithm, 777, hierarchical_options(0));
    ASSERT_EQ(runner.handle().node_topology().nodes(), 1);
    for (int call = 0; call < 3; ++call) {
      const Call c = runner.reduce(make_gradient(Dist::Heavy, 3, world_rank(), call, 777));
      check_common(runner, c);
      expect_hierarchical_oracle(algorithm, c, world_size());
      expect_library_oracle(runner, c);
    }
  }
}

TEST(Hierarchical, ChargesTheNodesTrafficToItsOwnPhases) {
  const int L = node_sizes().size() > 1 ? node_sizes()[1] : 1;
  constexpr std::int64_t n = 1001;
  Runner runner(Algorithm::OkTopk, n, hierarchical_options(L));
  runner.reduce(make_gradient(Dist::Uniform, 5, world_rank(), 0, n));
  const Call c = runner.reduce(make_gradient(Dist::Uniform, 5, world_rank(), 1, n));
  const int local = world_rank() % L;
  const std::int64_t shard = shard_begin(n, L, local + 1) - shard_begin(n, L, local);
  const auto traffic = [&](const char* phase) {
    const auto it = c.stats.phases.find(phase);
    return it == c.stats.phases.end() ? oktopk::PhaseTraffic{} : it->second.traffic;
  };
  // Inside the node: the other shards' sums sent once, this shard's result to the L - 1 others.
  EXPECT_EQ(traffic("node_reduce_scatter").bytes_sent, (n - shard) * 4);
  EXPECT_EQ(traffic("node_allgather").bytes_sent, (L - 1) * shard * 4);
  // Between the nodes: the method's own phases, on this shard.
  if (world_size() / L > 1) {
    EXPECT_GT(traffic("allgatherv").bytes_sent + traffic("split_reduce").bytes_sent, 0);
  }
  // The node's phases stay inside the node; the method's cross between nodes only (its ranks
  // are one per node); the checks over all ranks do both.
  for (const auto& [name, phase] : c.stats.phases) {
    SCOPED_TRACE(name);
    const oktopk::PhaseTraffic& t = phase.traffic;
    if (name == "node_reduce_scatter" || name == "node_allgather") {
      EXPECT_EQ(t.bytes_sent_between_nodes, 0);
      EXPECT_EQ(t.bytes_received_between_nodes, 0);
    } else if (name != "hierarchy_check") {
      EXPECT_EQ(t.bytes_sent_between_nodes, t.bytes_sent);
      EXPECT_EQ(t.bytes_received_between_nodes, t.bytes_received);
    }
  }
  // The traffic between nodes, summed over all ranks, balances.
  const oktopk::PhaseTraffic total = c.stats.total_traffic();
  EXPECT_EQ(sum_over_ranks(total.bytes_sent_between_nodes),
            sum_over_ranks(total.bytes_received_between_nodes));
}

TEST(Hierarchical, TakesALayoutAndCountsTheWholeOutputPerSegment) {
  constexpr std::int64_t n = 1001;
  oktopk::Layout layout;
  layout.append_dense(300, "head").append_sparse_rows(500, 10, "rows").append_dense(201, "tail");
  const oktopk::Communicator comm;
  for (const int L : node_sizes()) {
    for (const Algorithm algorithm : kMethods) {
      SCOPED_TRACE(std::string(oktopk::to_string(algorithm)) + ", node_size " + std::to_string(L));
      auto with =
          oktopk::make_sparse_allreduce<Exec>(algorithm, comm, n, hierarchical_options(L), layout);
      auto without =
          oktopk::make_sparse_allreduce<Exec>(algorithm, comm, n, hierarchical_options(L));
      EXPECT_EQ(with->layout().segments().size(), 3u);
      Exec exec;
      Vector out_with("out_with", n), out_without("out_without", n);
      oktopk::SparseAllreduce<Exec>::sparse_result_type entries;
      for (int call = 0; call < 3; ++call) {
        const Vector g = to_device(make_gradient(Dist::Uniform, 13, world_rank(), call, n), "g");
        with->reduce(exec, g, out_with);
        without->reduce(exec, g, out_without);
        exec.fence();
        const std::vector<float> a = to_host(out_with);
        const std::vector<float> b = to_host(out_without);
        Diff diff;
        for (std::size_t j = 0; j < a.size(); ++j) {
          if (!same_value_bits(a[j], b[j])) diff.note(j, a[j], b[j]);
        }
        EXPECT_EQ(diff.count, 0) << "with a layout vs without: " << diff;
        // Each segment's count is its part of the whole output, not of this rank's shard.
        const auto& segments = with->stats().segments;
        ASSERT_EQ(segments.size(), 3u);
        std::int64_t begin = 0;
        for (std::size_t s = 0; s < 3; ++s) {
          const std::int64_t end = begin + layout.segments()[s].length;
          std::int64_t nonzeros = 0;
          for (std::int64_t j = begin; j < end; ++j) nonzeros += a[j] != 0.0f ? 1 : 0;
          EXPECT_EQ(segments[s].name, layout.segments()[s].name);
          EXPECT_EQ(segments[s].nonzeros, nonzeros) << "segment " << s;
          begin = end;
        }
      }
      // The sparse result: its entries per segment.
      auto sparse =
          oktopk::make_sparse_allreduce<Exec>(algorithm, comm, n, hierarchical_options(L), layout);
      const Vector g = to_device(make_gradient(Dist::Uniform, 17, world_rank(), 0, n), "g");
      sparse->reduce_sparse(exec, g, entries);
      exec.fence();
      const auto indices =
          Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), entries.indices);
      std::int64_t counted[3] = {0, 0, 0};
      for (std::int64_t e = 0; e < entries.size; ++e) {
        counted[indices(e) < 300 ? 0 : indices(e) < 800 ? 1 : 2] += 1;
      }
      for (std::size_t s = 0; s < 3; ++s) {
        EXPECT_EQ(sparse->stats().segments[s].nonzeros, counted[s]) << "segment " << s;
      }
    }
  }
}

TEST(Hierarchical, SparseResultHoldsTheDenseOutputsEntries) {
  for (const int L : node_sizes()) {
    for (const Algorithm algorithm : {Algorithm::TopkA, Algorithm::OkTopk, Algorithm::Dense}) {
      SCOPED_TRACE(std::string(oktopk::to_string(algorithm)) + ", node_size " + std::to_string(L));
      constexpr std::int64_t n = 1001;
      Runner dense(algorithm, n, hierarchical_options(L));
      Runner sparse(algorithm, n, hierarchical_options(L), Output::Sparse);
      for (int call = 0; call < 3; ++call) {
        const auto grad = make_gradient(Dist::Uniform, 11, world_rank(), call, n);
        const Call a = dense.reduce(grad);
        const Call b = sparse.reduce(grad);
        Diff diff;
        for (std::size_t j = 0; j < a.out.size(); ++j) {
          if (!same_value_bits(a.out[j], b.out[j])) diff.note(j, a.out[j], b.out[j]);
        }
        EXPECT_EQ(diff.count, 0) << "reduce_sparse vs reduce: " << diff;
        EXPECT_EQ(sparse.sparse().size, count_nonzero(b.out));
      }
    }
  }
}

TEST(Hierarchical, ARestoredHandleContinuesBitForBit) {
  const int L = node_sizes().back();
  constexpr std::int64_t n = 1001;
  for (const Algorithm algorithm : {Algorithm::TopkA, Algorithm::OkTopk}) {
    SCOPED_TRACE(oktopk::to_string(algorithm));
    Runner original(algorithm, n, hierarchical_options(L));
    for (int call = 0; call < 3; ++call) {
      original.reduce(make_gradient(Dist::Uniform, 13, world_rank(), call, n));
    }
    Exec exec;
    std::stringstream checkpoint;
    original.handle().save_state(exec, checkpoint);
    Runner restored(algorithm, n, hierarchical_options(L));
    restored.handle().restore_state(exec, checkpoint);
    EXPECT_EQ(to_host(restored.handle().residual()), to_host(original.handle().residual()));
    for (int call = 3; call < 6; ++call) {
      const auto grad = make_gradient(Dist::Uniform, 13, world_rank(), call, n);
      const Call a = original.reduce(grad);
      const Call b = restored.reduce(grad);
      EXPECT_EQ(a.out, b.out) << "call " << call;
      EXPECT_EQ(a.residual_after, b.residual_after) << "call " << call;
      EXPECT_EQ(a.stats.iteration, b.stats.iteration);
    }
  }
}

TEST(Hierarchical, TakesDoubleGradients) {
  using DoubleHandle = oktopk::SparseAllreduce<Exec, double>;
  constexpr std::int64_t n = 1001;
  Exec exec;
  const auto handle =
      oktopk::make_sparse_allreduce<Exec, double>(exec, Algorithm::OkTopk, oktopk::Communicator(),
                                                  n, hierarchical_options(node_sizes().back()));
  DoubleHandle::vector_type grad("test::grad", n);
  DoubleHandle::vector_type out("test::out", n);
  DoubleHandle::residual_vector_type acc("test::acc", n);
  DoubleHandle::residual_vector_type expected("test::expected", n);
  DoubleHandle::residual_vector_type slack("test::slack", n);
  for (int call = 0; call < 3; ++call) {
    const auto host = make_gradient(Dist::Uniform, 17, world_rank(), call, n);
    auto mirror = Kokkos::create_mirror_view(grad);
    for (std::int64_t j = 0; j < n; ++j) mirror(j) = host[static_cast<std::size_t>(j)] / 3.0;
    Kokkos::deep_copy(grad, mirror);
    Kokkos::deep_copy(acc, handle->residual());
    add_into(acc, grad, n);
    Kokkos::fence();
    handle->reduce(exec, grad, out);
    oktopk::expected_result(exec, *handle, acc, expected, oktopk::default_oracle_tolerance, slack);
    EXPECT_EQ(oktopk::count_mismatches(exec, *handle, expected, out,
                                       oktopk::default_oracle_tolerance, slack),
              0)
        << "call " << call;
  }
}

TEST(Hierarchical, RefusesWhatItDoesNotTakeOnEveryRank) {
  const oktopk::Communicator comm;
  const int L = node_sizes().back();
  auto refusal = [&](Algorithm algorithm, const Options& options,
                     const oktopk::Layout& layout = {}) {
    return invalid_argument_of(
        [&] { oktopk::make_sparse_allreduce<Exec>(algorithm, comm, 100, options, layout); });
  };
  for (const Algorithm algorithm : {Algorithm::GTopk, Algorithm::S2Reducer}) {
    const std::string message = refusal(algorithm, hierarchical_options(L));
    EXPECT_NE(message.find("hierarchical=on takes methods dense, topka"), std::string::npos)
        << message;
  }
  EXPECT_NE(refusal(Algorithm::TopkA, hierarchical_options(L).set_wire(oktopk::Wire::BFloat16))
                .find("not wire=bf16"),
            std::string::npos);
  const std::string bf16 = invalid_argument_of([&] {
    oktopk::make_sparse_allreduce<Exec, oktopk::bfloat16>(Algorithm::TopkA, comm, 100,
                                                          hierarchical_options(L));
  });
  EXPECT_NE(bf16.find("takes float and double gradients, not bfloat16"), std::string::npos) << bf16;
  if (world_size() >= 3) {
    // Nodes of 2, 2, ..., and one of the rest: not all alike.
    const int uneven = world_size() % 2 == 1 ? 2 : world_size() - 1;
    const std::string message = refusal(Algorithm::OkTopk, hierarchical_options(uneven));
    EXPECT_NE(message.find("the same number of ranks on every node"), std::string::npos) << message;
    EXPECT_TRUE(same_text_on_all_ranks(message));
  }
}

TEST(Hierarchical, RejectedCallsLeaveTheHandleAsItWas) {
  const int L = node_sizes().size() > 1 ? node_sizes()[1] : 1;
  constexpr std::int64_t n = 1001;
  const float huge = std::numeric_limits<float>::max() / 1.5f;
  for (const Algorithm algorithm : {Algorithm::Dense, Algorithm::OkTopk}) {
    SCOPED_TRACE(oktopk::to_string(algorithm));
    Runner runner(algorithm, n, hierarchical_options(L));
    runner.reduce(make_gradient(Dist::Uniform, 19, world_rank(), 0, n));
    const std::vector<float> residual = to_host(runner.handle().residual());
    auto rejected = [&](std::vector<float> grad) {
      const std::string message = invalid_argument_of([&] {
        Exec exec;
        Vector out("test::out", n);
        runner.handle().reduce(exec, to_device(grad), out);
      });
      // Every rank throws (the rank at fault adds its count of bad entries).
      EXPECT_EQ(message.rfind("oktopk::SparseAllreduce::reduce: ", 0), 0) << message;
      EXPECT_EQ(runner.handle().stats().iteration, 1);
      EXPECT_EQ(to_host(runner.handle().residual()), residual);
      // The method's handle on this rank's shard too, whether its own call failed or not.
      const auto& hierarchical =
          dynamic_cast<const oktopk::impl::HierarchicalAllreduce<Exec, float>&>(
              runner.handle().implementation());
      EXPECT_EQ(hierarchical.across_nodes().stats().iteration, 1);
      return message;
    };
    // A NaN on the last rank.
    auto grad = make_gradient(Dist::Uniform, 19, world_rank(), 1, n);
    if (world_rank() == world_size() - 1) grad[500] = std::numeric_limits<float>::quiet_NaN();
    const std::string nan = rejected(grad);
    EXPECT_NE(nan.find("NaN or Inf on rank " + std::to_string(world_size() - 1)), std::string::npos)
        << nan;
    if (L >= 2) {
      // Finite gradients whose sum inside a node overflows, on the first shard only.
      grad = make_gradient(Dist::Uniform, 19, world_rank(), 1, n);
      grad[0] = huge;
      EXPECT_NE(rejected(grad).find("sum over a node's ranks"), std::string::npos);
    }
    if (algorithm == Algorithm::Dense && world_size() / L >= 2 && L >= 2) {
      // Node sums that are finite, whose sum across the nodes is not, on the first shard only:
      // the other shards' calls went through and are put back.
      grad = make_gradient(Dist::Uniform, 19, world_rank(), 1, n);
      grad[0] = world_rank() % L == 0 ? huge : 0.0f;
      EXPECT_NE(rejected(grad).find("overflows to Inf"), std::string::npos);
    }
    // And the handle goes on as if nothing had been tried.
    const Call c = runner.reduce(make_gradient(Dist::Uniform, 19, world_rank(), 1, n));
    EXPECT_EQ(c.stats.iteration, 2);
    expect_hierarchical_oracle(algorithm, c, L);
  }
}

TEST(Hierarchical, ReduceOnSomeRanksAndReduceSparseOnOthersThrowsOnEveryRank) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks";
  constexpr std::int64_t n = 1001;
  Runner runner(Algorithm::OkTopk, n, hierarchical_options(node_sizes().back()));
  const auto grad = make_gradient(Dist::Uniform, 23, world_rank(), 0, n);
  const std::string message = invalid_argument_of([&] {
    Exec exec;
    if (world_rank() == world_size() - 1) {
      oktopk::SparseResult<Handle::memory_space> result;
      runner.handle().reduce_sparse(exec, to_device(grad), result);
    } else {
      Vector out("test::out", n);
      runner.handle().reduce(exec, to_device(grad), out);
    }
  });
  EXPECT_NE(message.find("reduce on some ranks and reduce_sparse on others"), std::string::npos)
      << message;
  EXPECT_EQ(runner.handle().stats().iteration, 0);
  const Call c = runner.reduce(grad);
  EXPECT_EQ(c.stats.iteration, 1);
  expect_hierarchical_oracle(Algorithm::OkTopk, c, node_sizes().back());
}

}  // namespace
