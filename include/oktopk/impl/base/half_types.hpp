// SPDX-License-Identifier: BSD-3-Clause
// OkTopk's own 16-bit floating-point storage types and their conversions to and from float.
// Kokkos 3.4's half_t and bhalf_t differ from 4.x's, and 3.4 has no host bfloat16 at all, so the
// library owns the bit patterns and converts with integer operations that read the same on
// every backend: round to nearest, ties to even; NaN stays NaN (quiet, same sign), Inf stays
// Inf, and a float beyond the type's range rounds to Inf as IEEE 754 says.
#pragma once

#include <oktopk/impl/base/kokkos_compat.hpp>

#include <Kokkos_Macros.hpp>

#include <cstdint>

namespace oktopk {

/// \brief A bfloat16 value: the upper half of a float's bit pattern (1 sign, 8 exponent and 7
/// fraction bits), so float's range with 8 bits of precision.
struct bfloat16 {
  std::uint16_t bits;
};

/// \brief An IEEE 754 binary16 value (1 sign, 5 exponent and 10 fraction bits): 11 bits of
/// precision, finite magnitudes up to 65504, subnormals down to 2^-24.
struct float16 {
  std::uint16_t bits;
};

static_assert(sizeof(bfloat16) == 2 && alignof(bfloat16) == 2, "bfloat16 is two bytes");
static_assert(sizeof(float16) == 2 && alignof(float16) == 2, "float16 is two bytes");

/// The float whose upper half `x` is: exact.
KOKKOS_INLINE_FUNCTION float to_float(bfloat16 x) {
  return impl::bits_to_float(static_cast<std::uint32_t>(x.bits) << 16);
}

/// The float `x` stands for: exact (every binary16 value is a float). Branch-free, so that
/// loops over float16 Views vectorize: all three readings are formed and one is selected, and
/// none of them computes with a subnormal float (which flush-to-zero modes would read as 0).
KOKKOS_INLINE_FUNCTION float to_float(float16 x) {
  const std::uint32_t sign = static_cast<std::uint32_t>(x.bits & 0x8000u) << 16;
  const std::uint32_t exponent = (x.bits >> 10) & 0x1fu;
  const std::uint32_t fraction = x.bits & 0x3ffu;
  // Normal: rebias the exponent from 15 to 127. Inf and NaN: all ones, payload kept.
  const std::uint32_t normal = ((exponent + 112u) << 23) | (fraction << 13);
  const std::uint32_t special = 0x7f800000u | (fraction << 13);
  // Zero or subnormal: fraction * 2^-24, a normal float (or zero) times a power of two: exact.
  const std::uint32_t subnormal =
      impl::float_to_bits(static_cast<float>(static_cast<std::int32_t>(fraction)) * 0x1p-24f);
  // Masks rather than conditionals: compilers keep those out of the loop's control flow.
  const std::uint32_t is_subnormal = 0u - static_cast<std::uint32_t>(exponent == 0);
  const std::uint32_t is_special = 0u - static_cast<std::uint32_t>(exponent == 0x1fu);
  const std::uint32_t magnitude =
      (subnormal & is_subnormal) | (special & is_special) | (normal & ~(is_subnormal | is_special));
  return impl::bits_to_float(sign | magnitude);
}

KOKKOS_INLINE_FUNCTION constexpr float to_float(float x) { return x; }

namespace impl {
/// |x| as a float, as selections compare it (kokkos_compat.hpp): exact for the 16-bit types.
KOKKOS_INLINE_FUNCTION float magnitude(bfloat16 x) {
  return bits_to_float(static_cast<std::uint32_t>(x.bits & 0x7fffu) << 16);
}
KOKKOS_INLINE_FUNCTION float magnitude(float16 x) {
  return to_float(float16{static_cast<std::uint16_t>(x.bits & 0x7fffu)});
}
}  // namespace impl

/// \brief `x` rounded to T (float, bfloat16 or float16): to nearest, ties to even.
template <class T>
KOKKOS_INLINE_FUNCTION T round_to(float x);

template <>
KOKKOS_INLINE_FUNCTION float round_to<float>(float x) {
  return x;
}

template <>
KOKKOS_INLINE_FUNCTION bfloat16 round_to<bfloat16>(float x) {
  const std::uint32_t u = impl::float_to_bits(x);
  // NaN: keep the sign and the upper payload, and set the quiet bit, so it cannot become Inf.
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return bfloat16{static_cast<std::uint16_t>((u >> 16) | 0x40u)};
  // Adding 0x7fff plus the kept part's lowest bit carries into it exactly when the dropped half
  // is above the midpoint, or on it with an odd kept part; a carry out of the fraction bumps the
  // exponent, up to Inf, as rounding should.
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return bfloat16{static_cast<std::uint16_t>(rounded >> 16)};
}

template <>
KOKKOS_INLINE_FUNCTION float16 round_to<float16>(float x) {
  const std::uint32_t u = impl::float_to_bits(x);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {
    // NaN: the quiet bit and the upper payload bits.
    return float16{static_cast<std::uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu))};
  }
  // 65520 (0x477ff000) is halfway between 65504, the largest float16, and 65536; ties go to
  // the even 65536, which is out of range: Inf from there on.
  if (magnitude >= 0x477ff000u) return float16{static_cast<std::uint16_t>(sign | 0x7c00u)};
  if (magnitude >= 0x38800000u) {
    // Normal (>= 2^-14): rebias the exponent from 127 to 15, then round away 13 fraction bits
    // as round_to<bfloat16> rounds away 16.
    const std::uint32_t rebiased = magnitude - 0x38000000u;
    const std::uint32_t rounded = rebiased + 0x0fffu + ((rebiased >> 13) & 1u);
    return float16{static_cast<std::uint16_t>(sign | (rounded >> 13))};
  }
  const std::uint32_t exponent = magnitude >> 23;
  // Below 2^-25 (float subnormals included) everything rounds to zero.
  if (exponent < 102u) return float16{sign};
  // Subnormal result: the value is significand * 2^(exponent - 150), in units of 2^-24 that is
  // significand >> (126 - exponent), with 14 <= shift <= 24; round the dropped bits to even.
  const std::uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126u - exponent;
  std::uint32_t units = significand >> shift;
  const std::uint32_t dropped = significand & ((1u << shift) - 1u);
  const std::uint32_t midpoint = 1u << (shift - 1u);
  if (dropped > midpoint || (dropped == midpoint && (units & 1u) != 0)) ++units;
  // units == 0x400 is the smallest normal, whose bit pattern it also is.
  return float16{static_cast<std::uint16_t>(sign | units)};
}

}  // namespace oktopk
