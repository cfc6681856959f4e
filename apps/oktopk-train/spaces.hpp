// SPDX-License-Identifier: BSD-3-Clause
// Where oktopk-train computes: the execution and memory space of its models, layers and data.
// A header of its own so that the layers need not include the models that are built of them.
#pragma once

#include <Kokkos_Core.hpp>

namespace oktopk::train {

using ExecutionSpace = Kokkos::DefaultExecutionSpace;
using MemorySpace = ExecutionSpace::memory_space;

}  // namespace oktopk::train
