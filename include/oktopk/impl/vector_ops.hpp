// SPDX-License-Identifier: BSD-3-Clause
// Small kernels the collectives share: checked accumulation, averaging, and moves between
// dense and sparse forms. Internal: callers guarantee lengths and index ranges.
#pragma once

#include <oktopk/fwd.hpp>
#include <oktopk/impl/kokkos_compat.hpp>
#include <oktopk/impl/kokkos_ext.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace oktopk::impl {

template <class ExecSpace>
using RangeOf = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;

KOKKOS_INLINE_FUNCTION bool is_finite(float x) {
  return (float_to_bits(x) & 0x7f800000u) != 0x7f800000u;
}

/// What accumulate_counting() found in acc.
struct AccumulateCounts {
  std::int64_t nonfinite = 0;  ///< entries that are NaN or +-Inf
  std::int64_t above = 0;      ///< entries with |acc| > the threshold
};

/// \brief acc = residual + grad in one pass, counting the entries of acc that are not finite
/// and those with |acc| > threshold (none when threshold is NaN).
///
/// The pass goes by chunks of chunk_length_v entries (on the host a loop the compiler
/// vectorizes, on GPUs one entry per thread). When `chunk_counts` has one entry per chunk
/// (chunk_count<ExecSpace>(n)), each chunk's count above the threshold is stored there, so that
/// select_above_counted() compacts at that threshold in one pass instead of two.
template <class ExecSpace, class Residual, class Grad, class Acc, class ChunkCounts>
AccumulateCounts accumulate_counting(const ExecSpace& exec, const Residual& residual,
                                     const Grad& grad, const Acc& acc, float threshold,
                                     const ChunkCounts& chunk_counts) {
  const auto n = static_cast<std::int64_t>(grad.extent(0));
  const std::int64_t chunks = chunk_count<ExecSpace>(n);
  const std::int64_t chunk = chunk_length_v<ExecSpace>;
  const bool record = static_cast<std::int64_t>(chunk_counts.extent(0)) == chunks;
  // Both counts in one sum: above in the low 32 bits (it never reaches 2^31), non-finite above.
  std::int64_t packed = 0;
  Kokkos::parallel_reduce(
      "OkTopk::accumulate_counting", RangeOf<ExecSpace>(exec, 0, chunks),
      KOKKOS_LAMBDA(std::int64_t c, std::int64_t& sum) {
        const std::int64_t begin = c * chunk;
        const std::int64_t end = begin + chunk < n ? begin + chunk : n;
        std::int64_t above = 0;
        std::int64_t bad = 0;
        for (std::int64_t i = begin; i < end; ++i) {
          const float a = residual(i) + grad(i);
          acc(i) = a;
          above += abs(a) > threshold ? 1 : 0;
          bad += is_finite(a) ? 0 : 1;
        }
        if (record) chunk_counts(c) = above;
        sum += above + (bad << 32);
      },
      packed);
  AccumulateCounts counts;
  counts.nonfinite = packed >> 32;
  counts.above = packed & 0xffffffff;
  return counts;
}

/// How many entries have |x| > threshold, also stored per chunk in `chunk_counts` when it has
/// one entry per chunk (as accumulate_counting() does), for select_above_counted().
template <class ExecSpace, class X, class ChunkCounts>
std::int64_t count_above_by_chunk(const ExecSpace& exec, const X& x, float threshold,
                                  const ChunkCounts& chunk_counts) {
  const auto n = static_cast<std::int64_t>(x.extent(0));
  const std::int64_t chunks = chunk_count<ExecSpace>(n);
  const std::int64_t chunk = chunk_length_v<ExecSpace>;
  const bool record = static_cast<std::int64_t>(chunk_counts.extent(0)) == chunks;
  std::int64_t total = 0;
  Kokkos::parallel_reduce(
      "OkTopk::count_above_by_chunk", RangeOf<ExecSpace>(exec, 0, chunks),
      KOKKOS_LAMBDA(std::int64_t c, std::int64_t& sum) {
        const std::int64_t begin = c * chunk;
        const std::int64_t end = begin + chunk < n ? begin + chunk : n;
        std::int64_t above = 0;
        for (std::int64_t i = begin; i < end; ++i) above += abs(x(i)) > threshold ? 1 : 0;
        if (record) chunk_counts(c) = above;
        sum += above;
      },
      total);
  return total;
}

/// to = from, returning how many entries are not finite (one pass; from may be to).
template <class ExecSpace, class From, class To>
std::int64_t copy_counting_nonfinite(const ExecSpace& exec, const From& from, const To& to) {
  std::int64_t bad = 0;
  Kokkos::parallel_reduce(
      "OkTopk::copy_counting_nonfinite", RangeOf<ExecSpace>(exec, 0, from.extent(0)),
      KOKKOS_LAMBDA(std::int64_t i, std::int64_t& count) {
        const float x = from(i);
        to(i) = x;
        if (!is_finite(x)) ++count;
      },
      bad);
  return bad;
}

/// How many entries of x are not finite (one pass).
template <class ExecSpace, class X>
std::int64_t count_nonfinite(const ExecSpace& exec, const X& x) {
  std::int64_t bad = 0;
  Kokkos::parallel_reduce(
      "OkTopk::count_nonfinite", RangeOf<ExecSpace>(exec, 0, x.extent(0)),
      KOKKOS_LAMBDA(std::int64_t i, std::int64_t& count) {
        if (!is_finite(x(i))) ++count;
      },
      bad);
  return bad;
}

/// out = in / divisor as divide() does, returning how many results are not finite (one pass;
/// in may be out).
template <class ExecSpace, class In, class Out>
std::int64_t divide_counting_nonfinite(const ExecSpace& exec, const In& in, const Out& out,
                                       float divisor) {
  std::int64_t bad = 0;
  Kokkos::parallel_reduce(
      "OkTopk::divide_counting_nonfinite", RangeOf<ExecSpace>(exec, 0, out.extent(0)),
      KOKKOS_LAMBDA(std::int64_t i, std::int64_t& count) {
        const float average = in(i) / divisor;
        out(i) = average;
        if (!is_finite(average)) ++count;
      },
      bad);
  return bad;
}

/// out = in / divisor (a division, not a multiplication by 1/divisor, so that every method
/// rounds its average exactly like the dense reference).
template <class ExecSpace, class In, class Out>
void divide(const ExecSpace& exec, const In& in, const Out& out, float divisor) {
  Kokkos::parallel_for(
      "OkTopk::divide", RangeOf<ExecSpace>(exec, 0, out.extent(0)),
      KOKKOS_LAMBDA(std::int64_t i) { out(i) = in(i) / divisor; });
}

/// out(indices(j) + offset) = values(j) / divisor for j < count; indices must be distinct.
template <class ExecSpace, class Idx, class Val, class Out>
void scatter_divided(const ExecSpace& exec, const Idx& indices, const Val& values,
                     std::int64_t count, const Out& out, float divisor, std::int64_t offset = 0) {
  Kokkos::parallel_for(
      "OkTopk::scatter_divided", RangeOf<ExecSpace>(exec, 0, count),
      KOKKOS_LAMBDA(std::int64_t j) { out(indices(j) + offset) = values(j) / divisor; });
}

/// Compacts the pairs with |values(j)| > threshold (j < count) into the outputs, keeping their
/// order; returns how many there are, writing at most the outputs' capacity.
template <class ExecSpace, class Idx, class Val, class OutIdx, class OutVal>
std::int64_t select_pairs_above(const ExecSpace& exec, const Idx& indices, const Val& values,
                                std::int64_t count, float threshold, const OutIdx& out_indices,
                                const OutVal& out_values) {
  const auto capacity = static_cast<std::int64_t>(
      out_indices.extent(0) < out_values.extent(0) ? out_indices.extent(0) : out_values.extent(0));
  std::int64_t selected = 0;
  Kokkos::parallel_scan(
      "OkTopk::select_pairs_above", RangeOf<ExecSpace>(exec, 0, count),
      KOKKOS_LAMBDA(std::int64_t j, std::int64_t& slot, bool final) {
        const float v = values(j);
        if (abs(v) > threshold) {
          if (final && slot < capacity) {
            out_indices(slot) = indices(j);
            out_values(slot) = v;
          }
          ++slot;
        }
      },
      selected);
  return selected;
}

/// indices(j) += offset for j in [begin, end).
template <class ExecSpace, class Idx>
void add_offset(const ExecSpace& exec, const Idx& indices, std::int64_t begin, std::int64_t end,
                std::int64_t offset) {
  Kokkos::parallel_for(
      "OkTopk::add_offset", RangeOf<ExecSpace>(exec, begin, end),
      KOKKOS_LAMBDA(std::int64_t j) { indices(j) = static_cast<index_type>(indices(j) + offset); });
}

/// Grows a rank-1 View to hold at least `size` entries (contents are not kept), with 25%
/// headroom so that slowly growing counts do not reallocate every call. The allocation is
/// ordered on `exec`.
template <class ExecSpace, class View>
void ensure_capacity(const ExecSpace& exec, View& view, std::int64_t size) {
  if (static_cast<std::int64_t>(view.extent(0)) >= size) return;
  const auto grown = static_cast<std::size_t>(size + size / 4 + 16);
  view = View(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, view.label()), grown);
}

}  // namespace oktopk::impl
