// SPDX-License-Identifier: BSD-3-Clause
// The type a handle's values travel in (Options::wire, value_wire()), and one value on that
// wire: rounded to the wire's type, and written as, or read from, the 16-bit words a sparse
// method's messages carry. Device functions, with the
// wire a runtime argument (the same branch for every thread of a kernel).
#pragma once

#include <oktopk/options.hpp>
#include <oktopk/impl/base/half_types.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>

#include <Kokkos_Macros.hpp>

#include <cstdint>
#include <type_traits>

namespace oktopk::impl {

/// The type a handle for gradients of type Value sends its values in, in every method and in
/// its dense calls: a 16-bit gradient's own type; for float gradients Native (the arithmetic
/// type) or bf16 or fp16 as Options::wire says (fp32 is Native); for double ones Native or fp32.
/// Anything but Native is narrower than the arithmetic type: values are rounded when sent.
/// make_sparse_allreduce refuses the other pairs.
template <class Value>
Wire value_wire(const Options& options) {
  if constexpr (std::is_same_v<Value, bfloat16>) {
    return Wire::BFloat16;
  } else if constexpr (std::is_same_v<Value, float16>) {
    return Wire::Float16;
  } else if constexpr (std::is_same_v<Value, float>) {
    return options.wire == Wire::Float32 ? Wire::Native : options.wire;
  } else {
    return options.wire;
  }
}

/// 16-bit words one value of type Real takes on `wire` (a value_wire() result).
template <class Real>
constexpr std::int64_t wire_words(Wire wire) {
  if (wire == Wire::BFloat16 || wire == Wire::Float16) return 1;
  if (wire == Wire::Float32) return 2;
  return static_cast<std::int64_t>(sizeof(Real) / 2);
}

/// v as it arrives through `wire`: rounded to nearest, ties to even, in the wire's type, then
/// widened back (exactly). The same function wherever it runs, so the sender's residual keeps
/// exactly what the receivers did not get.
KOKKOS_INLINE_FUNCTION float wire_rounded(float v, Wire wire) {
  if (wire == Wire::BFloat16) return to_float(round_to<bfloat16>(v));
  if (wire == Wire::Float16) return to_float(round_to<float16>(v));
  return v;
}
KOKKOS_INLINE_FUNCTION double wire_rounded(double v, Wire wire) {
  if (wire == Wire::Float32) return static_cast<double>(static_cast<float>(v));
  return v;
}

/// Writes v, rounded for `wire`, as wire_words<Real>(wire) words from words(at), low bits
/// first; returns the rounded value.
template <class Words>
KOKKOS_INLINE_FUNCTION float put_wire_value(const Words& words, std::int64_t at, float v,
                                            Wire wire) {
  if (wire == Wire::BFloat16) {
    const bfloat16 w = round_to<bfloat16>(v);
    words(at) = w.bits;
    return to_float(w);
  }
  if (wire == Wire::Float16) {
    const float16 w = round_to<float16>(v);
    words(at) = w.bits;
    return to_float(w);
  }
  const std::uint32_t bits = float_to_bits(v);
  words(at) = static_cast<std::uint16_t>(bits);
  words(at + 1) = static_cast<std::uint16_t>(bits >> 16);
  return v;
}
template <class Words>
KOKKOS_INLINE_FUNCTION double put_wire_value(const Words& words, std::int64_t at, double v,
                                             Wire wire) {
  if (wire == Wire::Float32) {
    const float w = static_cast<float>(v);
    const std::uint32_t bits = float_to_bits(w);
    words(at) = static_cast<std::uint16_t>(bits);
    words(at + 1) = static_cast<std::uint16_t>(bits >> 16);
    return static_cast<double>(w);
  }
  const std::uint64_t bits = double_to_bits(v);
  for (int part = 0; part < 4; ++part)
    words(at + part) = static_cast<std::uint16_t>(bits >> (16 * part));
  return v;
}

/// The value put_wire_value wrote at words(at), widened to Real.
template <class Words>
KOKKOS_INLINE_FUNCTION void get_wire_value(const Words& words, std::int64_t at, Wire wire,
                                           float& v) {
  if (wire == Wire::BFloat16) {
    v = to_float(bfloat16{static_cast<std::uint16_t>(words(at))});
  } else if (wire == Wire::Float16) {
    v = to_float(float16{static_cast<std::uint16_t>(words(at))});
  } else {
    v = bits_to_float(static_cast<std::uint32_t>(words(at)) |
                      (static_cast<std::uint32_t>(words(at + 1)) << 16));
  }
}
template <class Words>
KOKKOS_INLINE_FUNCTION void get_wire_value(const Words& words, std::int64_t at, Wire wire,
                                           double& v) {
  if (wire == Wire::Float32) {
    v = static_cast<double>(bits_to_float(static_cast<std::uint32_t>(words(at)) |
                                          (static_cast<std::uint32_t>(words(at + 1)) << 16)));
  } else {
    std::uint64_t bits = 0;
    for (int part = 0; part < 4; ++part)
      bits |= static_cast<std::uint64_t>(static_cast<std::uint16_t>(words(at + part)))
              << (16 * part);
    v = bits_to_double(bits);
  }
}

}  // namespace oktopk::impl
