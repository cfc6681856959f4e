// SPDX-License-Identifier: BSD-3-Clause
// The count sketch S2 Reducer (Ge et al., arXiv 2110.02140) communicates: each entry is added,
// with a random sign, to one cell per sketch row, and read back as the median over rows; the
// sketch is linear, so sketches of several ranks add up to the sketch of their sum. Kernels
// only: what S2 sends, and when, is impl/algorithms/s2.hpp.
#pragma once

#include <oktopk/error.hpp>
#include <oktopk/options.hpp>
#include <oktopk/impl/base/hash.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>

#include <Kokkos_Core.hpp>

#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace oktopk::impl {

/// The most sketch rows S2 accepts: the decode sorts an entry's r estimates in registers.
inline constexpr int max_sketch_rows = 15;

/// \brief The shape of a count sketch and its hash functions: a small value that kernels
/// capture.
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
struct CountSketch {
  std::int64_t n = 0;
  std::int64_t row_width = 1;
  std::int64_t rows = 0;
  std::int64_t columns = 1;
  int sketch_rows = 1;
  bool exact = true;
  /// key_q for every sketch row, computed once rather than per entry.
  std::uint64_t row_keys[max_sketch_rows] = {};

  /// Validates the S2 options for gradients of length n; throws std::invalid_argument
  /// ("<where>: s2_...") for values S2 cannot use.
  static CountSketch make(const char* where, std::int64_t n, const Options& options) {
    options.validate();
    std::int64_t wanted = options.s2_sketch_columns;
    if (wanted == 0) {
      wanted = static_cast<std::int64_t>(std::ceil(2.0 * options.density * static_cast<double>(n)));
    }
    return with_shape(where, n, options.s2_row_width, options.s2_sketch_rows, wanted, options.seed);
  }

  /// The sketch of n keys read as rows of row_width, with sketch_rows rows of `wanted` columns
  /// (at least 1; n wide and exact when wanted >= n), hashed from `seed`. Options::validate
  /// has bounded the shape when it comes from make; throws std::invalid_argument ("<where>:
  /// ...") for an n or a cell count past 2^31 - 1.
  static CountSketch with_shape(const char* where, std::int64_t n, std::int64_t row_width,
                                int sketch_rows, std::int64_t wanted, std::uint64_t seed) {
    OKTOPK_REQUIRE(n >= 0 && n <= INT_MAX, std::invalid_argument, where,
                   "n must be in [0, 2^31 - 1], got " << n);
    OKTOPK_ASSERT(sketch_rows >= 1 && sketch_rows <= max_sketch_rows && row_width >= 1);
    CountSketch s;
    s.n = n;
    s.row_width = row_width;
    s.rows = n / s.row_width + (n % s.row_width != 0 ? 1 : 0);
    s.sketch_rows = sketch_rows;
    if (wanted < 1) wanted = 1;
    s.exact = wanted >= n;
    s.columns = s.exact ? (n > 0 ? n : 1) : wanted;
    // The table is allreduced in one call, whose count is an int.
    OKTOPK_REQUIRE(s.cells() <= INT_MAX, std::invalid_argument, where,
                   "s2_sketch_rows x columns = " << s.sketch_rows << " x " << s.columns
                                                 << " cells exceed 2^31 - 1");
    const std::uint64_t seed_key = splitmix64(seed);
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

  /// visit(q, cell, sign) for entry `key`'s cell in every sketch row q.
  template <class Visit>
  KOKKOS_INLINE_FUNCTION void for_each_cell(std::int64_t key, const Visit& visit) const {
    const std::uint64_t mixed = mix(key);
    for (int q = 0; q < sketch_rows; ++q) {
      float sign = 1.0f;
      const std::int64_t c = cell(q, key, mixed, sign);
      visit(q, c, sign);
    }
  }

  /// The count-sketch estimate of entry x: the median over sketch rows q of
  /// table(q, h_q(x))·s_q(x) (for even r, the mean of the two middle values).
  ///
  /// Every loop runs over the compile-time bound max_sketch_rows, so the compiler unrolls it
  /// and every array index is a constant: the estimates stay in registers on GPUs (a sort with
  /// runtime indices would put them in local memory). Of the table's value type.
  template <class Table>
  KOKKOS_INLINE_FUNCTION typename Table::non_const_value_type estimate(const Table& table,
                                                                       std::int64_t x) const {
    using Real = typename Table::non_const_value_type;
    Real e[max_sketch_rows] = {};
    const std::uint64_t mixed = mix(x);
    for (int q = 0; q < max_sketch_rows; ++q) {
      if (q < sketch_rows) {
        float sign = 1.0f;
        e[q] = table(cell(q, x, mixed, sign)) * sign;
      }
    }
    const int mid = sketch_rows / 2;
    if (sketch_rows % 2 == 1) return order_statistic(e, mid);
    const Real low = order_statistic(e, mid - 1);
    return low + Real(0.5) * (order_statistic(e, mid) - low);  // exact when the two are equal
  }

  /// The value of rank `rank` (from 0, ascending) among e[0, sketch_rows): the entry with
  /// exactly `rank` entries before it, counting equal entries at lower positions as before.
  template <class Real>
  KOKKOS_INLINE_FUNCTION Real order_statistic(const Real (&e)[max_sketch_rows], int rank) const {
    Real result = 0;
    for (int a = 0; a < max_sketch_rows; ++a) {
      int before = 0;
      for (int b = 0; b < max_sketch_rows; ++b) {
        before += (b < sketch_rows && (e[b] < e[a] || (e[b] == e[a] && b < a))) ? 1 : 0;
      }
      if (a < sketch_rows && before == rank) result = e[a];
    }
    return result;
  }
};

/// \brief The fixed-point grid one rank's sketch sums on, so that a cell is the same bits
/// whatever order its entries are added in (any thread count, any GPU schedule): integer
/// additions associate, float atomics do not. Values are rounded to multiples of a power-of-two
/// step, `step` = 2^-e, chosen per call as the finest step at which `terms` values of magnitude
/// at most `largest` sum to less than 2^62 in magnitude, so no int64 cell overflows. A value's
/// rounding error is at most step / 2 <= largest · terms · 2^-61; with error feedback the
/// residual keeps it.
struct FixedPointGrid {
  double to_fixed = 1.0;
  double step = 1.0;

  /// largest > 0 and finite, terms >= 1. The exponent is kept within [-1000, 1000], so both
  /// factors are normal doubles (values below 2^-1001 round to 0).
  static FixedPointGrid make(double largest, std::int64_t terms) {
    OKTOPK_ASSERT(largest > 0 && std::isfinite(largest) && terms >= 1);
    int largest_exponent = 0;  // largest < 2^largest_exponent
    std::frexp(largest, &largest_exponent);
    int terms_exponent = 0;  // terms <= 2^terms_exponent
    while ((std::int64_t{1} << terms_exponent) < terms) ++terms_exponent;
    int e = 62 - largest_exponent - terms_exponent;
    e = e > 1000 ? 1000 : (e < -1000 ? -1000 : e);
    FixedPointGrid grid;
    grid.to_fixed = std::ldexp(1.0, e);
    grid.step = std::ldexp(1.0, -e);
    return grid;
  }

  /// v on the grid, rounded to nearest (ties away from zero), in units of `step`.
  KOKKOS_INLINE_FUNCTION std::int64_t to_units(double v) const {
    const double scaled = v * to_fixed;
    return static_cast<std::int64_t>(scaled < 0 ? scaled - 0.5 : scaled + 0.5);
  }
};

/// The entries a sketch reads from a dense vector x: key i is x(i), in row i / row_width.
template <class X>
struct DenseSketchEntries {
  X x;
  std::int64_t row_width = 1;
  KOKKOS_INLINE_FUNCTION typename X::non_const_value_type operator()(std::int64_t i,
                                                                     std::int64_t& row) const {
    row = i / row_width;
    return x(i);
  }
};

// The kernels of this file are named functors, not lambdas: the library and the tests' oracle
// (impl::s2_oracle) instantiate them with the same types, and nvcc's host-side lambda wrappers
// do not survive that (scripts/check-lambda-odr.py; the S2 suite crashed on a GPU through one).

/// Marks the row of every non-zero entry in `bitmap` and finds the largest |value|.
template <class Entries, class Bitmap, class Real>
struct MarkRowsAndLargest {
  Entries entries;
  Bitmap bitmap;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t e, Real& most) const {
    using Mark = typename Bitmap::non_const_value_type;
    std::int64_t row = 0;
    const Real v = entries(e, row);
    if (v == Real(0)) return;
    bitmap(row) = Mark(1);
    const Real a = v < Real(0) ? -v : v;
    if (a > most) most = a;
  }
};

/// Adds each non-zero entry to its cells and counts the non-zeros: stored in its own cell of
/// `table` in an exact sketch, else added on `grid` into `fixed` with integer atomics.
template <class Entries, class Table, class Fixed>
struct AddToCells {
  CountSketch sketch;
  Entries entries;
  Table table;
  Fixed fixed;
  FixedPointGrid grid;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t e, std::int64_t& count) const {
    using Real = typename Table::non_const_value_type;
    std::int64_t row = 0;
    const Real v = entries(e, row);
    if (v == Real(0)) return;
    ++count;
    if (sketch.exact) {
      // h_q(e) = e: no two entries share a cell.
      sketch.for_each_cell(e, [&](int, std::int64_t c, float sign) { table(c) = sign * v; });
      return;
    }
    const std::int64_t units = grid.to_units(static_cast<double>(v));
    sketch.for_each_cell(e, [&](int, std::int64_t c, float sign) {
      Kokkos::atomic_add(&fixed(c), sign < 0.0f ? -units : units);
    });
  }
};

/// table(c) = fixed(c) · step, through double, in the table's type.
template <class Table, class Fixed>
struct CellsFromFixed {
  Table table;
  Fixed fixed;
  double step = 1.0;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t c) const {
    using Real = typename Table::non_const_value_type;
    table(c) = static_cast<Real>(static_cast<double>(fixed(c)) * step);
  }
};

/// Clears `table` and `bitmap`, then, for every non-zero entry of key e in [0, keys)
/// (value = entries(e, row)): table(q, h_q(e)) += s_q(e)·value in every sketch row q, and
/// bitmap(row) = 1. Returns the non-zeros. Several entries of a row may mark it at once; they
/// all store the same value.
///
/// The cells are deterministic. One pass marks the rows and finds the largest |value| (a max,
/// exact in any order); the next stores each entry in its own cell in an exact sketch, and
/// otherwise adds the entries on a FixedPointGrid into `fixed` (int64, one per cell) with
/// integer atomics, and a last pass over the cells converts them, through double, to the
/// table's type. One work item per key, so neighbouring GPU threads read neighbouring entries.
template <class ExecSpace, class Entries, class Table, class Fixed, class Bitmap>
std::int64_t sketch_entries(const ExecSpace& exec, const CountSketch& sketch, std::int64_t keys,
                            const Entries& entries, const Table& table, const Fixed& fixed,
                            const Bitmap& bitmap) {
  using Real = typename Table::non_const_value_type;
  using Mark = typename Bitmap::non_const_value_type;
  Kokkos::deep_copy(exec, table, Real(0));
  Kokkos::deep_copy(exec, bitmap, Mark(0));
  Real largest = 0;
  Kokkos::parallel_reduce("oktopk::count_sketch::largest", RangeOf<ExecSpace>(exec, 0, keys),
                          MarkRowsAndLargest<Entries, Bitmap, Real>{entries, bitmap},
                          Kokkos::Max<Real>(largest));
  if (!(largest > Real(0))) return 0;  // no non-zeros: the table stays 0
  OKTOPK_ASSERT(sketch.exact || static_cast<std::int64_t>(fixed.extent(0)) >= sketch.cells());
  const FixedPointGrid grid = FixedPointGrid::make(static_cast<double>(largest), keys);
  if (!sketch.exact) Kokkos::deep_copy(exec, fixed, std::int64_t{0});
  std::int64_t nonzeros = 0;
  Kokkos::parallel_reduce("oktopk::count_sketch::sketch", RangeOf<ExecSpace>(exec, 0, keys),
                          AddToCells<Entries, Table, Fixed>{sketch, entries, table, fixed, grid},
                          nonzeros);
  if (sketch.exact) return nonzeros;
  Kokkos::parallel_for("oktopk::count_sketch::from_fixed",
                       RangeOf<ExecSpace>(exec, 0, sketch.cells()),
                       CellsFromFixed<Table, Fixed>{table, fixed, grid.step});
  return nonzeros;
}

/// sketch_entries over a dense x of length sketch.n: key i is x(i), in row i / row_width.
template <class ExecSpace, class X, class Table, class Fixed, class Bitmap>
std::int64_t sketch_nonzeros(const ExecSpace& exec, const CountSketch& sketch, const X& x,
                             const Table& table, const Fixed& fixed, const Bitmap& bitmap) {
  return sketch_entries(exec, sketch, sketch.n, DenseSketchEntries<X>{x, sketch.row_width}, table,
                        fixed, bitmap);
}

/// The int64 cells sketch_entries sums in: one per cell, none for an exact sketch.
template <class ExecSpace>
Kokkos::View<std::int64_t*, typename ExecSpace::memory_space> make_fixed_cells(
    const ExecSpace& exec, const CountSketch& sketch, const char* label) {
  return Kokkos::View<std::int64_t*, typename ExecSpace::memory_space>(
      Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, std::string(label)),
      static_cast<std::size_t>(sketch.exact ? 0 : sketch.cells()));
}

/// x(i) -= estimate(table, i) where x(i) is not zero.
template <class Table, class X>
struct SubtractOwnEstimate {
  CountSketch sketch;
  Table table;
  X x;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    const auto v = x(i);
    if (v != 0.0f) x(i) = v - sketch.estimate(table, i);
  }
};

/// x(i) -= estimate(table, i) for every non-zero x(i): with the rank's own sketch, what error
/// feedback keeps of what the sketch lost.
template <class ExecSpace, class Table, class X>
void subtract_own_estimate(const ExecSpace& exec, const CountSketch& sketch, const Table& table,
                           const X& x) {
  Kokkos::parallel_for("oktopk::count_sketch::subtract_own_estimate",
                       RangeOf<ExecSpace>(exec, 0, sketch.n),
                       SubtractOwnEstimate<Table, X>{sketch, table, x});
}

/// out(i) = estimate(table, i) / divisor in a marked row (counted), 0 elsewhere.
template <class Table, class Bitmap, class Out>
struct DecodeMarkedRows {
  CountSketch sketch;
  Table table;
  Bitmap bitmap;
  Out out;
  float divisor = 1.0f;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i, std::int64_t& count) const {
    using Stored = typename Out::non_const_value_type;
    if (bitmap(i / sketch.row_width) != 0) {
      out(i) = value_cast<Stored>(sketch.estimate(table, i) / divisor);
      ++count;
    } else {
      out(i) = Stored{};
    }
  }
};

/// out(i) = estimate(table, i) / divisor on the rows the bitmap marks, 0 elsewhere; returns the
/// number of entries in marked rows.
template <class ExecSpace, class Table, class Bitmap, class Out>
std::int64_t decode_marked_rows(const ExecSpace& exec, const CountSketch& sketch,
                                const Table& table, const Bitmap& bitmap, const Out& out,
                                float divisor) {
  std::int64_t covered = 0;
  Kokkos::parallel_reduce("oktopk::count_sketch::decode", RangeOf<ExecSpace>(exec, 0, sketch.n),
                          DecodeMarkedRows<Table, Bitmap, Out>{sketch, table, bitmap, out, divisor},
                          covered);
  return covered;
}

}  // namespace oktopk::impl
