// SPDX-License-Identifier: BSD-3-Clause
// A call's output counted per segment of the handle's layout (ReduceStats::segments), from a
// dense output or from a sparse result: shared by the methods' driver and the hierarchical mode.
#pragma once

#include <oktopk/layout.hpp>
#include <oktopk/select.hpp>
#include <oktopk/stats.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/kernels/vector_ops.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <vector>

namespace oktopk::impl {

/// The non-zeros of `out` (n long, finite) in each segment of `layout`, in its order.
template <class ExecSpace, class Vector>
std::vector<SegmentStats> segment_nonzeros(const ExecSpace& exec, const Layout& layout,
                                           const Vector& out) {
  std::vector<SegmentStats> counts;
  counts.reserve(layout.segments().size());
  for (const Segment& segment : layout.segments()) {
    const auto range = Kokkos::make_pair(static_cast<std::size_t>(segment.offset),
                                         static_cast<std::size_t>(segment.offset + segment.length));
    // |x| > 0: the non-zeros (the output is finite: reduce rejects non-finite input).
    counts.push_back(
        SegmentStats{segment.name, count_above(exec, Kokkos::subview(out, range), 0.0f)});
  }
  return counts;
}

/// The entries of a sparse result (its indices ascending, all in [0, n)) in each segment of
/// `layout`, in its order.
template <class ExecSpace, class SparseResult>
std::vector<SegmentStats> segment_entries(const ExecSpace& exec, const Layout& layout,
                                          std::int64_t n, const SparseResult& result) {
  using memory_space = typename ExecSpace::memory_space;
  const std::vector<Segment>& segments = layout.segments();
  const auto count = static_cast<std::int64_t>(segments.size());
  Kokkos::View<std::int64_t*, Kokkos::HostSpace> host_bounds("oktopk::segment_bounds",
                                                             static_cast<std::size_t>(count + 1));
  for (std::int64_t s = 0; s < count; ++s) host_bounds(s) = segments[s].offset;
  host_bounds(count) = n;
  // Segments tile [0, n): entry positions of their starts in the sorted indices.
  const auto bounds = Kokkos::create_mirror_view_and_copy(memory_space(), host_bounds);
  count_below(exec, result.indices, result.size, bounds);
  Kokkos::deep_copy(exec, host_bounds, bounds);
  fence(exec, "oktopk::SparseAllreduce: segment entries");
  std::vector<SegmentStats> counts;
  counts.reserve(segments.size());
  for (std::int64_t s = 0; s < count; ++s) {
    counts.push_back(SegmentStats{segments[s].name, host_bounds(s + 1) - host_bounds(s)});
  }
  return counts;
}

}  // namespace oktopk::impl
