// SPDX-License-Identifier: BSD-3-Clause
// The public selection kernels on bfloat16 and float16 Views, in every space: a 16-bit value's
// magnitude is its float's, exactly, so every answer must be the one the same kernel gives on
// the widened floats (which the float tests check against host references), on many sizes and
// with ties, zeros, subnormals, NaN and Inf. Also accumulate_residual from a 16-bit gradient
// and clear_at on a 16-bit View.
#include "exec_spaces.hpp"

#include <oktopk/residual.hpp>
#include <oktopk/select.hpp>
#include <oktopk/topk.hpp>
#include <oktopk/impl/base/half_types.hpp>
#include <oktopk/impl/kernels/radix_select.hpp>
#include <oktopk/impl/kernels/vector_ops.hpp>

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace oktopk::test;  // NOLINT(google-build-using-namespace)

template <class ExecSpace>
class HalfKernels : public ::testing::Test {};
TYPED_TEST_SUITE(HalfKernels, EnabledSpaces);

/// 16-bit values from a fixed generator: few distinct magnitudes (ties), zeros of both signs,
/// values the type holds only as subnormals, and NaN and Inf where asked.
template <class V>
std::vector<V> values(std::size_t n, std::uint64_t seed, bool specials) {
  std::vector<V> x(n);
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (std::size_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    const auto r = static_cast<std::uint32_t>(s >> 33);
    float f = 0.0f;
    switch (r % 8) {
      case 0:
        f = (r & 16) != 0 ? -0.0f : 0.0f;
        break;
      case 1:
        f = 1.0f / 4096.0f * static_cast<float>((r >> 8) % 3 + 1);
        break;  // ties
      case 2:
        f = 3e-7f * static_cast<float>((r >> 8) % 50);
        break;  // float16 subnormals
      default:
        f = static_cast<float>(static_cast<int>((r >> 8) % 20001) - 10000) / 997.0f;
    }
    if ((r & 32) != 0) f = -f;
    x[i] = oktopk::round_to<V>(f);
  }
  if (specials && n > 3) {
    x[1] = oktopk::round_to<V>(std::numeric_limits<float>::quiet_NaN());
    x[n / 2] = oktopk::round_to<V>(-std::numeric_limits<float>::infinity());
  }
  return x;
}

template <class ExecSpace, class T>
Kokkos::View<T*, typename ExecSpace::memory_space> on_device(const std::vector<T>& host) {
  Kokkos::View<T*, typename ExecSpace::memory_space> d("test::x", host.size());
  auto mirror = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < host.size(); ++i) mirror(i) = host[i];
  Kokkos::deep_copy(d, mirror);
  return d;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

template <class ExecSpace, class V>
void check_type() {
  ExecSpace exec;
  for (const std::size_t n : {0, 1, 2, 7, 100, 4097, 100003}) {
    for (const bool specials : {false, true}) {
      const std::vector<V> half = values<V>(n, n + (specials ? 7 : 0), specials);
      std::vector<float> widened(n);
      for (std::size_t i = 0; i < n; ++i) widened[i] = oktopk::to_float(half[i]);
      const auto x = on_device<ExecSpace>(half);
      const auto xf = on_device<ExecSpace>(widened);
      const std::string what = std::string(std::is_same_v<V, oktopk::bfloat16> ? "bf16" : "fp16") +
                               ", n = " + std::to_string(n) + (specials ? ", NaN and Inf" : "");
      const auto m = static_cast<std::int64_t>(n);
      for (const std::int64_t k :
           {std::int64_t{0}, std::int64_t{1}, std::int64_t{2}, m / 100, m / 2, m - 1, m, m + 3}) {
        if (k < 0) continue;
        EXPECT_TRUE(
            same_bits(oktopk::kth_largest_abs(exec, x, k), oktopk::kth_largest_abs(exec, xf, k)))
            << what << ", k = " << k;
        if (n > 0) {
          EXPECT_TRUE(same_bits(oktopk::estimate_threshold_sampled(exec, x, k, 64, 5),
                                oktopk::estimate_threshold_sampled(exec, xf, k, 64, 5)))
              << what << ", k = " << k;
          const float gaussian = oktopk::estimate_threshold_gaussian(exec, x, k);
          const float gaussian_f = oktopk::estimate_threshold_gaussian(exec, xf, k);
          EXPECT_TRUE(same_bits(gaussian, gaussian_f) ||
                      (gaussian != gaussian && gaussian_f != gaussian_f))
              << what << ", k = " << k;
        }
      }
      // The radix histogram's GPU shape on every space (rounds of 16 reads for 16-bit values)
      // against the definition on the widened floats: the first pass, and the second under the
      // prefix of the middle entry.
      if (n > 0) {
        Kokkos::View<std::int64_t*, typename ExecSpace::memory_space> got("test::histogram", 2048);
        const std::uint32_t middle = oktopk::impl::abs_key(widened[n / 2]);
        for (const auto& digit :
             {oktopk::impl::radix_digit(0, 0), oktopk::impl::radix_digit(1, middle >> 20)}) {
          std::vector<std::int64_t> expected(2048, 0);
          for (const float w : widened) {
            const std::uint32_t key = oktopk::impl::abs_key(w);
            if (digit.counts(key)) ++expected[static_cast<std::size_t>(digit.bin(key))];
          }
          Kokkos::deep_copy(exec, got, std::int64_t{0});
          oktopk::impl::radix_histogram_device(exec, x, digit, got);
          const auto g = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), got);
          std::int64_t differ = 0;
          for (int b = 0; b < digit.bins; ++b) {
            differ += g(b) == expected[static_cast<std::size_t>(b)] ? 0 : 1;
          }
          EXPECT_EQ(differ, 0) << what << ", pass " << (digit.first_pass ? 0 : 1);
        }
      }
      for (const float t : {-1.0f, 0.0f, 1.0f / 4096.0f, 2.0f / 4096.0f, 1.0f, 9.0f}) {
        EXPECT_EQ(oktopk::count_above(exec, x, t), oktopk::count_above(exec, xf, t))
            << what << ", t = " << t;
        // The GPU shape on every space: rounds of 16 reads for 16-bit values.
        EXPECT_EQ(oktopk::impl::count_above_strided(exec, x, t), oktopk::count_above(exec, xf, t))
            << what << ", t = " << t;
        Kokkos::View<oktopk::index_type*, typename ExecSpace::memory_space> idx("test::idx", n);
        Kokkos::View<V*, typename ExecSpace::memory_space> val("test::val", n);
        Kokkos::View<oktopk::index_type*, typename ExecSpace::memory_space> idx_f("test::idx", n);
        Kokkos::View<float*, typename ExecSpace::memory_space> val_f("test::val", n);
        const std::int64_t count = oktopk::select_above(exec, x, t, idx, val);
        const std::int64_t count_f = oktopk::select_above(exec, xf, t, idx_f, val_f);
        ASSERT_EQ(count, count_f) << what << ", t = " << t;
        const auto hi = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), idx);
        const auto hv = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), val);
        const auto hi_f = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), idx_f);
        std::int64_t differ = 0;
        for (std::int64_t j = 0; j < count; ++j) {
          differ +=
              hi(j) == hi_f(j) && hv(j).bits == half[static_cast<std::size_t>(hi(j))].bits ? 0 : 1;
        }
        EXPECT_EQ(differ, 0) << what << ", t = " << t;
      }
    }
  }
}

TYPED_TEST(HalfKernels, SelectionsAreThoseOfTheWidenedFloats) {
  check_type<TypeParam, oktopk::bfloat16>();
  check_type<TypeParam, oktopk::float16>();
}

TYPED_TEST(HalfKernels, AccumulateWidensAndClearWritesZero) {
  using ExecSpace = TypeParam;
  ExecSpace exec;
  constexpr std::size_t n = 1000;
  const std::vector<oktopk::bfloat16> grad = values<oktopk::bfloat16>(n, 3, false);
  std::vector<float> residual(n);
  for (std::size_t i = 0; i < n; ++i) residual[i] = static_cast<float>(i % 13) * 0.37f - 2.0f;
  const auto g = on_device<ExecSpace>(grad);
  const auto r = on_device<ExecSpace>(residual);
  Kokkos::View<float*, typename ExecSpace::memory_space> acc("test::acc", n);
  oktopk::accumulate_residual(exec, r, g, 0.5f, acc);
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), acc);
  std::int64_t differ = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float expected = residual[i] + 0.5f * oktopk::to_float(grad[i]);
    differ += same_bits(host(i), expected) ? 0 : 1;
  }
  EXPECT_EQ(differ, 0);

  // The accumulate pass in its GPU shape (rounds of entries spread over the vector) on every
  // space, from the bfloat16 gradient: acc = residual + grad widened, bit for bit, and the
  // counts above each level.
  const auto levels = oktopk::impl::guard_levels(1.0f, 1.25, 0, 3);
  std::int64_t totals[1 + oktopk::impl::max_count_levels] = {};
  oktopk::impl::accumulate_counting_strided(exec, r, g, acc, levels, totals);
  const auto summed = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), acc);
  std::int64_t wrong_sums = 0;
  std::int64_t above[oktopk::impl::max_count_levels] = {};
  for (std::size_t i = 0; i < n; ++i) {
    const float expected = residual[i] + oktopk::to_float(grad[i]);
    wrong_sums += same_bits(summed(i), expected) ? 0 : 1;
    for (int j = 0; j < levels.count; ++j)
      above[j] += std::fabs(expected) > levels.threshold[j] ? 1 : 0;
  }
  EXPECT_EQ(wrong_sums, 0);
  EXPECT_EQ(totals[0], 0);
  for (int j = 0; j < levels.count; ++j) EXPECT_EQ(totals[1 + j], above[j]) << "level " << j;

  const std::vector<oktopk::float16> ones(n, oktopk::round_to<oktopk::float16>(1.0f));
  const auto v = on_device<ExecSpace>(ones);
  const std::vector<oktopk::index_type> cleared = {0, 5, 999};
  const auto at = on_device<ExecSpace>(cleared);
  oktopk::clear_at(exec, v, at);
  const auto hv = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  std::int64_t zeros = 0;
  for (std::size_t i = 0; i < n; ++i) zeros += hv(i).bits == 0 ? 1 : 0;
  EXPECT_EQ(zeros, 3);
  EXPECT_EQ(hv(0).bits, 0);
  EXPECT_EQ(hv(999).bits, 0);
}

}  // namespace
