// SPDX-License-Identifier: BSD-3-Clause
// S2 Reducer against first principles (spec §6.10): exact decode with an injective sketch, the
// row union, linearity (the s2_oracle and a host model of the summed sketch), fixed traffic,
// identical outputs, unbiased estimates, error feedback and option validation.
//
// Most inputs are embedding-like (only some rows non-zero per rank) with values k/256,
// |k| <= 256: sums over ranks and sketch cells are then exact in float, in any order, so most
// checks are equalities; tests that need inexact data say so.
#include "mpi/mpi_test_utils.hpp"
#include <oktopk/any_space.hpp>
#include <oktopk/impl/kernels/count_sketch.hpp>

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using oktopk::Algorithm;
using oktopk::Communicator;
using oktopk::Options;
using oktopk::impl::CountSketch;
using Handle = std::unique_ptr<oktopk::SparseAllreduce<Exec>>;

using oktopk::test::world_rank;
using oktopk::test::world_size;

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

Kokkos::View<float*, Mem> to_view(const std::vector<float>& v, const char* label) {
  Kokkos::View<float*, Mem> view(std::string(label), v.size());
  auto host = Kokkos::create_mirror_view(view);
  std::copy(v.begin(), v.end(), host.data());
  Kokkos::deep_copy(view, host);
  return view;
}

template <class View>
std::vector<float> to_vector(const View& view) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  return std::vector<float>(host.data(), host.data() + host.extent(0));
}

Options s2_options(std::int64_t row_width, int sketch_rows, std::int64_t columns) {
  Options o;
  o.set_s2_row_width(row_width).set_s2_sketch_rows(sketch_rows).set_s2_sketch_columns(columns);
  return o;
}

/// Embedding-like gradient: each row is non-zero with probability row_probability (and rank r
/// always has row r mod rows, so ranks differ); in a non-zero row each entry is k/256 with
/// probability 0.8, k uniform in [1, 256] (positive) or [-256, 256] \ {0}.
std::vector<float> rows_gradient(std::int64_t n, std::int64_t row_width, double row_probability,
                                 std::uint64_t seed, bool positive = false) {
  std::mt19937_64 rng(seed * 1000003u + static_cast<std::uint64_t>(world_rank()));
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  std::uniform_int_distribution<int> magnitude(1, 256);
  std::vector<float> g(static_cast<std::size_t>(n), 0.0f);
  const std::int64_t rows = (n + row_width - 1) / row_width;
  for (std::int64_t row = 0; row < rows; ++row) {
    if (coin(rng) >= row_probability && row != world_rank() % rows) continue;
    for (std::int64_t i = row * row_width; i < std::min(n, (row + 1) * row_width); ++i) {
      if (coin(rng) < 0.8) {
        const int sign = positive || coin(rng) < 0.5 ? 1 : -1;
        g[static_cast<std::size_t>(i)] = static_cast<float>(sign * magnitude(rng)) / 256.0f;
      }
    }
  }
  return g;
}

/// The sum over ranks with a plain MPI_Allreduce (exact for the k/256 data).
std::vector<float> dense_sum(const std::vector<float>& g) {
  std::vector<float> sum(g.size());
  MPI_Allreduce(g.data(), sum.data(), static_cast<int>(g.size()), MPI_FLOAT, MPI_SUM,
                MPI_COMM_WORLD);
  return sum;
}

/// 1 for the rows where any rank's gradient has a non-zero.
std::vector<unsigned char> union_rows(const std::vector<float>& g, std::int64_t row_width) {
  const auto n = static_cast<std::int64_t>(g.size());
  std::vector<unsigned char> mine(static_cast<std::size_t>((n + row_width - 1) / row_width), 0);
  for (std::int64_t i = 0; i < n; ++i) {
    if (g[static_cast<std::size_t>(i)] != 0.0f) mine[static_cast<std::size_t>(i / row_width)] = 1;
  }
  std::vector<unsigned char> all(mine.size());
  MPI_Allreduce(mine.data(), all.data(), static_cast<int>(mine.size()), MPI_UNSIGNED_CHAR, MPI_MAX,
                MPI_COMM_WORLD);
  return all;
}

std::int64_t count_nonzeros(const std::vector<float>& g) {
  return std::count_if(g.begin(), g.end(), [](float v) { return v != 0.0f; });
}

std::vector<float> reduce(oktopk::SparseAllreduce<Exec>& handle, const std::vector<float>& grad) {
  const Exec exec;
  const auto out = to_view(std::vector<float>(grad.size(), -7.0f), "out");  // stale contents
  handle.reduce(exec, to_view(grad, "grad"), out);
  exec.fence();
  return to_vector(out);
}

Handle make_s2(const Communicator& comm, std::int64_t n, const Options& options) {
  return oktopk::make_sparse_allreduce<Exec>(Algorithm::S2Reducer, comm, n, options);
}

// ---- a host model of the count sketch, from the hash definition ---------------------------------
// Only the hash functions (CountSketch::cell) are shared with the library; the tables are summed in
// double and the median is taken with std::sort, so sketching, signs, medians and the /P are
// checked independently of the kernels.

std::vector<double> host_table(const CountSketch& s, const std::vector<float>& x) {
  std::vector<double> table(static_cast<std::size_t>(s.cells()), 0.0);
  for (std::int64_t i = 0; i < s.n; ++i) {
    const float v = x[static_cast<std::size_t>(i)];
    if (v == 0.0f) continue;
    for (int q = 0; q < s.sketch_rows; ++q) {
      float sign = 0.0f;
      const auto c = s.cell(q, i, s.mix(i), sign);
      table[static_cast<std::size_t>(c)] += static_cast<double>(sign) * v;
    }
  }
  return table;
}

double host_estimate(const CountSketch& s, const std::vector<double>& table, std::int64_t i) {
  std::vector<double> e;
  for (int q = 0; q < s.sketch_rows; ++q) {
    float sign = 0.0f;
    const auto c = s.cell(q, i, s.mix(i), sign);
    e.push_back(table[static_cast<std::size_t>(c)] * sign);
  }
  std::sort(e.begin(), e.end());
  const std::size_t mid = e.size() / 2;
  return e.size() % 2 == 1 ? e[mid] : (e[mid - 1] + e[mid]) / 2.0;
}

std::vector<double> sum_over_ranks(const std::vector<double>& v) {
  std::vector<double> sum(v.size());
  MPI_Allreduce(v.data(), sum.data(), static_cast<int>(v.size()), MPI_DOUBLE, MPI_SUM,
                MPI_COMM_WORLD);
  return sum;
}

// ---- exact mode ----

// With c >= n the sketch is injective: the output is the dense average on union rows (bitwise:
// the sums are exact and both divide the same float by P), and exactly 0 on the other rows.
TEST(S2, ExactSketchEqualsDenseAverageOnUnionRows) {
  const Communicator comm;
  const std::int64_t n = 1000;  // 63 rows of 16, the last of 8
  const std::int64_t m = 16;
  const float p = static_cast<float>(world_size());
  struct Case {
    int rows;
    std::int64_t columns;
    double density;
  };
  // c = n, c > n (clamped to n), and c = ceil(2 * 0.5 * n) = n from the density.
  for (const Case& c : {Case{1, n, 0.01}, Case{3, n, 0.01}, Case{2, 10 * n, 0.01}, Case{3, 0, 0.5},
                        Case{15, n, 0.01}}) {
    SCOPED_TRACE("r = " + std::to_string(c.rows) + ", c = " + std::to_string(c.columns) +
                 ", density = " + std::to_string(c.density));
    auto options = s2_options(m, c.rows, c.columns);
    options.set_density(c.density);
    const auto grad = rows_gradient(n, m, 0.1, 1 + static_cast<std::uint64_t>(c.rows));
    const auto sum = dense_sum(grad);
    const auto in_union = union_rows(grad, m);
    auto handle = make_s2(comm, n, options);
    const auto out = reduce(*handle, grad);
    std::int64_t covered = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      if (in_union[static_cast<std::size_t>(i / m)] != 0) {
        ++covered;
        EXPECT_EQ(out[k], sum[k] / p) << "at " << i;
      } else {
        EXPECT_EQ(std::memcmp(&out[k], "\0\0\0\0", 4), 0) << "at " << i << ": " << out[k];
      }
    }
    const auto& stats = handle->stats();
    EXPECT_EQ(stats.local_selected, count_nonzeros(grad));
    EXPECT_EQ(stats.global_selected, covered);
    EXPECT_EQ(stats.local_threshold, 0.0f);
    EXPECT_EQ(stats.global_threshold, 0.0f);
    EXPECT_FALSE(stats.dense);
    for (const char* phase : {"sketch", "allreduce", "decode"}) {
      EXPECT_EQ(stats.phases.count(phase), 1u) << phase;
    }
    // The oracle agrees in exact mode too.
    const Exec exec;
    const auto oracle = to_view(std::vector<float>(static_cast<std::size_t>(n), -7.0f), "oracle");
    oktopk::impl::s2_oracle(exec, comm, n, options, to_view(grad, "acc"), oracle);
    EXPECT_EQ(to_vector(oracle), out);
  }
}

// Positive data cannot cancel, so in exact mode a row of the output is entirely non-zero exactly
// when some rank's row was non-zero: the union the method decodes is the OR of the local rows.
TEST(S2, UnionIsTheOrOfLocalNonzeroRows) {
  const Communicator comm;
  const std::int64_t n = 515;  // 33 rows of 16, the last of 3
  const std::int64_t m = 16;
  for (const double probability : {0.0, 0.05, 0.3}) {
    SCOPED_TRACE("row probability " + std::to_string(probability));
    auto grad = rows_gradient(n, m, probability, 7, /*positive=*/true);
    // Whole non-zero rows, so that "row non-zero in the output" is all-or-nothing.
    for (std::int64_t i = 0; i < n; ++i) {
      const auto row_start = static_cast<std::size_t>((i / m) * m);
      if (grad[static_cast<std::size_t>(i)] == 0.0f &&
          std::any_of(grad.begin() + static_cast<std::ptrdiff_t>(row_start),
                      grad.begin() +
                          static_cast<std::ptrdiff_t>(std::min<std::int64_t>(n, (i / m + 1) * m)),
                      [](float v) { return v != 0.0f; })) {
        grad[static_cast<std::size_t>(i)] = 1.0f / 256.0f;
      }
    }
    const auto expected = union_rows(grad, m);
    auto handle = make_s2(comm, n, s2_options(m, 3, n));
    const auto out = reduce(*handle, grad);
    for (std::int64_t row = 0; row * m < n; ++row) {
      std::int64_t nonzero = 0;
      const std::int64_t end = std::min(n, (row + 1) * m);
      for (std::int64_t i = row * m; i < end; ++i)
        nonzero += out[static_cast<std::size_t>(i)] != 0.0f;
      EXPECT_EQ(nonzero, expected[static_cast<std::size_t>(row)] != 0 ? end - row * m : 0)
          << "row " << row;
    }
  }
  // All ranks zero: nothing is decoded.
  auto handle = make_s2(comm, n, s2_options(m, 3, 0));
  const auto out = reduce(*handle, std::vector<float>(static_cast<std::size_t>(n), 0.0f));
  EXPECT_EQ(count_nonzeros(out), 0);
  EXPECT_EQ(handle->stats().global_selected, 0);
}

// Edge shapes: an empty gradient, one shorter-than-a-row gradient, and a 2-column sketch of 5
// entries (compressed), each against the dense average or the host model.
TEST(S2, TinyAndEmptyGradients) {
  const Communicator comm;
  const float p = static_cast<float>(world_size());
  for (const std::int64_t n : {0, 1, 5}) {
    for (const std::int64_t columns : {std::int64_t{0}, std::int64_t{2}}) {
      SCOPED_TRACE("n = " + std::to_string(n) + ", columns = " + std::to_string(columns));
      auto options = s2_options(16, 3, columns);
      const auto sketch = CountSketch::make("test", n, options);
      EXPECT_EQ(sketch.exact, n <= (columns == 0 ? 1 : columns));
      std::vector<float> grad(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) {
        grad[static_cast<std::size_t>(i)] = static_cast<float>((world_rank() + i) % 3) / 4.0f;
      }
      const auto table = sum_over_ranks(host_table(sketch, grad));
      const auto sum = dense_sum(grad);
      const auto in_union = union_rows(grad, 16);  // one row at most
      const bool any = !in_union.empty() && in_union[0] != 0;
      auto handle = make_s2(comm, n, options);
      const auto out = reduce(*handle, grad);
      ASSERT_EQ(out.size(), grad.size());
      for (std::int64_t i = 0; i < n; ++i) {
        const auto k = static_cast<std::size_t>(i);
        const float model = any ? static_cast<float>(host_estimate(sketch, table, i)) / p : 0.0f;
        EXPECT_EQ(out[k], model) << "at " << i;
        if (sketch.exact) {
          EXPECT_EQ(out[k], any ? sum[k] / p : 0.0f) << "at " << i;
        }
      }
    }
  }
}

// ---- compressed mode ----

// A sketch far narrower than the union: the output is the host model's median of the summed
// tables / P (equal: the tables are exact), the s2_oracle's decode of the sketched mean, and 0 off
// the union. Two calls on one handle: the table is cleared in between.
TEST(S2, CompressedSketchMatchesHostModelAndOracle) {
  const Communicator comm;
  const Exec exec;
  const std::int64_t n = 4099;  // 257 rows of 16, the last of 3
  const std::int64_t m = 16;
  const int p = world_size();
  const bool power_of_two = (p & (p - 1)) == 0;
  for (const int r : {1, 3, 4}) {
    SCOPED_TRACE("r = " + std::to_string(r));
    auto options = s2_options(m, r, 0);
    options.set_density(0.02);  // c = ceil(2 * 0.02 * 4099) = 164
    const auto sketch = CountSketch::make("test", n, options);
    ASSERT_FALSE(sketch.exact);
    ASSERT_EQ(sketch.columns, 164);
    auto handle = make_s2(comm, n, options);
    for (int call = 0; call < 2; ++call) {
      SCOPED_TRACE("call " + std::to_string(call));
      const auto grad = rows_gradient(n, m, 0.03, 100 + static_cast<std::uint64_t>(10 * r + call));
      const auto out = reduce(*handle, grad);
      const auto in_union = union_rows(grad, m);
      const auto table = sum_over_ranks(host_table(sketch, grad));
      const auto sum = dense_sum(grad);
      const auto oracle_view =
          to_view(std::vector<float>(static_cast<std::size_t>(n), -7.0f), "oracle");
      oktopk::impl::s2_oracle(exec, comm, n, options, to_view(grad, "acc"), oracle_view);
      const auto oracle = to_vector(oracle_view);
      // Per cell, the absolute mass and the number of non-zero mean entries: they bound the
      // oracle's rounding (below).
      std::vector<float> mean(sum.size());
      for (std::size_t i = 0; i < sum.size(); ++i) mean[i] = sum[i] / static_cast<float>(p);
      std::vector<double> mass(static_cast<std::size_t>(sketch.cells()), 0.0);
      std::vector<int> load(static_cast<std::size_t>(sketch.cells()), 0);
      for (std::int64_t i = 0; i < n; ++i) {
        if (mean[static_cast<std::size_t>(i)] == 0.0f) continue;
        for (int q = 0; q < r; ++q) {
          float sign = 0.0f;
          const auto c = static_cast<std::size_t>(sketch.cell(q, i, sketch.mix(i), sign));
          mass[c] += std::fabs(mean[static_cast<std::size_t>(i)]);
          ++load[c];
        }
      }
      std::int64_t sketch_errors = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const auto k = static_cast<std::size_t>(i);
        if (in_union[static_cast<std::size_t>(i / m)] == 0) {
          EXPECT_EQ(out[k], 0.0f) << "at " << i;
          EXPECT_EQ(oracle[k], 0.0f) << "at " << i;
          continue;
        }
        const float model =
            static_cast<float>(host_estimate(sketch, table, i)) / static_cast<float>(p);
        EXPECT_EQ(out[k], model) << "at " << i;
        sketch_errors += out[k] != sum[k] / static_cast<float>(p);
        if (power_of_two) {
          // The mean is exact too, so both ways sum the same exact numbers.
          EXPECT_EQ(out[k], oracle[k]) << "at " << i;
        } else {
          // The oracle rounds each mean entry (relative error <= u = 2^-24) and sums at most L of
          // them in a cell of absolute mass M: error <= L·u·M per cell, and the median moves no
          // more than its inputs; the method rounds once (/P) and the oracle's even-r midpoint
          // once more. Hence |out - oracle| <= (L + 2)·u·(M + |oracle|) with M, L the largest
          // over the entry's cells. This is an absolute bound on purpose: "1e-6 relative to the
          // entry" does not hold where a cell's terms cancel (seen at P = 3: method 0 exactly,
          // oracle 1.2e-7, for data of magnitude <= 1; the largest difference used ~23% of the
          // bound).
          double cell_mass = 0.0;
          int cell_load = 0;
          for (int q = 0; q < r; ++q) {
            float sign = 0.0f;
            const auto c = static_cast<std::size_t>(sketch.cell(q, i, sketch.mix(i), sign));
            cell_mass = std::max(cell_mass, mass[c]);
            cell_load = std::max(cell_load, load[c]);
          }
          const double u = std::ldexp(1.0, -24);
          const double bound = (cell_load + 2) * u * (cell_mass + std::fabs(oracle[k]));
          EXPECT_LE(std::fabs(static_cast<double>(out[k]) - oracle[k]), bound) << "at " << i;
        }
      }
      // The sketch really is lossy here (otherwise this test would not test compression).
      EXPECT_GT(sketch_errors, 0);
      EXPECT_EQ(handle->stats().local_selected, count_nonzeros(grad));
    }
  }
}

// The decode is identical on every rank, also for inexact (normally distributed) data.
TEST(S2, OutputIsBitIdenticalOnAllRanks) {
  const Communicator comm;
  const std::int64_t n = 3000;
  for (const std::int64_t columns : {std::int64_t{0}, n}) {
    auto options = s2_options(32, 5, columns);
    options.set_density(0.05);
    auto grad = rows_gradient(n, 32, 0.2, 31);
    std::mt19937_64 rng(99 + static_cast<std::uint64_t>(world_rank()));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : grad) {
      if (v != 0.0f) v = normal(rng);
    }
    auto handle = make_s2(comm, n, options);
    const auto out = reduce(*handle, grad);
    auto root = out;
    MPI_Bcast(root.data(), static_cast<int>(n), MPI_FLOAT, 0, MPI_COMM_WORLD);
    EXPECT_EQ(std::memcmp(root.data(), out.data(), out.size() * sizeof(float)), 0)
        << "columns = " << columns;
    EXPECT_GT(count_nonzeros(out), 0);
  }
}

// ---- traffic ------------------------------------------------------------------------------------

// Bytes per rank of an allreduce of B bytes as reduce-scatter + allgather over the exact block
// partition (block t has B/P bytes, the first B mod P one more): this rank sends every block
// but its own, then its own reduced block to each of the P - 1 others; it receives as much.
std::int64_t allreduce_bytes(std::int64_t bytes, int p, int rank) {
  const std::int64_t own = bytes / p + (rank < bytes % p ? 1 : 0);
  return (bytes - own) + (p - 1) * own;
}

TEST(S2, AllreduceTrafficIsFixedBySketchAndRows) {
  const Communicator comm;
  const int p = world_size();
  const std::int64_t n = 10007;
  const std::int64_t m = 64;
  for (const int r : {1, 3}) {
    auto options = s2_options(m, r, 0);
    options.set_density(0.01);
    const std::int64_t c = static_cast<std::int64_t>(std::ceil(2 * 0.01 * n));  // 201
    const std::int64_t rows = (n + m - 1) / m;                                  // 157
    const std::int64_t expected =
        allreduce_bytes(4 * r * c, p, world_rank()) + allreduce_bytes(rows, p, world_rank());
    auto handle = make_s2(comm, n, options);
    std::vector<std::vector<float>> grads = {std::vector<float>(static_cast<std::size_t>(n), 0.0f),
                                             rows_gradient(n, m, 0.02, 5),
                                             rows_gradient(n, m, 1.0, 6)};
    for (std::size_t g = 0; g < grads.size(); ++g) {
      SCOPED_TRACE("r = " + std::to_string(r) + ", gradient " + std::to_string(g) + " with " +
                   std::to_string(count_nonzeros(grads[g])) + " non-zeros");
      reduce(*handle, grads[g]);
      const auto& phases = handle->stats().phases;
      ASSERT_EQ(phases.count("allreduce"), 1u);
      const auto& t = phases.at("allreduce").traffic;
      EXPECT_EQ(t.bytes_sent, expected);
      EXPECT_EQ(t.bytes_received, expected);
      EXPECT_EQ(t.messages_sent, 4 * (p - 1));  // two allreduces of 2(P - 1) messages
      EXPECT_EQ(t.messages_received, 4 * (p - 1));
      for (const char* quiet : {"sketch", "decode"}) {
        ASSERT_EQ(phases.count(quiet), 1u) << quiet;
        EXPECT_EQ(phases.at(quiet).traffic.bytes_sent, 0) << quiet;
      }
    }
  }
}

// ---- statistics ---------------------------------------------------------------------------------

// The count sketch estimate est(x) = x + sum over y != x hashed to x's cell of s(x)s(y)·v(y)
// is unbiased over the random signs. Every rank holds the same integer vector, so the output is
// the r = 1 estimate of v itself, exactly. Over S = 200 seeds the error at x has variance
// sum_{y != x} v(y)^2 / c / S (each y collides with probability 1/c, with a random sign),
// and the test allows 5 standard deviations. A method without signs (or with seed-independent
// hashes) is off by about sum v / c ~ 20 (or by a fixed collision sum of std ~ 3 at some x),
// against a tolerance of about 1.6.
TEST(S2, CountSketchEstimateIsUnbiasedOverSeeds) {
  const Communicator comm;
  const std::int64_t n = 256;
  const std::int64_t c = 32;
  const int seeds = 200;
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] = static_cast<float>(1 + i % 4);
  std::vector<double> mean(v.size(), 0.0);
  for (int s = 0; s < seeds; ++s) {
    auto options = s2_options(16, 1, c);
    options.set_seed(1000 + static_cast<std::uint64_t>(s));
    auto handle = make_s2(comm, n, options);
    const auto out = reduce(*handle, v);
    for (std::size_t i = 0; i < v.size(); ++i) mean[i] += out[i] / static_cast<double>(seeds);
  }
  double total_square = 0.0;
  for (const float x : v) total_square += static_cast<double>(x) * x;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double sigma = std::sqrt((total_square - double(v[i]) * v[i]) / c / seeds);
    EXPECT_NEAR(mean[i], v[i], 5.0 * sigma) << "at " << i;
  }
}

// The median over independent sketch rows concentrates: with the same width, r = 5 has a smaller
// total squared error than r = 1 (whose row is the r = 5 sketch's first row, same seed). Rows
// sharing one hash function would give equal errors.
TEST(S2, MoreSketchRowsReduceTheError) {
  const Communicator comm;
  const std::int64_t n = 2048;
  const std::int64_t m = 16;
  const auto grad = rows_gradient(n, m, 0.25, 21);
  const auto sum = dense_sum(grad);
  double error[2] = {0.0, 0.0};
  const int rows[2] = {1, 5};
  for (int j = 0; j < 2; ++j) {
    auto handle = make_s2(comm, n, s2_options(m, rows[j], 128));
    const auto out = reduce(*handle, grad);
    for (std::size_t i = 0; i < out.size(); ++i) {
      const double e = out[i] - static_cast<double>(sum[i]) / world_size();
      error[j] += e * e;
    }
  }
  EXPECT_GT(error[0], 0.0);
  EXPECT_LT(error[1], 0.7 * error[0]);
}

// ---- error feedback -----------------------------------------------------------------------------

// Exact sketch: the own estimate is exact, so nothing is left in the residual.
TEST(S2, ErrorFeedbackWithExactSketchLeavesNoResidual) {
  const Communicator comm;
  const std::int64_t n = 777;
  auto options = s2_options(8, 3, n);
  options.set_s2_error_feedback(true);
  auto handle = make_s2(comm, n, options);
  for (int call = 0; call < 2; ++call) {
    const auto grad = rows_gradient(n, 8, 0.2, 50 + static_cast<std::uint64_t>(call));
    const auto sum = dense_sum(grad);
    const auto out = reduce(*handle, grad);
    const auto residual = to_vector(handle->residual());
    EXPECT_EQ(count_nonzeros(residual), 0);
    for (std::size_t i = 0; i < out.size(); ++i) {
      EXPECT_EQ(out[i], sum[i] / static_cast<float>(world_size())) << "at " << i;
    }
  }
}

// Compressed sketch: residual = acc - (decode of this rank's own sketch) on acc's non-zeros,
// computed with the host model; the second call sketches acc = residual + grad.
TEST(S2, ErrorFeedbackKeepsWhatTheOwnSketchLost) {
  const Communicator comm;
  const std::int64_t n = 2003;
  const std::int64_t m = 16;
  for (const int r : {1, 3, 4}) {
    SCOPED_TRACE("r = " + std::to_string(r));
    auto options = s2_options(m, r, 61);
    options.set_s2_error_feedback(true);
    const auto sketch = CountSketch::make("test", n, options);
    auto handle = make_s2(comm, n, options);
    std::vector<float> residual(static_cast<std::size_t>(n), 0.0f);
    std::int64_t kept = 0;
    for (int call = 0; call < 3; ++call) {
      SCOPED_TRACE("call " + std::to_string(call));
      const auto grad = rows_gradient(n, m, 0.1, 70 + static_cast<std::uint64_t>(call));
      std::vector<float> acc(grad.size());
      for (std::size_t i = 0; i < acc.size(); ++i) acc[i] = residual[i] + grad[i];  // exact
      const auto own = host_table(sketch, acc);
      const auto table = sum_over_ranks(own);
      const auto in_union = union_rows(acc, m);
      const auto out = reduce(*handle, grad);
      for (std::int64_t i = 0; i < n; ++i) {
        const auto k = static_cast<std::size_t>(i);
        if (acc[k] != 0.0f) {
          residual[k] = static_cast<float>(acc[k] - host_estimate(sketch, own, i));
        }
        const float model = in_union[static_cast<std::size_t>(i / m)] != 0
                                ? static_cast<float>(host_estimate(sketch, table, i)) /
                                      static_cast<float>(world_size())
                                : 0.0f;
        EXPECT_EQ(out[k], model) << "at " << i;
      }
      EXPECT_EQ(to_vector(handle->residual()), residual);
      kept += count_nonzeros(residual);
    }
    EXPECT_GT(kept, 0);  // the sketch lost something, so the check above was not vacuous
  }
}

TEST(S2, WithoutErrorFeedbackNothingIsKept) {
  const Communicator comm;
  const std::int64_t n = 2003;
  auto handle = make_s2(comm, n, s2_options(16, 3, 61));
  for (int call = 0; call < 2; ++call) {
    reduce(*handle, rows_gradient(n, 16, 0.1, 80 + static_cast<std::uint64_t>(call)));
    EXPECT_EQ(count_nonzeros(to_vector(handle->residual())), 0);
  }
}

// ---- options ------------------------------------------------------------------------------------

// Every rank passes the same options, so every rank throws (the test main fails the test if any
// rank does not). The too-large table is rejected before the n-long buffers are allocated.
TEST(S2, InvalidOptionsThrowOnEveryRank) {
  const Communicator comm;
  struct Case {
    Options options;
    std::int64_t n;
    const char* prefix;
  };
  const Case cases[] = {
      {s2_options(16, 16, 0), 1000, "oktopk::Options::validate: "},
      {s2_options(16, 100, 0), 1000, "oktopk::Options::validate: "},
      {s2_options(16, 3, std::int64_t{1} << 30), std::int64_t{1} << 30,
       "oktopk::make_sparse_allreduce: s2_sketch_rows"},
      {s2_options(16, 0, 0), 1000, "oktopk::Options::validate: "},
      {s2_options(0, 3, 0), 1000, "oktopk::Options::validate: "},
      {s2_options(16, 3, -1), 1000, "oktopk::Options::validate: "},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.prefix);
    try {
      make_s2(comm, c.n, c.options);
      ADD_FAILURE() << "no exception";
    } catch (const std::invalid_argument& e) {
      EXPECT_TRUE(starts_with(e.what(), c.prefix)) << e.what();
    }
  }
  // The oracle validates the same way.
  const Exec exec;
  const auto x = to_view(std::vector<float>(10, 0.0f), "x");
  EXPECT_THROW(oktopk::impl::s2_oracle(exec, comm, 10, s2_options(16, 16, 0), x, x),
               std::invalid_argument);
  // ... and lengths, on every rank even if only one rank's are wrong.
  const auto y = to_view(std::vector<float>(world_rank() == 0 ? 9 : 10, 0.0f), "y");
  EXPECT_THROW(oktopk::impl::s2_oracle(exec, comm, 10, s2_options(16, 3, 0), x, y),
               std::invalid_argument);
}

}  // namespace
