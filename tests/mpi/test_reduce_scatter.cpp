// SPDX-License-Identifier: BSD-3-Clause
// reduce_scatter: for Ok-Topk, TopkA, TopkDSA and Gaussian-k, every rank's shard is the
// matching slice of a twin handle's reduce() output on the same gradients, bit for bit, with
// the same residual and statistics, on warm-up, exact and reused-threshold calls, with Ok-Topk's
// regions balanced or fixed at the equal shards (then only counts cross ranks), for equal and
// uneven shards, float, double and bfloat16 gradients and a bfloat16 wire (TopkDSA also past its
// dense switch); its traffic has no allgather and stays within the bounds of docs/reference.md.
// For Dense on OkTopk's ring (every gradient type and wire) the same holds with equal shards;
// with MPI, or uneven shards, the shard is the slice up to the order of the sums. gTopk,
// S2, hierarchical handles and bad arguments are refused on every rank with the handle
// unchanged.
#include "mpi/method_checks.hpp"

#include <oktopk/any_space.hpp>
#include <oktopk/shards.hpp>

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace oktopk::test;  // NOLINT(google-build-using-namespace)
using oktopk::Algorithm;
using oktopk::Options;

template <class Value>
std::uint64_t bits_of_value(Value x) {
  std::uint64_t b = 0;
  std::memcpy(&b, &x, sizeof x);
  return b;
}

template <class Value>
Kokkos::View<Value*, Exec::memory_space> device_values(const std::vector<float>& host) {
  Kokkos::View<Value*, Exec::memory_space> device("test::grad", host.size());
  auto mirror = Kokkos::create_mirror_view(device);
  for (std::size_t j = 0; j < host.size(); ++j)
    mirror(j) = oktopk::impl::value_cast<Value>(host[j]);
  Kokkos::deep_copy(device, mirror);
  return device;
}

template <class V>
std::vector<typename V::non_const_value_type> host_values(const V& device) {
  using T = typename V::non_const_value_type;
  std::vector<T> host(device.extent(0));
  auto mirror = Kokkos::create_mirror_view(device);
  Kokkos::deep_copy(mirror, device);
  for (std::size_t j = 0; j < host.size(); ++j) host[j] = mirror(j);
  return host;
}

/// Uneven shards: rank 0's empty, the last rank's the largest, the others' unequal.
std::vector<std::int64_t> uneven_offsets(std::int64_t n, int P) {
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(P) + 1, 0);
  for (int r = 1; r < P; ++r) {
    offsets[static_cast<std::size_t>(r) + 1] =
        std::min<std::int64_t>(n, offsets[static_cast<std::size_t>(r)] + (n / (2 * P)) * r + 1);
  }
  offsets[static_cast<std::size_t>(P)] = n;
  if (P > 1) offsets[1] = 0;
  for (int r = 1; r <= P; ++r) {
    offsets[static_cast<std::size_t>(r)] =
        std::max(offsets[static_cast<std::size_t>(r)], offsets[static_cast<std::size_t>(r) - 1]);
  }
  return offsets;
}

std::int64_t sent_bytes(const oktopk::ReduceStats& stats, const std::string& phase) {
  const auto it = stats.phases.find(phase);
  return it == stats.phases.end() ? 0 : it->second.traffic.bytes_sent;
}

std::int64_t total_sent(const oktopk::ReduceStats& stats) {
  std::int64_t total = 0;
  for (const auto& entry : stats.phases) total += entry.second.traffic.bytes_sent;
  return total;
}

std::int64_t sum_over_ranks(std::int64_t x) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return x;
}

/// Twin handles of `method` fed the same gradients, one calling reduce(), one
/// reduce_scatter(): the shard against the slice, the residuals, the statistics, and the traffic
/// bounds.
template <class Value>
void expect_shards_of_twin(Algorithm method, std::int64_t n, const Options& options,
                           const std::vector<std::int64_t>& given_offsets, int calls) {
  const int P = world_size();
  const int me = world_rank();
  auto reducing =
      oktopk::make_sparse_allreduce<Exec, Value>(method, oktopk::Communicator(), n, options);
  auto scattering =
      oktopk::make_sparse_allreduce<Exec, Value>(method, oktopk::Communicator(), n, options);
  const std::vector<std::int64_t> offsets =
      given_offsets.empty() ? oktopk::equal_shard_offsets(n, P) : given_offsets;
  const std::int64_t begin = offsets[static_cast<std::size_t>(me)];
  const std::int64_t length = offsets[static_cast<std::size_t>(me) + 1] - begin;
  Exec exec;
  Kokkos::View<Value*, Exec::memory_space> out("test::out", static_cast<std::size_t>(n));
  Kokkos::View<Value*, Exec::memory_space> shard("test::shard", static_cast<std::size_t>(length));
  std::int64_t sparse_calls = 0;
  std::int64_t dense_switches = 0;
  for (const Dist d : {Dist::Uniform, Dist::Correlated, Dist::Heavy, Dist::Ties, Dist::Rows}) {
    for (int call = 0; call < calls; ++call) {
      const std::int64_t t = scattering->stats().iteration;
      SCOPED_TRACE(std::string(name_of(d)) + " call " + std::to_string(t + 1));
      const auto grad = device_values<Value>(make_gradient(d, 17, me, t, n));
      // NaN first, so that an entry the call leaves unwritten shows.
      Kokkos::deep_copy(shard, oktopk::impl::value_cast<Value>(std::nanf("")));
      reducing->reduce(exec, grad, out);
      scattering->reduce_scatter(exec, grad, shard, given_offsets);
      exec.fence();
      const auto full = host_values(out);
      const auto mine = host_values(shard);
      std::int64_t differ = 0;
      for (std::int64_t j = 0; j < length; ++j) {
        if (bits_of_value(mine[static_cast<std::size_t>(j)]) !=
            bits_of_value(full[static_cast<std::size_t>(begin + j)]))
          ++differ;
      }
      EXPECT_EQ(differ, 0) << "entries of the shard differ from reduce()'s output";
      const auto r1 = host_values(reducing->residual());
      const auto r2 = host_values(scattering->residual());
      std::int64_t residual_differ = 0;
      for (std::size_t j = 0; j < r1.size(); ++j) {
        if (bits_of_value(r1[j]) != bits_of_value(r2[j])) ++residual_differ;
      }
      EXPECT_EQ(residual_differ, 0) << "residual differs from reduce()'s";
      const auto& rs = reducing->stats();
      const auto& ss = scattering->stats();
      EXPECT_EQ(ss.global_selected, rs.global_selected);
      EXPECT_EQ(ss.local_selected, rs.local_selected);
      EXPECT_EQ(bits_of(ss.global_threshold), bits_of(rs.global_threshold));
      EXPECT_EQ(bits_of(ss.local_threshold), bits_of(rs.local_threshold));
      EXPECT_EQ(ss.dense, rs.dense);
      EXPECT_EQ(ss.iteration, rs.iteration);
      EXPECT_TRUE(ss.reduce_scatter);
      EXPECT_FALSE(rs.reduce_scatter);
      if (ss.dense) continue;
      ++sparse_calls;
      // An entry: its 4-byte index and its value on the wire.
      const std::int64_t entry_bytes =
          4 + (options.wire == oktopk::Wire::Native
                   ? static_cast<std::int64_t>(sizeof(oktopk::impl::arithmetic_t<Value>))
                   : 2);
      // What a rank sends to the shards' owners: Ok-Topk and TopkDSA their region's reduced
      // entries, TopkA and Gaussian-k their local selection, each entry once, as the
      // allgather's pairs, plus the counts' alltoall (8 bytes a rank) and the total's
      // allreduce.
      const bool regions = method == Algorithm::OkTopk || method == Algorithm::TopkDSA;
      EXPECT_LE(sent_bytes(ss, "shard_exchange"),
                entry_bytes * (regions ? ss.global_selected : ss.local_selected) + 16 * P);
      // Over all ranks, the shard exchange sends each entry at most once.
      EXPECT_LE(sum_over_ranks(sent_bytes(ss, "shard_exchange")),
                entry_bytes * (regions ? ss.global_selected : sum_over_ranks(ss.local_selected)) +
                    16 * P * P);
      EXPECT_EQ(sent_bytes(ss, "balance"), 0);
      if (method == Algorithm::OkTopk) {
        // No allgather of entries: what "allgatherv" still sends is the ladder's counts, one
        // int32 per level.
        EXPECT_LE(sent_bytes(ss, "allgatherv"), (P - 1) * 4 * oktopk::impl::max_count_levels);
        // One byte back for each entry another rank sent this one.
        EXPECT_LE(sum_over_ranks(sent_bytes(ss, "feedback")), sum_over_ranks(ss.local_selected));
      } else {
        // Every selected entry reaches the result: no feedback, and no allgather at all.
        EXPECT_EQ(sent_bytes(ss, "allgatherv"), 0);
        EXPECT_EQ(sent_bytes(ss, "feedback"), 0);
      }
      if (method == Algorithm::OkTopk && options.equal_regions && given_offsets.empty()) {
        EXPECT_EQ(sent_bytes(ss, "repartition"), 0);
        // Each region is its owner's shard: only the counts and the total travel.
        EXPECT_LE(sent_bytes(ss, "shard_exchange"), 16 * P);
      }
      if (method == Algorithm::TopkDSA) {
        EXPECT_EQ(sent_bytes(ss, "split_reduce"), sent_bytes(rs, "split_reduce"));
        if (rs.dense_switch) ++dense_switches;
      }
      // Less traffic than the allgather once there are entries to gather (counts and totals
      // cost more than they save on a handful).
      if (P >= 4 && ss.global_selected >= 4 * P) {
        EXPECT_LT(sum_over_ranks(total_sent(ss)), sum_over_ranks(total_sent(rs)));
      }
    }
  }
  if (n >= 1000 && method != Algorithm::Dense) {
    EXPECT_GT(sparse_calls, 0) << "no call after the warm-up";
  }
  // At density 0.3 on 3 ranks or more, uncorrelated selections fill more than half of the
  // vector: reduce() sends TopkDSA's regions dense.
  if (method == Algorithm::TopkDSA && options.density >= 0.3 && P >= 3 && n >= 1000) {
    EXPECT_GT(dense_switches, 0) << "reduce() never took its dense switch";
  }
}

TEST(ReduceScatterOkTopk, ShardsAreTheTwinReducesOutput) {
  for (const std::int64_t n :
       {std::int64_t{1}, std::int64_t{5}, std::int64_t{3001}, std::int64_t{20000}}) {
    for (const Options& options :
         {Options{}.set_density(0.02), Options{}.set_density(0.02).set_warmup_iterations(1),
          Options{}.set_density(0.05).set_guard_ladder(false).set_threshold_period(3),
          Options{}
              .set_density(0.02)
              .set_balancing(oktopk::Balancing::On)
              .set_repartition_period(2),
          Options{}.set_density(0.01).set_warmup_iterations(1).set_dense_allreduce(
              oktopk::DenseAlgorithm::Ring),
          Options{}.set_density(0.02).set_equal_regions(true)}) {
      std::ostringstream described;
      described << "n = " << n << ", " << options;
      SCOPED_TRACE(described.str());
      expect_shards_of_twin<float>(Algorithm::OkTopk, n, options, {}, 3);
    }
  }
}

TEST(ReduceScatterOkTopk, UnevenShards) {
  const int P = world_size();
  for (const std::int64_t n : {std::int64_t{3}, std::int64_t{4001}}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    expect_shards_of_twin<float>(Algorithm::OkTopk, n, Options{}.set_density(0.03),
                                 uneven_offsets(n, P), 2);
    // Everything on the last rank.
    std::vector<std::int64_t> last(static_cast<std::size_t>(P) + 1, 0);
    last[static_cast<std::size_t>(P)] = n;
    expect_shards_of_twin<float>(Algorithm::OkTopk, n, Options{}.set_density(0.03), last, 2);
  }
}

TEST(ReduceScatterOkTopk, GradientTypesAndWires) {
  expect_shards_of_twin<double>(Algorithm::OkTopk, 3001, Options{}.set_density(0.02), {}, 3);
  expect_shards_of_twin<oktopk::bfloat16>(Algorithm::OkTopk, 3001, Options{}.set_density(0.02), {},
                                          3);
  expect_shards_of_twin<float>(Algorithm::OkTopk, 3001,
                               Options{}.set_density(0.02).set_wire(oktopk::Wire::BFloat16), {}, 3);
}

TEST(ReduceScatterTopk, ShardsAreTheTwinReducesOutput) {
  const int P = world_size();
  for (const Algorithm method : {Algorithm::TopkA, Algorithm::TopkDSA, Algorithm::GaussianK}) {
    for (const std::int64_t n :
         {std::int64_t{1}, std::int64_t{5}, std::int64_t{3001}, std::int64_t{20000}}) {
      // TopkDSA past its dense switch too (density 0.3 on 3 ranks or more).
      for (const Options& options :
           {Options{}.set_density(0.02), Options{}.set_density(0.02).set_warmup_iterations(1),
            Options{}.set_density(0.3).set_warmup_iterations(1)}) {
        std::ostringstream described;
        described << oktopk::to_string(method) << ", n = " << n << ", " << options;
        SCOPED_TRACE(described.str());
        expect_shards_of_twin<float>(method, n, options, {}, 2);
      }
    }
    SCOPED_TRACE(oktopk::to_string(method));
    expect_shards_of_twin<float>(method, 4001, Options{}.set_density(0.03), uneven_offsets(4001, P),
                                 2);
    expect_shards_of_twin<double>(method, 3001, Options{}.set_density(0.02), {}, 2);
    expect_shards_of_twin<oktopk::bfloat16>(method, 3001, Options{}.set_density(0.02), {}, 2);
    for (const double density : {0.02, 0.3}) {
      expect_shards_of_twin<float>(
          method, 3001, Options{}.set_density(density).set_wire(oktopk::Wire::BFloat16), {}, 2);
    }
  }
}

TEST(ReduceScatterDense, OnTheRingIsTheTwinReducesSlice) {
  const Options ring = Options{}.set_dense_allreduce(oktopk::DenseAlgorithm::Ring);
  for (const std::int64_t n :
       {std::int64_t{1}, std::int64_t{5}, std::int64_t{3001}, std::int64_t{40003}}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    expect_shards_of_twin<float>(Algorithm::Dense, n, ring, {}, 1);
  }
  // A wire narrower than the gradient, and 16-bit gradients, run on the ring whatever
  // dense_allreduce says.
  expect_shards_of_twin<double>(Algorithm::Dense, 3001, ring, {}, 1);
  expect_shards_of_twin<double>(Algorithm::Dense, 3001, Options{}.set_wire(oktopk::Wire::Float32),
                                {}, 1);
  expect_shards_of_twin<float>(Algorithm::Dense, 3001, Options{}.set_wire(oktopk::Wire::BFloat16),
                               {}, 1);
  expect_shards_of_twin<float>(Algorithm::Dense, 3001, Options{}.set_wire(oktopk::Wire::Float16),
                               {}, 1);
  expect_shards_of_twin<oktopk::bfloat16>(Algorithm::Dense, 3001, Options{}, {}, 1);
  expect_shards_of_twin<oktopk::float16>(Algorithm::Dense, 3001, Options{}, {}, 1);
}

TEST(ReduceScatterDense, IsTheSliceOfTheAverage) {
  const int P = world_size();
  const int me = world_rank();
  for (const std::int64_t n : {std::int64_t{0}, std::int64_t{3}, std::int64_t{3001}}) {
    for (const bool uneven : {false, true}) {
      for (const bool on_ring : {false, true}) {
        SCOPED_TRACE("n = " + std::to_string(n) + (uneven ? ", uneven shards" : "") +
                     (on_ring ? ", ring" : ", MPI"));
        const std::vector<std::int64_t> offsets =
            uneven ? uneven_offsets(n, P) : oktopk::equal_shard_offsets(n, P);
        const Options options = Options{}.set_dense_allreduce(
            on_ring ? oktopk::DenseAlgorithm::Ring : oktopk::DenseAlgorithm::Mpi);
        Runner twin(Algorithm::Dense, n, options);
        auto h = oktopk::make_sparse_allreduce<Exec>(Algorithm::Dense, oktopk::Communicator(), n,
                                                     options);
        const std::int64_t begin = offsets[static_cast<std::size_t>(me)];
        const std::int64_t length = offsets[static_cast<std::size_t>(me) + 1] - begin;
        Vector shard("test::shard", static_cast<std::size_t>(length));
        Exec exec;
        for (int call = 0; call < 2; ++call) {
          std::vector<std::vector<float>> grads;
          for (int r = 0; r < P; ++r) grads.push_back(make_gradient(Dist::Uniform, 5, r, call, n));
          const auto& grad = grads[static_cast<std::size_t>(me)];
          const Call c = twin.reduce(grad);
          h->reduce_scatter(exec, to_device(grad), shard,
                            uneven ? offsets : std::vector<std::int64_t>{});
          exec.fence();
          const auto mine = to_host(shard);
          // Summed in another order than reduce()'s: within the rounding of P - 1 additions.
          std::int64_t off = 0;
          for (std::int64_t j = 0; j < length; ++j) {
            double scale = 0.0;
            for (const auto& g : grads) scale += std::fabs(g[static_cast<std::size_t>(begin + j)]);
            const double tolerance = 2.0 * P * std::numeric_limits<float>::epsilon() * scale / P;
            if (!(std::fabs(mine[static_cast<std::size_t>(j)] -
                            c.out[static_cast<std::size_t>(begin + j)]) <= tolerance))
              ++off;
          }
          EXPECT_EQ(off, 0);
          const auto& stats = h->stats();
          EXPECT_TRUE(stats.dense);
          // MPI_Reduce_scatter's volume, and the ring's: every other rank's shard, once.
          EXPECT_EQ(sent_bytes(stats, "dense_reduce_scatter"),
                    static_cast<std::int64_t>(sizeof(float)) * (n - length));
        }
      }
    }
  }
}

TEST(ReduceScatter, RefusesMethodsWithoutOneOnEveryRank) {
  const std::int64_t n = 600;
  const int me = world_rank();
  const auto offsets = oktopk::equal_shard_offsets(n, world_size());
  Vector shard("test::shard", static_cast<std::size_t>(offsets[me + 1] - offsets[me]));
  Exec exec;
  for (const Algorithm a : {Algorithm::GTopk, Algorithm::S2Reducer}) {
    SCOPED_TRACE(oktopk::to_string(a));
    auto h = oktopk::make_sparse_allreduce<Exec>(a, oktopk::Communicator(), n,
                                                 Options{}.set_density(0.05));
    const std::string message = invalid_argument_of([&] {
      h->reduce_scatter(exec, to_device(make_gradient(Dist::Uniform, 3, me, 0, n)), shard);
    });
    EXPECT_TRUE(starts_with(message, "oktopk::SparseAllreduce::reduce_scatter: method " +
                                         oktopk::to_string(a) + " has no reduce-scatter: "))
        << message;
    EXPECT_TRUE(same_text_on_all_ranks(message));
    EXPECT_EQ(h->stats().iteration, 0);
    // Still usable.
    Vector out("test::out", n);
    h->reduce(exec, to_device(make_gradient(Dist::Uniform, 3, me, 0, n)), out);
    EXPECT_EQ(h->stats().iteration, 1);
  }
  // A hierarchical handle.
  auto hier = oktopk::make_sparse_allreduce<Exec>(
      Algorithm::OkTopk, oktopk::Communicator(), n,
      Options{}.set_density(0.05).set_hierarchical(true).set_node_size(1));
  const std::string hier_message = invalid_argument_of([&] {
    hier->reduce_scatter(exec, to_device(make_gradient(Dist::Uniform, 3, me, 0, n)), shard);
  });
  EXPECT_TRUE(starts_with(hier_message, "oktopk::SparseAllreduce::reduce_scatter: a hierarchical"))
      << hier_message;
  EXPECT_TRUE(same_text_on_all_ranks(hier_message));
}

TEST(ReduceScatter, RejectsBadArgumentsOnEveryRankAndStaysUsable) {
  const std::int64_t n = 1500;
  const int P = world_size();
  const int me = world_rank();
  const int culprit = P - 1;
  const Options options = Options{}.set_density(0.04);
  Runner twin(Algorithm::OkTopk, n, options);
  auto h =
      oktopk::make_sparse_allreduce<Exec>(Algorithm::OkTopk, oktopk::Communicator(), n, options);
  Exec exec;
  const auto offsets = oktopk::equal_shard_offsets(n, P);
  const std::int64_t length = offsets[me + 1] - offsets[me];
  const Vector grad = to_device(make_gradient(Dist::Heavy, 4, me, 0, n));
  const auto expect_rejected = [&](const std::string& message, const std::string& what) {
    EXPECT_TRUE(starts_with(message, "oktopk::SparseAllreduce::reduce_scatter: ")) << message;
    EXPECT_NE(message.find(what), std::string::npos) << message;
    EXPECT_EQ(h->stats().iteration, 0);
  };
  // A shard of the wrong length on one rank.
  {
    Vector wrong("test::shard", static_cast<std::size_t>(me == culprit ? length + 1 : length));
    const std::string message = invalid_argument_of([&] { h->reduce_scatter(exec, grad, wrong); });
    expect_rejected(message, "rank " + std::to_string(culprit) + " passed");
    if (me == culprit) EXPECT_NE(message.find("shard of length"), std::string::npos) << message;
  }
  Vector shard("test::shard", static_cast<std::size_t>(length));
  // Offsets that differ between ranks (from P = 2 on), and offsets that are not a partition.
  if (P > 1) {
    std::vector<std::int64_t> mine = offsets;
    if (me == culprit) {
      mine[1] += 1;
    }
    Vector other("test::shard", static_cast<std::size_t>(mine[me + 1] - mine[me]));
    const std::string message =
        invalid_argument_of([&] { h->reduce_scatter(exec, grad, other, mine); });
    expect_rejected(message, "different shard offsets");
    EXPECT_TRUE(same_text_on_all_ranks(message));
  }
  {
    std::vector<std::int64_t> bad = offsets;
    bad.back() = n + 1;
    const std::string message =
        invalid_argument_of([&] { h->reduce_scatter(exec, grad, shard, bad); });
    expect_rejected(message, "passed");
    if (me == P - 1) {
      EXPECT_NE(message.find("must run from 0 to n"), std::string::npos) << message;
    }
    if (P > 1) {
      const std::string short_message = invalid_argument_of([&] {
        h->reduce_scatter(exec, grad, shard, std::vector<std::int64_t>{0, n});
      });
      expect_rejected(short_message, "passed");
      if (me == P - 1) {
        EXPECT_NE(short_message.find("boundaries expected"), std::string::npos) << short_message;
      }
    }
  }
  // reduce on some ranks, reduce_scatter on the others.
  if (P > 1) {
    Vector out("test::out", n);
    const std::string message = invalid_argument_of([&] {
      if (me == culprit) {
        h->reduce(exec, grad, out);
      } else {
        h->reduce_scatter(exec, grad, shard);
      }
    });
    EXPECT_NE(message.find("reduce on some ranks and reduce_scatter on others"), std::string::npos)
        << message;
    EXPECT_EQ(h->stats().iteration, 0);
  }
  // NaN on one rank.
  {
    auto bad = make_gradient(Dist::Heavy, 4, me, 0, n);
    if (me == culprit) bad[7] = std::numeric_limits<float>::quiet_NaN();
    const std::string message =
        invalid_argument_of([&] { h->reduce_scatter(exec, to_device(bad), shard); });
    expect_rejected(message, "NaN or Inf on rank " + std::to_string(culprit));
  }
  // The handle is as it was: its first call matches the twin's.
  h->reduce_scatter(exec, grad, shard);
  exec.fence();
  const Call c = twin.reduce(make_gradient(Dist::Heavy, 4, me, 0, n));
  const auto mine = to_host(shard);
  std::int64_t differ = 0;
  for (std::int64_t j = 0; j < length; ++j) {
    if (bits_of(mine[static_cast<std::size_t>(j)]) !=
        bits_of(c.out[static_cast<std::size_t>(offsets[me] + j)]))
      ++differ;
  }
  EXPECT_EQ(differ, 0);
}

TEST(ReduceScatter, EqualShardOffsets) {
  EXPECT_EQ(oktopk::equal_shard_offsets(10, 4), (std::vector<std::int64_t>{0, 2, 5, 7, 10}));
  EXPECT_EQ(oktopk::equal_shard_offsets(0, 2), (std::vector<std::int64_t>{0, 0, 0}));
  EXPECT_EQ(oktopk::equal_shard_offsets(3, 5), (std::vector<std::int64_t>{0, 0, 1, 1, 2, 3}));
  EXPECT_THROW(oktopk::equal_shard_offsets(-1, 2), std::invalid_argument);
  EXPECT_THROW(oktopk::equal_shard_offsets(5, 0), std::invalid_argument);
}

}  // namespace
