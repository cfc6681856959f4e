// SPDX-License-Identifier: BSD-3-Clause
// S2's count sketch is deterministic: a rank's table is the same bits on every run and at any
// thread count, because its cells sum on a fixed-point grid. Checked against a host model that
// adds the same grid values one entry at a time, in index order (CTest runs these kernels with
// OMP_NUM_THREADS=2, and on a GPU build on the device).
#include "exec_spaces.hpp"
#include "test_data.hpp"

#include <oktopk/impl/kernels/count_sketch.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace oktopk::test;
using oktopk::impl::CountSketch;

template <class ExecSpace>
class Sketch : public ::testing::Test {};
TYPED_TEST_SUITE(Sketch, EnabledSpaces);

struct HostSketch {
  std::vector<float> table;
  std::vector<unsigned char> bitmap;
  std::int64_t nonzeros = 0;
};

/// The grid's step derived apart from FixedPointGrid: the finest power of two at which n values
/// of magnitude at most `largest` sum below 2^62.
double model_step(double largest, std::int64_t n) {
  int a = 0;
  while (std::ldexp(1.0, a) <= largest) ++a;
  while (std::ldexp(1.0, a - 1) > largest) --a;
  int b = 0;
  while ((std::int64_t{1} << b) < n) ++b;
  return std::ldexp(1.0, a + b - 62);
}

/// The sketch as the library defines it, one entry at a time in index order: an exact sketch
/// stores each value in its own cell, any other sums on the grid.
HostSketch model_sketch(const CountSketch& s, const std::vector<float>& x) {
  HostSketch m;
  m.table.assign(static_cast<std::size_t>(s.cells()), 0.0f);
  m.bitmap.assign(static_cast<std::size_t>(s.rows), 0);
  if (s.exact) {
    for (std::int64_t i = 0; i < s.n; ++i) {
      const float v = x[static_cast<std::size_t>(i)];
      if (v == 0.0f) continue;
      ++m.nonzeros;
      m.bitmap[static_cast<std::size_t>(i / s.row_width)] = 1;
      const std::uint64_t mixed = s.mix(i);
      for (int q = 0; q < s.sketch_rows; ++q) {
        float sign = 1.0f;
        const auto c = static_cast<std::size_t>(s.cell(q, i, mixed, sign));
        m.table[c] = sign * v;
      }
    }
    return m;
  }
  double largest = 0;
  for (const float v : x) largest = std::max(largest, std::fabs(static_cast<double>(v)));
  if (largest == 0) return m;
  const double step = model_step(largest, s.n);
  std::vector<std::int64_t> units(m.table.size(), 0);
  for (std::int64_t i = 0; i < s.n; ++i) {
    const float v = x[static_cast<std::size_t>(i)];
    if (v == 0.0f) continue;
    ++m.nonzeros;
    m.bitmap[static_cast<std::size_t>(i / s.row_width)] = 1;
    const auto u = static_cast<std::int64_t>(std::llround(static_cast<double>(v) / step));
    const std::uint64_t mixed = s.mix(i);
    for (int q = 0; q < s.sketch_rows; ++q) {
      float sign = 1.0f;
      const std::int64_t c = s.cell(q, i, mixed, sign);
      units[static_cast<std::size_t>(c)] += sign < 0.0f ? -u : u;
    }
  }
  for (std::size_t c = 0; c < units.size(); ++c) {
    m.table[c] = static_cast<float>(static_cast<double>(units[c]) * step);
  }
  return m;
}

template <class ExecSpace>
HostSketch device_sketch(const ExecSpace& exec, const CountSketch& s,
                         const Kokkos::View<float*, typename ExecSpace::memory_space>& x) {
  using Memory = typename ExecSpace::memory_space;
  Kokkos::View<float*, Memory> table("table", static_cast<std::size_t>(s.cells()));
  Kokkos::View<unsigned char*, Memory> bitmap("bitmap", static_cast<std::size_t>(s.rows));
  const auto fixed = oktopk::impl::make_fixed_cells(exec, s, "fixed");
  HostSketch d;
  d.nonzeros = oktopk::impl::sketch_nonzeros(exec, s, x, table, fixed, bitmap);
  d.table = to_vector(exec, table);
  const auto bitmap_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), bitmap);
  d.bitmap.assign(bitmap_host.data(), bitmap_host.data() + bitmap_host.extent(0));
  return d;
}

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Normally distributed and heavy-tailed data, sketched twice: both runs and the host model
/// agree byte for byte (float atomics would sum each cell in the threads' order).
TYPED_TEST(Sketch, TableIsTheSameBitsOnEveryRunAndAsTheInOrderModel) {
  const TypeParam exec;
  for (const auto kind :
       {DataKind::normal, DataKind::heavy_tailed, DataKind::ties, DataKind::signed_zero}) {
    for (const std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{1000003}}) {
      for (const int rows : {1, 3, 4}) {
        // Columns as S2's default at density 0.01: 2 · 0.01 · n (exact for n = 1).
        const auto columns = static_cast<std::int64_t>(std::ceil(0.02 * static_cast<double>(n)));
        const CountSketch s =
            CountSketch::with_shape("test", static_cast<std::int64_t>(n), 64, rows, columns, 9);
        SCOPED_TRACE(std::string(to_string(kind)) + ", n = " + std::to_string(n) +
                     ", rows = " + std::to_string(rows) + (s.exact ? " (exact)" : ""));
        const auto& x = cached_data(kind, n, 4);
        const auto x_view = to_view<TypeParam>(x, "x");
        const HostSketch first = device_sketch(exec, s, x_view);
        const HostSketch second = device_sketch(exec, s, x_view);
        const HostSketch model = model_sketch(s, x);
        EXPECT_TRUE(same_bytes(first.table, second.table)) << "two runs differ";
        EXPECT_TRUE(same_bytes(first.table, model.table)) << "the run differs from the model";
        EXPECT_EQ(first.bitmap, model.bitmap);
        EXPECT_EQ(first.nonzeros, model.nonzeros);
        EXPECT_EQ(second.nonzeros, model.nonzeros);
      }
    }
  }
}

/// The grid keeps each value to half a step: a cell differs from its exact (double) sum by at
/// most load · step / 2, plus the one rounding to float.
TYPED_TEST(Sketch, CellsStayWithinHalfAStepPerEntryOfTheExactSum) {
  const TypeParam exec;
  const std::size_t n = 1000003;
  const CountSketch s =
      CountSketch::with_shape("test", static_cast<std::int64_t>(n), 64, 3, 2001, 2);
  ASSERT_FALSE(s.exact);
  const auto& x = cached_data(DataKind::heavy_tailed, n, 5);
  const HostSketch got = device_sketch(exec, s, to_view<TypeParam>(x, "x"));
  double largest = 0;
  for (const float v : x) largest = std::max(largest, std::fabs(static_cast<double>(v)));
  const double step = model_step(largest, s.n);
  std::vector<double> exact(static_cast<std::size_t>(s.cells()), 0.0);
  std::vector<double> load(exact.size(), 0.0);
  for (std::int64_t i = 0; i < s.n; ++i) {
    const double v = x[static_cast<std::size_t>(i)];
    if (v == 0) continue;
    const std::uint64_t mixed = s.mix(i);
    for (int q = 0; q < s.sketch_rows; ++q) {
      float sign = 1.0f;
      const auto c = static_cast<std::size_t>(s.cell(q, i, mixed, sign));
      exact[c] += sign * v;
      load[c] += 1;
    }
  }
  for (std::size_t c = 0; c < exact.size(); ++c) {
    const double bound = load[c] * step / 2 + std::fabs(exact[c]) * std::ldexp(1.0, -23);
    ASSERT_LE(std::fabs(got.table[c] - exact[c]), bound) << "cell " << c;
  }
}

}  // namespace
