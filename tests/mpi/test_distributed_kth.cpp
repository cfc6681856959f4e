// SPDX-License-Identifier: BSD-3-Clause
// impl::distributed_topk_threshold (Ok-Topk's exact global threshold) against the threshold of
// the concatenated vectors on the host, for k from 0 past the total, with ties, zeros and
// infinities, vectors of different lengths per rank (one empty), the ties that complete k and
// each rank's share of them, and its digit schedule: the histograms' traffic shrinks with k as
// documented. Runs at several rank counts.
#include <oktopk/communicator.hpp>
#include <oktopk/topk.hpp>
#include <oktopk/impl/collectives/distributed_kth.hpp>

#include "mpi_test_utils.hpp"

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace {

using namespace oktopk::test;  // NOLINT(google-build-using-namespace)
using Exec = Kokkos::DefaultExecutionSpace;
using oktopk::impl::RadixSchedule;

constexpr float kInf = std::numeric_limits<float>::infinity();

/// Rank r's part: r = 1 has none; the others mix multiples of 1/8 (many ties), small and large
/// magnitudes of both signs, zeros, and on the last rank one -Inf.
std::vector<float> part_of(int rank, int ranks) {
  if (rank == 1) return {};
  const std::size_t length = 700 + 613 * static_cast<std::size_t>(rank);
  std::vector<float> x(length);
  std::uint64_t state = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(rank + 1);
  for (std::size_t i = 0; i < length; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const auto draw = static_cast<std::uint32_t>(state >> 33);
    switch (draw % 4) {
      case 0:
        x[i] = static_cast<float>(static_cast<int>(draw % 64) - 32) / 8.0f;
        break;
      case 1:
        x[i] = 0.0f;
        break;
      case 2:
        x[i] = std::ldexp(static_cast<float>(draw % 1000) + 1.0f, -static_cast<int>(draw % 40));
        break;
      default:
        x[i] = -std::ldexp(static_cast<float>(draw % 997) + 1.0f, static_cast<int>(draw % 20));
        break;
    }
  }
  if (rank == ranks - 1 && length > 3) x[3] = -kInf;
  return x;
}

/// The spec's exact threshold over all of x: the (k+1)-th largest |x|; +Inf for k <= 0, -Inf
/// for k >= the length.
float expected_threshold(std::vector<float> all, std::int64_t k) {
  const auto n = static_cast<std::int64_t>(all.size());
  if (k <= 0) return kInf;
  if (k >= n) return -kInf;
  for (float& v : all) v = std::fabs(v);
  std::nth_element(all.begin(), all.begin() + k, all.end(), std::greater<float>());
  return all[static_cast<std::size_t>(k)];
}

TEST(DistributedKth, MatchesTheThresholdOfTheConcatenation) {
  const int P = world_size();
  const int me = world_rank();
  std::vector<float> all;
  for (int r = 0; r < P; ++r) {
    const auto part = part_of(r, P);
    all.insert(all.end(), part.begin(), part.end());
  }
  const auto total = static_cast<std::int64_t>(all.size());
  const auto mine = part_of(me, P);
  Kokkos::View<float*, Exec::memory_space> x("x", mine.size());
  Kokkos::deep_copy(x, Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                           mine.data(), mine.size()));
  const Exec exec;
  const oktopk::Communicator comm;
  oktopk::KthLargestWorkspace<Exec> workspace(exec);
  // Both ends, small k (narrow digits), k past 2^16 of the total (widest digits) and ties.
  for (const std::int64_t k :
       {std::int64_t{-1}, std::int64_t{0}, std::int64_t{1}, std::int64_t{2}, std::int64_t{17},
        std::int64_t{600}, std::int64_t{1500}, total / 2, total - 1, total, total + 5}) {
    SCOPED_TRACE("k = " + std::to_string(k) + ", total = " + std::to_string(total));
    const oktopk::impl::DistributedThreshold got =
        oktopk::impl::distributed_topk_threshold(exec, comm, x, k, workspace);
    const float want = expected_threshold(all, k);
    EXPECT_EQ(bits_of(got.value), bits_of(want)) << got.value << " against " << want;
    // The ties that complete the k, over all ranks and on this one, counted on the host.
    const bool inside = k > 0 && k < total;
    const auto above =
        std::count_if(all.begin(), all.end(), [want](float v) { return std::fabs(v) > want; });
    const auto count_equal = [want](const std::vector<float>& v) {
      return static_cast<std::int64_t>(
          std::count_if(v.begin(), v.end(), [want](float e) { return std::fabs(e) == want; }));
    };
    EXPECT_EQ(got.ties_wanted, inside ? k - above : 0);
    EXPECT_EQ(got.ties_here, inside ? count_equal(mine) : 0);
    // Each rank's share: the first ties_wanted in rank order, none at a threshold of 0.
    std::int64_t before = 0;
    for (int r = 0; r < me; ++r) before += count_equal(part_of(r, P));
    const std::int64_t share =
        inside && want > 0.0f
            ? std::clamp<std::int64_t>(got.ties_wanted - before, 0, count_equal(mine))
            : 0;
    EXPECT_EQ(oktopk::impl::ties_to_select(comm, got), share);
  }
}

TEST(DistributedKth, TiesAtTheThresholdAreCountedAndSharedInRankOrder) {
  // Every rank holds 10 entries of 1.0, then 10 of -3.0: the k = 10P + 5 largest are all the
  // -3.0s and the first five 1.0s, on rank 0; k = 10P + 15 takes rank 0's ten and five of
  // rank 1's.
  const int P = world_size();
  const int me = world_rank();
  std::vector<float> mine(20, 1.0f);
  for (std::size_t i = 10; i < 20; ++i) mine[i] = -3.0f;
  Kokkos::View<float*, Exec::memory_space> x("x", mine.size());
  Kokkos::deep_copy(x, Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                           mine.data(), mine.size()));
  const Exec exec;
  const oktopk::Communicator comm;
  oktopk::KthLargestWorkspace<Exec> workspace(exec);
  for (const std::int64_t extra : {std::int64_t{5}, std::int64_t{15}}) {
    const std::int64_t k = 10 * P + extra;
    if (k >= 20 * P) continue;
    SCOPED_TRACE("k = " + std::to_string(k));
    const auto got = oktopk::impl::distributed_topk_threshold(exec, comm, x, k, workspace);
    EXPECT_EQ(got.value, 1.0f);
    EXPECT_EQ(got.ties_wanted, extra);
    EXPECT_EQ(got.ties_here, 10);
    const std::int64_t share = std::clamp<std::int64_t>(extra - 10 * me, 0, 10);
    EXPECT_EQ(oktopk::impl::ties_to_select(comm, got), share);
  }
}

TEST(DistributedKth, SchedulesCoverTheKeyWithSmallHistogramsForSmallK) {
  // The widest digits: 11 + 10 + 10 bits from the top.
  const RadixSchedule wide = RadixSchedule::of_width(11);
  ASSERT_EQ(wide.passes, 3);
  EXPECT_EQ(wide.bits[0], 11);
  EXPECT_EQ(wide.bits[1], 10);
  EXPECT_EQ(wide.bits[2], 10);
  EXPECT_EQ(wide.shift[0], 20);
  EXPECT_EQ(wide.shift[1], 10);
  EXPECT_EQ(wide.shift[2], 0);
  for (std::int64_t k = 1; k < (std::int64_t{1} << 22); k = k * 3 + 1) {
    const RadixSchedule s = oktopk::impl::distributed_radix_schedule(k);
    int covered = 0;
    for (int p = 0; p < s.passes; ++p) {
      covered += s.bits[p];
      EXPECT_EQ(s.shift[p], 31 - covered) << "k = " << k << ", pass " << p;
      EXPECT_LE(std::int64_t{1} << s.bits[p], std::max<std::int64_t>(16, k / 32)) << "k = " << k;
    }
    EXPECT_EQ(covered, 31) << "k = " << k;
    if (k >= 512) EXPECT_LE(s.total_bins(), k / 4) << "k = " << k;
    if (k >= 8192) EXPECT_LE(10 * s.total_bins(), 11 * k / 10) << "k = " << k;
  }
  EXPECT_EQ(oktopk::impl::distributed_radix_schedule(1 << 16).passes, 3);
  EXPECT_EQ(oktopk::impl::distributed_radix_schedule(2351).total_bins(), 64 + 5 * 32);
}

TEST(DistributedKth, TrafficIsOneAllreducePerDigitOfTheSchedule) {
  const int P = world_size();
  const std::vector<float> mine = part_of(world_rank(), P);
  Kokkos::View<float*, Exec::memory_space> x("x", mine.size());
  Kokkos::deep_copy(x, Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                           mine.data(), mine.size()));
  const Exec exec;
  oktopk::Communicator comm;
  oktopk::KthLargestWorkspace<Exec> workspace(exec);
  std::int64_t total = 0;
  for (int r = 0; r < P; ++r) total += static_cast<std::int64_t>(part_of(r, P).size());
  // Below the total, so that every digit is selected.
  for (const std::int64_t k : {std::int64_t{3}, total / 3, total - 1}) {
    const RadixSchedule s = oktopk::impl::distributed_radix_schedule(k);
    comm.reset_traffic();
    oktopk::impl::distributed_topk_threshold(exec, comm, x, k, workspace);
    const oktopk::PhaseTraffic t = comm.total_traffic();
    // The total length (one count), then one histogram of 32-bit counts per digit.
    const std::int64_t allreduces = 1 + s.passes;
    EXPECT_EQ(t.messages_sent, P > 1 ? allreduces * 2 * (P - 1) : 0) << "k = " << k;
    // A bandwidth-optimal allreduce of B bytes sends under 2B per rank.
    EXPECT_LE(t.bytes_sent, 2 * (8 + 4 * s.total_bins())) << "k = " << k;
    if (P > 1) EXPECT_GE(t.bytes_sent, 4 * s.total_bins() * (P - 1) / P) << "k = " << k;
  }
}

}  // namespace
