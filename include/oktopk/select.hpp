// SPDX-License-Identifier: BSD-3-Clause
// Threshold selection: which entries of a gradient have |x| > t, counted or stream-compacted
// into (index, value) pairs, for the whole vector or split into P contiguous regions.
//
// Selection is strict (|x| > t, as the Ok-Topk reference does), so NaN is never selected and an
// entry equal to the threshold is not either, except where select_above_and_ties() is asked to
// take some of those. Output keeps the order of x: indices ascend. The kernels are in
// impl/kernels/select_kernels.hpp.
#pragma once

#include <oktopk/error.hpp>
#include <oktopk/fwd.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/kernels/count_levels.hpp>
#include <oktopk/impl/kernels/select_kernels.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

namespace oktopk {

/// \brief Number of entries with |x(i)| > threshold.
template <class ExecSpace, class XView>
std::int64_t count_above(const ExecSpace& exec, const XView& x, float threshold) {
  OKTOPK_STATIC_CHECK_VALUES(ExecSpace, XView, "oktopk::count_above: x");
  impl::ScopedRegion region("oktopk::count_above");
  const auto n = static_cast<std::int64_t>(x.extent(0));
  std::int64_t count = 0;
  if constexpr (impl::runs_on_host_v<ExecSpace>) {
    const std::int64_t chunk = impl::chunk_length_v<ExecSpace>;
    Kokkos::parallel_reduce("oktopk::count_above",
                            impl::RangeOf<ExecSpace>(exec, 0, impl::chunk_count<ExecSpace>(n)),
                            impl::CountAboveChunks<XView>{x, threshold, chunk}, count);
  } else {
    count = impl::count_above_strided(exec, x, threshold);
  }
  return count;
}

/// \brief Stream-compacts {i : |x(i)| > threshold} into (indices, values), in ascending order.
///
/// Returns the number of selected entries. Only the first min(count, capacity) are written,
/// capacity being the smaller extent of `indices` and `values`: a caller whose buffers were too
/// small sees count > capacity, grows them and calls again. On GPUs x is read once
/// (impl::compact_in_order()); on the host twice, a counting pass and the writing one.
template <class ExecSpace, class XView, class IdxView, class ValView>
std::int64_t select_above(const ExecSpace& exec, const XView& x, float threshold,
                          const IdxView& indices, const ValView& values) {
  OKTOPK_STATIC_CHECK_VALUES(ExecSpace, XView, "oktopk::select_above: x");
  OKTOPK_STATIC_CHECK_VIEW(ExecSpace, IdxView, index_type, "oktopk::select_above: indices");
  OKTOPK_STATIC_CHECK_VALUES(ExecSpace, ValView, "oktopk::select_above: values");
  OKTOPK_STATIC_CHECK_WRITABLE(IdxView, "oktopk::select_above: indices");
  OKTOPK_STATIC_CHECK_WRITABLE(ValView, "oktopk::select_above: values");
  impl::check_length("oktopk::select_above", x.extent(0));
  impl::ScopedRegion region("oktopk::select_above");

  const auto capacity = static_cast<std::int64_t>(
      indices.extent(0) < values.extent(0) ? indices.extent(0) : values.extent(0));
  const auto n = static_cast<std::int64_t>(x.extent(0));
  if constexpr (!impl::runs_on_host_v<ExecSpace>) {
    using Keep = impl::KeepAbove<ExecSpace, XView, IdxView, ValView, false>;
    return static_cast<std::int64_t>(impl::compact_in_order(
        exec, n,
        Keep{x, threshold, 0, indices, values, static_cast<impl::PackedCounts>(capacity)}));
  }
  std::int64_t count = 0;
  Kokkos::parallel_scan(
      "oktopk::select_above::compact",
      impl::RangeOf<ExecSpace>(exec, 0, impl::chunk_count<ExecSpace>(n)),
      impl::SelectAboveFunctor<XView, IdxView, ValView>{x, threshold, indices, values, capacity, n,
                                                        impl::chunk_length_v<ExecSpace>},
      count);
  return count;
}

/// \brief select_above() that also keeps the first `ties` entries (lowest indices) with
/// |x(i)| == threshold, all in ascending order: the k largest with ties broken by index, when
/// `threshold` is the (k+1)-th largest |x| and `ties` is k less the count above it.
///
/// Returns the number selected, min(ties, entries equal) more than select_above(); writes the
/// first min(count, capacity) as select_above() does. std::invalid_argument when ties < 0.
/// On GPUs one read of x, as select_above(); on the host one pass to count and one to write,
/// each over all of x: for calls where ties matter, which exact thresholds on coarse values
/// (sums of 16-bit values) make common.
template <class ExecSpace, class XView, class IdxView, class ValView>
std::int64_t select_above_and_ties(const ExecSpace& exec, const XView& x, float threshold,
                                   std::int64_t ties, const IdxView& indices,
                                   const ValView& values) {
  constexpr const char* where = "oktopk::select_above_and_ties";
  OKTOPK_STATIC_CHECK_VALUES(ExecSpace, XView, "oktopk::select_above_and_ties: x");
  OKTOPK_STATIC_CHECK_VIEW(ExecSpace, IdxView, index_type,
                           "oktopk::select_above_and_ties: indices");
  OKTOPK_STATIC_CHECK_VALUES(ExecSpace, ValView, "oktopk::select_above_and_ties: values");
  OKTOPK_STATIC_CHECK_WRITABLE(IdxView, "oktopk::select_above_and_ties: indices");
  OKTOPK_STATIC_CHECK_WRITABLE(ValView, "oktopk::select_above_and_ties: values");
  impl::check_length(where, x.extent(0));
  OKTOPK_REQUIRE(ties >= 0, std::invalid_argument, where, "ties must be at least 0, got " << ties);
  impl::ScopedRegion region(where);

  const auto capacity = static_cast<std::int64_t>(
      indices.extent(0) < values.extent(0) ? indices.extent(0) : values.extent(0));
  const auto n = static_cast<std::int64_t>(x.extent(0));
  if constexpr (!impl::runs_on_host_v<ExecSpace>) {
    using Keep = impl::KeepAbove<ExecSpace, XView, IdxView, ValView, true>;
    return impl::kept_with_ties(
        impl::compact_in_order(exec, n,
                               Keep{x, threshold, static_cast<impl::PackedCounts>(ties), indices,
                                    values, static_cast<impl::PackedCounts>(capacity)}),
        ties);
  }
  using Functor = impl::SelectAboveAndTiesFunctor<XView, IdxView, ValView>;
  impl::PackedCounts packed = 0;
  Kokkos::parallel_scan(
      "oktopk::select_above_and_ties::compact",
      impl::RangeOf<ExecSpace>(exec, 0, impl::chunk_count<ExecSpace>(n)),
      Functor{x, threshold, ties, indices, values, capacity, n, impl::chunk_length_v<ExecSpace>},
      packed);
  return impl::kept_with_ties(packed, ties);
}

/// \brief select_above() when each chunk's count of entries above the threshold is already
/// known: `chunk_counts` has chunk_count<ExecSpace>(n) entries, as impl::accumulate_counting()
/// stores them on host spaces (impl::count_above_by_chunk() on any) for the same x and
/// threshold. On the host, a scan over the counts and one pass over x, where select_above()
/// reads x twice (a counting scan pass, then the writing pass). On GPUs, where a chunk is one
/// entry, select_above() itself: its compaction already counts in the pass that marks the
/// entries, and scanning n counts would cost an n-entry View per call. Same results.
template <class ExecSpace, class XView, class CountView, class IdxView, class ValView>
std::int64_t select_above_counted(const ExecSpace& exec, const XView& x, float threshold,
                                  const CountView& chunk_counts, const IdxView& indices,
                                  const ValView& values) {
  constexpr const char* where = "oktopk::select_above_counted";
  OKTOPK_STATIC_CHECK_VALUES(ExecSpace, XView, "oktopk::select_above_counted: x");
  OKTOPK_STATIC_CHECK_VIEW(ExecSpace, IdxView, index_type, "oktopk::select_above_counted: indices");
  OKTOPK_STATIC_CHECK_VALUES(ExecSpace, ValView, "oktopk::select_above_counted: values");
  OKTOPK_STATIC_CHECK_WRITABLE(IdxView, "oktopk::select_above_counted: indices");
  OKTOPK_STATIC_CHECK_WRITABLE(ValView, "oktopk::select_above_counted: values");
  impl::check_length(where, x.extent(0));
  impl::ScopedRegion region("oktopk::select_above_counted");
  const auto n = static_cast<std::int64_t>(x.extent(0));
  const std::int64_t chunks = impl::chunk_count<ExecSpace>(n);
  OKTOPK_REQUIRE(
      static_cast<std::int64_t>(chunk_counts.extent(0)) == chunks, std::invalid_argument, where,
      "chunk_counts has " << chunk_counts.extent(0) << " entries for " << chunks << " chunks of x");
  if constexpr (!impl::runs_on_host_v<ExecSpace>) {
    return select_above(exec, x, threshold, indices, values);
  }
  const auto capacity = static_cast<std::int64_t>(
      indices.extent(0) < values.extent(0) ? indices.extent(0) : values.extent(0));
  const auto first_slot = impl::make_uninitialized<std::int64_t>(
      exec, "oktopk::select_above_counted::first_slot", static_cast<std::size_t>(chunks));
  using SlotView = std::remove_const_t<decltype(first_slot)>;
  std::int64_t count = 0;
  Kokkos::parallel_scan(
      "oktopk::select_above_counted::offsets", impl::RangeOf<ExecSpace>(exec, 0, chunks),
      impl::ChunkFirstSlots<CountView, SlotView>{chunk_counts, first_slot}, count);
  using Compact = impl::SelectAboveFunctor<XView, IdxView, ValView>;
  const Compact compact{
      x, threshold, indices, values, capacity, n, impl::chunk_length_v<ExecSpace>};
  Kokkos::parallel_for("oktopk::select_above_counted::compact",
                       impl::RangeOf<ExecSpace>(exec, 0, chunks),
                       impl::CompactFromSlots<Compact, SlotView>{compact, first_slot});
  return count;
}

/// \brief Threshold selection split into P contiguous regions, in one pass over x.
///
/// Region r is [offsets(r), offsets(r+1)); `region_offsets` has P+1 non-decreasing entries
/// from 0 to x.extent(0) (std::invalid_argument otherwise). Selected entries are written
/// grouped by region, in ascending order, with indices relative to their region's start;
/// `region_counts(r)` (P entries) receives how many region r holds, so region r's entries
/// start at the sum of the counts before it.
///
/// Returns the total count. When it exceeds the capacity, the contents of indices, values and
/// region_counts are unspecified: grow the buffers and call again.
///
/// `chunk_counts`, when not empty, holds x's counts above the threshold per chunk (see
/// select_above_counted()), and the selection then reads x once.
template <class ExecSpace, class XView, class OffsetView, class IdxView, class ValView,
          class CountView,
          class ChunkCountView = Kokkos::View<const count_type*, typename ExecSpace::memory_space>>
std::int64_t select_above_by_region(const ExecSpace& exec, const XView& x, float threshold,
                                    const OffsetView& region_offsets, const IdxView& indices,
                                    const ValView& values, const CountView& region_counts,
                                    const ChunkCountView& chunk_counts = ChunkCountView()) {
  constexpr const char* where = "oktopk::select_above_by_region";
  OKTOPK_STATIC_CHECK_VALUES(ExecSpace, XView, "oktopk::select_above_by_region: x");
  OKTOPK_STATIC_CHECK_VIEW(ExecSpace, OffsetView, count_type,
                           "oktopk::select_above_by_region: region_offsets");
  OKTOPK_STATIC_CHECK_VIEW(ExecSpace, IdxView, index_type,
                           "oktopk::select_above_by_region: indices");
  OKTOPK_STATIC_CHECK_VALUES(ExecSpace, ValView, "oktopk::select_above_by_region: values");
  OKTOPK_STATIC_CHECK_VIEW(ExecSpace, CountView, count_type,
                           "oktopk::select_above_by_region: region_counts");
  OKTOPK_STATIC_CHECK_WRITABLE(CountView, "oktopk::select_above_by_region: region_counts");
  impl::ScopedRegion region("oktopk::select_above_by_region");

  const auto n = static_cast<std::int64_t>(x.extent(0));
  const auto regions = static_cast<std::int64_t>(region_offsets.extent(0)) - 1;
  OKTOPK_REQUIRE(regions >= 1, std::invalid_argument, where,
                 "region_offsets needs at least 2 entries, got " << region_offsets.extent(0));
  OKTOPK_REQUIRE(
      static_cast<std::int64_t>(region_counts.extent(0)) >= regions, std::invalid_argument, where,
      "region_counts has " << region_counts.extent(0) << " entries for " << regions << " regions");
  std::int64_t bad_offsets = 0;
  Kokkos::parallel_reduce("oktopk::select_above_by_region::check_offsets",
                          impl::RangeOf<ExecSpace>(exec, 0, regions + 1),
                          impl::CountBadOffsets<OffsetView>{region_offsets, regions, n},
                          bad_offsets);
  OKTOPK_REQUIRE(bad_offsets == 0, std::invalid_argument, where,
                 "region_offsets must rise from 0 to the length of x (" << n << ")");

  const std::int64_t total =
      chunk_counts.extent(0) != 0
          ? select_above_counted(exec, x, threshold, chunk_counts, indices, values)
          : select_above(exec, x, threshold, indices, values);
  impl::split_by_region(exec, region_offsets, indices, values, total, region_counts);
  return total;
}

}  // namespace oktopk
