// SPDX-License-Identifier: BSD-3-Clause
// The exact k-th largest |x| over a vector distributed across ranks, without moving the data:
// radix select whose digit histograms are summed over ranks (one small allreduce per digit).
#pragma once

#include <oktopk/communicator.hpp>
#include <oktopk/topk.hpp>
#include <oktopk/impl/kernels/radix_select.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <limits>
#include <vector>

namespace oktopk::impl {

/// The digits of the distributed select for k: as few as can be with at most max(16, k/32)
/// bins in a histogram (and at most 2^11). The histograms then total at most 0.24 k counts
/// from k = 512 on and 0.11 k from k = 2^13 on; at k >= 2^16 they are three digits of 11, 10
/// and 10 bits (4096 counts). Each digit is one more pass over x and one more allreduce.
inline RadixSchedule distributed_radix_schedule(std::int64_t k) {
  const std::int64_t budget = k / 32 > 16 ? k / 32 : 16;
  int width = 4;
  while (width < radix_max_bits && (std::int64_t{1} << (width + 1)) <= budget) ++width;
  return RadixSchedule::of_width(width);
}

/// What distributed_topk_threshold() found: the threshold, and how many of the entries equal
/// to it would complete the k largest (the same on every rank) and how many this rank holds.
struct DistributedThreshold {
  float value = 0.0f;
  std::int64_t ties_wanted = 0;
  std::int64_t ties_here = 0;
};

/// \brief Collective. The threshold t for "the k largest |x| over all ranks' x", the (k+1)-th
/// largest: selecting |x| > t on every rank keeps k entries in all when no entry equals t, and
/// k - ties_wanted otherwise; +Inf for k <= 0, -Inf when k is at least the total length (no
/// ties wanted in either case). Every rank gets the same t and ties_wanted. No NaN may be
/// present.
///
/// Ok-Topk's reference gathers every non-zero of the reduced regions to every rank to find the
/// global threshold, a volume that grows with P·k. Here only digit histograms of 32-bit counts
/// travel, one allreduce per digit (distributed_radix_schedule): at most 2048 + 1024 + 1024
/// counts in three allreduces, and for small k narrower digits in more of them, so that the
/// histograms stay a small fraction of the k words the call is allowed to move. The digits
/// cover all 31 bits of a magnitude, so the last digit's bin counts the entries equal to t.
template <class ExecSpace, class XView>
DistributedThreshold distributed_topk_threshold(const ExecSpace& exec, const Communicator& comm,
                                                const XView& x, std::int64_t k,
                                                KthLargestWorkspace<ExecSpace>& workspace) {
  constexpr float infinity = std::numeric_limits<float>::infinity();
  std::int64_t total = static_cast<std::int64_t>(x.extent(0));
  comm.allreduce_in_place(&total, 1, MPI_SUM);
  if (k <= 0) return {infinity, 0, 0};
  if (k >= total) return {-infinity, 0, 0};
  std::int64_t remaining = k + 1;  // the (k+1)-th largest: strictly above it are at most k
  const RadixSchedule schedule = distributed_radix_schedule(k);
  std::uint32_t prefix = 0;
  std::int64_t here = 0;
  for (int pass = 0; pass < schedule.passes; ++pass) {
    radix_histogram(exec, x, schedule.digit(pass, prefix), workspace.histogram);
    const int bins = 1 << schedule.bits[pass];
    Kokkos::deep_copy(exec, workspace.histogram_host, workspace.histogram);
    fence(exec, "oktopk::distributed_topk_threshold: histogram to host");
    // Summed as 32-bit counts (halving the bytes): the total is n < 2^31.
    std::vector<std::int32_t> hist(bins);
    for (int b = 0; b < bins; ++b) hist[b] = static_cast<std::int32_t>(workspace.histogram_host(b));
    comm.allreduce_in_place(hist.data(), bins, MPI_SUM);
    int digit = bins - 1;
    while (hist[digit] < remaining) {
      remaining -= hist[digit];
      --digit;
      OKTOPK_ASSERT(digit >= 0);
    }
    prefix = (prefix << schedule.bits[pass]) | static_cast<std::uint32_t>(digit);
    here = static_cast<std::int64_t>(workspace.histogram_host(digit));
  }
  // k + 1 - remaining entries lie above t: the rest of the k are ties.
  return {bits_to_float(prefix), remaining - 1, here};
}

/// \brief Collective. How many of this rank's entries equal to `threshold.value` to select, so
/// that the ranks' selections together hold the k largest with ties broken by the lowest
/// rank, then the lowest index: the first ties_wanted of the ties counted in rank order. One
/// allgather of a count, made only when ties are wanted (the same on every rank) and the
/// threshold is above 0 (entries equal to 0 are worth nothing to select).
inline std::int64_t ties_to_select(const Communicator& comm,
                                   const DistributedThreshold& threshold) {
  if (threshold.ties_wanted <= 0 || !(threshold.value > 0.0f)) return 0;
  std::vector<std::int64_t> counts(static_cast<std::size_t>(comm.size()), 0);
  comm.allgather(&threshold.ties_here, 1, counts.data());
  std::int64_t before = 0;
  for (int r = 0; r < comm.rank(); ++r) before += counts[static_cast<std::size_t>(r)];
  const std::int64_t left = threshold.ties_wanted - before;
  return left <= 0 ? 0 : (left < threshold.ties_here ? left : threshold.ties_here);
}

}  // namespace oktopk::impl
