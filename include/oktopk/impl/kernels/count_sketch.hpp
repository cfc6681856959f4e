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
    OKTOPK_REQUIRE(n >= 0 && n <= INT_MAX, std::invalid_argument, where,
                   "n must be in [0, 2^31 - 1], got " << n);
    // Options::validate bounds rows (1..max_sketch_rows), width and columns.
    OKTOPK_ASSERT(options.s2_sketch_rows >= 1 && options.s2_sketch_rows <= max_sketch_rows);
    CountSketch s;
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

  /// The sketch's insert: table(q, h_q(key)) += s_q(key)·value in every sketch row q, atomic
  /// (entries that share a cell may be added at once).
  template <class Table, class Real>
  KOKKOS_INLINE_FUNCTION void add(const Table& table, std::int64_t key, Real value) const {
    for_each_cell(
        key, [&](int, std::int64_t c, float sign) { Kokkos::atomic_add(&table(c), sign * value); });
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

/// Clears `table` and `bitmap`, then, for every non-zero x(i): table(q, h_q(i)) += s_q(i)·x(i)
/// and bitmap(row of i) = 1. Returns the non-zeros of x. One pass over x, one entry per work
/// item, so neighbouring GPU threads read neighbouring entries. Several entries of a row may
/// mark it at once; they all store the same byte.
template <class ExecSpace, class X, class Table, class Bitmap>
std::int64_t sketch_nonzeros(const ExecSpace& exec, const CountSketch& sketch, const X& x,
                             const Table& table, const Bitmap& bitmap) {
  const CountSketch s = sketch;
  Kokkos::deep_copy(exec, table, 0.0f);
  Kokkos::deep_copy(exec, bitmap, static_cast<unsigned char>(0));
  std::int64_t nonzeros = 0;
  Kokkos::parallel_reduce(
      "oktopk::count_sketch::sketch", RangeOf<ExecSpace>(exec, 0, s.n),
      KOKKOS_LAMBDA(const std::int64_t i, std::int64_t& count) {
        const auto v = x(i);
        if (v == 0.0f) return;
        ++count;
        bitmap(i / s.row_width) = 1;
        s.add(table, i, v);
      },
      nonzeros);
  return nonzeros;
}

/// x(i) -= estimate(table, i) for every non-zero x(i): with the rank's own sketch, what error
/// feedback keeps of what the sketch lost.
template <class ExecSpace, class Table, class X>
void subtract_own_estimate(const ExecSpace& exec, const CountSketch& sketch, const Table& table,
                           const X& x) {
  const CountSketch s = sketch;
  Kokkos::parallel_for(
      "oktopk::count_sketch::subtract_own_estimate", RangeOf<ExecSpace>(exec, 0, s.n),
      KOKKOS_LAMBDA(std::int64_t i) {
        const auto v = x(i);
        if (v != 0.0f) x(i) = v - s.estimate(table, i);
      });
}

/// out(i) = estimate(table, i) / divisor on the rows the bitmap marks, 0 elsewhere; returns the
/// number of entries in marked rows.
template <class ExecSpace, class Table, class Bitmap, class Out>
std::int64_t decode_marked_rows(const ExecSpace& exec, const CountSketch& sketch,
                                const Table& table, const Bitmap& bitmap, const Out& out,
                                float divisor) {
  using Stored = typename Out::non_const_value_type;
  const CountSketch s = sketch;
  std::int64_t covered = 0;
  Kokkos::parallel_reduce(
      "oktopk::count_sketch::decode", RangeOf<ExecSpace>(exec, 0, s.n),
      KOKKOS_LAMBDA(const std::int64_t i, std::int64_t& count) {
        if (bitmap(i / s.row_width) != 0) {
          out(i) = value_cast<Stored>(s.estimate(table, i) / divisor);
          ++count;
        } else {
          out(i) = Stored{};
        }
      },
      covered);
  return covered;
}

}  // namespace oktopk::impl
