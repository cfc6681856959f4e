// SPDX-License-Identifier: BSD-3-Clause
// The count sketch's kernels over a fused buffer with a Layout (S2 with a layout): only the
// SparseRows segments are sketched, keyed by their entry numbers in the SegmentMap, and the
// Dense segments are packed for their average (exact on the native wire).
#pragma once

#include <oktopk/options.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/base/wire_rounding.hpp>
#include <oktopk/impl/kernels/count_sketch.hpp>
#include <oktopk/impl/kernels/segment_map.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace oktopk::impl {

/// The entries S2 sketches in a fused buffer: key e is the e-th entry of the SparseRows
/// segments, acc at its position, in the row the map gives.
template <class Map, class Acc>
struct SegmentSketchEntries {
  Map map;
  Acc acc;
  KOKKOS_INLINE_FUNCTION typename Acc::non_const_value_type operator()(std::int64_t e,
                                                                       std::int64_t& row) const {
    return acc(map.sparse_position(e, row));
  }
};

/// sketch_entries over the SparseRows segments (sparse entry e): clears `table` and `bitmap`,
/// then table(q, h_q(e)) += s_q(e)·value and bitmap(its row) = 1 for every non-zero. Returns
/// the non-zeros. One work item per sparse entry, in buffer order within each segment.
template <class ExecSpace, class Map, class Acc, class Table, class Fixed, class Bitmap>
std::int64_t sketch_segments(const ExecSpace& exec, const CountSketch& sketch, const Map& map,
                             const Acc& acc, const Table& table, const Fixed& fixed,
                             const Bitmap& bitmap) {
  return sketch_entries(exec, sketch, map.sparse_entries, SegmentSketchEntries<Map, Acc>{map, acc},
                        table, fixed, bitmap);
}

/// acc -= estimate(table) on the non-zero sparse entries (error feedback, with this rank's
/// own sketch).
template <class ExecSpace, class Map, class Table, class Acc>
void subtract_own_estimate_segments(const ExecSpace& exec, const CountSketch& sketch,
                                    const Map& map, const Table& table, const Acc& acc) {
  const CountSketch s = sketch;
  const Map m = map;
  Kokkos::parallel_for(
      "oktopk::count_sketch::subtract_own_estimate_segments",
      RangeOf<ExecSpace>(exec, 0, m.sparse_entries), KOKKOS_LAMBDA(std::int64_t e) {
        std::int64_t row = 0;
        const std::int64_t i = m.sparse_position(e, row);
        const auto v = acc(i);
        if (v != 0.0f) acc(i) = v - s.estimate(table, e);
      });
}

/// dense(d) = acc(position of packed entry d); with `feedback`, acc there keeps what `wire`
/// loses of it, acc - wire_rounded(acc): 0 on the native wire (the entry is sent exactly, so
/// error feedback keeps nothing of it), this rank's rounding error on a narrower one.
template <class ExecSpace, class Map, class Acc, class Dense>
void pack_dense_segments(const ExecSpace& exec, const Map& map, const Acc& acc, const Dense& dense,
                         bool feedback, Wire wire) {
  const Map m = map;
  Kokkos::parallel_for(
      "oktopk::count_sketch::pack_dense", RangeOf<ExecSpace>(exec, 0, m.dense_entries),
      KOKKOS_LAMBDA(std::int64_t d) {
        const std::int64_t i = m.dense_position(d);
        const auto v = acc(i);
        dense(d) = v;
        if (feedback) acc(i) = v - wire_rounded(v, wire);
      });
}

/// out(position of packed entry d) = dense(d) / divisor.
template <class ExecSpace, class Map, class Dense, class Out>
void unpack_dense_segments(const ExecSpace& exec, const Map& map, const Dense& dense,
                           const Out& out, float divisor) {
  using Stored = typename Out::non_const_value_type;
  const Map m = map;
  Kokkos::parallel_for(
      "oktopk::count_sketch::unpack_dense", RangeOf<ExecSpace>(exec, 0, m.dense_entries),
      KOKKOS_LAMBDA(std::int64_t d) {
        out(m.dense_position(d)) = value_cast<Stored>(dense(d) / divisor);
      });
}

/// Decodes the SparseRows segments into `out`: estimate(table, e) / divisor on the rows the
/// summed bitmap marks, 0 on the others. The union rows are compacted first (one scan over
/// the rows), so the estimates, the costly part, run as one flat pass over the union rows'
/// entries only, neighbouring work items on neighbouring entries. Returns the entries decoded.
template <class ExecSpace, class Map, class Table, class Bitmap, class Out, class Rows>
std::int64_t decode_segments(const ExecSpace& exec, const CountSketch& sketch, const Map& map,
                             const Table& table, const Bitmap& bitmap, const Out& out,
                             float divisor, const Rows& union_rows, const Rows& union_entry_begin) {
  using Stored = typename Out::non_const_value_type;
  const CountSketch s = sketch;
  const Map m = map;
  const std::int64_t rows = m.sparse_rows;
  // The scan carries (entries so far) << 32 | (rows so far): both stay below 2^31, so one
  // 64-bit sum gives each union row its slot and its first decoded entry in one pass.
  constexpr std::int64_t row_unit = 1;
  constexpr int entry_shift = 32;
  std::int64_t totals = 0;
  Kokkos::parallel_scan(
      "oktopk::count_sketch::compact_union_rows", RangeOf<ExecSpace>(exec, 0, rows),
      KOKKOS_LAMBDA(const std::int64_t row, std::int64_t& prefix, bool final) {
        if (bitmap(row) == 0.0f) return;
        std::int64_t entries = 0;
        m.row_entries(row, entries);
        if (final) {
          union_rows(prefix & 0xffffffff) = row;
          union_entry_begin(prefix & 0xffffffff) = prefix >> entry_shift;
        }
        prefix += row_unit + (entries << entry_shift);
      },
      totals);
  const std::int64_t union_count = totals & 0xffffffff;
  const std::int64_t decoded = totals >> entry_shift;
  // Rows outside the union: 0, whatever out held.
  Kokkos::parallel_for(
      "oktopk::count_sketch::clear_other_rows", RangeOf<ExecSpace>(exec, 0, m.sparse_entries),
      KOKKOS_LAMBDA(std::int64_t e) {
        std::int64_t row = 0;
        const std::int64_t i = m.sparse_position(e, row);
        if (bitmap(row) == 0.0f) out(i) = Stored{};
      });
  Kokkos::parallel_for(
      "oktopk::count_sketch::decode_segments", RangeOf<ExecSpace>(exec, 0, decoded),
      KOKKOS_LAMBDA(std::int64_t u) {
        const std::int64_t slot = Map::find(union_entry_begin, union_count, u);
        std::int64_t entries = 0;
        const std::int64_t e =
            m.row_entries(union_rows(slot), entries) + u - union_entry_begin(slot);
        std::int64_t row = 0;
        out(m.sparse_position(e, row)) = value_cast<Stored>(s.estimate(table, e) / divisor);
      });
  return decoded;
}

}  // namespace oktopk::impl
