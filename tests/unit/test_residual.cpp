// SPDX-License-Identifier: BSD-3-Clause
// accumulate_residual and clear_at (error feedback) against host references, per space.
#include "exec_spaces.hpp"
#include "host_reference.hpp"
#include "test_data.hpp"

#include <oktopk/residual.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

namespace {

using namespace oktopk::test;
using oktopk::count_type;
using oktopk::index_type;

template <class ExecSpace>
class Residual : public ::testing::Test {};
TYPED_TEST_SUITE(Residual, EnabledSpaces);

/// The kernel's acc must equal residual + scale·grad rounded either as two operations or as
/// one FMA (a compiler may contract the expression); NaN matches any NaN. For scales 1, 0 and
/// -0.5 the product is exact (bar subnormals), so both roundings agree.
::testing::AssertionResult is_accumulation(const std::vector<float>& acc,
                                           const std::vector<float>& residual,
                                           const std::vector<float>& grad, float scale) {
  std::vector<float> expected(residual.size());
  for (std::size_t i = 0; i < residual.size(); ++i) {
    const float unfused = ref::multiply_add_unfused(residual[i], scale, grad[i]);
    const float fused = ref::multiply_add_fused(residual[i], scale, grad[i]);
    expected[i] = i < acc.size() && same_value(acc[i], fused) ? fused : unfused;
  }
  return same_values(acc, expected);
}

TYPED_TEST(Residual, AccumulateResidualMatchesReference) {
  const TypeParam exec;
  constexpr std::size_t kinds = std::size(all_data_kinds);
  for (std::size_t r = 0; r < kinds; ++r) {
    // The gradient is of the same kind (an independent draw) or of the next kind.
    for (const std::size_t g : {r, (r + 1) % kinds}) {
      const auto residual_kind = all_data_kinds[r];
      const auto grad_kind = all_data_kinds[g];
      for (const auto n : test_sizes) {
        if (n > 100000 && g != r) continue;  // keeps the run short
        const auto& residual = cached_data(residual_kind, n, 0);
        const auto& grad = cached_data(grad_kind, n, 1);
        const auto grad_view = to_view<TypeParam>(grad, "grad");
        for (const float scale : {1.0f, 0.0f, -0.5f, 0.1f}) {
          SCOPED_TRACE(std::string("residual ") + to_string(residual_kind) + ", grad " +
                       to_string(grad_kind) + ", n = " + std::to_string(n) +
                       ", scale = " + describe(scale));
          // Into a separate View: the inputs stay as they were.
          {
            const auto residual_view = to_view<TypeParam>(residual, "residual");
            const auto acc = filled_view<TypeParam>(n, 7.0f, "acc");
            oktopk::accumulate_residual(exec, residual_view, grad_view, scale, acc);
            EXPECT_TRUE(is_accumulation(to_vector(exec, acc), residual, grad, scale));
            EXPECT_TRUE(same_entries(to_vector(exec, residual_view), residual));
            EXPECT_TRUE(same_entries(to_vector(exec, grad_view), grad));
          }
          // In place: acc is the residual View itself.
          {
            const auto residual_view = to_view<TypeParam>(residual, "residual");
            oktopk::accumulate_residual(exec, residual_view, grad_view, scale, residual_view);
            EXPECT_TRUE(is_accumulation(to_vector(exec, residual_view), residual, grad, scale));
          }
        }
      }
    }
  }
}

TYPED_TEST(Residual, AccumulateResidualRejectsLengthMismatch) {
  const TypeParam exec;
  const auto a = filled_view<TypeParam>(10, 1.0f, "a");
  const auto b = filled_view<TypeParam>(11, 1.0f, "b");
  const auto c = filled_view<TypeParam>(9, 1.0f, "c");
  const auto empty = filled_view<TypeParam>(0, 1.0f, "empty");
  const std::string where = "oktopk::accumulate_residual";
  EXPECT_TRUE(throws_invalid_argument([&] { oktopk::accumulate_residual(exec, a, b, 1.0f, a); },
                                      where));  // grad longer
  EXPECT_TRUE(throws_invalid_argument([&] { oktopk::accumulate_residual(exec, b, a, 1.0f, a); },
                                      where));  // residual longer
  EXPECT_TRUE(throws_invalid_argument([&] { oktopk::accumulate_residual(exec, a, a, 1.0f, c); },
                                      where));  // acc shorter
  EXPECT_TRUE(throws_invalid_argument([&] { oktopk::accumulate_residual(exec, a, a, 1.0f, b); },
                                      where));  // acc longer
  EXPECT_TRUE(throws_invalid_argument(
      [&] { oktopk::accumulate_residual(exec, empty, a, 1.0f, empty); }, where));
}

// ---- clear_at ----------------------------------------------------------------------------

struct IndexCase {
  std::string what;
  std::vector<index_type> indices;
  count_type offset;
};

/// Index lists that stay inside v of length n: sorted, shuffled, with repeats, empty, and
/// region-relative ones with a positive or negative offset.
std::vector<IndexCase> index_cases(std::size_t n) {
  std::vector<IndexCase> cases;
  cases.push_back({"none", {}, 0});
  cases.push_back({"sorted", make_unique_indices(n / 3 + 1, n, 1, true), 0});
  cases.push_back({"shuffled", make_unique_indices(n / 3 + 1, n, 2, false), 0});
  cases.push_back({"all", make_unique_indices(n, n, 3, false), 0});
  if (n > 0) cases.push_back({"repeated", make_repeated_indices(n / 2 + 3, n, 4), 0});
  const std::size_t start = n / 4;
  cases.push_back({"region-relative", make_unique_indices(n / 3 + 1, n - start, 5, true),
                   static_cast<count_type>(start)});
  auto shifted = make_unique_indices(n / 3 + 1, n, 6, false);
  for (auto& i : shifted) i += 5;
  cases.push_back({"negative offset", shifted, -5});
  return cases;
}

TYPED_TEST(Residual, ClearAtMatchesReference) {
  const TypeParam exec;
  for (const auto kind : all_data_kinds) {
    for (const auto n : test_sizes) {
      for (const auto& c : index_cases(n)) {
        SCOPED_TRACE(std::string(to_string(kind)) + ", n = " + std::to_string(n) + ", " + c.what +
                     " indices, offset " + std::to_string(c.offset));
        auto expected = cached_data(kind, n);
        ASSERT_EQ(ref::clear_at(expected, c.indices, c.offset), 0);
        const auto v = to_view<TypeParam>(cached_data(kind, n), "v");
        const auto indices = to_view<TypeParam>(c.indices, "indices");
        oktopk::clear_at(exec, v, indices, c.offset);
        // Cleared entries are +0 bit for bit; the others, NaN payloads included, untouched.
        EXPECT_TRUE(same_entries(to_vector(exec, v), expected));
      }
    }
  }
}

/// Out-of-range positions are skipped and reported after the in-range ones are cleared.
TYPED_TEST(Residual, ClearAtOutOfRangeThrowsAfterClearingTheRest) {
  const TypeParam exec;
  constexpr index_type int_max = std::numeric_limits<index_type>::max();
  constexpr index_type int_min = std::numeric_limits<index_type>::min();
  const std::size_t n = 1000;
  struct Case {
    const char* what;
    std::size_t length;
    std::vector<index_type> indices;
    count_type offset;
    std::int64_t outside;
  };
  const std::vector<Case> cases = {
      {"mixed", n, {3, -1, 999, 1000, 0, 5000, int_max, 17, int_min, 500}, 0, 5},
      {"offset pushes past the end", n, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 995, 5},
      {"negative offset", n, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, -3, 3},
      {"index plus offset overflows 32 bits", n, {int_max, 1, int_max}, 1, 2},
      {"empty vector", 0, {0, 1, 0}, 0, 3},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    auto expected = make_data(DataKind::normal, c.length, 9);
    ASSERT_EQ(ref::clear_at(expected, c.indices, c.offset), c.outside);
    const auto v = to_view<TypeParam>(make_data(DataKind::normal, c.length, 9), "v");
    const auto indices = to_view<TypeParam>(c.indices, "indices");
    EXPECT_TRUE(throws_invalid_argument([&] { oktopk::clear_at(exec, v, indices, c.offset); },
                                        "oktopk::clear_at",
                                        std::to_string(c.outside) + " indices"));
    EXPECT_TRUE(same_entries(to_vector(exec, v), expected));
  }
}

}  // namespace
