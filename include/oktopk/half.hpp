// SPDX-License-Identifier: BSD-3-Clause
// The 16-bit gradient types, oktopk::bfloat16 and oktopk::float16, and their conversions:
// oktopk::to_float(x) widens exactly, oktopk::round_to<T>(f) rounds a float to nearest even
// (NaN stays NaN, Inf stays Inf, beyond the type's range gives Inf). What a program needs to
// fill or read a View of 16-bit gradients without the rest of the library.
#pragma once

#include <oktopk/impl/base/half_types.hpp>
