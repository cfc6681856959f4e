// SPDX-License-Identifier: BSD-3-Clause
// The kernels of the threshold selections of oktopk/select.hpp: counting |x| > t per chunk,
// per level and per stride, the ordered compaction with ties, and the split by region.
#pragma once

#include <oktopk/error.hpp>
#include <oktopk/fwd.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/kernels/count_levels.hpp>
#include <oktopk/impl/kernels/ordered_compaction.hpp>
#include <oktopk/impl/kernels/read_rounds.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace oktopk::impl {

inline void check_length(const char* where, std::size_t n) {
  OKTOPK_REQUIRE(n <= static_cast<std::size_t>(std::numeric_limits<index_type>::max()),
                 std::invalid_argument, where,
                 "length " << n << " exceeds the 32-bit index range (at most 2^31-1 entries)");
}

/// Entries of x[begin, end) with |x| > t; a branch-free loop, so it vectorizes.
template <class XView>
KOKKOS_INLINE_FUNCTION int count_above_in(const XView& x, float t, std::int64_t begin,
                                          std::int64_t end) {
  int count = 0;
  for (std::int64_t i = begin; i < end; ++i) count += impl::magnitude(x(i)) > t ? 1 : 0;
  return count;
}

// The kernels of this file are named functors, not lambdas: a user's program and the library
// instantiate them with the same types, and nvcc's host-side lambda wrappers do not survive
// that (scripts/check-lambda-odr.py).

/// Adds the entries with |x| > t of chunk c (`chunk` entries, the last one shorter) to `sum`.
template <class XView>
struct CountAboveChunks {
  XView x;
  float t = 0.0f;
  std::int64_t chunk = 1;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t c, std::int64_t& sum) const {
    const auto n = static_cast<std::int64_t>(x.extent(0));
    const std::int64_t begin = c * chunk;
    sum += count_above_in(x, t, begin, begin + chunk < n ? begin + chunk : n);
  }
};

/// count_above's kernel on GPUs: work item c of `items` (n / reads, rounded up) counts the
/// entries c + j items, j < reads, reading them all before it counts (read_in_rounds): one entry
/// per item, each of a reduction's threads read one entry at a time.
template <class XView>
struct CountAboveStrided {
  static constexpr int reads = reads_in_flight(sizeof(typename XView::non_const_value_type));
  XView x;
  float t = 0.0f;
  std::int64_t items = 1;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t c, std::int64_t& sum) const {
    const auto n = static_cast<std::int64_t>(x.extent(0));
    int count = 0;
    read_in_rounds<reads>(
        0, n, c, items, [&](std::int64_t i) { return impl::magnitude(x(i)); },
        [&](std::int64_t, float m) { count += m > t ? 1 : 0; });
    sum += count;
  }
};

/// Entries of x with |x| > t in count_above's shape on GPUs (any space: the tests run it on the
/// host).
template <class ExecSpace, class XView>
std::int64_t count_above_strided(const ExecSpace& exec, const XView& x, float t) {
  using Kernel = CountAboveStrided<XView>;
  const auto n = static_cast<std::int64_t>(x.extent(0));
  const std::int64_t items = (n + Kernel::reads - 1) / Kernel::reads;
  std::int64_t count = 0;
  Kokkos::parallel_reduce("oktopk::count_above", RangeOf<ExecSpace>(exec, 0, items),
                          Kernel{x, t, items}, count);
  return count;
}

/// Stream compaction of {i : |x(i)| > t}, one chunk of `chunk` entries per work item. The
/// scan's exclusive prefix is the chunk's first output slot; entries past the capacity are
/// counted but not written. The first scan pass only counts (a loop that vectorizes); the
/// final pass tests groups of entries at once and walks one by one only through groups that
/// hold a selected entry, which at typical densities are few.
template <class XView, class IdxView, class ValView>
struct SelectAboveFunctor {
  static constexpr std::int64_t group = 16;
  XView x;
  float threshold;
  IdxView indices;
  ValView values;
  std::int64_t capacity;
  std::int64_t n;
  std::int64_t chunk;

  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t c, std::int64_t& slot, bool final) const {
    const std::int64_t begin = c * chunk;
    const std::int64_t end = begin + chunk < n ? begin + chunk : n;
    if (!final) {
      slot += count_above_in(x, threshold, begin, end);
      return;
    }
    for (std::int64_t g = begin; g < end; g += group) {
      const std::int64_t g_end = g + group < end ? g + group : end;
      if (count_above_in(x, threshold, g, g_end) == 0) continue;
      for (std::int64_t i = g; i < g_end; ++i) {
        const auto xi = x(i);
        if (impl::magnitude(xi) > threshold) {
          if (slot < capacity) {
            indices(slot) = static_cast<index_type>(i);
            values(slot) = impl::value_cast<typename ValView::non_const_value_type>(xi);
          }
          ++slot;
        }
      }
    }
  }
};

/// How many entries a selection with ties keeps, from its two counts packed as PackedCounts
/// (above t, equal to t): every one above and at most `ties` equal.
inline std::int64_t kept_with_ties(PackedCounts packed, std::int64_t ties) {
  const auto above = static_cast<std::int64_t>(packed & above_mask);
  const auto equal = static_cast<std::int64_t>(packed >> tied_shift);
  return above + (equal < ties ? equal : ties);
}

/// Stream compaction of {i : |x(i)| > t} and the first `ties` entries with |x(i)| == t, one
/// chunk per work item. A chunk's scan value holds two counts in one word, as compact_in_order's
/// do (PackedCounts: the entries above t in the low 31 bits, those equal to t from bit 31; each
/// is below 2^31, as n is): an entry's slot is then (above before it) + min(equal before it,
/// ties), which a plain sum scan gives. Entries past the capacity are counted but not written.
template <class XView, class IdxView, class ValView>
struct SelectAboveAndTiesFunctor {
  XView x;
  float threshold;
  std::int64_t ties;
  IdxView indices;
  ValView values;
  std::int64_t capacity;
  std::int64_t n;
  std::int64_t chunk;

  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t c, PackedCounts& packed, bool final) const {
    const std::int64_t begin = c * chunk;
    const std::int64_t end = begin + chunk < n ? begin + chunk : n;
    auto above = static_cast<std::int64_t>(packed & above_mask);
    auto equal = static_cast<std::int64_t>(packed >> tied_shift);
    for (std::int64_t i = begin; i < end; ++i) {
      const auto xi = x(i);
      const float m = impl::magnitude(xi);
      const bool is_above = m > threshold;
      const bool is_tie = m == threshold;
      if (final && (is_above || (is_tie && equal < ties))) {
        const std::int64_t slot = above + (equal < ties ? equal : ties);
        if (slot < capacity) {
          indices(slot) = static_cast<index_type>(i);
          values(slot) = impl::value_cast<typename ValView::non_const_value_type>(xi);
        }
      }
      above += is_above ? 1 : 0;
      equal += is_tie ? 1 : 0;
    }
    packed = (static_cast<PackedCounts>(equal) << tied_shift) | static_cast<PackedCounts>(above);
  }
};

/// per_chunk(j, c) = entries of chunk c with |x| > thresholds.threshold[j], for every level j.
template <class XView, class ChunkCounts>
struct CountChunkLevels {
  XView x;
  CountLevels thresholds;
  ChunkCounts per_chunk;
  std::int64_t chunk = 1;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t c) const {
    const auto n = static_cast<std::int64_t>(x.extent(0));
    const std::int64_t begin = c * chunk;
    const std::int64_t end = begin + chunk < n ? begin + chunk : n;
    std::int64_t counts[max_count_levels] = {};
    count_levels_in(x, thresholds, begin, end, counts);
    for (int j = 0; j < thresholds.count; ++j) per_chunk(j, c) = counts[j];
  }
};

/// totals[j] = entries with |x(i)| > levels.threshold[j], for every level, in one pass: on the
/// host each chunk is counted at every level while it is in cache; on GPUs in rounds of entries
/// spread over x, in a reduction over the array of counts (CountAboveLevels). On the host,
/// per_chunk (at least levels.count rows, chunk_count<ExecSpace>(n) columns) receives each
/// chunk's counts too, a row per level, for select_above_counted() at any of them; empty, the
/// counts are kept in a View of the call's own. On GPUs it is not used.
template <class ExecSpace, class XView, class ChunkCounts>
void count_above_levels(const ExecSpace& exec, const XView& x, const CountLevels& levels,
                        std::int64_t* totals, ChunkCounts per_chunk) {
  static_assert(ChunkCounts::rank == 2, "per_chunk: one row per level");
  for (int j = 0; j < levels.count; ++j) totals[j] = 0;
  if constexpr (runs_on_host_v<ExecSpace>) {
    const auto n = static_cast<std::int64_t>(x.extent(0));
    const std::int64_t chunks = chunk_count<ExecSpace>(n);
    const std::int64_t chunk = chunk_length_v<ExecSpace>;
    if (per_chunk.extent(0) == 0) {
      per_chunk =
          ChunkCounts(Kokkos::view_alloc(Kokkos::WithoutInitializing, "oktopk::count_above_levels"),
                      static_cast<std::size_t>(levels.count), static_cast<std::size_t>(chunks));
    }
    OKTOPK_ASSERT(static_cast<int>(per_chunk.extent(0)) >= levels.count &&
                  static_cast<std::int64_t>(per_chunk.extent(1)) == chunks);
    Kokkos::parallel_for("oktopk::count_above_levels", impl::RangeOf<ExecSpace>(exec, 0, chunks),
                         CountChunkLevels<XView, ChunkCounts>{x, levels, per_chunk, chunk});
    fence(exec, "oktopk::count_above_levels: counts to the host");
    for (int j = 0; j < levels.count; ++j) {
      for (std::int64_t c = 0; c < chunks; ++c) totals[j] += per_chunk(j, c);
    }
  } else {
    if (levels.count == 0) return;
    count_above_levels_strided(exec, x, levels, totals);
  }
}

/// count_above_levels() with the counts per chunk kept in a View of the call's own.
template <class ExecSpace, class XView>
void count_above_levels(const ExecSpace& exec, const XView& x, const CountLevels& levels,
                        std::int64_t* totals) {
  count_above_levels(
      exec, x, levels, totals,
      Kokkos::View<count_type**, Kokkos::LayoutRight, typename ExecSpace::memory_space>());
}

/// first_slot(c) = the sum of counts before chunk c (an exclusive scan).
template <class CountView, class SlotView>
struct ChunkFirstSlots {
  CountView counts;
  SlotView first_slot;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t c, std::int64_t& slot,
                                         const bool final) const {
    if (final) first_slot(c) = slot;
    slot += counts(c);
  }
};

/// Writes chunk c's selected entries from its first slot on.
template <class Compact, class SlotView>
struct CompactFromSlots {
  Compact compact;
  SlotView first_slot;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t c) const {
    std::int64_t slot = first_slot(c);
    compact(c, slot, true);
  }
};

/// region_counts(r) = how many of the `total` ascending indices lie in region r.
template <class OffsetView, class IdxView, class CountView>
struct CountRegionEntries {
  OffsetView region_offsets;
  IdxView indices;
  CountView region_counts;
  std::int64_t total = 0;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t r) const {
    const auto begin = lower_bound(indices, total, region_offsets(r));
    const auto end = lower_bound(indices, total, region_offsets(r + 1));
    region_counts(r) = end - begin;
  }
};

/// indices(j) becomes relative to the start of its region.
template <class OffsetView, class IdxView>
struct MakeRegionRelative {
  OffsetView region_offsets;
  IdxView indices;
  std::int64_t regions = 0;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t j) const {
    const index_type global = indices(j);
    // Last region starting at or before `global`; empty regions share their start with the
    // next one, and upper_bound skips past them.
    const auto r = upper_bound(region_offsets, regions + 1, global) - 1;
    indices(j) = static_cast<index_type>(global - region_offsets(r));
  }
};

/// Counts the r where region_offsets breaks its rules: offsets(0) = 0, offsets(regions) = n,
/// non-decreasing.
template <class OffsetView>
struct CountBadOffsets {
  OffsetView region_offsets;
  std::int64_t regions = 0;
  std::int64_t n = 0;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t r, std::int64_t& bad) const {
    const bool ends_ok =
        (r != 0 || region_offsets(0) == 0) && (r != regions || region_offsets(regions) == n);
    const bool ordered = r == 0 || region_offsets(r - 1) <= region_offsets(r);
    if (!ends_ok || !ordered) ++bad;
  }
};

/// The region split of select_above_by_region(), after the compaction: region_counts(r)
/// receives how many of the `total` ascending indices lie in region r, and each index becomes
/// relative to its region's start. Nothing when total exceeds the outputs' capacity.
template <class ExecSpace, class OffsetView, class IdxView, class ValView, class CountView>
void split_by_region(const ExecSpace& exec, const OffsetView& region_offsets,
                     const IdxView& indices, const ValView& values, std::int64_t total,
                     const CountView& region_counts) {
  const auto regions = static_cast<std::int64_t>(region_offsets.extent(0)) - 1;
  const auto capacity = static_cast<std::int64_t>(
      indices.extent(0) < values.extent(0) ? indices.extent(0) : values.extent(0));
  if (total > capacity) return;

  // The compacted indices ascend, so each region's entries are one contiguous run: its start is
  // a binary search for the region's first index. This touches only the selected entries.
  Kokkos::parallel_for("oktopk::select_above_by_region::count",
                       impl::RangeOf<ExecSpace>(exec, 0, regions),
                       CountRegionEntries<OffsetView, IdxView, CountView>{region_offsets, indices,
                                                                          region_counts, total});
  Kokkos::parallel_for("oktopk::select_above_by_region::relative_indices",
                       impl::RangeOf<ExecSpace>(exec, 0, total),
                       MakeRegionRelative<OffsetView, IdxView>{region_offsets, indices, regions});
}

}  // namespace oktopk::impl
