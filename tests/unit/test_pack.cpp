// SPDX-License-Identifier: BSD-3-Clause
// scatter_add, merge_sorted and intersect_sorted on sparse vectors against host references.
#include "exec_spaces.hpp"
#include "host_reference.hpp"
#include "test_data.hpp"

#include <oktopk/pack.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace {

using namespace oktopk::test;
using oktopk::count_type;
using oktopk::index_type;

template <class ExecSpace>
class Pack : public ::testing::Test {};
TYPED_TEST_SUITE(Pack, EnabledSpaces);

constexpr index_type index_sentinel = -7;
const float value_sentinel = float_from_bits(0x7fe5a5a5u);  // a NaN payload no kernel produces
constexpr index_type int_max = std::numeric_limits<index_type>::max();
constexpr index_type int_min = std::numeric_limits<index_type>::min();

template <class T>
std::vector<T> prefix(const std::vector<T>& v, std::size_t count) {
  return std::vector<T>(v.begin(),
                        v.begin() + static_cast<std::ptrdiff_t>(std::min(count, v.size())));
}

// ---- scatter_add -------------------------------------------------------------------------

/// Unique indices: one addition per entry, so the result is exact whatever the order.
TYPED_TEST(Pack, ScatterAddUniqueIndicesMatchesReference) {
  const TypeParam exec;
  for (const auto kind : all_data_kinds) {
    for (const auto n : test_sizes) {
      for (const bool sorted : {true, false}) {
        const auto count = n / 3 + (n > 0 ? 1 : 0);
        const auto indices = make_unique_indices(count, n, 10, sorted);
        const auto values = make_data(kind, indices.size(), 11);
        SCOPED_TRACE(std::string(to_string(kind)) + ", n = " + std::to_string(n) + ", " +
                     std::to_string(indices.size()) + (sorted ? " sorted" : " shuffled") +
                     " indices");
        auto expected = cached_data(DataKind::normal, n, 2);
        ASSERT_EQ(ref::scatter_add(expected, indices, values, 0), 0);
        const auto dense = to_view<TypeParam>(cached_data(DataKind::normal, n, 2), "dense");
        oktopk::scatter_add(exec, to_view<TypeParam>(indices, "indices"),
                            to_view<TypeParam>(values, "values"), dense);
        EXPECT_TRUE(same_values(to_vector(exec, dense), expected));
      }
    }
  }
}

/// Repeated indices with small-integer values: every partial sum is an exact float, so any
/// order of the atomic additions gives the reference bit for bit.
TYPED_TEST(Pack, ScatterAddRepeatedIndicesIsExact) {
  const TypeParam exec;
  for (const auto n : test_sizes) {
    if (n == 0) continue;
    // Few distinct targets (heavy contention), all of them, and one single target.
    for (const std::size_t range : {std::min<std::size_t>(n, 50), n, std::size_t{1}}) {
      const std::size_t count = std::max<std::size_t>(n, 1000);
      SCOPED_TRACE("n = " + std::to_string(n) + ", " + std::to_string(count) +
                   " indices drawn from " + std::to_string(range));
      const auto indices = make_repeated_indices(count, range, 12);
      const auto values = make_small_integers(count, 13);
      auto expected = make_small_integers(n, 14);
      ASSERT_EQ(ref::scatter_add(expected, indices, values, 0), 0);
      const auto dense = to_view<TypeParam>(make_small_integers(n, 14), "dense");
      oktopk::scatter_add(exec, to_view<TypeParam>(indices, "indices"),
                          to_view<TypeParam>(values, "values"), dense);
      EXPECT_TRUE(same_entries(to_vector(exec, dense), expected));
    }
  }
}

/// Region-relative indices plus an offset (positive, or negative with shifted indices).
TYPED_TEST(Pack, ScatterAddWithOffset) {
  const TypeParam exec;
  for (const auto n : test_sizes) {
    const std::size_t start = n / 3;
    auto relative = make_unique_indices((n - start) / 2 + 1, n - start, 15, false);
    auto shifted = make_unique_indices(n / 2 + 1, n, 16, false);
    for (auto& i : shifted) i += 9;
    for (const auto& [indices, offset] : {std::make_pair(relative, static_cast<count_type>(start)),
                                          std::make_pair(shifted, count_type{-9})}) {
      SCOPED_TRACE("n = " + std::to_string(n) + ", offset " + std::to_string(offset));
      const auto values = make_data(DataKind::heavy_tailed, indices.size(), 17);
      auto expected = cached_data(DataKind::normal, n, 3);
      ASSERT_EQ(ref::scatter_add(expected, indices, values, offset), 0);
      const auto dense = to_view<TypeParam>(cached_data(DataKind::normal, n, 3), "dense");
      oktopk::scatter_add(exec, to_view<TypeParam>(indices, "indices"),
                          to_view<TypeParam>(values, "values"), dense, offset);
      EXPECT_TRUE(same_values(to_vector(exec, dense), expected));
    }
  }
}

/// Out-of-range positions are skipped, counted in the message, and the others still added.
TYPED_TEST(Pack, ScatterAddOutOfRangeThrowsAndReports) {
  const TypeParam exec;
  struct Case {
    const char* what;
    std::size_t length;
    std::vector<index_type> indices;
    count_type offset;
    std::int64_t outside;
  };
  const std::vector<Case> cases = {
      {"mixed", 1000, {3, -1, 999, 1000, 0, 5000, int_max, 17, int_min, 3}, 0, 5},
      {"offset pushes past the end", 1000, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 994, 4},
      {"negative offset", 1000, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, -2, 2},
      {"index plus offset overflows 32 bits", 1000, {int_max, 1}, 1, 1},
      {"empty dense vector", 0, {0, 0, 5}, 0, 3},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const auto values = make_small_integers(c.indices.size(), 18);
    auto expected = make_small_integers(c.length, 19);
    ASSERT_EQ(ref::scatter_add(expected, c.indices, values, c.offset), c.outside);
    const auto dense = to_view<TypeParam>(make_small_integers(c.length, 19), "dense");
    const auto indices = to_view<TypeParam>(c.indices, "indices");
    const auto values_view = to_view<TypeParam>(values, "values");
    EXPECT_TRUE(throws_invalid_argument(
        [&] { oktopk::scatter_add(exec, indices, values_view, dense, c.offset); },
        "oktopk::scatter_add", std::to_string(c.outside) + " indices"));
    EXPECT_TRUE(same_entries(to_vector(exec, dense), expected));
  }
}

TYPED_TEST(Pack, ScatterAddRejectsLengthMismatch) {
  const TypeParam exec;
  const auto indices = to_view<TypeParam>(std::vector<index_type>{0, 1, 2}, "indices");
  const auto values = to_view<TypeParam>(std::vector<float>{1.0f, 2.0f}, "values");
  const auto dense = filled_view<TypeParam>(10, 0.0f, "dense");
  EXPECT_TRUE(throws_invalid_argument([&] { oktopk::scatter_add(exec, indices, values, dense); },
                                      "oktopk::scatter_add"));
  EXPECT_TRUE(same_entries(to_vector(exec, dense), std::vector<float>(10, 0.0f)));
}

// ---- merge_sorted ------------------------------------------------------------------------

template <class ExecSpace>
void check_merge(const ExecSpace& exec, const std::vector<index_type>& ai,
                 const std::vector<float>& av, const std::vector<index_type>& bi,
                 const std::vector<float>& bv, std::size_t extra_room) {
  const auto expected = ref::merge_sorted(ai, av, bi, bv);
  const std::size_t room = ai.size() + bi.size() + extra_room;
  auto out_indices = filled_view<ExecSpace>(room, index_sentinel, "out_indices");
  auto out_values = filled_view<ExecSpace>(room, value_sentinel, "out_values");
  const auto count =
      oktopk::merge_sorted(exec, to_view<ExecSpace>(ai, "a_indices"),
                           to_view<ExecSpace>(av, "a_values"), to_view<ExecSpace>(bi, "b_indices"),
                           to_view<ExecSpace>(bv, "b_values"), out_indices, out_values);
  ASSERT_EQ(count, static_cast<std::int64_t>(expected.indices.size()));
  const auto n = static_cast<std::size_t>(count);
  EXPECT_TRUE(same_entries(prefix(to_vector(exec, out_indices), n), expected.indices));
  EXPECT_TRUE(same_values(prefix(to_vector(exec, out_values), n), expected.values));
}

TYPED_TEST(Pack, MergeSortedMatchesReference) {
  const TypeParam exec;
  for (const auto overlap : all_overlaps) {
    for (const auto n : test_sizes) {
      const auto pair = make_overlap(overlap, n, 20);
      std::vector<DataKind> kinds = {DataKind::normal, DataKind::non_finite};
      if (n <= 1000) kinds.insert(kinds.end(), {DataKind::ties, DataKind::signed_zero});
      for (const auto kind : kinds) {
        SCOPED_TRACE(std::string(to_string(overlap)) + ", |a| = " + std::to_string(pair.a.size()) +
                     ", |b| = " + std::to_string(pair.b.size()) + ", " + to_string(kind) +
                     " values");
        const auto av = make_data(kind, pair.a.size(), 21);
        const auto bv = make_data(kind, pair.b.size(), 22);
        check_merge(exec, pair.a, av, pair.b, bv, 0);
        if (n <= 1000) check_merge(exec, pair.a, av, pair.b, bv, 3);
      }
    }
  }
}

TYPED_TEST(Pack, MergeSortedExtremeIndices) {
  const TypeParam exec;
  const std::vector<index_type> ai = {0, 5, int_max - 1, int_max};
  const std::vector<index_type> bi = {0, 1, int_max};
  check_merge(exec, ai, {1.0f, 2.0f, 3.0f, 4.0f}, bi, {10.0f, 20.0f, 40.0f}, 0);
  check_merge(exec, std::vector<index_type>{int_max}, {-0.0f}, std::vector<index_type>{int_max},
              {-0.0f}, 0);
  check_merge(exec, std::vector<index_type>{int_max}, {-0.0f}, std::vector<index_type>{int_max},
              {0.0f}, 0);
}

TYPED_TEST(Pack, MergeSortedRejectsBadInput) {
  const TypeParam exec;
  const std::string where = "oktopk::merge_sorted";
  const auto run = [&](const std::vector<index_type>& ai, const std::vector<index_type>& bi,
                       std::size_t index_room, std::size_t value_room,
                       std::size_t a_values = std::numeric_limits<std::size_t>::max()) {
    const auto av = make_data(DataKind::normal, std::min(ai.size(), a_values), 23);
    const auto bv = make_data(DataKind::normal, bi.size(), 24);
    auto out_indices = filled_view<TypeParam>(index_room, index_sentinel, "out_indices");
    auto out_values = filled_view<TypeParam>(value_room, value_sentinel, "out_values");
    return throws_invalid_argument(
        [&] {
          oktopk::merge_sorted(exec, to_view<TypeParam>(ai, "a_indices"),
                               to_view<TypeParam>(av, "a_values"),
                               to_view<TypeParam>(bi, "b_indices"),
                               to_view<TypeParam>(bv, "b_values"), out_indices, out_values);
        },
        where);
  };
  EXPECT_TRUE(run({3, 1, 5}, {2, 4}, 5, 5)) << "a falls";
  EXPECT_TRUE(run({1, 3, 5}, {2, 2, 4}, 6, 6)) << "b repeats an index";
  EXPECT_TRUE(run({1, 3, 5}, {0, 7, 4}, 6, 6)) << "b falls at its end";
  // The output must hold |a| + |b| even when the merge is shorter.
  EXPECT_TRUE(run({1, 3, 5}, {1, 3, 5}, 5, 6)) << "index room short";
  EXPECT_TRUE(run({1, 3, 5}, {1, 3, 5}, 6, 5)) << "value room short";
  EXPECT_TRUE(run({1, 3, 5}, {}, 0, 0)) << "no room";
  EXPECT_TRUE(run({1, 3, 5}, {2}, 4, 4, 2)) << "fewer a values than indices";
}

// ---- intersect_sorted --------------------------------------------------------------------

template <class ExecSpace>
void check_intersect(const ExecSpace& exec, const std::vector<index_type>& a,
                     const std::vector<index_type>& b, std::size_t extra_room) {
  auto expected = ref::intersect_sorted(a, b);
  const std::size_t room = std::min(a.size(), b.size()) + extra_room;
  auto out = filled_view<ExecSpace>(room, index_sentinel, "out");
  const auto count =
      oktopk::intersect_sorted(exec, to_view<ExecSpace>(a, "a"), to_view<ExecSpace>(b, "b"), out);
  ASSERT_EQ(count, static_cast<std::int64_t>(expected.size()));
  // Only `count` entries are written: the rest keep their sentinel.
  expected.resize(room, index_sentinel);
  EXPECT_TRUE(same_entries(to_vector(exec, out), expected));
}

TYPED_TEST(Pack, IntersectSortedMatchesReference) {
  const TypeParam exec;
  for (const auto overlap : all_overlaps) {
    for (const auto n : test_sizes) {
      const auto pair = make_overlap(overlap, n, 25);
      SCOPED_TRACE(std::string(to_string(overlap)) + ", |a| = " + std::to_string(pair.a.size()) +
                   ", |b| = " + std::to_string(pair.b.size()));
      check_intersect(exec, pair.a, pair.b, 0);
      check_intersect(exec, pair.b, pair.a, 0);  // the other list is the shorter one
      check_intersect(exec, pair.a, pair.b, 3);
    }
  }
}

TYPED_TEST(Pack, IntersectSortedExtremeIndices) {
  const TypeParam exec;
  const std::vector<index_type> a = {0, 5, int_max - 1, int_max};
  const std::vector<index_type> b = {0, 1, int_max};
  check_intersect(exec, a, b, 0);
  check_intersect(exec, b, a, 0);
  check_intersect(exec, {int_max}, {int_max}, 0);
  check_intersect(exec, {int_max}, {0}, 0);
}

TYPED_TEST(Pack, IntersectSortedRejectsBadInput) {
  const TypeParam exec;
  const std::string where = "oktopk::intersect_sorted";
  const auto run = [&](const std::vector<index_type>& a, const std::vector<index_type>& b,
                       std::size_t room) {
    auto out = filled_view<TypeParam>(room, index_sentinel, "out");
    return throws_invalid_argument(
        [&] {
          oktopk::intersect_sorted(exec, to_view<TypeParam>(a, "a"), to_view<TypeParam>(b, "b"),
                                   out);
        },
        where);
  };
  EXPECT_TRUE(run({3, 1, 5}, {1, 2, 3}, 3)) << "a falls";
  EXPECT_TRUE(run({1, 3, 5}, {1, 1, 3}, 3)) << "b repeats an index";
  EXPECT_TRUE(run({1, 3, 5, 7}, {1, 3, 5, 6, 0}, 4)) << "b falls at its end";
  // Room for min(|a|, |b|) is required even when the intersection is smaller.
  EXPECT_TRUE(run({1, 3, 5}, {2, 4, 6, 8}, 2)) << "room short, disjoint lists";
  EXPECT_TRUE(run({1, 3, 5}, {1, 3, 5}, 2)) << "room short, identical lists";
  EXPECT_TRUE(run({1}, {1}, 0)) << "no room";
}

}  // namespace
