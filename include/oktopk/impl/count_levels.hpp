// SPDX-License-Identifier: BSD-3-Clause
// Several thresholds counted in one pass: Ok-Topk's guards raise a reused threshold by a fixed
// step until few enough entries pass, and counting every step's threshold at once replaces a
// pass (and, for the global threshold, an allreduce) per step with one.
#pragma once

#include <oktopk/impl/kokkos_compat.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace oktopk::impl {

/// At most this many thresholds are counted in one pass.
inline constexpr int max_count_levels = 8;

/// Thresholds counted together, in the order a guard visits them.
struct CountLevels {
  int count = 0;
  float threshold[max_count_levels] = {};
};

/// The thresholds a guard visits that starts at t and multiplies by step: t, t·step, ...,
/// rounded to float after every step as the guard rounds, min(levels, max_count_levels) of them.
inline CountLevels raised_levels(float t, double step, int levels) {
  CountLevels out;
  out.count = levels < max_count_levels ? (levels > 0 ? levels : 0) : max_count_levels;
  for (int j = 0; j < out.count; ++j) {
    out.threshold[j] = t;
    t = static_cast<float>(t * step);
  }
  return out;
}

/// counts[j] = entries of x[begin, end) with |x| > levels.threshold[j], for every level; the
/// thresholds must be at least the first one, as raised_levels() makes them. The first level
/// is one loop that vectorizes; the others look only at the groups of 16 entries that hold
/// one above the first, which at typical densities are few.
template <class XView>
KOKKOS_INLINE_FUNCTION void count_levels_in(const XView& x, const CountLevels& levels,
                                            std::int64_t begin, std::int64_t end,
                                            std::int64_t* counts) {
  if (levels.count == 0) return;
  const float first = levels.threshold[0];
  std::int64_t above = 0;
  for (std::int64_t i = begin; i < end; ++i) above += abs(x(i)) > first ? 1 : 0;
  counts[0] = above;
  for (int j = 1; j < levels.count; ++j) counts[j] = 0;
  if (above == 0 || levels.count == 1) return;
  constexpr std::int64_t group = 16;
  for (std::int64_t g = begin; g < end; g += group) {
    const std::int64_t g_end = g + group < end ? g + group : end;
    int hits = 0;
    for (std::int64_t i = g; i < g_end; ++i) hits += abs(x(i)) > first ? 1 : 0;
    if (hits == 0) continue;
    for (std::int64_t i = g; i < g_end; ++i) {
      const float magnitude = abs(x(i));
      for (int j = 1; j < levels.count; ++j) counts[j] += magnitude > levels.threshold[j] ? 1 : 0;
    }
  }
}

}  // namespace oktopk::impl
