// SPDX-License-Identifier: BSD-3-Clause
// The largest vector the 32-bit index type allows (2^31 - 1 floats, 8 GiB): selection, regions
// and radix select must not overflow anywhere near the top index. On the default execution
// space, so a GPU build runs the device kernels at that length.
#include <oktopk/select.hpp>
#include <oktopk/topk.hpp>

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace {

TEST(LargeVector, SelectionAndRadixSelectAtMaximumLength) {
  using Exec = Kokkos::DefaultExecutionSpace;
  const std::int64_t n = std::numeric_limits<std::int32_t>::max();
  Exec exec;
  Kokkos::View<float*, Exec::memory_space> x("LargeVector::x", static_cast<std::size_t>(n));
  // Five marked entries, three of them past 2^31 - 16, with distinct magnitudes.
  const std::vector<std::pair<std::int64_t, float>> marked = {
      {0, 5.0f}, {1'000'000'000, -4.0f}, {n - 9, 3.0f}, {n - 2, -2.0f}, {n - 1, 1.0f}};
  for (const auto& [i, v] : marked) {
    Kokkos::deep_copy(exec, Kokkos::subview(x, i), v);
  }
  exec.fence();

  EXPECT_EQ(oktopk::count_above(exec, x, 0.5f), 5);
  EXPECT_EQ(oktopk::kth_largest_abs(exec, x, 1), 5.0f);
  EXPECT_EQ(oktopk::kth_largest_abs(exec, x, 5), 1.0f);
  EXPECT_EQ(oktopk::kth_largest_abs(exec, x, 6), 0.0f);
  EXPECT_EQ(oktopk::kth_largest_abs(exec, x, n), 0.0f);

  Kokkos::View<std::int32_t*, Exec::memory_space> indices("LargeVector::indices", 8);
  Kokkos::View<float*, Exec::memory_space> values("LargeVector::values", 8);
  ASSERT_EQ(oktopk::select_above(exec, x, 0.5f, indices, values), 5);
  const auto indices_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), indices);
  const auto values_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), values);
  for (std::size_t j = 0; j < marked.size(); ++j) {
    EXPECT_EQ(indices_host(j), marked[j].first) << "entry " << j;
    EXPECT_EQ(values_host(j), marked[j].second) << "entry " << j;
  }

  // Two regions, the second starting just below the top: its relative indices are small.
  Kokkos::View<std::int64_t*, Kokkos::HostSpace> offsets_host("LargeVector::offsets", 3);
  offsets_host(0) = 0;
  offsets_host(1) = n - 10;
  offsets_host(2) = n;
  const auto offsets = Kokkos::create_mirror_view_and_copy(Exec::memory_space(), offsets_host);
  Kokkos::View<std::int64_t*, Exec::memory_space> counts("LargeVector::counts", 2);
  ASSERT_EQ(oktopk::select_above_by_region(exec, x, 0.5f, offsets, indices, values, counts), 5);
  const auto counts_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), counts);
  const auto relative_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), indices);
  EXPECT_EQ(counts_host(0), 2);
  EXPECT_EQ(counts_host(1), 3);
  const std::vector<std::int32_t> relative = {0, 1'000'000'000, 1, 8, 9};
  for (std::size_t j = 0; j < relative.size(); ++j) {
    EXPECT_EQ(relative_host(j), relative[j]) << "entry " << j;
  }
}

}  // namespace
