// SPDX-License-Identifier: BSD-3-Clause
// The gradient types a handle takes, and for each the type its arithmetic is done in: sums,
// averages and the error-feedback residual. Selections compare magnitudes as floats whatever
// the type (magnitude() in kokkos_compat.hpp), so thresholds are floats everywhere.
#pragma once

#include <oktopk/impl/base/half_types.hpp>

#include <Kokkos_Macros.hpp>

#include <cstdint>
#include <type_traits>

namespace oktopk::impl {

/// What OkTopk knows of a gradient type; defined for the types the library is built for.
template <class Value>
struct ValueTraits;

template <>
struct ValueTraits<float> {
  using arithmetic_type = float;
  /// The name the documentation, checkpoints and error messages use.
  static constexpr const char* name = "float32";
  /// The number checkpoints and agreement checks carry.
  static constexpr std::uint32_t code = 0;
};

template <>
struct ValueTraits<double> {
  using arithmetic_type = double;
  static constexpr const char* name = "float64";
  static constexpr std::uint32_t code = 1;
};

/// The 16-bit types hold values only: their sums, averages and residual are floats, so that
/// what a 16-bit rounding would lose stays in the residual (error feedback).
template <>
struct ValueTraits<bfloat16> {
  using arithmetic_type = float;
  static constexpr const char* name = "bfloat16";
  static constexpr std::uint32_t code = 2;
};

template <>
struct ValueTraits<float16> {
  using arithmetic_type = float;
  static constexpr const char* name = "float16";
  static constexpr std::uint32_t code = 3;
};

/// The gradient types with a ValueTraits, in the order of their codes.
inline constexpr const char* value_type_names[] = {"float32", "float64", "bfloat16", "float16"};

/// Whether T is one of the 16-bit storage types (no arithmetic of their own).
template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

/// The smallest magnitude that rounds to Inf in the 16-bit type T: halfway between its largest
/// finite value and the next power of two, where ties go to the even one, Inf.
template <class T>
inline constexpr float rounds_to_inf_v = std::is_same_v<T, bfloat16> ? 0x1.ffp+127f : 65520.0f;

template <class Value, class = void>
struct is_gradient_value : std::false_type {};
template <class Value>
struct is_gradient_value<Value, std::void_t<typename ValueTraits<Value>::arithmetic_type>>
    : std::true_type {};
template <class Value>
inline constexpr bool is_gradient_value_v = is_gradient_value<Value>::value;

/// The type a handle for gradients of type Value sums, averages and keeps its residual in.
template <class Value>
using arithmetic_t = typename ValueTraits<Value>::arithmetic_type;

/// A stored value as a number to compute with: the 16-bit types widen to float (exactly),
/// float and double stay what they are.
KOKKOS_INLINE_FUNCTION constexpr float to_arithmetic(float x) { return x; }
KOKKOS_INLINE_FUNCTION constexpr double to_arithmetic(double x) { return x; }
KOKKOS_INLINE_FUNCTION float to_arithmetic(bfloat16 x) { return to_float(x); }
KOKKOS_INLINE_FUNCTION float to_arithmetic(float16 x) { return to_float(x); }

/// x stored as To: rounded to nearest even into a 16-bit type or a float, exact into a wider
/// type or the same one. Every kernel that writes a View of the gradient type from a sum writes
/// through it, so a handle's output is its arithmetic rounded once.
template <class To, class From>
KOKKOS_INLINE_FUNCTION To value_cast(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (is_half_v<To>) {
    return round_to<To>(static_cast<float>(to_arithmetic(x)));
  } else {
    return static_cast<To>(to_arithmetic(x));
  }
}

}  // namespace oktopk::impl
