// SPDX-License-Identifier: BSD-3-Clause
// The gradient types a handle takes, and for each the type its arithmetic is done in: sums,
// averages and the error-feedback residual. Selections compare magnitudes as floats whatever
// the type (magnitude() in kokkos_compat.hpp), so thresholds are floats everywhere.
#pragma once

#include <cstdint>
#include <type_traits>

namespace oktopk::impl {

/// What OkTopk knows of a gradient type; defined for the types the library is built for.
template <class Value>
struct ValueTraits;

template <>
struct ValueTraits<float> {
  using arithmetic_type = float;
  /// The name the user guide, checkpoints and error messages use.
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

/// The gradient types with a ValueTraits, in the order of their codes.
inline constexpr const char* value_type_names[] = {"float32", "float64"};

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

}  // namespace oktopk::impl
