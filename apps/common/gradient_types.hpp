// SPDX-License-Identifier: BSD-3-Clause
// The gradient types the programs take by name (--dtype), and the two conversions their own
// kernels need: a value as the number it stands for, and a float stored as a value.
#pragma once

#include <oktopk/half.hpp>

#include <Kokkos_Macros.hpp>

#include <string>
#include <type_traits>

namespace oktopk::apps {

/// The --dtype names, as the library names the types (checkpoints, error messages).
inline constexpr const char* dtype_list = "float32, float64, bfloat16 or float16";

inline bool is_dtype(const std::string& name) {
  return name == "float32" || name == "float64" || name == "bfloat16" || name == "float16";
}

/// f(Value{}) for the type `name` stands for (float32 for any name is_dtype refuses: check
/// first), so that f instantiates once per type.
template <class F>
decltype(auto) with_dtype(const std::string& name, F&& f) {
  if (name == "float64") return f(double{});
  if (name == "bfloat16") return f(oktopk::bfloat16{});
  if (name == "float16") return f(oktopk::float16{});
  return f(float{});
}

/// The number a stored value stands for: a 16-bit value widened to float (exactly), a float or
/// a double as it is.
KOKKOS_INLINE_FUNCTION constexpr float number_of(float x) { return x; }
KOKKOS_INLINE_FUNCTION constexpr double number_of(double x) { return x; }
KOKKOS_INLINE_FUNCTION float number_of(oktopk::bfloat16 x) { return oktopk::to_float(x); }
KOKKOS_INLINE_FUNCTION float number_of(oktopk::float16 x) { return oktopk::to_float(x); }

/// f stored as a Value: rounded to nearest even for the 16-bit types, exact for float and
/// double. A function, not a branch in a kernel: nvcc refuses `if constexpr` around a device
/// lambda's first use of a capture.
template <class Value>
KOKKOS_INLINE_FUNCTION Value value_from_float(float f) {
  if constexpr (std::is_same_v<Value, oktopk::bfloat16> || std::is_same_v<Value, oktopk::float16>) {
    return oktopk::round_to<Value>(f);
  } else {
    return static_cast<Value>(f);
  }
}

}  // namespace oktopk::apps
