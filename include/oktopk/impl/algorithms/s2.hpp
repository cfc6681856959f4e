// SPDX-License-Identifier: BSD-3-Clause
// S2 Reducer (Ge et al., arXiv 2110.02140): each rank puts the non-zeros of its gradient into a
// count sketch of fixed size and marks the rows that hold them in a bitmap; both are allreduced,
// so the volume depends on neither P nor the number of non-zeros, and every rank decodes the
// summed sketch (median over sketch rows) on the union of the marked rows. With a Layout,
// only its SparseRows segments are sketched, and its Dense segments ride along in the same
// allreduce, averaged exactly.
#pragma once

#include <oktopk/layout.hpp>
#include <oktopk/impl/algorithms/method_base.hpp>
#include <oktopk/impl/base/hash.hpp>
#include <oktopk/impl/comm/mpi_mirror.hpp>

#include <Kokkos_Core.hpp>

#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace oktopk::impl {

/// The most sketch rows S2 accepts: the decode sorts an entry's r estimates in registers.
inline constexpr int s2_max_sketch_rows = 15;

/// \brief The shape of S2's data and its hash functions: a small value that kernels capture.
///
/// The gradient is read as `rows` rows of `row_width` entries (the last may be shorter). The
/// sketch has `sketch_rows` x `columns` cells, stored row-major in one flat View. For sketch row q,
/// entry x goes to column h_q(x) with sign s_q(x), both read off
///   h = splitmix64(key_q ^ splitmix64(x)),  key_q = splitmix64(splitmix64(seed) + q):
/// the high 32 bits pick the column (multiply-shift onto [0, columns)), the low bit the sign.
/// This random-function hash replaces the reference's polynomial hashes mod 2^61 - 1 drawn from a
/// seeded generator and tabulated for every position: it depends on the seed alone, so every
/// rank has the same functions (sketches then add linearly), and it needs no table.
/// A sketch at least as wide as the gradient uses h_q(x) = x (`exact`): every cell holds at most
/// one entry and the decode is exact. Wider than n would only add empty columns, so it is n wide.
struct S2Sketch {
  std::int64_t n = 0;
  std::int64_t row_width = 1;
  std::int64_t rows = 0;
  std::int64_t columns = 1;
  int sketch_rows = 1;
  bool exact = true;
  /// key_q for every sketch row, computed once rather than per entry.
  std::uint64_t row_keys[s2_max_sketch_rows] = {};

  /// Validates the S2 options for gradients of length n; throws std::invalid_argument
  /// ("<where>: s2_...") for values S2 cannot use.
  static S2Sketch make(const char* where, std::int64_t n, const Options& options) {
    options.validate();
    OKTOPK_REQUIRE(n >= 0 && n <= INT_MAX, std::invalid_argument, where,
                   "n must be in [0, 2^31 - 1], got " << n);
    // Options::validate bounds rows (1..s2_max_sketch_rows), width and columns.
    OKTOPK_ASSERT(options.s2_sketch_rows >= 1 && options.s2_sketch_rows <= s2_max_sketch_rows);
    S2Sketch s;
    s.n = n;
    s.row_width = options.s2_row_width;
    s.rows = n / s.row_width + (n % s.row_width != 0 ? 1 : 0);
    s.sketch_rows = options.s2_sketch_rows;
    std::int64_t wanted = options.s2_sketch_columns;
    if (wanted == 0) {
      wanted = static_cast<std::int64_t>(std::ceil(2.0 * options.density * static_cast<double>(n)));
    }
    if (wanted < 1) wanted = 1;
    s.exact = wanted >= n;
    s.columns = s.exact ? (n > 0 ? n : 1) : wanted;
    // The table is allreduced in one call, whose count is an int.
    OKTOPK_REQUIRE(s.cells() <= INT_MAX, std::invalid_argument, where,
                   "s2_sketch_rows x columns = " << s.sketch_rows << " x " << s.columns
                                                 << " cells exceed 2^31 - 1");
    const std::uint64_t seed_key = splitmix64(options.seed);
    for (int q = 0; q < s.sketch_rows; ++q) {
      s.row_keys[q] = splitmix64(seed_key + static_cast<std::uint64_t>(q));
    }
    return s;
  }

  std::int64_t cells() const { return sketch_rows * columns; }

  /// The part of the hash shared by every sketch row (computed once per entry).
  KOKKOS_INLINE_FUNCTION std::uint64_t mix(std::int64_t x) const {
    return splitmix64(static_cast<std::uint64_t>(x));
  }

  /// The flat cell of entry x (with mixed = mix(x)) in sketch row q, and its sign.
  KOKKOS_INLINE_FUNCTION std::int64_t cell(int q, std::int64_t x, std::uint64_t mixed,
                                           float& sign) const {
    const std::uint64_t h = splitmix64(row_keys[q] ^ mixed);
    sign = (h & 1u) != 0 ? 1.0f : -1.0f;
    // columns < n < 2^31 here, so the product fits in 64 bits.
    const std::int64_t column =
        exact ? x
              : static_cast<std::int64_t>(((h >> 32) * static_cast<std::uint64_t>(columns)) >> 32);
    return q * columns + column;
  }

  /// The count-sketch estimate of entry x: the median over sketch rows q of
  /// table(q, h_q(x))·s_q(x) (for even r, the mean of the two middle values).
  ///
  /// Every loop runs over the compile-time bound s2_max_sketch_rows, so the compiler unrolls it
  /// and every array index is a constant: the estimates stay in registers on GPUs (a sort with
  /// runtime indices would put them in local memory).
  template <class Table>
  KOKKOS_INLINE_FUNCTION float estimate(const Table& table, std::int64_t x) const {
    float e[s2_max_sketch_rows] = {};
    const std::uint64_t mixed = mix(x);
    for (int q = 0; q < s2_max_sketch_rows; ++q) {
      if (q < sketch_rows) {
        float sign = 1.0f;
        e[q] = table(cell(q, x, mixed, sign)) * sign;
      }
    }
    const int mid = sketch_rows / 2;
    if (sketch_rows % 2 == 1) return order_statistic(e, mid);
    const float low = order_statistic(e, mid - 1);
    return low + 0.5f * (order_statistic(e, mid) - low);  // exact when the two are equal
  }

  /// The value of rank `rank` (from 0, ascending) among e[0, sketch_rows): the entry with
  /// exactly `rank` entries before it, counting equal entries at lower positions as before.
  KOKKOS_INLINE_FUNCTION float order_statistic(const float (&e)[s2_max_sketch_rows],
                                               int rank) const {
    float result = 0.0f;
    for (int a = 0; a < s2_max_sketch_rows; ++a) {
      int before = 0;
      for (int b = 0; b < s2_max_sketch_rows; ++b) {
        before += (b < sketch_rows && (e[b] < e[a] || (e[b] == e[a] && b < a))) ? 1 : 0;
      }
      if (a < sketch_rows && before == rank) result = e[a];
    }
    return result;
  }
};

/// Per-handle sketch state (the reference shared one sketch object between all layers).
template <class ExecSpace>
struct S2Buffers {
  using memory_space = typename ExecSpace::memory_space;
  Kokkos::View<float*, memory_space> table;
  Kokkos::View<unsigned char*, memory_space> bitmap;

  S2Buffers(const ExecSpace& exec, const S2Sketch& sketch)
      : table(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "OkTopk::s2::table"),
              static_cast<std::size_t>(sketch.cells())),
        bitmap(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "OkTopk::s2::bitmap"),
               static_cast<std::size_t>(sketch.rows)) {}
};

/// Clears `table` and `bitmap`, then, for every non-zero x(i): table(q, h_q(i)) += s_q(i)·x(i)
/// and bitmap(row of i) = 1. Returns the non-zeros of x. One pass over x, one entry per work
/// item, so neighbouring GPU threads read neighbouring entries. Several entries of a row may
/// mark it at once; they all store the same byte.
template <class ExecSpace, class X, class Table, class Bitmap>
std::int64_t s2_sketch(const ExecSpace& exec, const S2Sketch& sketch, const X& x,
                       const Table& table, const Bitmap& bitmap) {
  const S2Sketch s = sketch;
  Kokkos::deep_copy(exec, table, 0.0f);
  Kokkos::deep_copy(exec, bitmap, static_cast<unsigned char>(0));
  std::int64_t nonzeros = 0;
  Kokkos::parallel_reduce(
      "OkTopk::s2::sketch", RangeOf<ExecSpace>(exec, 0, s.n),
      KOKKOS_LAMBDA(std::int64_t i, std::int64_t& count) {
        const float v = x(i);
        if (v == 0.0f) return;
        ++count;
        bitmap(i / s.row_width) = 1;
        const std::uint64_t mixed = s.mix(i);
        for (int q = 0; q < s.sketch_rows; ++q) {
          float sign = 1.0f;
          const std::int64_t c = s.cell(q, i, mixed, sign);
          Kokkos::atomic_add(&table(c), sign * v);
        }
      },
      nonzeros);
  return nonzeros;
}

/// x(i) -= estimate(table, i) for every non-zero x(i): with the rank's own sketch, what error
/// feedback keeps of what the sketch lost.
template <class ExecSpace, class Table, class X>
void s2_subtract_estimate(const ExecSpace& exec, const S2Sketch& sketch, const Table& table,
                          const X& x) {
  const S2Sketch s = sketch;
  Kokkos::parallel_for(
      "OkTopk::s2::subtract_own_estimate", RangeOf<ExecSpace>(exec, 0, s.n),
      KOKKOS_LAMBDA(std::int64_t i) {
        const float v = x(i);
        if (v != 0.0f) x(i) = v - s.estimate(table, i);
      });
}

/// out(i) = estimate(table, i) / divisor on the rows the bitmap marks, 0 elsewhere; returns the
/// number of entries in marked rows.
template <class ExecSpace, class Table, class Bitmap, class Out>
std::int64_t s2_decode(const ExecSpace& exec, const S2Sketch& sketch, const Table& table,
                       const Bitmap& bitmap, const Out& out, float divisor) {
  const S2Sketch s = sketch;
  std::int64_t covered = 0;
  Kokkos::parallel_reduce(
      "OkTopk::s2::decode", RangeOf<ExecSpace>(exec, 0, s.n),
      KOKKOS_LAMBDA(std::int64_t i, std::int64_t& count) {
        if (bitmap(i / s.row_width) != 0) {
          out(i) = s.estimate(table, i) / divisor;
          ++count;
        } else {
          out(i) = 0.0f;
        }
      },
      covered);
  return covered;
}

/// \brief Collective. S2's result computed another way, for tests and benchmark checks: the
/// dense mean of every rank's `acc` (MPI allreduce, then /P) is sketched once with the same hash
/// functions, and decoded on the union of every rank's non-zero rows, without a further /P. By
/// linearity of the sketch this equals S2Reducer's output (same n and options, before error
/// feedback changes acc) up to the order of float additions. Throws std::invalid_argument on
/// every rank if any rank's Views do not have length n, or for options S2 cannot use.
template <class ExecSpace>
void s2_oracle(const ExecSpace& exec, const Communicator& comm, std::int64_t n,
               const Options& options,
               const Kokkos::View<const float*, typename ExecSpace::memory_space>& acc,
               const Kokkos::View<float*, typename ExecSpace::memory_space>& out) {
  constexpr const char* where = "oktopk::impl::s2_oracle";
  const S2Sketch sketch = S2Sketch::make(where, n, options);
  ScopedRegion region("OkTopk::s2::oracle");
  int bad_rank = static_cast<std::int64_t>(acc.extent(0)) == n &&
                         static_cast<std::int64_t>(out.extent(0)) == n
                     ? 0
                     : comm.rank() + 1;
  comm.allreduce_in_place(&bad_rank, 1, MPI_MAX);
  OKTOPK_REQUIRE(bad_rank == 0, std::invalid_argument, where,
                 "acc and out must have length " << n << " on every rank; rank " << bad_rank - 1
                                                 << " passed other lengths");
  S2Buffers<ExecSpace> buffers(exec, sketch);
  s2_sketch(exec, sketch, acc, buffers.table, buffers.bitmap);  // for the rows it marks
  mpi_allreduce_in_place(exec, comm, buffers.bitmap, MPI_MAX);
  auto mean = make_uninitialized<float>(exec, "OkTopk::s2::oracle_mean", static_cast<std::size_t>(n));
  Kokkos::deep_copy(exec, mean, acc);
  mpi_allreduce_in_place(exec, comm, mean, MPI_SUM);
  divide(exec, mean, mean, static_cast<float>(comm.size()));
  auto mean_rows = make_uninitialized<unsigned char>(exec, "OkTopk::s2::oracle_mean_rows",
                                                    static_cast<std::size_t>(sketch.rows));
  s2_sketch(exec, sketch, mean, buffers.table, mean_rows);
  s2_decode(exec, sketch, buffers.table, buffers.bitmap, out, 1.0f);
  fence(exec, "OkTopk::s2::oracle");
}

/// \brief Where S2 finds each kind of entry of a fused buffer with a Layout, in device Views.
///
/// The SparseRows segments' entries are numbered consecutively in layout order (the keys the
/// sketch hashes: sparse entry e of segment s is buffer position offset(s) + e -
/// entry_begin(s)), and so are their rows (the bitmap's positions; each segment has its own
/// row width, its last row may be shorter). The Dense segments' entries are numbered likewise,
/// as they are packed after the bitmap. The begin Views have a sentinel at the end.
template <class MemorySpace>
struct S2SegmentMap {
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
  S2SegmentMap(const ExecSpace& exec, const Layout& layout) {
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
    sparse_offset = to_device(exec, "OkTopk::s2::sparse_offset", offset);
    sparse_width = to_device(exec, "OkTopk::s2::sparse_width", width);
    sparse_entry_begin = to_device(exec, "OkTopk::s2::sparse_entry_begin", entry_begin);
    sparse_row_begin = to_device(exec, "OkTopk::s2::sparse_row_begin", row_begin);
    dense_offset = to_device(exec, "OkTopk::s2::dense_offset", dense_offset_host);
    dense_entry_begin = to_device(exec, "OkTopk::s2::dense_entry_begin", dense_begin);
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
    const std::int64_t first = sparse_entry_begin(s) + (row - sparse_row_begin(s)) * sparse_width(s);
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
    fence(exec, "OkTopk::s2::segment_map");
    return view;
  }
};

/// \brief S2's buffers for a fused buffer with a Layout: everything one allreduce carries,
/// [sketch table | bitmap over the sparse rows (as floats, so one SUM adds it too: a row is in
/// the union where the sum is non-zero) | the Dense segments' entries], plus the compacted
/// union rows the decode works from.
template <class ExecSpace>
struct S2SegmentBuffers {
  using memory_space = typename ExecSpace::memory_space;
  Kokkos::View<float*, memory_space> fused;
  Kokkos::View<float*, memory_space> table;
  Kokkos::View<float*, memory_space> bitmap;
  Kokkos::View<float*, memory_space> dense;
  /// Union rows in ascending order, and the first decoded entry of each.
  Kokkos::View<std::int64_t*, memory_space> union_rows;
  Kokkos::View<std::int64_t*, memory_space> union_entry_begin;

  S2SegmentBuffers() = default;
  S2SegmentBuffers(const ExecSpace& exec, const S2Sketch& sketch,
                   const S2SegmentMap<memory_space>& map)
      : fused(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "OkTopk::s2::fused"),
              fused_length(sketch, map)),
        union_rows(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "OkTopk::s2::union_rows"),
                   static_cast<std::size_t>(map.sparse_rows)),
        union_entry_begin(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing,
                                             "OkTopk::s2::union_entry_begin"),
                          static_cast<std::size_t>(map.sparse_rows)) {
    const auto cells = static_cast<std::size_t>(sketch.cells());
    const auto rows = static_cast<std::size_t>(map.sparse_rows);
    table = Kokkos::subview(fused, Kokkos::make_pair(std::size_t{0}, cells));
    bitmap = Kokkos::subview(fused, Kokkos::make_pair(cells, cells + rows));
    dense = Kokkos::subview(fused, Kokkos::make_pair(cells + rows, fused.extent(0)));
  }

 private:
  static std::size_t fused_length(const S2Sketch& sketch, const S2SegmentMap<memory_space>& map) {
    const std::int64_t length = sketch.cells() + map.sparse_rows + map.dense_entries;
    // One allreduce carries it all, and MPI counts are ints.
    OKTOPK_REQUIRE(length <= INT_MAX, std::invalid_argument, "oktopk::make_sparse_allreduce",
                   "S2 with a layout allreduces sketch cells + sparse rows + dense entries = "
                       << sketch.cells() << " + " << map.sparse_rows << " + " << map.dense_entries
                       << " floats in one call, more than 2^31 - 1");
    return static_cast<std::size_t>(length);
  }
};

/// Clears `table` and `bitmap`, then, for every non-zero acc entry of a SparseRows segment
/// (sparse entry e): table(q, h_q(e)) += s_q(e)·value and bitmap(its row) = 1. Returns the
/// non-zeros. One work item per sparse entry, in buffer order within each segment.
template <class ExecSpace, class Map, class Acc, class Table, class Bitmap>
std::int64_t s2_sketch_segments(const ExecSpace& exec, const S2Sketch& sketch, const Map& map,
                                const Acc& acc, const Table& table, const Bitmap& bitmap) {
  const S2Sketch s = sketch;
  const Map m = map;
  Kokkos::deep_copy(exec, table, 0.0f);
  Kokkos::deep_copy(exec, bitmap, 0.0f);
  std::int64_t nonzeros = 0;
  Kokkos::parallel_reduce(
      "OkTopk::s2::sketch_segments", RangeOf<ExecSpace>(exec, 0, m.sparse_entries),
      KOKKOS_LAMBDA(std::int64_t e, std::int64_t& count) {
        std::int64_t row = 0;
        const float v = acc(m.sparse_position(e, row));
        if (v == 0.0f) return;
        ++count;
        bitmap(row) = 1.0f;
        const std::uint64_t mixed = s.mix(e);
        for (int q = 0; q < s.sketch_rows; ++q) {
          float sign = 1.0f;
          const std::int64_t c = s.cell(q, e, mixed, sign);
          Kokkos::atomic_add(&table(c), sign * v);
        }
      },
      nonzeros);
  return nonzeros;
}

/// acc -= estimate(table) on the non-zero sparse entries (error feedback, with this rank's
/// own sketch).
template <class ExecSpace, class Map, class Table, class Acc>
void s2_subtract_estimate_segments(const ExecSpace& exec, const S2Sketch& sketch, const Map& map,
                                   const Table& table, const Acc& acc) {
  const S2Sketch s = sketch;
  const Map m = map;
  Kokkos::parallel_for(
      "OkTopk::s2::subtract_own_estimate_segments", RangeOf<ExecSpace>(exec, 0, m.sparse_entries),
      KOKKOS_LAMBDA(std::int64_t e) {
        std::int64_t row = 0;
        const std::int64_t i = m.sparse_position(e, row);
        const float v = acc(i);
        if (v != 0.0f) acc(i) = v - s.estimate(table, e);
      });
}

/// dense(d) = acc(position of packed entry d); with `clear`, acc there becomes 0 (the entry is
/// sent exactly, so error feedback keeps nothing of it).
template <class ExecSpace, class Map, class Acc, class Dense>
void s2_pack_dense(const ExecSpace& exec, const Map& map, const Acc& acc, const Dense& dense,
                   bool clear) {
  const Map m = map;
  Kokkos::parallel_for(
      "OkTopk::s2::pack_dense", RangeOf<ExecSpace>(exec, 0, m.dense_entries),
      KOKKOS_LAMBDA(std::int64_t d) {
        const std::int64_t i = m.dense_position(d);
        dense(d) = acc(i);
        if (clear) acc(i) = 0.0f;
      });
}

/// out(position of packed entry d) = dense(d) / divisor.
template <class ExecSpace, class Map, class Dense, class Out>
void s2_unpack_dense(const ExecSpace& exec, const Map& map, const Dense& dense, const Out& out,
                     float divisor) {
  const Map m = map;
  Kokkos::parallel_for(
      "OkTopk::s2::unpack_dense", RangeOf<ExecSpace>(exec, 0, m.dense_entries),
      KOKKOS_LAMBDA(std::int64_t d) { out(m.dense_position(d)) = dense(d) / divisor; });
}

/// Decodes the SparseRows segments into `out`: estimate(table, e) / divisor on the rows the
/// summed bitmap marks, 0 on the others. The union rows are compacted first (one scan over
/// the rows), so the estimates, the costly part, run as one flat pass over the union rows'
/// entries only, neighbouring work items on neighbouring entries. Returns the entries decoded.
template <class ExecSpace, class Map, class Table, class Bitmap, class Out, class Rows>
std::int64_t s2_decode_segments(const ExecSpace& exec, const S2Sketch& sketch, const Map& map,
                                const Table& table, const Bitmap& bitmap, const Out& out,
                                float divisor, const Rows& union_rows,
                                const Rows& union_entry_begin) {
  const S2Sketch s = sketch;
  const Map m = map;
  const std::int64_t rows = m.sparse_rows;
  // The scan carries (entries so far) << 32 | (rows so far): both stay below 2^31, so one
  // 64-bit sum gives each union row its slot and its first decoded entry in one pass.
  constexpr std::int64_t row_unit = 1;
  constexpr int entry_shift = 32;
  std::int64_t totals = 0;
  Kokkos::parallel_scan(
      "OkTopk::s2::compact_union_rows", RangeOf<ExecSpace>(exec, 0, rows),
      KOKKOS_LAMBDA(std::int64_t row, std::int64_t& prefix, bool final) {
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
      "OkTopk::s2::clear_other_rows", RangeOf<ExecSpace>(exec, 0, m.sparse_entries),
      KOKKOS_LAMBDA(std::int64_t e) {
        std::int64_t row = 0;
        const std::int64_t i = m.sparse_position(e, row);
        if (bitmap(row) == 0.0f) out(i) = 0.0f;
      });
  Kokkos::parallel_for(
      "OkTopk::s2::decode_segments", RangeOf<ExecSpace>(exec, 0, decoded),
      KOKKOS_LAMBDA(std::int64_t u) {
        const std::int64_t slot = Map::find(union_entry_begin, union_count, u);
        std::int64_t entries = 0;
        const std::int64_t e = m.row_entries(union_rows(slot), entries) + u -
                               union_entry_begin(slot);
        std::int64_t row = 0;
        out(m.sparse_position(e, row)) = s.estimate(table, e) / divisor;
      });
  return decoded;
}

/// \brief S2 Reducer: count sketch + row bitmap, both allreduced.
///
/// Per call: bitmap of this rank's non-zero rows and a count sketch of its non-zeros ("sketch");
/// allreduce of the table (SUM, 4·r·c bytes) and of the bitmap (MAX, i.e. OR, one byte per row)
/// ("allreduce"); every rank decodes the median estimate / P on the union rows, 0 elsewhere
/// ("decode"). Differences from the reference code: the decoded result is written to the output,
/// the table is cleared every call, and each handle owns its sketch state.
///
/// Error feedback (s2_error_feedback, off by default as in the reference): before the
/// allreduce, each non-zero entry of acc loses the estimate this rank's own sketch gives it, so
/// the residual keeps what this rank's sketch got wrong about its own entries ("residual" phase);
/// the global estimate's errors from other ranks' entries are not attributed to anyone.
///
/// Stats: local_selected = this rank's non-zeros (every non-zero is sketched, so the thresholds
/// are 0: |x| > 0 selects); global_selected = entries in union rows, the decoded entries.
///
/// With a Layout (user guide, "Fused buffers: layouts"): only the SparseRows segments are
/// sketched, keyed by their entries numbered consecutively over those segments, with a bitmap
/// over their rows (each segment its own row width; s2_row_width is not used); the Dense
/// segments' entries are packed behind table and bitmap, and one allreduce (SUM, floats) of
/// [table | bitmap | dense] replaces the two; the decode computes estimates on the union rows
/// only, and the dense average goes straight to out. Default columns: ceil(2 * density * the
/// SparseRows entries). Error feedback keeps nothing of the Dense entries (they are sent
/// exactly). local_selected and global_selected then also count the Dense entries.
template <class ExecSpace>
class S2Reducer final : public MethodBase<ExecSpace> {
  using Base = MethodBase<ExecSpace>;
  using vector_type = typename Base::vector_type;

 public:
  S2Reducer(const ExecSpace& exec, const Communicator& comm, std::int64_t n,
            const Options& options, const Layout& layout = Layout())
      : S2Reducer(exec, comm, n, options, layout,
                  S2Sketch::make("oktopk::make_sparse_allreduce",
                                 layout.empty() ? n : layout.sparse_entries(), options)) {}

  const S2Sketch& sketch() const { return sketch_; }

 protected:
  bool uses_error_feedback() const override { return this->options_.s2_error_feedback; }

  void reduce_step(const ExecSpace& exec, const vector_type& acc, const vector_type& out) override {
    if (!this->layout_.empty()) {
      reduce_segments(exec, acc, out);
      return;
    }
    auto& stats = this->stats_;
    {
      auto timer = this->phase(exec, "sketch");
      stats.local_selected = s2_sketch(exec, sketch_, acc, buffers_.table, buffers_.bitmap);
    }
    if (uses_error_feedback()) {
      // Before the allreduce, while the table is still this rank's own sketch.
      auto timer = this->phase(exec, "residual");
      s2_subtract_estimate(exec, sketch_, buffers_.table, acc);
    }
    {
      auto timer = this->phase(exec, "allreduce");
      mpi_allreduce_in_place(exec, this->comm_, buffers_.table, MPI_SUM);
      mpi_allreduce_in_place(exec, this->comm_, buffers_.bitmap, MPI_MAX);
    }
    {
      auto timer = this->phase(exec, "decode");
      stats.global_selected = s2_decode(exec, sketch_, buffers_.table, buffers_.bitmap, out,
                                        static_cast<float>(this->comm_.size()));
    }
    stats.local_threshold = stats.global_threshold = 0.0f;
  }

 private:
  // Validates (in make) before the base allocates n-long buffers. Without a layout the
  // segment buffers stay empty, with one the whole-buffer ones hold a single cell.
  S2Reducer(const ExecSpace& exec, const Communicator& comm, std::int64_t n, const Options& options,
            const Layout& layout, const S2Sketch& sketch)
      : Base(exec, Algorithm::S2Reducer, comm, n, options, layout),
        sketch_(sketch),
        buffers_(exec, layout.empty() ? sketch : S2Sketch{}),
        map_(exec, layout),
        segment_buffers_(layout.empty() ? S2SegmentBuffers<ExecSpace>()
                                        : S2SegmentBuffers<ExecSpace>(exec, sketch, map_)) {}

  /// reduce_step for a handle with a layout: one allreduce of [table | bitmap | dense].
  void reduce_segments(const ExecSpace& exec, const vector_type& acc, const vector_type& out) {
    auto& stats = this->stats_;
    auto& b = segment_buffers_;
    const bool feedback = uses_error_feedback();
    {
      auto timer = this->phase(exec, "sketch");
      stats.local_selected = s2_sketch_segments(exec, sketch_, map_, acc, b.table, b.bitmap) +
                             map_.dense_entries;
    }
    if (feedback) {
      // Before the allreduce, while the table is still this rank's own sketch.
      auto timer = this->phase(exec, "residual");
      s2_subtract_estimate_segments(exec, sketch_, map_, b.table, acc);
    }
    {
      auto timer = this->phase(exec, "pack");
      s2_pack_dense(exec, map_, acc, b.dense, feedback);
    }
    const auto P = static_cast<float>(this->comm_.size());
    {
      auto timer = this->phase(exec, "allreduce");
      mpi_allreduce_in_place(exec, this->comm_, b.fused, MPI_SUM);
    }
    {
      auto timer = this->phase(exec, "decode");
      s2_unpack_dense(exec, map_, b.dense, out, P);
      stats.global_selected = s2_decode_segments(exec, sketch_, map_, b.table, b.bitmap, out, P,
                                                 b.union_rows, b.union_entry_begin) +
                              map_.dense_entries;
    }
    stats.local_threshold = stats.global_threshold = 0.0f;
  }

  S2Sketch sketch_;
  S2Buffers<ExecSpace> buffers_;
  S2SegmentMap<typename ExecSpace::memory_space> map_;
  S2SegmentBuffers<ExecSpace> segment_buffers_;
};

}  // namespace oktopk::impl
