// SPDX-License-Identifier: BSD-3-Clause
// Where each kind of entry of a fused buffer with a Layout lies, in device Views that kernels
// read: the SparseRows segments' entries and rows numbered consecutively over those segments,
// and the Dense segments' entries numbered likewise, as S2 packs them.
#pragma once

#include <oktopk/layout.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace oktopk::impl {

/// \brief Where S2 finds each kind of entry of a fused buffer with a Layout, in device Views.
///
/// The SparseRows segments' entries are numbered consecutively in layout order (the keys the
/// sketch hashes: sparse entry e of segment s is buffer position offset(s) + e -
/// entry_begin(s)), and so are their rows (the bitmap's positions; each segment has its own
/// row width, its last row may be shorter). The Dense segments' entries are numbered likewise,
/// as they are packed after the bitmap. The begin Views have a sentinel at the end.
template <class MemorySpace>
struct SegmentMap {
  using Positions = Kokkos::View<std::int64_t*, MemorySpace>;
  Positions sparse_offset;       // buffer position of each sparse segment
  Positions sparse_width;        // its row width
  Positions sparse_entry_begin;  // its first sparse entry number (+ sentinel)
  Positions sparse_row_begin;    // its first row number (+ sentinel)
  Positions dense_offset;        // buffer position of each dense segment
  Positions dense_entry_begin;   // its first packed number (+ sentinel)
  std::int64_t sparse_segments = 0;
  std::int64_t dense_segments = 0;
  std::int64_t sparse_entries = 0;
  std::int64_t sparse_rows = 0;
  std::int64_t dense_entries = 0;

  template <class ExecSpace>
  SegmentMap(const ExecSpace& exec, const Layout& layout) {
    std::vector<std::int64_t> offset, width, entry_begin{0}, row_begin{0}, dense_offset_host,
        dense_begin{0};
    for (const Segment& segment : layout.segments()) {
      if (segment.kind == SegmentKind::SparseRows) {
        offset.push_back(segment.offset);
        width.push_back(segment.row_width);
        entry_begin.push_back(entry_begin.back() + segment.length);
        row_begin.push_back(row_begin.back() + segment.rows());
      } else {
        dense_offset_host.push_back(segment.offset);
        dense_begin.push_back(dense_begin.back() + segment.length);
      }
    }
    sparse_segments = static_cast<std::int64_t>(offset.size());
    dense_segments = static_cast<std::int64_t>(dense_offset_host.size());
    sparse_entries = entry_begin.back();
    sparse_rows = row_begin.back();
    dense_entries = dense_begin.back();
    sparse_offset = to_device(exec, "oktopk::segment_map::sparse_offset", offset);
    sparse_width = to_device(exec, "oktopk::segment_map::sparse_width", width);
    sparse_entry_begin = to_device(exec, "oktopk::segment_map::sparse_entry_begin", entry_begin);
    sparse_row_begin = to_device(exec, "oktopk::segment_map::sparse_row_begin", row_begin);
    dense_offset = to_device(exec, "oktopk::segment_map::dense_offset", dense_offset_host);
    dense_entry_begin = to_device(exec, "oktopk::segment_map::dense_entry_begin", dense_begin);
  }

  /// The last s in [0, count) with begin(s) <= x, for begin(0) <= x < begin(count): the
  /// segment (or row) that holds x, skipping empty ones, which share their begin with the next.
  KOKKOS_INLINE_FUNCTION static std::int64_t find(const Positions& begin, std::int64_t count,
                                                  std::int64_t x) {
    std::int64_t low = 0;
    std::int64_t high = count;
    while (high - low > 1) {
      const std::int64_t mid = low + (high - low) / 2;
      if (begin(mid) <= x) {
        low = mid;
      } else {
        high = mid;
      }
    }
    return low;
  }

  /// The buffer position of sparse entry e, and its row number.
  KOKKOS_INLINE_FUNCTION std::int64_t sparse_position(std::int64_t e, std::int64_t& row) const {
    const std::int64_t s = find(sparse_entry_begin, sparse_segments, e);
    const std::int64_t local = e - sparse_entry_begin(s);
    row = sparse_row_begin(s) + local / sparse_width(s);
    return sparse_offset(s) + local;
  }

  /// The buffer position of packed dense entry d.
  KOKKOS_INLINE_FUNCTION std::int64_t dense_position(std::int64_t d) const {
    const std::int64_t s = find(dense_entry_begin, dense_segments, d);
    return dense_offset(s) + d - dense_entry_begin(s);
  }

  /// The first sparse entry number of row `row`, and its number of entries.
  KOKKOS_INLINE_FUNCTION std::int64_t row_entries(std::int64_t row, std::int64_t& count) const {
    const std::int64_t s = find(sparse_row_begin, sparse_segments, row);
    const std::int64_t first =
        sparse_entry_begin(s) + (row - sparse_row_begin(s)) * sparse_width(s);
    const std::int64_t segment_end = sparse_entry_begin(s + 1);
    count = segment_end - first < sparse_width(s) ? segment_end - first : sparse_width(s);
    return first;
  }

 private:
  template <class ExecSpace>
  static Positions to_device(const ExecSpace& exec, const char* label,
                             const std::vector<std::int64_t>& values) {
    Positions view(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, std::string(label)),
                   values.size());
    using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
    const Kokkos::View<const std::int64_t*, Kokkos::HostSpace, Unmanaged> host(values.data(),
                                                                               values.size());
    Kokkos::deep_copy(exec, view, host);
    // `values` is the caller's: the copy must finish before it goes.
    fence(exec, "oktopk::segment_map::segment_map");
    return view;
  }
};

}  // namespace oktopk::impl
