// SPDX-License-Identifier: BSD-3-Clause
// The dense allreduce: the ring against MPI_Allreduce, and non-finite averages on either.
#include "mpi/method_checks.hpp"

#include <oktopk/impl/collectives/ring_allreduce.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace {

using namespace oktopk::test;  // NOLINT(google-build-using-namespace)
using oktopk::Algorithm;
using oktopk::Options;

Options ring_options() { return Options{}.set_dense_allreduce(oktopk::DenseAlgorithm::Ring); }
Options mpi_options() { return Options{}.set_dense_allreduce(oktopk::DenseAlgorithm::Mpi); }

TEST(DenseRing, MatchesMpiAllreduceBitForBitAtEverySize) {
  const int P = world_size();
  // Empty, one entry, fewer entries than ranks, chunks of unequal length, many entries, and
  // chunks of several segments (oktopk::impl::ring_segment_values), the last one partial.
  const std::int64_t segmented = P * 2 * oktopk::impl::ring_segment_values + 2 * P + 1;
  for (const std::int64_t n :
       std::vector<std::int64_t>{0, 1, std::max(1, P - 1), P + 1, 3001, segmented}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    Runner ring(Algorithm::Dense, n, ring_options());
    Runner mpi(Algorithm::Dense, n, mpi_options());
    for (const Dist d : {Dist::Uniform, Dist::Heavy, Dist::Wide}) {
      SCOPED_TRACE(name_of(d));
      const auto grad = make_gradient(d, 11, world_rank(), ring.calls(), n);
      const Call r = ring.reduce(grad);
      const Call m = mpi.reduce(grad);
      check_call(ring, r);  // the dense oracle: (Σ grad) / P, bit for bit, the same on every rank
      Diff diff;
      for (std::size_t j = 0; j < r.out.size(); ++j) {
        if (bits_of(r.out[j]) != bits_of(m.out[j])) diff.note(j, m.out[j], r.out[j]);
      }
      EXPECT_EQ(diff.count, 0) << "ring vs MPI_Allreduce: " << diff;
      expect_ring_bytes(r, 4);
    }
  }
}

TEST(DenseRing, SendsItsChunksToTheRightNeighbourOnly) {
  const int P = world_size();
  const std::int64_t n = 1000;
  Runner runner(Algorithm::Dense, n, ring_options());
  oktopk::Communicator log = runner.handle().communicator();  // shares the handle's counters
  log.set_message_log(true);
  runner.reduce(make_gradient(Dist::Uniform, 19, world_rank(), 0, n));
  std::int64_t sends = 0, to_right = 0, collectives = 0;
  for (const auto& m : log.message_log()) {
    if (m.phase != "dense_allreduce") continue;
    if (std::string(m.operation) == "send") {
      ++sends;
      if (m.peer == (world_rank() + 1) % P) ++to_right;
    } else if (m.peer < 0) {
      ++collectives;
    }
  }
  log.set_message_log(false);
  EXPECT_EQ(sends, 2 * (P - 1));
  EXPECT_EQ(to_right, sends);
  EXPECT_EQ(collectives, 0) << "the ring made a collective call";
}

TEST(DenseRing, SumsOrdinaryFloatsWithinTheOrderBoundOfMpi) {
  // Random floats whose sums round: the ring and MPI may differ, by no more than the order
  // bound, and each is the same on every rank.
  const int P = world_size();
  const std::int64_t n = 4099;
  Runner ring(Algorithm::Dense, n, ring_options());
  Runner mpi(Algorithm::Dense, n, mpi_options());
  std::vector<float> grad(static_cast<std::size_t>(n));
  std::uint32_t state = 2463534242u + static_cast<std::uint32_t>(world_rank()) * 7919u;
  for (auto& g : grad) {
    state ^= state << 13, state ^= state >> 17, state ^= state << 5;
    g = static_cast<float>(state) * 0x1p-32f - 0.5f;
  }
  const Call r = ring.reduce(grad);
  const Call m = mpi.reduce(grad);
  EXPECT_EQ(bits_differing_from_rank0(r.out), 0);
  std::vector<float> magnitude(grad.size());
  for (std::size_t j = 0; j < grad.size(); ++j) magnitude[j] = std::fabs(grad[j]);
  const std::vector<float> abs_sum = sum_over_ranks(magnitude);
  Diff diff;
  for (std::size_t j = 0; j < grad.size(); ++j) {
    const float bound =
        2.0f * static_cast<float>(P) * 0x1p-24f * abs_sum[j] / static_cast<float>(P);
    if (!(std::fabs(r.out[j] - m.out[j]) <= bound)) diff.note(j, m.out[j], r.out[j]);
  }
  EXPECT_EQ(diff.count, 0) << "ring vs MPI beyond the order bound: " << diff;
}

TEST(DenseRing, WarmupCallsOfASparseMethodUseItToo) {
  Runner runner(Algorithm::OkTopk, 2000, ring_options().set_warmup_iterations(2).set_density(0.05));
  for (int call = 0; call < 3; ++call) {
    const Call c = runner.reduce(make_gradient(Dist::Heavy, 13, world_rank(), call, 2000));
    const Checked checked = check_call(runner, c);
    EXPECT_EQ(checked.dense, call < 2);
  }
}

/// A dense call checks the average rather than its input: NaN or Inf on one rank, and finite
/// gradients whose sum overflows, throw on every rank, and the handle goes on as if the call
/// had never been made. The bad entries lie at the two ends of the gradient, and for n = 40003
/// also in the middle of a rank's own chunk and in the last, partial run of entries a host
/// thread averages (oktopk::impl::chunk_length_v).
void expect_dense_rejects_nonfinite(const Options& options, std::int64_t n) {
  SCOPED_TRACE("n = " + std::to_string(n));
  const int P = world_size();
  const int me = world_rank();
  Runner runner(Algorithm::Dense, n, options);
  Runner fresh(Algorithm::Dense, n, options);
  const auto g1 = make_gradient(Dist::Uniform, 17, me, 0, n);
  runner.reduce(g1);
  fresh.reduce(g1);
  Exec exec;
  Vector out("test::out", static_cast<std::size_t>(n));
  const oktopk::ReduceStats stats_before = runner.handle().stats();
  {
    auto bad = g1;
    if (me == P - 1) bad[n / 2] = bad[n - 2] = std::numeric_limits<float>::quiet_NaN();
    const Vector g = to_device(bad);
    const std::string message = expect_invalid_argument(
        [&] { runner.handle().reduce(exec, g, out); }, "oktopk::SparseAllreduce::reduce");
    EXPECT_NE(message.find("NaN or Inf on rank " + std::to_string(P - 1)), std::string::npos)
        << message;
    // The rank to blame also says how many entries: both bad ones, wherever they lie.
    if (me == P - 1) EXPECT_NE(message.find("(2 entries)"), std::string::npos) << message;
    EXPECT_TRUE(same_text_on_all_ranks(message.substr(0, message.find(" ("))));
    EXPECT_EQ(runner.handle().stats().iteration, stats_before.iteration);
    EXPECT_EQ(runner.handle().stats().phases.size(), stats_before.phases.size());
  }
  {
    // +Inf on rank 0, -Inf on the last, at the last entry: their sum is NaN, the only bad
    // average, at the end of the last rank's chunk.
    auto bad = g1;
    if (me == 0) bad[n - 1] = kInf;
    if (me == P - 1) bad[n - 1] = -kInf;
    const Vector g = to_device(bad);
    expect_invalid_argument([&] { runner.handle().reduce(exec, g, out); },
                            "oktopk::SparseAllreduce::reduce");
  }
  if (P > 1) {
    // Finite everywhere, but 0.75 of the largest float on every rank sums past it.
    auto big = g1;
    big[n - 7] = 0.75f * std::numeric_limits<float>::max();
    const Vector g = to_device(big);
    const std::string message = expect_invalid_argument(
        [&] { runner.handle().reduce(exec, g, out); }, "oktopk::SparseAllreduce::reduce");
    EXPECT_NE(message.find("overflows"), std::string::npos) << message;
    EXPECT_TRUE(same_text_on_all_ranks(message));
  }
  const auto g2 = make_gradient(Dist::Uniform, 17, me, 1, n);
  const Call c = runner.reduce(g2);
  const Call f = fresh.reduce(g2);
  EXPECT_EQ(c.stats.iteration, 2);
  check_call(runner, c);
  Diff diff;
  for (std::size_t j = 0; j < c.out.size(); ++j) {
    if (bits_of(f.out[j]) != bits_of(c.out[j])) diff.note(j, f.out[j], c.out[j]);
  }
  EXPECT_EQ(diff.count, 0) << "after rejected calls vs a fresh handle: " << diff;
}

TEST(DenseRing, NonFiniteAverageThrowsOnEveryRankAndChangesNothing) {
  for (const std::int64_t n : {500, 40003}) expect_dense_rejects_nonfinite(ring_options(), n);
}

TEST(DenseMpi, NonFiniteAverageThrowsOnEveryRankAndChangesNothing) {
  for (const std::int64_t n : {500, 40003}) expect_dense_rejects_nonfinite(mpi_options(), n);
}

/// The point-to-point messages the dense allreduce of one call sent: the ring's (an
/// MPI_Allreduce sends none that the communicator sees).
std::int64_t ring_sends(std::int64_t n, const Options& options) {
  Runner runner(Algorithm::Dense, n, options);
  oktopk::Communicator log = runner.handle().communicator();  // shares the handle's counters
  log.set_message_log(true);
  const Call c = runner.reduce(make_gradient(Dist::Uniform, 23, world_rank(), 0, n));
  std::int64_t sends = 0;
  for (const auto& message : log.message_log()) {
    if (message.phase == "dense_allreduce" && std::string(message.operation) == "send") ++sends;
  }
  log.set_message_log(false);  // and forgets the log
  check_call(runner, c);
  return sends;
}

// The default (auto) runs the ring on the host where a rank's chunk holds at least
// dense_ring_min_chunk values, and MPI_Allreduce below; an explicit choice is kept.
TEST(DenseAuto, TakesTheRingForLargeChunksAndMpiBelow) {
  const int P = world_size();
  EXPECT_EQ(Options{}.dense_allreduce, oktopk::DenseAlgorithm::Auto);
  const std::int64_t large = P * oktopk::dense_ring_min_chunk;
  const std::int64_t small = P * oktopk::dense_ring_min_chunk - 1;
  const bool ring_expected = oktopk::impl::runs_on_host_v<Exec> && P > 1;
  EXPECT_EQ(ring_sends(large, Options{}) > 0, ring_expected)
      << "a chunk of dense_ring_min_chunk values";
  EXPECT_EQ(ring_sends(small, Options{}), 0) << "a chunk one value short of dense_ring_min_chunk";
  EXPECT_EQ(ring_sends(large, mpi_options()), 0);
  EXPECT_EQ(ring_sends(small, ring_options()) > 0, P > 1);
}

}  // namespace
