// SPDX-License-Identifier: BSD-3-Clause
// Several thresholds counted in one pass: Ok-Topk's guards move a reused threshold by a fixed
// step until the number of entries passing it is in range, and counting every step's
// threshold at once replaces a pass (and, for the global threshold, an allreduce) per step
// with one.
#pragma once

#include <oktopk/error.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/kernels/read_rounds.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace oktopk::impl {

/// At most this many thresholds are counted in one pass.
inline constexpr int max_count_levels = 16;

/// Thresholds counted together, in rising order.
struct CountLevels {
  int count = 0;
  float threshold[max_count_levels] = {};
};

/// The thresholds a guard may visit from t with `step`: `down` of them lowered (t / step,
/// t / step², ...) and `up` starting at t (t, t·step, ...), each rounded to float after every
/// step as the guard rounds; rising order. At most max_count_levels: the lowered ones are
/// dropped first.
inline CountLevels guard_levels(float t, double step, int down, int up) {
  up = up < 0 ? 0 : (up < max_count_levels ? up : max_count_levels);
  down = down < 0 ? 0 : (down < max_count_levels - up ? down : max_count_levels - up);
  CountLevels out;
  out.count = down + up;
  float lowered = t;
  for (int j = down - 1; j >= 0; --j) {
    lowered = static_cast<float>(lowered / step);
    out.threshold[j] = lowered;
  }
  float raised = t;
  for (int j = down; j < out.count; ++j) {
    out.threshold[j] = raised;
    raised = static_cast<float>(raised * step);
  }
  return out;
}

/// counts[j] += 1 for every level whose threshold m exceeds. The levels rise, so the walk ends
/// at the first it does not: one comparison for the many entries below the lowest level.
KOKKOS_INLINE_FUNCTION void add_to_levels(float m, const CountLevels& levels,
                                          std::int64_t* counts) {
  for (int j = 0; j < levels.count && m > levels.threshold[j]; ++j) ++counts[j];
}

/// The init() and join() of the GPU counting passes, Kokkos reductions over an array of
/// `count` counts (value_type std::int64_t[], value_count set): on GPUs Kokkos keeps such an
/// array per thread in shared memory and merges it once per thread, where an array per entry
/// would sit in local memory and be cleared for every entry.
KOKKOS_INLINE_FUNCTION void clear_counts(std::int64_t* counts, unsigned count) {
  for (unsigned j = 0; j < count; ++j) counts[j] = 0;
}

KOKKOS_INLINE_FUNCTION void add_counts(OKTOPK_JOIN_QUALIFIER std::int64_t* into,
                                       const OKTOPK_JOIN_QUALIFIER std::int64_t* from,
                                       unsigned count) {
  for (unsigned j = 0; j < count; ++j) into[j] += from[j];
}

/// The GPU form of count_above_levels(): counts[j] = entries of x with |x| above level j, for
/// at least one level. Work item c of `items` (n / reads, rounded up) counts the entries
/// c + j items, j < reads, a round read before any is counted (read_in_rounds). Each entry is
/// compared with the first level before the level count is looked at: with no level, an entry
/// would not be needed, and nvcc moved a read past that test, out of the round.
template <class XView>
struct CountAboveLevels {
  using value_type = std::int64_t[];
  static constexpr int reads = reads_in_flight(sizeof(typename XView::non_const_value_type));
  unsigned value_count;
  XView x;
  CountLevels levels;
  std::int64_t items = 1;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t c, value_type counts) const {
    const auto n = static_cast<std::int64_t>(x.extent(0));
    read_in_rounds<reads>(
        0, n, c, items, [&](std::int64_t i) { return magnitude(x(i)); },
        [&](std::int64_t, float m) {
          if (m > levels.threshold[0]) {
            ++counts[0];
            for (int j = 1; j < levels.count && m > levels.threshold[j]; ++j) ++counts[j];
          }
        });
  }
  KOKKOS_INLINE_FUNCTION void init(value_type counts) const { clear_counts(counts, value_count); }
  KOKKOS_INLINE_FUNCTION void join(OKTOPK_JOIN_QUALIFIER value_type into,
                                   const OKTOPK_JOIN_QUALIFIER value_type from) const {
    add_counts(into, from, value_count);
  }
};

/// count_above_levels() in its GPU shape on any space (the tests run it on the host):
/// totals[j] = entries of x with |x| above level j, for at least one level.
template <class ExecSpace, class XView>
void count_above_levels_strided(const ExecSpace& exec, const XView& x, const CountLevels& levels,
                                std::int64_t* totals) {
  using Kernel = CountAboveLevels<XView>;
  OKTOPK_ASSERT(levels.count >= 1);
  const auto n = static_cast<std::int64_t>(x.extent(0));
  const std::int64_t items = (n + Kernel::reads - 1) / Kernel::reads;
  const auto count = static_cast<unsigned>(levels.count);
  Kokkos::parallel_reduce(
      "oktopk::count_above_levels", RangeOf<ExecSpace>(exec, 0, items),
      Kernel{count, x, levels, items},
      Kokkos::View<std::int64_t*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(totals, count));
}

/// counts[j] = entries of x[begin, end) with |x| > levels.threshold[j], for every level; the
/// thresholds must rise, as guard_levels() makes them. One level is one loop that vectorizes;
/// several go by groups of 16 entries, each counted at the first level in such a loop, and
/// only the entries above it, at typical densities few, at the others.
template <class XView>
KOKKOS_INLINE_FUNCTION void count_levels_in(const XView& x, const CountLevels& levels,
                                            std::int64_t begin, std::int64_t end,
                                            std::int64_t* counts) {
  for (int j = 0; j < levels.count; ++j) counts[j] = 0;
  if (levels.count == 0) return;
  const float first = levels.threshold[0];
  if (levels.count == 1) {
    for (std::int64_t i = begin; i < end; ++i) counts[0] += magnitude(x(i)) > first ? 1 : 0;
    return;
  }
  constexpr std::int64_t group = 16;
  for (std::int64_t g = begin; g < end; g += group) {
    const std::int64_t g_end = g + group < end ? g + group : end;
    int hits = 0;
    for (std::int64_t i = g; i < g_end; ++i) hits += magnitude(x(i)) > first ? 1 : 0;
    if (hits == 0) continue;
    counts[0] += hits;
    // The few entries above the first level, one by one: the levels rise, so an entry's
    // count stops at the first level it does not exceed.
    for (std::int64_t i = g; i < g_end; ++i) {
      const float m = magnitude(x(i));
      if (!(m > first)) continue;
      for (int j = 1; j < levels.count && m > levels.threshold[j]; ++j) ++counts[j];
    }
  }
}

}  // namespace oktopk::impl
