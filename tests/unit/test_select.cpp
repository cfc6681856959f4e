// SPDX-License-Identifier: BSD-3-Clause
// count_above, select_above, select_above_and_ties (and impl::select_pairs_above,
// impl::tied_end_of, which tells what it took, and impl::compact_in_order, their GPU form),
// select_above_counted (after impl::accumulate_counting) and select_above_by_region against
// host references, per space.
#include "exec_spaces.hpp"
#include "host_reference.hpp"
#include "test_data.hpp"

#include <oktopk/select.hpp>
#include <oktopk/impl/kernels/ordered_compaction.hpp>
#include <oktopk/impl/kernels/vector_ops.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace oktopk::test;
using oktopk::count_type;
using oktopk::index_type;

template <class ExecSpace>
class Select : public ::testing::Test {};
TYPED_TEST_SUITE(Select, EnabledSpaces);

constexpr index_type index_sentinel = -7;
const float value_sentinel = float_from_bits(0x7fe5a5a5u);  // a NaN payload no kernel produces

/// Thresholds worth trying on x: zero of both signs, negative (every non-NaN is selected),
/// +-Inf, NaN (nothing is selected), a plain value, and |x| of an entry of x (strict: that
/// entry is not selected).
std::vector<float> thresholds_for(const std::vector<float>& x) {
  std::vector<float> t = {0.0f, -0.0f, -1.0f, -inf, inf, std::numeric_limits<float>::quiet_NaN(),
                          1.0f};
  for (std::size_t i = x.size() / 2; i < x.size(); ++i) {
    if (!std::isnan(x[i])) {
      t.push_back(std::fabs(x[i]));
      break;
    }
  }
  return t;
}

std::string case_name(DataKind kind, std::size_t n, float threshold) {
  return std::string(to_string(kind)) + ", n = " + std::to_string(n) +
         ", threshold = " + describe(threshold);
}

TYPED_TEST(Select, CountAboveMatchesReference) {
  const TypeParam exec;
  for (const auto kind : all_data_kinds) {
    for (const auto n : test_sizes) {
      const auto& x = cached_data(kind, n);
      const auto x_view = to_view<TypeParam>(x, "x");
      for (const float t : thresholds_for(x)) {
        SCOPED_TRACE(case_name(kind, n, t));
        EXPECT_EQ(oktopk::count_above(exec, x_view, t), ref::count_above(x, t));
      }
    }
  }
}

/// count_above's kernel on GPUs (impl::count_above_strided), on every space: work items of 8
/// entries spread over x, the last ones partial, on the test sizes and around multiples of 8.
TYPED_TEST(Select, CountAboveInTheGpuShapeMatchesReference) {
  const TypeParam exec;
  std::vector<std::size_t> sizes(std::begin(test_sizes), std::end(test_sizes));
  for (const std::size_t n : {8, 9, 15, 16, 17, 63, 64, 65, 4097}) sizes.push_back(n);
  for (const auto kind : all_data_kinds) {
    for (const auto n : sizes) {
      const auto& x = cached_data(kind, n);
      const auto x_view = to_view<TypeParam>(x, "x");
      for (const float t : thresholds_for(x)) {
        SCOPED_TRACE(case_name(kind, n, t));
        EXPECT_EQ(oktopk::impl::count_above_strided(exec, x_view, t), ref::count_above(x, t));
      }
    }
  }
}

TYPED_TEST(Select, SelectAboveMatchesReference) {
  const TypeParam exec;
  for (const auto kind : all_data_kinds) {
    for (const auto n : test_sizes) {
      const auto& x = cached_data(kind, n);
      const auto x_view = to_view<TypeParam>(x, "x");
      for (const float t : thresholds_for(x)) {
        SCOPED_TRACE(case_name(kind, n, t));
        auto expected = ref::select_above(x, t);
        const auto count = static_cast<std::int64_t>(expected.indices.size());
        // Room for three more than needed: those must keep their sentinels.
        const auto capacity = static_cast<std::size_t>(count) + 3;
        auto indices = filled_view<TypeParam>(capacity, index_sentinel, "indices");
        auto values = filled_view<TypeParam>(capacity, value_sentinel, "values");
        EXPECT_EQ(oktopk::select_above(exec, x_view, t, indices, values), count);
        expected.indices.resize(capacity, index_sentinel);
        expected.values.resize(capacity, value_sentinel);
        EXPECT_TRUE(same_entries(to_vector(exec, indices), expected.indices));
        EXPECT_TRUE(same_entries(to_vector(exec, values), expected.values));
      }
    }
  }
}

/// The host reference of select_above_and_ties: the entries above t and the first `ties` equal
/// to it, in index order.
ref::Selection select_above_and_ties_reference(const std::vector<float>& x, float t,
                                               std::int64_t ties) {
  ref::Selection s;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float m = std::fabs(x[i]);
    const bool tie = m == t && ties > 0;
    if (m > t || tie) {
      s.indices.push_back(static_cast<index_type>(i));
      s.values.push_back(x[i]);
    }
    if (tie) --ties;
  }
  return s;
}

/// The outputs hold the first `count` entries of `expected`.
template <class ExecSpace, class IdxView, class ValView>
void expect_first_entries(const ExecSpace& exec, const IdxView& indices, const ValView& values,
                          const ref::Selection& expected, std::size_t count) {
  const std::vector<index_type> first_indices(expected.indices.begin(),
                                              expected.indices.begin() + count);
  const std::vector<float> first_values(expected.values.begin(), expected.values.begin() + count);
  EXPECT_TRUE(same_entries(to_vector(exec, indices), first_indices));
  EXPECT_TRUE(same_entries(to_vector(exec, values), first_values));
}

/// select_above_and_ties, and impl::select_pairs_above (its form for (index, value) pairs),
/// against the reference, for no ties, some, and more than there are; with a spare capacity
/// of three that keeps its sentinels, and with a capacity of half the count.
TYPED_TEST(Select, SelectAboveAndTiesMatchesReference) {
  const TypeParam exec;
  for (const auto kind : all_data_kinds) {
    for (const auto n : test_sizes) {
      const auto& x = cached_data(kind, n);
      const auto x_view = to_view<TypeParam>(x, "x");
      std::vector<index_type> all_indices(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) all_indices[i] = static_cast<index_type>(i);
      const auto index_view = to_view<TypeParam>(all_indices, "all_indices");
      for (const float t : thresholds_for(x)) {
        const auto equal = static_cast<std::int64_t>(
            std::count_if(x.begin(), x.end(), [t](float v) { return std::fabs(v) == t; }));
        for (const std::int64_t ties :
             {std::int64_t{0}, std::int64_t{1}, std::int64_t{3}, equal / 2, equal + 2}) {
          SCOPED_TRACE(case_name(kind, n, t) + ", ties = " + std::to_string(ties) + " of " +
                       std::to_string(equal));
          auto expected = select_above_and_ties_reference(x, t, ties);
          const auto count = static_cast<std::int64_t>(expected.indices.size());
          const auto capacity = static_cast<std::size_t>(count) + 3;
          auto indices = filled_view<TypeParam>(capacity, index_sentinel, "indices");
          auto values = filled_view<TypeParam>(capacity, value_sentinel, "values");
          EXPECT_EQ(oktopk::select_above_and_ties(exec, x_view, t, ties, indices, values), count);
          auto pair_indices = filled_view<TypeParam>(capacity, index_sentinel, "pair_indices");
          auto pair_values = filled_view<TypeParam>(capacity, value_sentinel, "pair_values");
          EXPECT_EQ(oktopk::impl::select_pairs_above(exec, index_view, x_view,
                                                     static_cast<std::int64_t>(x.size()), t, ties,
                                                     pair_indices, pair_values),
                    count);
          const auto half = static_cast<std::size_t>(count / 2);
          auto short_indices = filled_view<TypeParam>(half, index_sentinel, "short_indices");
          auto short_values = filled_view<TypeParam>(half, value_sentinel, "short_values");
          EXPECT_EQ(
              oktopk::select_above_and_ties(exec, x_view, t, ties, short_indices, short_values),
              count);
          expect_first_entries(exec, short_indices, short_values, expected, half);
          // What the selection took, told apart by impl::LocalSelection from tied_end_of.
          const oktopk::impl::LocalSelection took{
              t, oktopk::impl::tied_end_of(exec, indices, values, count, t)};
          std::vector<char> selected(x.size(), 0);
          for (const index_type i : expected.indices) selected[static_cast<std::size_t>(i)] = 1;
          std::int64_t misjudged = 0;
          for (std::size_t i = 0; i < x.size(); ++i) {
            misjudged += took.took(x[i], static_cast<std::int64_t>(i)) != (selected[i] != 0);
          }
          EXPECT_EQ(misjudged, 0) << "tied_end " << took.tied_end;
          expected.indices.resize(capacity, index_sentinel);
          expected.values.resize(capacity, value_sentinel);
          EXPECT_TRUE(same_entries(to_vector(exec, indices), expected.indices));
          EXPECT_TRUE(same_entries(to_vector(exec, values), expected.values));
          EXPECT_TRUE(same_entries(to_vector(exec, pair_indices), expected.indices));
          EXPECT_TRUE(same_entries(to_vector(exec, pair_values), expected.values));
        }
      }
    }
  }
  const auto x_view = to_view<TypeParam>(std::vector<float>{1.0f}, "x");
  auto indices = filled_view<TypeParam>(1, index_sentinel, "indices");
  auto values = filled_view<TypeParam>(1, value_sentinel, "values");
  EXPECT_THROW(oktopk::select_above_and_ties(exec, x_view, 1.0f, -1, indices, values),
               std::invalid_argument);
}

/// compact_in_order's first kernel at the team sizes a GPU takes (host teams have one or a few
/// threads): each thread's rows of adjacent reads (mark_row), then each thread's word of 32
/// adjacent entries from them (word_from_rows), run here thread by thread, must equal the
/// words read straight from the entries, for teams of 1 to 256 threads, full and partial tiles.
TEST(OrderedCompaction, WordsFromRowsAtEveryTeamSize) {
  using Exec = Kokkos::DefaultHostExecutionSpace;
  using XView = Kokkos::View<float*, Exec::memory_space>;
  using IdxView = Kokkos::View<index_type*, Exec::memory_space>;
  using ValView = Kokkos::View<float*, Exec::memory_space>;
  using Keep = oktopk::impl::KeepAbove<Exec, XView, IdxView, ValView, true>;
  using Kernels = oktopk::impl::OrderedCompaction<Keep>;
  const float threshold = 1.0f;
  for (int shift = 0; shift <= 8; ++shift) {
    const std::int64_t tile_entries = std::int64_t{32} << shift;
    for (const std::int64_t n : {tile_entries, 2 * tile_entries + 37, std::int64_t{1}}) {
      SCOPED_TRACE("team size " + std::to_string(1 << shift) + ", n = " + std::to_string(n));
      // Every third entry above the threshold, every fifth at it (tied), the rest below.
      XView x("x", static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) {
        x(i) = i % 3 == 0 ? 2.0f : (i % 5 == 0 ? -threshold : 0.5f);
      }
      const Kernels kernels{Keep{x, threshold, 0, {}, {}, 0}, {}, {}, {}, n, shift};
      const int team_size = 1 << shift;
      Kokkos::View<std::uint32_t*, Kokkos::HostSpace> above_rows(
          "above_rows", static_cast<std::size_t>(Kernels::rows_per_team(shift)));
      Kokkos::View<std::uint32_t*, Kokkos::HostSpace> tied_rows(
          "tied_rows", static_cast<std::size_t>(Kernels::rows_per_team(shift)));
      const std::int64_t tiles = (n + tile_entries - 1) / tile_entries;
      for (std::int64_t tile = 0; tile < tiles; ++tile) {
        for (int t = 0; t < team_size; ++t) {
          std::uint32_t above = 0;
          std::uint32_t tied = 0;
          kernels.mark_row(tile, t, above, tied);
          above_rows(oktopk::impl::padded_row(t)) = above;
          tied_rows(oktopk::impl::padded_row(t)) = tied;
        }
        for (int t = 0; t < team_size; ++t) {
          std::uint32_t expected_above = 0;
          std::uint32_t expected_tied = 0;
          for (int j = 0; j < 32; ++j) {
            const std::int64_t i = tile * tile_entries + 32 * t + j;
            if (i >= n) break;
            const float m = std::fabs(x(i));
            expected_above |= m > threshold ? std::uint32_t{1} << j : 0u;
            expected_tied |= m == threshold ? std::uint32_t{1} << j : 0u;
          }
          ASSERT_EQ(kernels.word_from_rows(above_rows, t), expected_above)
              << "tile " << tile << ", word " << t;
          ASSERT_EQ(kernels.word_from_rows(tied_rows, t), expected_tied)
              << "tile " << tile << ", word " << t;
        }
      }
    }
  }
}

/// impl::compact_in_order, the compaction behind select_above and select_above_and_ties on
/// GPUs, on every space: the references' entries, with three spare slots that keep their
/// sentinels, and with room for half of them (the first half written, the count whole), at the
/// test sizes and around the ends of its 32-entry words and its tiles (up to 256 words).
TYPED_TEST(Select, OrderedCompactionMatchesReference) {
  using Exec = TypeParam;
  using oktopk::impl::PackedCounts;
  const Exec exec;
  std::vector<std::size_t> sizes(std::begin(test_sizes), std::end(test_sizes));
  for (const std::size_t n : {31, 32, 33, 8191, 8192, 8193, 65537}) sizes.push_back(n);
  for (const auto kind : all_data_kinds) {
    for (const auto n : sizes) {
      const auto& x = cached_data(kind, n);
      const auto x_view = to_view<Exec>(x, "x");
      using XView = std::decay_t<decltype(x_view)>;
      for (const float t : thresholds_for(x)) {
        const auto equal = static_cast<std::int64_t>(
            std::count_if(x.begin(), x.end(), [t](float v) { return std::fabs(v) == t; }));
        for (const std::int64_t ties : {std::int64_t{-1}, std::int64_t{0}, equal / 2, equal + 1}) {
          SCOPED_TRACE(case_name(kind, n, t) + ", ties = " + std::to_string(ties));
          auto expected =
              ties < 0 ? ref::select_above(x, t) : select_above_and_ties_reference(x, t, ties);
          const auto count = static_cast<std::int64_t>(expected.indices.size());
          const auto capacity = static_cast<std::size_t>(count) + 3;
          auto indices = filled_view<Exec>(capacity, index_sentinel, "indices");
          auto values = filled_view<Exec>(capacity, value_sentinel, "values");
          using Idx = decltype(indices);
          using Val = decltype(values);
          const PackedCounts room = capacity;
          std::int64_t selected = 0;
          // One alias of each name in this function: of four local aliases named alike, CUDA
          // 11's nvcc left the last two out of the host code it hands the host compiler.
          using Keep = oktopk::impl::KeepAbove<Exec, XView, Idx, Val, false>;
          using KeepTies = oktopk::impl::KeepAbove<Exec, XView, Idx, Val, true>;
          if (ties < 0) {
            selected = static_cast<std::int64_t>(oktopk::impl::compact_in_order(
                exec, static_cast<std::int64_t>(n), Keep{x_view, t, 0, indices, values, room}));
          } else {
            const PackedCounts packed = oktopk::impl::compact_in_order(
                exec, static_cast<std::int64_t>(n),
                KeepTies{x_view, t, static_cast<PackedCounts>(ties), indices, values, room});
            const auto above = static_cast<std::int64_t>(packed & oktopk::impl::above_mask);
            EXPECT_EQ(static_cast<std::int64_t>(packed >> oktopk::impl::tied_shift), equal);
            selected = above + std::min(equal, ties);
          }
          EXPECT_EQ(selected, count);
          // Room for half: the first half written, the count the same.
          const auto half = static_cast<std::size_t>(count / 2);
          auto short_indices = filled_view<Exec>(half, index_sentinel, "short_indices");
          auto short_values = filled_view<Exec>(half, value_sentinel, "short_values");
          const PackedCounts short_room = half;
          PackedCounts short_packed = 0;
          if (ties < 0) {
            short_packed = oktopk::impl::compact_in_order(
                exec, static_cast<std::int64_t>(n),
                Keep{x_view, t, 0, short_indices, short_values, short_room});
          } else {
            short_packed =
                oktopk::impl::compact_in_order(exec, static_cast<std::int64_t>(n),
                                               KeepTies{x_view, t, static_cast<PackedCounts>(ties),
                                                        short_indices, short_values, short_room});
          }
          EXPECT_EQ(short_packed & oktopk::impl::above_mask,
                    static_cast<PackedCounts>(ref::count_above(x, t)));
          expect_first_entries(exec, short_indices, short_values, expected, half);
          expected.indices.resize(capacity, index_sentinel);
          expected.values.resize(capacity, value_sentinel);
          EXPECT_TRUE(same_entries(to_vector(exec, indices), expected.indices));
          EXPECT_TRUE(same_entries(to_vector(exec, values), expected.values));
        }
      }
    }
  }
}

/// impl::accumulate_counting (acc = residual + grad with its counts at every level, per chunk
/// too on host spaces), its GPU form and count_above_levels's (run on every space),
/// impl::count_above_by_chunk and impl::count_above_levels, followed by select_above_counted,
/// against the host reference of the same sum.
TYPED_TEST(Select, AccumulateCountingThenSelectAboveCountedMatchesReference) {
  using Memory = typename TypeParam::memory_space;
  const TypeParam exec;
  for (const auto kind : all_data_kinds) {
    for (const auto n : test_sizes) {
      const auto& grad = cached_data(kind, n);
      // A residual of small multiples of 1/4: the sums differ from grad, stay exact for
      // ordinary values, and keep NaN and Inf where grad has them.
      std::vector<float> residual(n);
      for (std::size_t i = 0; i < n; ++i) residual[i] = static_cast<float>(i % 5) * 0.25f - 0.5f;
      std::vector<float> acc(n);
      for (std::size_t i = 0; i < n; ++i) acc[i] = residual[i] + grad[i];
      const auto grad_view = to_view<TypeParam>(grad, "grad");
      const auto residual_view = to_view<TypeParam>(residual, "residual");
      Kokkos::View<float*, Memory> acc_view("acc", n);
      const auto chunks = oktopk::impl::chunk_count<TypeParam>(static_cast<std::int64_t>(n));
      Kokkos::View<count_type**, Kokkos::LayoutRight, Memory> level_counts(
          "level_counts", oktopk::impl::max_count_levels, chunks);
      const auto chunk_counts = Kokkos::subview(level_counts, 0, Kokkos::ALL);
      for (const float t : thresholds_for(acc)) {
        SCOPED_TRACE(case_name(kind, n, t));
        // Levels as Ok-Topk's guard visits them from t: t / 1.25^2, t / 1.25, t, 1.25 t,
        // 1.25^2 t (rising, so only for a positive t), else t and two raised ones.
        const bool positive = std::isfinite(t) && t > 0.0f;
        const auto levels = oktopk::impl::guard_levels(t, 1.25, positive ? 2 : 0, 3);
        const auto counts = oktopk::impl::accumulate_counting(exec, residual_view, grad_view,
                                                              acc_view, levels, level_counts);
        // Computed sums: a NaN's payload is the hardware's (CUDA makes 0x7fffffff).
        EXPECT_TRUE(same_values(to_vector(exec, acc_view), acc));
        const auto expected_nonfinite =
            std::count_if(acc.begin(), acc.end(), [](float v) { return !std::isfinite(v); });
        EXPECT_EQ(counts.nonfinite, expected_nonfinite);
        // Each level's total and (host spaces, which keep them) each chunk's count: the
        // reference over that chunk's entries.
        constexpr bool rows_kept = oktopk::impl::runs_on_host_v<TypeParam>;
        const auto chunk = oktopk::impl::chunk_length_v<TypeParam>;
        std::int64_t wrong_chunks = 0;
        for (int j = 0; j < levels.count; ++j) {
          const float level_t = levels.threshold[j];
          EXPECT_EQ(counts.above[j], ref::count_above(acc, level_t)) << "level " << j;
          const auto row = to_vector(exec, Kokkos::subview(level_counts, j, Kokkos::ALL));
          for (std::int64_t c = 0; rows_kept && c < chunks; ++c) {
            const auto begin = static_cast<std::size_t>(c * chunk);
            const auto end = std::min(n, static_cast<std::size_t>((c + 1) * chunk));
            const std::vector<float> part(acc.begin() + begin, acc.begin() + end);
            if (row[c] != ref::count_above(part, level_t)) ++wrong_chunks;
          }
        }
        EXPECT_EQ(wrong_chunks, 0);
        const auto got = to_vector(exec, chunk_counts);
        // Counting again (as Ok-Topk's guard does past the counted levels) stores the same.
        const float first = levels.threshold[0];
        Kokkos::deep_copy(chunk_counts, count_type{-1});
        EXPECT_EQ(oktopk::impl::count_above_by_chunk(exec, acc_view, first, chunk_counts),
                  counts.above[0]);
        if (rows_kept) EXPECT_TRUE(same_entries(to_vector(exec, chunk_counts), got));
        // The GPU forms of both counting passes (rounds of entries spread over the vector),
        // run on every space: the same totals, and the same sums.
        {
          Kokkos::View<float*, Memory> acc_again("acc_again", n);
          std::int64_t pass[1 + oktopk::impl::max_count_levels] = {};
          oktopk::impl::accumulate_counting_strided(exec, residual_view, grad_view, acc_again,
                                                    levels, pass);
          EXPECT_TRUE(same_values(to_vector(exec, acc_again), acc));
          EXPECT_EQ(pass[0], expected_nonfinite);
          std::int64_t above[oktopk::impl::max_count_levels] = {};
          oktopk::impl::count_above_levels_strided(exec, acc_view, levels, above);
          for (int j = 0; j < levels.count; ++j) {
            EXPECT_EQ(pass[1 + j], ref::count_above(acc, levels.threshold[j])) << "level " << j;
            EXPECT_EQ(above[j], pass[1 + j]) << "level " << j;
          }
        }
        // All levels in one pass, as the global guard counts: the totals alone, then with
        // each chunk's counts kept (host spaces), the same as the accumulate pass's.
        std::int64_t totals[oktopk::impl::max_count_levels] = {};
        oktopk::impl::count_above_levels(exec, acc_view, levels, totals);
        for (int j = 0; j < levels.count; ++j) {
          EXPECT_EQ(totals[j], ref::count_above(acc, levels.threshold[j])) << "level " << j;
        }
        if constexpr (oktopk::impl::runs_on_host_v<TypeParam>) {
          Kokkos::View<count_type**, Kokkos::LayoutRight, Memory> kept(
              "kept", oktopk::impl::max_count_levels, chunks);
          Kokkos::deep_copy(kept, count_type{-1});
          std::int64_t kept_totals[oktopk::impl::max_count_levels] = {};
          oktopk::impl::count_above_levels(exec, acc_view, levels, kept_totals, kept);
          std::int64_t wrong_rows = 0;
          for (int j = 0; j < levels.count; ++j) {
            EXPECT_EQ(kept_totals[j], totals[j]) << "level " << j;
            const auto row = to_vector(exec, Kokkos::subview(kept, j, Kokkos::ALL));
            if (row != to_vector(exec, Kokkos::subview(level_counts, j, Kokkos::ALL))) ++wrong_rows;
          }
          EXPECT_EQ(wrong_rows, 0);
        }

        // Selection at the first level, from its counts.
        auto expected = ref::select_above(acc, first);
        const auto count = static_cast<std::int64_t>(expected.indices.size());
        const auto capacity = static_cast<std::size_t>(count) + 3;
        auto indices = filled_view<TypeParam>(capacity, index_sentinel, "indices");
        auto values = filled_view<TypeParam>(capacity, value_sentinel, "values");
        EXPECT_EQ(
            oktopk::select_above_counted(exec, acc_view, first, chunk_counts, indices, values),
            count);
        expected.indices.resize(capacity, index_sentinel);
        expected.values.resize(capacity, value_sentinel);
        EXPECT_TRUE(same_entries(to_vector(exec, indices), expected.indices));
        EXPECT_TRUE(same_entries(to_vector(exec, values), expected.values));
        // Too little room: the count still, and only what fits written.
        if (count >= 2) {
          auto small_indices = filled_view<TypeParam>(1, index_sentinel, "small_indices");
          auto small_values = filled_view<TypeParam>(1, value_sentinel, "small_values");
          EXPECT_EQ(oktopk::select_above_counted(exec, acc_view, first, chunk_counts, small_indices,
                                                 small_values),
                    count);
          EXPECT_EQ(to_vector(exec, small_indices)[0], expected.indices[0]);
        }
      }
      // An empty chunk_counts records nothing (and must not be written); a NaN threshold
      // counts nothing.
      Kokkos::View<count_type**, Kokkos::LayoutRight, Memory> none;
      const auto plain = oktopk::impl::accumulate_counting(
          exec, residual_view, grad_view, acc_view,
          oktopk::impl::guard_levels(std::numeric_limits<float>::quiet_NaN(), 1.25, 0, 1), none);
      EXPECT_EQ(plain.above[0], 0);
    }
  }
}

TYPED_TEST(Select, SelectAboveCountedRejectsCountsOfAnotherLength) {
  const TypeParam exec;
  const std::vector<float> x(10000, 1.0f);
  const auto x_view = to_view<TypeParam>(x, "x");
  const auto chunks = oktopk::impl::chunk_count<TypeParam>(10000);
  Kokkos::View<count_type*, typename TypeParam::memory_space> wrong("wrong", chunks + 1);
  auto indices = filled_view<TypeParam>(x.size(), index_sentinel, "indices");
  auto values = filled_view<TypeParam>(x.size(), value_sentinel, "values");
  try {
    oktopk::select_above_counted(exec, x_view, 0.5f, wrong, indices, values);
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("oktopk::select_above_counted: ", 0), 0u) << e.what();
  }
}

/// Hand-checked expectations, independent of the host reference.
TYPED_TEST(Select, SelectAboveThresholdEdgeCases) {
  const TypeParam exec;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float sub = std::numeric_limits<float>::denorm_min();
  //                            0     1      2     3      4    5     6     7     8
  const std::vector<float> x = {1.0f, -2.0f, 0.0f, -0.0f, nan, inf, -inf, 2.0f, -sub};
  const auto x_view = to_view<TypeParam>(x, "x");
  struct Case {
    float threshold;
    std::vector<index_type> indices;
  };
  const std::vector<Case> cases = {
      {2.0f, {5, 6}},                     // equal to |x|: not selected
      {1.0f, {1, 5, 6, 7}},               //
      {0.0f, {0, 1, 5, 6, 7, 8}},         // zeros of both signs are not above 0
      {-0.0f, {0, 1, 5, 6, 7, 8}},        //
      {-1.0f, {0, 1, 2, 3, 5, 6, 7, 8}},  // negative: every non-NaN
      {-inf, {0, 1, 2, 3, 5, 6, 7, 8}},   //
      {sub, {0, 1, 5, 6, 7}},             // the subnormal equals the threshold
      {std::numeric_limits<float>::max(), {5, 6}},
      {inf, {}},  // nothing exceeds +Inf
      {nan, {}},  // nothing compares above NaN
  };
  for (const auto& c : cases) {
    SCOPED_TRACE("threshold = " + describe(c.threshold));
    auto indices = filled_view<TypeParam>(x.size(), index_sentinel, "indices");
    auto values = filled_view<TypeParam>(x.size(), value_sentinel, "values");
    const auto count = static_cast<std::int64_t>(c.indices.size());
    EXPECT_EQ(oktopk::count_above(exec, x_view, c.threshold), count);
    ASSERT_EQ(oktopk::select_above(exec, x_view, c.threshold, indices, values), count);
    auto got_indices = to_vector(exec, indices);
    auto got_values = to_vector(exec, values);
    got_indices.resize(c.indices.size());
    got_values.resize(c.indices.size());
    std::vector<float> expected_values;
    for (const auto i : c.indices) expected_values.push_back(x[static_cast<std::size_t>(i)]);
    EXPECT_TRUE(same_entries(got_indices, c.indices));
    EXPECT_TRUE(same_entries(got_values, expected_values));
  }
}

/// capacity = min(extent(indices), extent(values)) < count: the full count comes back and
/// exactly the first `capacity` entries are written; nothing past them.
TYPED_TEST(Select, SelectAboveCapacityContract) {
  const TypeParam exec;
  for (const auto kind : {DataKind::normal, DataKind::ties, DataKind::non_finite}) {
    for (const std::size_t n : {std::size_t{7}, std::size_t{1000}, std::size_t{1000003}}) {
      const auto& x = cached_data(kind, n);
      const auto x_view = to_view<TypeParam>(x, "x");
      const float t = 0.5f;
      const auto expected = ref::select_above(x, t);
      const auto count = static_cast<std::int64_t>(expected.indices.size());
      ASSERT_GT(count, 2) << to_string(kind) << ", n = " << n;
      const std::vector<std::int64_t> capacities = {0, 1, count / 2, count - 1};
      for (const auto capacity : capacities) {
        // Either buffer may be the smaller one; the other's surplus must stay untouched.
        for (const int larger : {0, 1, 2}) {
          SCOPED_TRACE(case_name(kind, n, t) + ", capacity = " + std::to_string(capacity) +
                       ", larger buffer = " + std::to_string(larger));
          const auto cap = static_cast<std::size_t>(capacity);
          const std::size_t index_extent = cap + (larger == 1 ? 5 : 0);
          const std::size_t value_extent = cap + (larger == 2 ? 5 : 0);
          auto indices = filled_view<TypeParam>(index_extent, index_sentinel, "indices");
          auto values = filled_view<TypeParam>(value_extent, value_sentinel, "values");
          EXPECT_EQ(oktopk::select_above(exec, x_view, t, indices, values), count);
          std::vector<index_type> want_indices(expected.indices.begin(),
                                               expected.indices.begin() + capacity);
          std::vector<float> want_values(expected.values.begin(),
                                         expected.values.begin() + capacity);
          want_indices.resize(index_extent, index_sentinel);
          want_values.resize(value_extent, value_sentinel);
          EXPECT_TRUE(same_entries(to_vector(exec, indices), want_indices));
          EXPECT_TRUE(same_entries(to_vector(exec, values), want_values));
        }
      }
    }
  }
}

// ---- select_above_by_region --------------------------------------------------------------

enum class Split { equal, random_with_empty, empty_ends, all_in_first, all_in_last };

const char* to_string(Split split) {
  switch (split) {
    case Split::equal:
      return "equal";
    case Split::random_with_empty:
      return "random_with_empty";
    case Split::empty_ends:
      return "empty_ends";
    case Split::all_in_first:
      return "all_in_first";
    case Split::all_in_last:
      return "all_in_last";
  }
  return "unknown";
}

/// P + 1 offsets from 0 to n. With n < P the equal split already has empty regions.
std::vector<count_type> make_offsets(Split split, std::size_t n_size, int regions) {
  const auto n = static_cast<count_type>(n_size);
  const auto p = static_cast<std::size_t>(regions);
  std::vector<count_type> off(p + 1, 0);
  off[p] = n;
  switch (split) {
    case Split::equal:
      for (std::size_t r = 0; r <= p; ++r) off[r] = n * static_cast<count_type>(r) / regions;
      break;
    case Split::random_with_empty: {
      auto rng = make_rng(100, n_size, p);
      std::uniform_int_distribution<count_type> cut(0, n);
      for (std::size_t r = 1; r < p; ++r) off[r] = cut(rng);
      std::sort(off.begin() + 1, off.end() - 1);
      if (p >= 2) off[p / 2] = off[p / 2 + 1];  // region p/2 is empty
      break;
    }
    case Split::empty_ends:  // the first and the last region are empty
      for (std::size_t r = 1; r < p; ++r)
        off[r] = n * static_cast<count_type>(r - 1) / std::max(regions - 2, 1);
      if (p >= 2) off[p - 1] = n;
      break;
    case Split::all_in_first:
      for (std::size_t r = 1; r <= p; ++r) off[r] = n;
      break;
    case Split::all_in_last:
      break;
  }
  return off;
}

TYPED_TEST(Select, SelectAboveByRegionMatchesReference) {
  const TypeParam exec;
  for (const auto kind : all_data_kinds) {
    for (const auto n : test_sizes) {
      const auto& x = cached_data(kind, n);
      const auto x_view = to_view<TypeParam>(x, "x");
      std::vector<float> thresholds = {0.5f, -1.0f};
      if (n > 0 && !std::isnan(x[n / 3])) thresholds.push_back(std::fabs(x[n / 3]));
      // The large size gets fewer combinations, to keep the run short.
      const bool large = n > 100000;
      if (large) thresholds.resize(1);
      std::vector<Split> splits = {Split::equal, Split::random_with_empty, Split::all_in_last};
      if (!large) splits.insert(splits.end(), {Split::empty_ends, Split::all_in_first});
      for (const int regions : {1, 2, 3, 7, 16}) {
        for (const auto split : splits) {
          const auto offsets = make_offsets(split, n, regions);
          const auto offsets_view = to_view<TypeParam>(offsets, "offsets");
          for (const float t : thresholds) {
            SCOPED_TRACE(case_name(kind, n, t) + ", P = " + std::to_string(regions) + ", " +
                         to_string(split) + " split");
            const auto expected = ref::select_above_by_region(x, t, offsets);
            const auto total = static_cast<std::int64_t>(expected.indices.size());
            const auto cap = static_cast<std::size_t>(total);
            auto indices = filled_view<TypeParam>(cap, index_sentinel, "indices");
            auto values = filled_view<TypeParam>(cap, value_sentinel, "values");
            auto counts =
                filled_view<TypeParam>(static_cast<std::size_t>(regions), count_type{-1}, "counts");
            ASSERT_EQ(oktopk::select_above_by_region(exec, x_view, t, offsets_view, indices, values,
                                                     counts),
                      total);
            EXPECT_TRUE(same_entries(to_vector(exec, counts), expected.counts));
            EXPECT_TRUE(same_entries(to_vector(exec, indices), expected.indices));
            EXPECT_TRUE(same_entries(to_vector(exec, values), expected.values));
          }
        }
      }
    }
  }
}

/// n < P: most regions are empty, some hold one entry.
TYPED_TEST(Select, SelectAboveByRegionFewerEntriesThanRegions) {
  const TypeParam exec;
  const std::vector<float> x = {3.0f, -0.0f, -5.0f};
  const auto x_view = to_view<TypeParam>(x, "x");
  // 16 regions: [0,0) [0,1) [1,1) ... [1,3) [3,3) ...
  std::vector<count_type> offsets(17, 3);
  offsets[0] = 0;
  offsets[1] = 0;
  offsets[2] = 1;
  offsets[3] = 1;
  offsets[4] = 1;
  const auto offsets_view = to_view<TypeParam>(offsets, "offsets");
  auto indices = filled_view<TypeParam>(2, index_sentinel, "indices");
  auto values = filled_view<TypeParam>(2, value_sentinel, "values");
  auto counts = filled_view<TypeParam>(16, count_type{-1}, "counts");
  ASSERT_EQ(
      oktopk::select_above_by_region(exec, x_view, 1.0f, offsets_view, indices, values, counts), 2);
  std::vector<count_type> expected_counts(16, 0);
  expected_counts[1] = 1;  // x[0] in region [0, 1)
  expected_counts[4] = 1;  // x[2] in region [1, 3), at relative position 1
  EXPECT_TRUE(same_entries(to_vector(exec, counts), expected_counts));
  EXPECT_TRUE(same_entries(to_vector(exec, indices), std::vector<index_type>{0, 1}));
  EXPECT_TRUE(same_entries(to_vector(exec, values), std::vector<float>{3.0f, -5.0f}));
}

/// Too small a buffer: the total comes back, and the values written are the first ones in
/// order (region_counts is unspecified then).
TYPED_TEST(Select, SelectAboveByRegionOverflowReturnsTotal) {
  const TypeParam exec;
  const auto& x = cached_data(DataKind::normal, 1000);
  const auto x_view = to_view<TypeParam>(x, "x");
  const auto offsets = make_offsets(Split::equal, x.size(), 7);
  const auto offsets_view = to_view<TypeParam>(offsets, "offsets");
  const auto expected = ref::select_above_by_region(x, 0.5f, offsets);
  const auto total = static_cast<std::int64_t>(expected.values.size());
  for (const std::int64_t capacity : {std::int64_t{0}, std::int64_t{1}, total / 2, total - 1}) {
    SCOPED_TRACE("capacity = " + std::to_string(capacity));
    const auto cap = static_cast<std::size_t>(capacity);
    auto indices = filled_view<TypeParam>(cap, index_sentinel, "indices");
    auto values = filled_view<TypeParam>(cap, value_sentinel, "values");
    auto counts = filled_view<TypeParam>(7, count_type{-1}, "counts");
    EXPECT_EQ(
        oktopk::select_above_by_region(exec, x_view, 0.5f, offsets_view, indices, values, counts),
        total);
    const std::vector<float> want(expected.values.begin(), expected.values.begin() + capacity);
    EXPECT_TRUE(same_entries(to_vector(exec, values), want));
  }
}

TYPED_TEST(Select, SelectAboveByRegionRejectsInvalidOffsets) {
  const TypeParam exec;
  const auto& x = cached_data(DataKind::normal, 10);
  const auto x_view = to_view<TypeParam>(x, "x");
  auto indices = filled_view<TypeParam>(10, index_sentinel, "indices");
  auto values = filled_view<TypeParam>(10, value_sentinel, "values");
  auto counts = filled_view<TypeParam>(16, count_type{-1}, "counts");
  const std::string where = "oktopk::select_above_by_region";
  const std::vector<std::vector<count_type>> bad = {
      {1, 4, 7, 10},   // does not start at 0
      {0, 4, 7, 9},    // does not end at n
      {0, 4, 7, 11},   // ends past n
      {0, 7, 4, 10},   // decreasing
      {0, 10, 0, 10},  // decreasing to 0
      {-1, 5, 10},     // negative start
      {0},             // no region at all
      {},              //
  };
  for (const auto& offsets : bad) {
    SCOPED_TRACE("offsets of size " + std::to_string(offsets.size()));
    const auto offsets_view = to_view<TypeParam>(offsets, "offsets");
    EXPECT_TRUE(throws_invalid_argument(
        [&] {
          oktopk::select_above_by_region(exec, x_view, 0.0f, offsets_view, indices, values, counts);
        },
        where));
  }
  // Fewer region_counts than regions.
  const auto offsets_view = to_view<TypeParam>(std::vector<count_type>{0, 3, 6, 10}, "offsets");
  auto short_counts = filled_view<TypeParam>(2, count_type{-1}, "counts");
  EXPECT_TRUE(throws_invalid_argument(
      [&] {
        oktopk::select_above_by_region(exec, x_view, 0.0f, offsets_view, indices, values,
                                       short_counts);
      },
      where));
}

}  // namespace
