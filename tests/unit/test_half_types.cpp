// SPDX-License-Identifier: BSD-3-Clause
// The 16-bit storage types' conversions, run in kernels of every space, bit for bit against a
// host reference that works from the types' definitions (powers of two and a nearest search),
// not from the bit tricks the library uses: every one of the 65,536 patterns both ways, every
// midpoint between neighbours and the floats next to it, specials, and random floats.
#include "exec_spaces.hpp"

#include <oktopk/impl/base/half_types.hpp>

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace {

using namespace oktopk::test;  // NOLINT(google-build-using-namespace)

std::uint32_t bits_of(float x) {
  std::uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

float float_of(std::uint32_t u) {
  float x = 0.0f;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

/// One 16-bit format by its definition: exponent and fraction widths and the exponent bias.
struct Format {
  const char* name;
  int exponent_bits;
  int fraction_bits;
  int bias() const { return (1 << (exponent_bits - 1)) - 1; }
  std::uint32_t exponent_all_ones() const { return (1u << exponent_bits) - 1u; }
  /// The pattern of +Inf, one past the largest finite magnitude.
  std::uint32_t infinity() const { return exponent_all_ones() << fraction_bits; }

  /// The value of a pattern: (-1)^s 2^(e - bias) (1 + f / 2^F), or 2^(1 - bias) f / 2^F when
  /// e = 0; Inf or NaN when e is all ones. Exact in double, hence as a float.
  double value(std::uint32_t pattern) const {
    const bool negative = (pattern >> (exponent_bits + fraction_bits)) & 1u;
    const std::uint32_t e = (pattern >> fraction_bits) & exponent_all_ones();
    const std::uint32_t f = pattern & ((1u << fraction_bits) - 1u);
    double magnitude = 0.0;
    if (e == exponent_all_ones()) {
      magnitude = f == 0 ? std::numeric_limits<double>::infinity()
                         : std::numeric_limits<double>::quiet_NaN();
    } else if (e == 0) {
      magnitude = std::ldexp(static_cast<double>(f), 1 - bias() - fraction_bits);
    } else {
      magnitude = std::ldexp(static_cast<double>((1u << fraction_bits) + f),
                             static_cast<int>(e) - bias() - fraction_bits);
    }
    return negative ? -magnitude : magnitude;
  }

  /// What the value one past the largest finite one would be, were the exponent not reserved.
  double beyond_largest() const { return std::ldexp(1.0, bias() + 1); }

  /// x rounded to the format: the nearest of the finite magnitudes (Inf from halfway past the
  /// largest on), ties to the even pattern; NaN to NaN. Returns the pattern, or for NaN the
  /// quiet NaN with x's sign (the test accepts any NaN of that sign).
  std::uint16_t round(float x) const {
    const std::uint32_t sign = bits_of(x) >> 31 << (exponent_bits + fraction_bits);
    if (std::isnan(x))
      return static_cast<std::uint16_t>(sign | infinity() | (1u << (fraction_bits - 1)));
    const double target = std::fabs(static_cast<double>(x));
    // The largest pattern whose value is <= target (values grow with patterns).
    std::uint32_t lo = 0;
    std::uint32_t hi = infinity();  // exclusive
    while (hi - lo > 1) {
      const std::uint32_t mid = lo + (hi - lo) / 2;
      if (value(mid) <= target) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    std::uint32_t best = lo;
    if (value(lo) != target) {
      const std::uint32_t up = lo + 1;
      const double up_value = up == infinity() ? beyond_largest() : value(up);
      const double below = target - value(lo);
      const double above = up_value - target;
      if (above < below || (above == below && (up & 1u) == 0)) best = up;
    }
    return static_cast<std::uint16_t>(sign | best);
  }
};

constexpr Format kBFloat16{"bfloat16", 8, 7};
constexpr Format kFloat16{"float16", 5, 10};

/// The floats whose rounding is worth checking: every value of the format, every midpoint
/// between neighbours (and past the largest), the floats on either side of each, both signs;
/// specials; and pseudo-random bit patterns (deterministic).
std::vector<float> rounding_inputs(const Format& format) {
  std::vector<float> inputs;
  const std::uint32_t inf = format.infinity();
  for (std::uint32_t p = 0; p < inf; ++p) {
    const double here = format.value(p);
    const double next = p + 1 == inf ? format.beyond_largest() : format.value(p + 1);
    const auto midpoint = static_cast<float>((here + next) / 2);  // exact: one more bit
    EXPECT_EQ(static_cast<double>(midpoint), (here + next) / 2) << format.name << " " << p;
    for (const float x : {static_cast<float>(here), midpoint, std::nextafter(midpoint, 0.0f),
                          std::nextafter(midpoint, std::numeric_limits<float>::infinity())}) {
      inputs.push_back(x);
      inputs.push_back(-x);
    }
  }
  const float specials[] = {0.0f,
                            std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::min(),
                            std::numeric_limits<float>::denorm_min(),
                            float_of(0x7fc00000u),   // quiet NaN
                            float_of(0x7f800001u),   // signalling NaN, smallest payload
                            float_of(0x7fbfffffu),   // signalling NaN, payload that rounds up
                            float_of(0x7fffffffu)};  // quiet NaN, all payload bits
  for (const float x : specials) {
    inputs.push_back(x);
    inputs.push_back(-x);
  }
  std::uint32_t state = 0x9e3779b9u;
  for (int i = 0; i < (1 << 20); ++i) {
    state ^= state << 13, state ^= state >> 17, state ^= state << 5;
    inputs.push_back(float_of(state));
  }
  return inputs;
}

/// The pattern matches the reference: equal bits, or both NaN with the same sign.
bool same_rounding(const Format& format, std::uint16_t got, std::uint16_t expected) {
  if (got == expected) return true;
  const auto is_nan = [&](std::uint16_t p) {
    return ((p >> format.fraction_bits) & format.exponent_all_ones()) ==
               format.exponent_all_ones() &&
           (p & ((1u << format.fraction_bits) - 1u)) != 0;
  };
  return is_nan(got) && is_nan(expected) && (got >> 15) == (expected >> 15);
}

template <class ExecSpace>
class HalfTypes : public ::testing::Test {};
TYPED_TEST_SUITE(HalfTypes, EnabledSpaces);

template <class ExecSpace, class Half>
void expect_widening_matches(const Format& format) {
  using Memory = typename ExecSpace::memory_space;
  const ExecSpace exec;
  Kokkos::View<Half*, Memory> patterns("test::patterns", 65536);
  Kokkos::View<float*, Memory> widened("test::widened", 65536);
  Kokkos::parallel_for(
      "test::widen", Kokkos::RangePolicy<ExecSpace>(exec, 0, 65536), KOKKOS_LAMBDA(int i) {
        patterns(i) = Half{static_cast<std::uint16_t>(i)};
        widened(i) = oktopk::to_float(patterns(i));
      });
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), widened);
  int wrong = 0;
  std::string first;
  for (std::uint32_t p = 0; p < 65536; ++p) {
    const double expected = format.value(p);
    const bool ok = std::isnan(expected)
                        ? std::isnan(host(p)) && std::signbit(host(p)) == ((p >> 15) != 0)
                        : bits_of(host(p)) == bits_of(static_cast<float>(expected));
    if (!ok && wrong++ == 0) {
      first = "pattern " + std::to_string(p) + ": " + std::to_string(host(p)) + " instead of " +
              std::to_string(expected);
    }
  }
  EXPECT_EQ(wrong, 0) << format.name << " to float, first: " << first;
}

template <class ExecSpace, class Half>
void expect_rounding_matches(const Format& format) {
  using Memory = typename ExecSpace::memory_space;
  const ExecSpace exec;
  const std::vector<float> inputs = rounding_inputs(format);
  const auto count = static_cast<int>(inputs.size());
  Kokkos::View<float*, Kokkos::HostSpace> host_in("test::in", inputs.size());
  for (int i = 0; i < count; ++i) host_in(i) = inputs[static_cast<std::size_t>(i)];
  const auto in = Kokkos::create_mirror_view_and_copy(Memory(), host_in);
  Kokkos::View<std::uint16_t*, Memory> rounded("test::rounded", inputs.size());
  Kokkos::parallel_for(
      "test::round", Kokkos::RangePolicy<ExecSpace>(exec, 0, count),
      KOKKOS_LAMBDA(int i) { rounded(i) = oktopk::round_to<Half>(in(i)).bits; });
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), rounded);
  int wrong = 0;
  std::string first;
  for (int i = 0; i < count; ++i) {
    const float x = inputs[static_cast<std::size_t>(i)];
    const std::uint16_t expected = format.round(x);
    if (!same_rounding(format, host(i), expected) && wrong++ == 0) {
      first = "float bits " + std::to_string(bits_of(x)) + ": pattern " + std::to_string(host(i)) +
              " instead of " + std::to_string(expected);
    }
  }
  EXPECT_EQ(wrong, 0) << format.name << " rounding of " << count << " floats, first: " << first;
}

TYPED_TEST(HalfTypes, BFloat16WidensEveryPatternExactly) {
  expect_widening_matches<TypeParam, oktopk::bfloat16>(kBFloat16);
}

TYPED_TEST(HalfTypes, Float16WidensEveryPatternExactly) {
  expect_widening_matches<TypeParam, oktopk::float16>(kFloat16);
}

TYPED_TEST(HalfTypes, BFloat16RoundsToNearestEven) {
  expect_rounding_matches<TypeParam, oktopk::bfloat16>(kBFloat16);
}

TYPED_TEST(HalfTypes, Float16RoundsToNearestEven) {
  expect_rounding_matches<TypeParam, oktopk::float16>(kFloat16);
}

TEST(HalfTypes, ReferenceRoundsAsTheStandardSays) {
  // The reference itself, on cases worked by hand, so a shared mistake cannot pass unseen.
  EXPECT_EQ(kFloat16.round(65504.0f), 0x7bffu);         // the largest float16
  EXPECT_EQ(kFloat16.round(65519.0f), 0x7bffu);         // below halfway to 65536
  EXPECT_EQ(kFloat16.round(65520.0f), 0x7c00u);         // halfway: to even, i.e. Inf
  EXPECT_EQ(kFloat16.round(0x1p-24f), 0x0001u);         // the smallest subnormal
  EXPECT_EQ(kFloat16.round(0x1p-25f), 0x0000u);         // halfway to it: to even zero
  EXPECT_EQ(kFloat16.round(0x1.8p-24f), 0x0002u);       // 1.5 units: to even 2
  EXPECT_EQ(kFloat16.round(1.0f + 0x1p-11f), 0x3c00u);  // halfway above 1: to even 1
  EXPECT_EQ(kFloat16.round(-2.0f), 0xc000u);
  EXPECT_EQ(kBFloat16.round(1.0f + 0x1p-8f), 0x3f80u);                     // halfway: to even 1
  EXPECT_EQ(kBFloat16.round(1.0f + 0x1.8p-7f), 0x3f82u);                   // 1.5 units: to even 2
  EXPECT_EQ(kBFloat16.round(std::numeric_limits<float>::max()), 0x7f80u);  // Inf
  EXPECT_EQ(kBFloat16.round(-0.0f), 0x8000u);
}

}  // namespace
