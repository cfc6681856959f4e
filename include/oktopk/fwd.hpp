// SPDX-License-Identifier: BSD-3-Clause
// The scalar types of OkTopk's sparse data and forward declarations of its classes.
#pragma once

#include <cstdint>

namespace oktopk {

/// Gradient values.
using value_type = float;
/// Positions in a gradient or in a region of it: 32-bit, so lengths are < 2^31.
using index_type = std::int32_t;
/// Counts and offsets, which may exceed 2^31 when summed over ranks.
using count_type = std::int64_t;

class Communicator;
struct PhaseTraffic;
// 16-bit floating-point storage types: impl/base/half_types.hpp.
struct bfloat16;
struct float16;

}  // namespace oktopk
