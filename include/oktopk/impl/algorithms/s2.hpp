// SPDX-License-Identifier: BSD-3-Clause
// S2 Reducer (Ge et al., arXiv 2110.02140): each rank puts the non-zeros of its gradient into a
// count sketch of fixed size and marks the rows that hold them in a bitmap; both are allreduced,
// so the volume depends on neither P nor the number of non-zeros, and every rank decodes the
// summed sketch (median over sketch rows) on the union of the marked rows.
#pragma once

#include <oktopk/sparse_allreduce.hpp>
#include <oktopk/impl/hash.hpp>
#include <oktopk/impl/mpi_mirror.hpp>

#include <Kokkos_Core.hpp>

#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>

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
template <class ExecSpace>
class S2Reducer final : public SparseAllreduce<ExecSpace> {
  using Base = SparseAllreduce<ExecSpace>;
  using vector_type = typename Base::vector_type;

 public:
  S2Reducer(const ExecSpace& exec, const Communicator& comm, std::int64_t n, const Options& options)
      : S2Reducer(exec, comm, n, options,
                  S2Sketch::make("oktopk::make_sparse_allreduce", n, options)) {}

  const S2Sketch& sketch() const { return sketch_; }

 protected:
  bool uses_error_feedback() const override { return this->options_.s2_error_feedback; }

  void reduce_step(const ExecSpace& exec, const vector_type& acc, const vector_type& out) override {
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
  // Validates (in make) before the base allocates n-long buffers.
  S2Reducer(const ExecSpace& exec, const Communicator& comm, std::int64_t n, const Options& options,
            const S2Sketch& sketch)
      : Base(exec, Algorithm::S2Reducer, comm, n, options), sketch_(sketch), buffers_(exec, sketch) {}

  S2Sketch sketch_;
  S2Buffers<ExecSpace> buffers_;
};

}  // namespace oktopk::impl
