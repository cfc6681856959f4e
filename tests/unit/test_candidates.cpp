// SPDX-License-Identifier: BSD-3-Clause
// impl::accumulate_keeping_candidates and impl::select_candidates (Ok-Topk's selection from
// the entries the accumulate pass kept) against host references, on the host spaces that keep
// candidates; with room for every chunk's entries and with so little room that chunks spill.
#include "exec_spaces.hpp"
#include "host_reference.hpp"
#include "test_data.hpp"

#include <oktopk/select.hpp>
#include <oktopk/impl/kernels/candidates.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace oktopk::test;
using oktopk::count_type;
using oktopk::index_type;

template <class ExecSpace>
class Candidates : public ::testing::Test {};
TYPED_TEST_SUITE(Candidates, EnabledSpaces);

/// Candidates with `capacity` slots per chunk for vectors of length n.
template <class ExecSpace>
oktopk::impl::Candidates<ExecSpace, float> make_candidates(std::int64_t n, std::int64_t capacity) {
  oktopk::impl::Candidates<ExecSpace, float> c;
  c.capacity = capacity;
  const auto slots = static_cast<std::size_t>(oktopk::impl::chunk_count<ExecSpace>(n) * c.stride());
  c.indices = decltype(c.indices)("indices", slots);
  c.values = decltype(c.values)("values", slots);
  c.counts = decltype(c.counts)("counts", oktopk::impl::chunk_count<ExecSpace>(n));
  return c;
}

TYPED_TEST(Candidates, KeepThenSelectMatchesReference) {
  if constexpr (oktopk::impl::runs_on_host_v<TypeParam>) {
    using Memory = typename TypeParam::memory_space;
    const TypeParam exec;
    const auto chunk = oktopk::impl::chunk_length_v<TypeParam>;
    for (const auto kind : all_data_kinds) {
      for (const auto n : test_sizes) {
        const auto& grad = cached_data(kind, n);
        std::vector<float> residual(n);
        for (std::size_t i = 0; i < n; ++i) residual[i] = static_cast<float>(i % 3) * 0.5f - 0.5f;
        std::vector<float> acc(n);
        for (std::size_t i = 0; i < n; ++i) acc[i] = residual[i] + grad[i];
        const auto grad_view = to_view<TypeParam>(grad, "grad");
        const auto residual_view = to_view<TypeParam>(residual, "residual");
        Kokkos::View<float*, Memory> acc_view("acc", n);
        const auto sn = static_cast<std::int64_t>(n);
        const auto chunks = oktopk::impl::chunk_count<TypeParam>(sn);
        Kokkos::View<count_type**, Kokkos::LayoutRight, Memory> level_counts(
            "level_counts", oktopk::impl::max_count_levels, chunks);
        // A plain threshold, and |acc| of one entry (ties at the threshold are not selected).
        std::vector<float> thresholds = {0.75f};
        for (std::size_t i = n / 3; i < n; ++i) {
          if (std::isfinite(acc[i]) && acc[i] != 0.0f) {
            thresholds.push_back(std::fabs(acc[i]));
            break;
          }
        }
        // Room for a few entries per chunk (dense chunks spill and are read from acc), and
        // room for all of them.
        for (const std::int64_t capacity : {std::int64_t{3}, std::int64_t{chunk}}) {
          auto candidates = make_candidates<TypeParam>(sn, capacity);
          for (const float t : thresholds) {
            SCOPED_TRACE(std::string(to_string(kind)) + ", n = " + std::to_string(n) +
                         ", t = " + describe(t) + ", capacity " + std::to_string(capacity));
            const auto levels = oktopk::impl::guard_levels(t, 1.25, 2, 3);
            const auto counts = oktopk::impl::accumulate_keeping_candidates(
                exec, residual_view, grad_view, acc_view, levels, level_counts, candidates);
            EXPECT_TRUE(same_entries(to_vector(exec, acc_view), acc));
            EXPECT_EQ(counts.nonfinite, std::count_if(acc.begin(), acc.end(),
                                                      [](float v) { return !std::isfinite(v); }));
            EXPECT_EQ(candidates.threshold, levels.threshold[0]);
            // Every level: its total, each chunk's count, and the selection from the candidates.
            for (int j = 0; j < levels.count; ++j) {
              const float level_t = levels.threshold[j];
              SCOPED_TRACE("level " + std::to_string(j));
              EXPECT_TRUE(candidates.cover(level_t));
              EXPECT_EQ(counts.above[j], ref::count_above(acc, level_t));
              const auto row = to_vector(exec, Kokkos::subview(level_counts, j, Kokkos::ALL));
              std::int64_t wrong_chunks = 0;
              for (std::int64_t c = 0; c < chunks; ++c) {
                const auto begin = static_cast<std::size_t>(c * chunk);
                const auto end = std::min(n, static_cast<std::size_t>((c + 1) * chunk));
                const std::vector<float> part(acc.begin() + begin, acc.begin() + end);
                if (row[c] != ref::count_above(part, level_t)) ++wrong_chunks;
              }
              EXPECT_EQ(wrong_chunks, 0);

              auto expected = ref::select_above(acc, level_t);
              const auto count = static_cast<std::int64_t>(expected.indices.size());
              const auto capacity_out = static_cast<std::size_t>(count) + 2;
              auto indices = filled_view<TypeParam>(capacity_out, index_type{-7}, "indices");
              auto values = filled_view<TypeParam>(capacity_out, 0.0f, "values");
              const auto level_row = Kokkos::subview(level_counts, j, Kokkos::ALL);
              EXPECT_EQ(oktopk::impl::select_candidates(exec, candidates, acc_view, level_t,
                                                        level_row, indices, values),
                        count);
              expected.indices.resize(capacity_out, index_type{-7});
              expected.values.resize(capacity_out, 0.0f);
              EXPECT_TRUE(same_entries(to_vector(exec, indices), expected.indices));
              EXPECT_TRUE(same_entries(to_vector(exec, values), expected.values));
              // Too little room: the count still, and only what fits written, in order.
              if (count >= 2) {
                auto one_index = filled_view<TypeParam>(1, index_type{-7}, "one_index");
                auto one_value = filled_view<TypeParam>(1, 0.0f, "one_value");
                EXPECT_EQ(oktopk::impl::select_candidates(exec, candidates, acc_view, level_t,
                                                          level_row, one_index, one_value),
                          count);
                EXPECT_EQ(to_vector(exec, one_index)[0], expected.indices[0]);
              }
            }
          }
        }
      }
    }
  } else {
    GTEST_SKIP() << "candidates are kept on host execution spaces only";
  }
}

TYPED_TEST(Candidates, CoverOnlyAtOrAboveWhatWasKept) {
  oktopk::impl::Candidates<TypeParam, float> c;
  EXPECT_FALSE(c.cover(1.0f));  // nothing kept yet
  c.threshold = 2.0f;
  EXPECT_TRUE(c.cover(2.0f));
  EXPECT_TRUE(c.cover(3.0f));
  EXPECT_FALSE(c.cover(1.5f));
}

TYPED_TEST(Candidates, CapacityIsSeveralTimesTheAverageShareWithinAChunk) {
  const auto chunk = oktopk::impl::chunk_length_v<TypeParam>;
  const std::int64_t n = 64 * chunk;
  // k / chunks = 10 per chunk on average: room for 8 times that.
  EXPECT_EQ(oktopk::impl::candidate_capacity<TypeParam>(n, 640), std::min<std::int64_t>(80, chunk));
  EXPECT_EQ(oktopk::impl::candidate_capacity<TypeParam>(n, 1), std::min<std::int64_t>(32, chunk));
  EXPECT_EQ(oktopk::impl::candidate_capacity<TypeParam>(n, n), chunk);
  EXPECT_EQ(oktopk::impl::candidate_capacity<TypeParam>(0, 0), std::min<std::int64_t>(32, chunk));
}

}  // namespace
