// SPDX-License-Identifier: BSD-3-Clause
// Layouts of fused buffers: validation and cross-rank agreement; S2 with a layout against a
// host oracle (dense segments averaged exactly, sparse rows decoded on the bitmap union and 0
// elsewhere, one allreduce of [table | bitmap | dense]); other methods unchanged by a layout but
// for per-segment statistics; checkpoints tied to their layout; S2 with a layout against
// oktopk::expected_result, the oracle oktopk-bench --check uses.
//
// Values are k/256 with |k| <= 256: sums over ranks are exact in float in any order, so the
// checks are equalities. The oracle tests also scale them per rank into inexact floats, which
// its summation-order slack must then cover.
#include "mpi/mpi_test_utils.hpp"
#include <oktopk/any_space.hpp>
#include <oktopk/layout.hpp>
#include <oktopk/impl/base/half_types.hpp>

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using oktopk::Algorithm;
using oktopk::Communicator;
using oktopk::Layout;
using oktopk::Options;
using oktopk::Segment;
using oktopk::SegmentKind;
using Handle = std::unique_ptr<oktopk::SparseAllreduce<Exec>>;

using oktopk::test::invalid_argument_of;
using oktopk::test::world_rank;
using oktopk::test::world_size;

constexpr const char* validate_prefix = "oktopk::Layout::validate: ";

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

bool same_text_on_all_ranks(const std::string& text) {
  const auto digest = oktopk::agreement_digest(std::string_view(text));
  std::int64_t extremes[2] = {digest, ~digest};
  MPI_Allreduce(MPI_IN_PLACE, extremes, 2, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  return extremes[0] == ~extremes[1];
}

Kokkos::View<float*, Mem> to_view(const std::vector<float>& v, const char* label) {
  Kokkos::View<float*, Mem> view(std::string(label), v.size());
  auto host = Kokkos::create_mirror_view(view);
  for (std::size_t i = 0; i < v.size(); ++i) host(i) = v[i];
  Kokkos::deep_copy(view, host);
  return view;
}

template <class View>
std::vector<float> to_vector(const View& view) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  return std::vector<float>(host.data(), host.data() + host.extent(0));
}

std::vector<float> reduce(oktopk::SparseAllreduce<Exec>& handle, const std::vector<float>& grad) {
  const Exec exec;
  const auto out = to_view(std::vector<float>(grad.size(), -7.0f), "out");  // stale contents
  handle.reduce(exec, to_view(grad, "grad"), out);
  exec.fence();
  return to_vector(out);
}

/// Dense segments around two sparse-row segments of different widths (the second's last row
/// shorter), and empty segments of both kinds.
Layout mixed_layout() {
  Layout layout;
  layout.append_dense(100, "bias")
      .append_sparse_rows(40 * 8, 8, "embedding_a")
      .append_dense(77, "fc")
      .append_dense(0, "nothing")
      .append_sparse_rows(13, 5, "embedding_b")
      .append_sparse_rows(0, 4, "no_rows")
      .append_dense(31, "head");
  return layout;
}

/// Per rank and seed: dense segments mostly non-zero, sparse-row segments embedding-like (each
/// row non-zero with probability 0.25, rank r always touches its segment's row r mod rows).
std::vector<float> layout_gradient(const Layout& layout, std::uint64_t seed) {
  std::mt19937_64 rng(seed * 7919u + static_cast<std::uint64_t>(world_rank()));
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  std::uniform_int_distribution<int> magnitude(-256, 256);
  std::vector<float> g(static_cast<std::size_t>(layout.end()), 0.0f);
  for (const Segment& s : layout.segments()) {
    if (s.kind == SegmentKind::Dense) {
      for (std::int64_t i = s.offset; i < s.offset + s.length; ++i) {
        g[static_cast<std::size_t>(i)] = static_cast<float>(magnitude(rng)) / 256.0f;
      }
      continue;
    }
    for (std::int64_t row = 0; row < s.rows(); ++row) {
      if (coin(rng) >= 0.25 && row != world_rank() % s.rows()) continue;
      const std::int64_t begin = s.offset + row * s.row_width;
      const std::int64_t end = std::min(s.offset + s.length, begin + s.row_width);
      for (std::int64_t i = begin; i < end; ++i) {
        if (coin(rng) < 0.8)
          g[static_cast<std::size_t>(i)] = static_cast<float>(magnitude(rng)) / 256.0f;
      }
    }
  }
  return g;
}

std::vector<float> sum_over_ranks(const std::vector<float>& g) {
  std::vector<float> sum(g.size());
  MPI_Allreduce(g.data(), sum.data(), static_cast<int>(g.size()), MPI_FLOAT, MPI_SUM,
                MPI_COMM_WORLD);
  return sum;
}

/// Per entry: 1 where its row (of a SparseRows segment) is non-zero on some rank; dense
/// entries are 1.
std::vector<int> in_union(const Layout& layout, const std::vector<float>& g) {
  std::vector<int> mine(g.size(), 0);
  for (const Segment& s : layout.segments()) {
    for (std::int64_t row_begin = s.offset; row_begin < s.offset + s.length;
         row_begin += s.kind == SegmentKind::Dense ? s.length : s.row_width) {
      const std::int64_t end = s.kind == SegmentKind::Dense
                                   ? s.offset + s.length
                                   : std::min(s.offset + s.length, row_begin + s.row_width);
      int touched = s.kind == SegmentKind::Dense ? 1 : 0;
      for (std::int64_t i = row_begin; i < end; ++i)
        touched |= g[static_cast<std::size_t>(i)] != 0.0f;
      for (std::int64_t i = row_begin; i < end; ++i) mine[static_cast<std::size_t>(i)] = touched;
    }
  }
  std::vector<int> all(g.size());
  MPI_Allreduce(mine.data(), all.data(), static_cast<int>(g.size()), MPI_INT, MPI_MAX,
                MPI_COMM_WORLD);
  return all;
}

Options s2_options(int sketch_rows, std::int64_t columns) {
  Options o;
  o.set_s2_sketch_rows(sketch_rows).set_s2_sketch_columns(columns).set_seed(5);
  return o;
}

Handle make(Algorithm algorithm, const Communicator& comm, std::int64_t n, const Options& options,
            const Layout& layout) {
  return oktopk::make_sparse_allreduce(Exec(), algorithm, comm, n, options, layout);
}

// =============================================================================================
// Validation
// =============================================================================================

TEST(LayoutValidate, AcceptsCoveringLayoutsAndTheEmptyOne) {
  EXPECT_NO_THROW(Layout().validate(0));
  EXPECT_NO_THROW(Layout().validate(12345));
  const Layout layout = mixed_layout();
  EXPECT_NO_THROW(layout.validate(layout.end()));
  EXPECT_EQ(layout.end(), 100 + 320 + 77 + 13 + 31);
  EXPECT_EQ(layout.sparse_entries(), 320 + 13);
  EXPECT_EQ(layout.sparse_rows(), 40 + 3);
  EXPECT_EQ(layout.dense_entries(), 100 + 77 + 31);
  EXPECT_EQ(layout.segments()[4].offset, 497);
}

TEST(LayoutValidate, RejectsWithTheFunctionName) {
  struct Case {
    std::vector<Segment> segments;
    std::int64_t n;
    const char* cause;
  };
  const auto dense = [](std::int64_t offset, std::int64_t length) {
    return Segment{offset, length, SegmentKind::Dense, 1, "d"};
  };
  const auto rows = [](std::int64_t offset, std::int64_t length, std::int64_t width) {
    return Segment{offset, length, SegmentKind::SparseRows, width, "r"};
  };
  const Case cases[] = {
      {{dense(0, 10), dense(8, 12)}, 20, "must not overlap"},
      {{dense(0, 10), dense(12, 8)}, 20, "leaving [10, 12) uncovered"},
      {{dense(2, 18)}, 20, "leaving [0, 2) uncovered"},
      {{dense(0, 10), dense(10, 10), dense(5, 5)}, 20, "must be sorted"},
      {{dense(0, 10), rows(10, 10, 5)}, 25, "cover [0, 20), not [0, n) with n = 25"},
      {{dense(0, 10), rows(10, 10, 5)}, 15, "ends at 20, past n = 15"},
      {{dense(0, 10), rows(10, 10, 0)}, 20, "sparse rows of width 0 < 1"},
      {{dense(0, -1), dense(-1, 21)}, 20, "length -1 < 0"},
  };
  for (const Case& c : cases) {
    const Layout layout(c.segments);
    SCOPED_TRACE(::testing::PrintToString(c.cause));
    const std::string message = invalid_argument_of([&] { layout.validate(c.n); });
    EXPECT_TRUE(starts_with(message, validate_prefix)) << message;
    EXPECT_NE(message.find(c.cause), std::string::npos) << message;
  }
}

TEST(LayoutValidate, AppendRejectsLengthsOutsideAGradient) {
  const std::int64_t most = (std::int64_t{1} << 31) - 1;
  Layout layout;
  std::string message = invalid_argument_of([&] { layout.append_dense(-1); });
  EXPECT_TRUE(starts_with(message, "oktopk::Layout::append_dense: ")) << message;
  layout.append_dense(most - 4);
  message = invalid_argument_of([&] { layout.append_sparse_rows(5, 1); });
  EXPECT_TRUE(starts_with(message, "oktopk::Layout::append_sparse_rows: ")) << message;
  layout.append_sparse_rows(4, 2);  // exactly up to 2^31 - 1
  EXPECT_EQ(layout.end(), most);
  EXPECT_EQ(layout.segments().size(), 2u);
}

TEST(LayoutValidate, DigestSeesEveryField) {
  const Layout a = mixed_layout();
  EXPECT_EQ(a.digest(), mixed_layout().digest());
  EXPECT_TRUE(a == mixed_layout());
  Layout renamed = Layout().append_dense(100, "bias2");
  Layout wider = Layout().append_sparse_rows(100, 4, "bias");
  Layout narrower = Layout().append_sparse_rows(100, 5, "bias");
  EXPECT_NE(Layout().append_dense(100, "bias").digest(), renamed.digest());
  EXPECT_NE(wider.digest(), narrower.digest());
  EXPECT_NE(Layout().append_dense(100, "bias").digest(), Layout().digest());
  std::ostringstream os;
  os << narrower;
  EXPECT_EQ(os.str(), "bias:rows:[0,100):5");
}

// Through the factory: an invalid layout, and layouts that differ across ranks, throw the
// same std::invalid_argument on every rank (the MPI main reduces failures over ranks).
TEST(LayoutFactory, RejectsInvalidLayoutsOnEveryRank) {
  Communicator comm;
  const Layout gap({Segment{0, 10, SegmentKind::Dense, 1, "a"},
                    Segment{11, 9, SegmentKind::SparseRows, 3, "b"}});
  const std::string message =
      invalid_argument_of([&] { make(Algorithm::S2Reducer, comm, 20, Options(), gap); });
  EXPECT_TRUE(starts_with(message, validate_prefix)) << message;
  EXPECT_TRUE(same_text_on_all_ranks(message)) << message;
  const std::string total = invalid_argument_of(
      [&] { make(Algorithm::OkTopk, comm, 21, Options(), Layout().append_dense(20)); });
  EXPECT_TRUE(starts_with(total, validate_prefix)) << total;
}

TEST(LayoutFactory, RejectsLayoutsThatDifferAcrossRanks) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks";
  Communicator comm;
  for (const Algorithm algorithm : {Algorithm::S2Reducer, Algorithm::TopkA}) {
    // Rank 1 names a segment otherwise, or passes no layout at all.
    for (const bool none : {false, true}) {
      Layout layout = Layout().append_sparse_rows(64, 8, "emb").append_dense(36, "fc");
      if (world_rank() == 1) {
        layout =
            none ? Layout() : Layout().append_sparse_rows(64, 8, "emb").append_dense(36, "fc2");
      }
      const std::string message =
          invalid_argument_of([&] { make(algorithm, comm, 100, Options(), layout); });
      EXPECT_TRUE(
          starts_with(message, "oktopk::make_sparse_allreduce: layout differs across ranks"))
          << message;
      EXPECT_TRUE(same_text_on_all_ranks(message)) << message;
    }
  }
}

// =============================================================================================
// S2 with a layout
// =============================================================================================

/// Checks one S2 call on mixed_layout() against the host oracle: dense segments the exact
/// average, sparse rows outside the union exactly 0, and (exact sketch) union rows the exact
/// average too.
void check_s2_call(const Options& options, bool exact_sketch, std::uint64_t seed) {
  Communicator comm;
  const Layout layout = mixed_layout();
  const std::int64_t n = layout.end();
  const Handle h = make(Algorithm::S2Reducer, comm, n, options, layout);
  const std::vector<float> g = layout_gradient(layout, seed);
  const std::vector<float> out = reduce(*h, g);
  const std::vector<float> sum = sum_over_ranks(g);
  const std::vector<int> marked = in_union(layout, g);
  const float P = static_cast<float>(world_size());
  std::int64_t union_sparse_entries = 0;
  std::int64_t my_sparse_nonzeros = 0;
  for (const Segment& s : layout.segments()) {
    for (std::int64_t i = s.offset; i < s.offset + s.length; ++i) {
      const auto at = static_cast<std::size_t>(i);
      SCOPED_TRACE("segment " + s.name + ", entry " + std::to_string(i));
      if (s.kind == SegmentKind::Dense) {
        ASSERT_EQ(out[at], sum[at] / P);
        continue;
      }
      my_sparse_nonzeros += g[at] != 0.0f;
      if (marked[at] == 0) {
        ASSERT_EQ(out[at], 0.0f);
      } else {
        ++union_sparse_entries;
        if (exact_sketch) ASSERT_EQ(out[at], sum[at] / P);
      }
    }
  }
  EXPECT_EQ(h->stats().global_selected, union_sparse_entries + layout.dense_entries());
  EXPECT_EQ(h->stats().local_selected, my_sparse_nonzeros + layout.dense_entries());
  const auto& segments = h->stats().segments;
  ASSERT_EQ(segments.size(), layout.segments().size());
  for (std::size_t k = 0; k < segments.size(); ++k) {
    const Segment& s = layout.segments()[k];
    std::int64_t nonzeros = 0;
    for (std::int64_t i = s.offset; i < s.offset + s.length; ++i) {
      nonzeros += out[static_cast<std::size_t>(i)] != 0.0f;
    }
    EXPECT_EQ(segments[k].name, s.name);
    EXPECT_EQ(segments[k].nonzeros, nonzeros) << s.name;
  }
}

TEST(S2Layout, ExactSketchGivesTheExactAverage) {
  // Columns >= the sparse entries: every sparse entry has its own cell.
  for (const int rows : {1, 2, 3}) {
    SCOPED_TRACE("sketch rows " + std::to_string(rows));
    check_s2_call(s2_options(rows, mixed_layout().sparse_entries()), true, 11 + rows);
  }
}

// A 3-column sketch cannot hold the dense segments' 208 distinct values: their exact averages
// show that they went around it.
TEST(S2Layout, SmallSketchKeepsDenseExactAndOtherRowsZero) {
  for (const std::int64_t columns : {1, 3, 17}) {
    SCOPED_TRACE("columns " + std::to_string(columns));
    check_s2_call(s2_options(3, columns), false, 40 + static_cast<std::uint64_t>(columns));
  }
}

// One allreduce carries everything: its charge equals that of one allreduce of
// sketch cells + sparse rows + dense entries floats, and no other phase but the input check
// communicates.
TEST(S2Layout, TrafficIsOneAllreduceOfTheFusedBuffer) {
  Communicator comm;
  const Layout layout = mixed_layout();
  const std::int64_t columns = 17;
  const int sketch_rows = 3;
  const Handle h =
      make(Algorithm::S2Reducer, comm, layout.end(), s2_options(sketch_rows, columns), layout);
  reduce(*h, layout_gradient(layout, 3));
  const std::int64_t count = sketch_rows * columns + layout.sparse_rows() + layout.dense_entries();
  // On the handle's nodes, so that the traffic splits inside and between nodes as the handle's.
  Communicator reference = Communicator().with_nodes(h->node_topology().node_of_rank());
  std::vector<float> buffer(static_cast<std::size_t>(count), 1.0f);
  reference.reset_traffic();
  reference.allreduce_in_place(buffer.data(), count, MPI_SUM);
  const auto& phases = h->stats().phases;
  ASSERT_EQ(phases.count("allreduce"), 1u);
  EXPECT_TRUE(phases.at("allreduce").traffic == reference.total_traffic())
      << phases.at("allreduce").traffic.bytes_sent << " bytes sent, expected "
      << reference.total_traffic().bytes_sent;
  for (const auto& [name, phase] : phases) {
    if (name == "allreduce" || name == "check") continue;
    EXPECT_EQ(phase.traffic.bytes_sent + phase.traffic.bytes_received, 0) << name;
  }
  // Default columns: ceil(2 * density * sparse entries).
  const Handle d =
      make(Algorithm::S2Reducer, comm, layout.end(), Options().set_density(0.05), layout);
  reduce(*d, layout_gradient(layout, 4));
  const std::int64_t default_count =
      3 * 34 + layout.sparse_rows() + layout.dense_entries();  // ceil(2 * 0.05 * 333) = 34
  reference.reset_traffic();
  buffer.assign(static_cast<std::size_t>(default_count), 1.0f);
  reference.allreduce_in_place(buffer.data(), default_count, MPI_SUM);
  EXPECT_TRUE(d->stats().phases.at("allreduce").traffic == reference.total_traffic());
}

// With error feedback, the dense entries (sent exactly) leave nothing behind, and an exact
// sketch loses nothing of the sparse ones either.
TEST(S2Layout, ErrorFeedbackKeepsNothingOfExactEntries) {
  Communicator comm;
  const Layout layout = mixed_layout();
  for (const std::int64_t columns : {layout.sparse_entries(), std::int64_t{3}}) {
    Options o = s2_options(3, columns);
    o.set_s2_error_feedback(true);
    const Handle h = make(Algorithm::S2Reducer, comm, layout.end(), o, layout);
    const std::vector<float> g = layout_gradient(layout, 9);
    reduce(*h, g);
    const std::vector<float> residual = to_vector(h->residual());
    for (const Segment& s : layout.segments()) {
      for (std::int64_t i = s.offset; i < s.offset + s.length; ++i) {
        const auto at = static_cast<std::size_t>(i);
        if (s.kind == SegmentKind::Dense || columns == layout.sparse_entries() || g[at] == 0.0f) {
          ASSERT_EQ(residual[at], 0.0f) << s.name << " " << i;
        }
      }
    }
  }
}

// Only dense segments, or one sparse-row segment over everything: the degenerate layouts.
TEST(S2Layout, AllDenseAndAllRows) {
  Communicator comm;
  const float P = static_cast<float>(world_size());
  {
    const Layout layout = Layout().append_dense(50, "a").append_dense(70, "b");
    const Handle h = make(Algorithm::S2Reducer, comm, 120, s2_options(3, 1), layout);
    const std::vector<float> g = layout_gradient(layout, 21);
    const std::vector<float> out = reduce(*h, g);
    const std::vector<float> sum = sum_over_ranks(g);
    for (std::size_t i = 0; i < g.size(); ++i) ASSERT_EQ(out[i], sum[i] / P) << i;
  }
  {
    const Layout layout = Layout().append_sparse_rows(120, 6, "all");
    const Handle h = make(Algorithm::S2Reducer, comm, 120, s2_options(3, 120), layout);
    const std::vector<float> g = layout_gradient(layout, 22);
    const std::vector<float> out = reduce(*h, g);
    const std::vector<float> sum = sum_over_ranks(g);
    const std::vector<int> marked = in_union(layout, g);
    for (std::size_t i = 0; i < g.size(); ++i) {
      ASSERT_EQ(out[i], marked[i] != 0 ? sum[i] / P : 0.0f) << i;
    }
  }
}

// =============================================================================================
// S2 with a layout against oktopk::expected_result
// =============================================================================================

/// The oracle on data the host model above decides exactly: dense segments the exact average,
/// rows outside the union 0, and with an exact sketch the union rows the exact average; a
/// small sketch is checked there only by count_mismatches.
TEST(S2LayoutOracle, AgreesWithTheHostModel) {
  Communicator comm;
  const Exec exec;
  const Layout layout = mixed_layout();
  const std::int64_t n = layout.end();
  const float P = static_cast<float>(world_size());
  for (const std::int64_t columns : {layout.sparse_entries(), std::int64_t{17}}) {
    SCOPED_TRACE("columns " + std::to_string(columns));
    const bool exact = columns == layout.sparse_entries();
    const Handle h = make(Algorithm::S2Reducer, comm, n, s2_options(3, columns), layout);
    const std::vector<float> g = layout_gradient(layout, 61);
    const auto out = to_view(reduce(*h, g), "out");
    Kokkos::View<float*, Mem> expected("expected", static_cast<std::size_t>(n));
    Kokkos::View<float*, Mem> slack("slack", static_cast<std::size_t>(n));
    oktopk::expected_result(exec, *h, to_view(g, "acc"), expected, oktopk::default_oracle_tolerance,
                            slack);
    const std::vector<float> e = to_vector(expected);
    const std::vector<float> sum = sum_over_ranks(g);
    const std::vector<int> marked = in_union(layout, g);
    for (const Segment& s : layout.segments()) {
      for (std::int64_t i = s.offset; i < s.offset + s.length; ++i) {
        const auto at = static_cast<std::size_t>(i);
        SCOPED_TRACE("segment " + s.name + ", entry " + std::to_string(i));
        if (s.kind == SegmentKind::Dense || (marked[at] != 0 && exact)) {
          ASSERT_EQ(e[at], sum[at] / P);
        } else if (marked[at] == 0) {
          ASSERT_EQ(e[at], 0.0f);
        } else {
          ASSERT_TRUE(std::isfinite(e[at]));
        }
      }
    }
    EXPECT_EQ(
        oktopk::count_mismatches(exec, *h, expected, out, oktopk::default_oracle_tolerance, slack),
        0);
  }
}

/// Per rank, layout_gradient scaled by a factor of the rank and call that makes its sums inexact.
std::vector<float> inexact_gradient(const Layout& layout, std::uint64_t seed) {
  std::vector<float> g = layout_gradient(layout, seed);
  const float scale = 0.7071f + 0.0131f * static_cast<float>(world_rank()) +
                      0.00173f * static_cast<float>(seed % 7);
  for (float& v : g) v *= scale;
  return g;
}

/// Runs `calls` S2 calls on `layout`, checking each output against expected_result, with the
/// slack and without it (then order-sensitive entries are skipped). The input handed to the
/// oracle is the residual before the call plus the gradient, as oktopk-bench computes it.
void check_against_oracle(const Layout& layout, const Options& options, int calls,
                          std::uint64_t seed) {
  Communicator comm;
  const Exec exec;
  const std::int64_t n = layout.end();
  const auto length = static_cast<std::size_t>(n);
  const Handle h = make(Algorithm::S2Reducer, comm, n, options, layout);
  Kokkos::View<float*, Mem> expected("expected", length);
  Kokkos::View<float*, Mem> slack("slack", length);
  Kokkos::View<float*, Mem> unchecked("unchecked", 0);
  for (int call = 0; call < calls; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    const std::vector<float> g = (call % 2 == 0 ? inexact_gradient : layout_gradient)(
        layout, seed + static_cast<std::uint64_t>(call));
    std::vector<float> acc = to_vector(h->residual());
    for (std::size_t i = 0; i < length; ++i) acc[i] += g[i];
    const auto acc_view = to_view(acc, "acc");
    const auto out = to_view(reduce(*h, g), "out");
    oktopk::expected_result(exec, *h, acc_view, expected, oktopk::default_oracle_tolerance, slack);
    // With the slack every entry is checked: none is left undecided.
    for (const float e : to_vector(expected)) ASSERT_FALSE(std::isnan(e));
    EXPECT_EQ(
        oktopk::count_mismatches(exec, *h, expected, out, oktopk::default_oracle_tolerance, slack),
        0);
    oktopk::expected_result(exec, *h, acc_view, expected, oktopk::default_oracle_tolerance,
                            unchecked);
    EXPECT_EQ(oktopk::count_mismatches(exec, *h, expected, out), 0);
  }
}

/// Rows of several widths, one of them with fewer entries than most runs have ranks.
Layout rows_only_layout() {
  return Layout()
      .append_sparse_rows(64, 8, "wide")
      .append_sparse_rows(13, 5, "short_last_row")
      .append_sparse_rows(30, 1, "single_entries")
      .append_sparse_rows(3, 2, "three_entries");
}

/// Tiny segments between dense ones: a rows segment of 1 entry and one of 3 (n < P at P = 4),
/// a row wider than its segment, and empty segments of both kinds at both ends.
Layout tiny_rows_layout() {
  return Layout()
      .append_sparse_rows(0, 3, "empty_rows")
      .append_dense(10, "a")
      .append_sparse_rows(1, 4, "one")
      .append_dense(0, "empty")
      .append_sparse_rows(3, 2, "three")
      .append_dense(5, "b")
      .append_sparse_rows(2, 7, "wide_row")
      .append_dense(0, "empty_end");
}

struct OracleCase {
  const char* name;
  Layout layout;
};

std::vector<OracleCase> oracle_cases() {
  return {{"rows only", rows_only_layout()},
          {"dense only", Layout().append_dense(50, "a").append_dense(70, "b")},
          {"mixed", mixed_layout()},
          {"tiny rows", tiny_rows_layout()}};
}

// Small sketches (collisions: the median and the slack matter), an even number of sketch rows
// (the mean of the two middle estimates), and exact ones; error feedback off and on, several
// calls each, so that with feedback the residual carries inexact values into later calls.
TEST(S2LayoutOracle, MatchesTheMethod) {
  for (const OracleCase& c : oracle_cases()) {
    for (const bool feedback : {false, true}) {
      // Columns 0 stands for an exact sketch here: as many columns as sparse entries. The list's
      // type is named: CUDA 11's nvcc deduces none from the braces.
      for (const auto& [sketch_rows, columns] :
           std::initializer_list<std::pair<int, std::int64_t>>{{3, 5}, {4, 17}, {1, 3}, {3, 0}}) {
        const std::int64_t width = columns == 0 ? c.layout.sparse_entries() : columns;
        SCOPED_TRACE(std::string(c.name) + ", feedback " + (feedback ? "on" : "off") + ", sketch " +
                     std::to_string(sketch_rows) + " x " + std::to_string(width));
        Options o = s2_options(sketch_rows, width);
        o.set_s2_error_feedback(feedback);
        check_against_oracle(c.layout, o, 4, 300);
      }
    }
  }
}

// On a 16-bit wire the fused buffer is averaged by the ring in that type: every call within
// the oracle's slack for the ring's roundings, with error feedback off and on.
TEST(S2LayoutOracle, MatchesTheMethodOnA16BitWire) {
  for (const OracleCase& c : oracle_cases()) {
    for (const oktopk::Wire wire : {oktopk::Wire::BFloat16, oktopk::Wire::Float16}) {
      for (const bool feedback : {false, true}) {
        for (const auto& [sketch_rows, columns] :
             std::initializer_list<std::pair<int, std::int64_t>>{{3, 5}, {4, 17}}) {
          std::ostringstream name;
          name << c.name << ", wire " << wire << ", feedback " << (feedback ? "on" : "off")
               << ", sketch " << sketch_rows << " x " << columns;
          SCOPED_TRACE(name.str());
          Options o = s2_options(sketch_rows, columns);
          o.set_s2_error_feedback(feedback).set_wire(wire);
          check_against_oracle(c.layout, o, 4, 300);
        }
      }
    }
  }
}

// On a 16-bit wire with error feedback, this rank's rounding of what it sends stays behind: a
// Dense entry keeps g - round(g), and so does a sparse-row entry of an exact sketch, whose own
// estimate is its cells as sent.
TEST(S2Layout, ErrorFeedbackOnA16BitWireKeepsThisRanksRoundings) {
  Communicator comm;
  const Layout layout = mixed_layout();
  Options o = s2_options(3, layout.sparse_entries());
  o.set_s2_error_feedback(true).set_wire(oktopk::Wire::BFloat16);
  const Handle h = make(Algorithm::S2Reducer, comm, layout.end(), o, layout);
  const std::vector<float> g = inexact_gradient(layout, 9);  // most values bfloat16 lacks
  reduce(*h, g);
  const std::vector<float> residual = to_vector(h->residual());
  std::int64_t differ = 0;
  std::int64_t kept = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const float expected = g[i] - oktopk::to_float(oktopk::round_to<oktopk::bfloat16>(g[i]));
    differ += residual[i] == expected ? 0 : 1;
    kept += expected != 0.0f ? 1 : 0;
  }
  EXPECT_EQ(differ, 0);
  EXPECT_GT(kept, 0);
}

// Dense warm-up calls take the dense oracle; the calls after them the S2 one, with the
// residual error feedback builds from then on.
TEST(S2LayoutOracle, AfterDenseWarmUp) {
  Options o = s2_options(3, 7);
  o.set_warmup_iterations(2).set_s2_error_feedback(true);
  check_against_oracle(mixed_layout(), o, 5, 400);
}

// =============================================================================================
// Other methods, the empty layout, checkpoints
// =============================================================================================

// A layout leaves every other method's output as it is, bit for bit, and fills
// stats().segments with each segment's output non-zeros; the empty layout changes nothing,
// for S2 too.
TEST(LayoutOtherMethods, SameOutputAndSegmentCounts) {
  Communicator comm;
  const Layout layout = mixed_layout();
  const std::int64_t n = layout.end();
  Options o;
  o.set_density(0.05);
  for (const Algorithm algorithm :
       {Algorithm::Dense, Algorithm::TopkA, Algorithm::TopkDSA, Algorithm::GTopk,
        Algorithm::GaussianK, Algorithm::OkTopk, Algorithm::S2Reducer}) {
    SCOPED_TRACE(oktopk::to_string(algorithm));
    const bool s2 = algorithm == Algorithm::S2Reducer;
    const Handle plain = oktopk::make_sparse_allreduce(Exec(), algorithm, comm, n, o);
    const Handle labelled = make(algorithm, comm, n, o, s2 ? Layout() : layout);
    for (std::uint64_t call = 1; call <= 3; ++call) {
      const std::vector<float> g = layout_gradient(layout, 100 + call);
      const std::vector<float> a = reduce(*plain, g);
      const std::vector<float> b = reduce(*labelled, g);
      for (std::size_t i = 0; i < a.size(); ++i) {
        ASSERT_EQ(oktopk::test::bits_of(a[i]), oktopk::test::bits_of(b[i]))
            << "call " << call << " entry " << i;
      }
      EXPECT_TRUE(plain->stats().segments.empty());
      if (s2) {
        EXPECT_TRUE(labelled->stats().segments.empty());
        continue;
      }
      const auto& segments = labelled->stats().segments;
      ASSERT_EQ(segments.size(), layout.segments().size());
      for (std::size_t k = 0; k < segments.size(); ++k) {
        const Segment& s = layout.segments()[k];
        std::int64_t nonzeros = 0;
        for (std::int64_t i = s.offset; i < s.offset + s.length; ++i) {
          nonzeros += b[static_cast<std::size_t>(i)] != 0.0f;
        }
        EXPECT_EQ(segments[k].name, s.name);
        EXPECT_EQ(segments[k].nonzeros, nonzeros) << s.name;
      }
    }
  }
}

std::string saved(const oktopk::SparseAllreduce<Exec>& h) {
  std::ostringstream os;
  h.save_state(Exec(), os);
  return os.str();
}

// A checkpoint belongs to its layout: restoring it into a handle with another layout (or
// none) fails on every rank with std::invalid_argument; the same layout restores. Handles
// without a layout still write format version 1.
TEST(LayoutCheckpoint, RejectsAnotherLayout) {
  Communicator comm;
  const Layout layout = mixed_layout();
  const Layout renamed =
      Layout(std::vector<Segment>(layout.segments().begin(), layout.segments().end()))
          .append_dense(0, "extra");
  const std::int64_t n = layout.end();
  const Options o = s2_options(3, 20);
  const Handle with = make(Algorithm::S2Reducer, comm, n, o, layout);
  const Handle without = oktopk::make_sparse_allreduce(Exec(), Algorithm::S2Reducer, comm, n, o);
  const Handle other = make(Algorithm::S2Reducer, comm, n, o, renamed);
  reduce(*with, layout_gradient(layout, 1));
  reduce(*without, layout_gradient(layout, 1));
  const std::string with_blob = saved(*with);
  const std::string without_blob = saved(*without);
  EXPECT_EQ(static_cast<unsigned char>(with_blob[8]), 2u);
  EXPECT_EQ(static_cast<unsigned char>(without_blob[8]), 1u);
  const auto restore = [](oktopk::SparseAllreduce<Exec>& h, const std::string& blob) {
    std::istringstream is(blob);
    h.restore_state(Exec(), is);
  };
  using Mismatch = std::pair<oktopk::SparseAllreduce<Exec>*, const std::string*>;
  for (const auto& mismatch : std::initializer_list<Mismatch>{
           {other.get(), &with_blob}, {without.get(), &with_blob}, {with.get(), &without_blob}}) {
    // Named copies: C++17 lambdas cannot capture structured bindings.
    oktopk::SparseAllreduce<Exec>* const target = mismatch.first;
    const std::string* const blob = mismatch.second;
    const std::string message = invalid_argument_of([&] { restore(*target, *blob); });
    EXPECT_TRUE(starts_with(message, "oktopk::SparseAllreduce::restore_state: rank 0: "))
        << message;
    EXPECT_NE(message.find("another layout"), std::string::npos) << message;
    EXPECT_TRUE(same_text_on_all_ranks(message)) << message;
  }
  // The same layout: the next calls continue identically.
  const Handle twin = make(Algorithm::S2Reducer, comm, n, o, layout);
  restore(*twin, with_blob);
  const std::vector<float> g = layout_gradient(layout, 2);
  const std::vector<float> a = reduce(*with, g);
  const std::vector<float> b = reduce(*twin, g);
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(oktopk::test::bits_of(a[i]), oktopk::test::bits_of(b[i])) << i;
  }
}

}  // namespace
