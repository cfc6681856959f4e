// SPDX-License-Identifier: BSD-3-Clause
// oktopk-bench: the execution space and the vector of draws that all its files share.
#pragma once

#include <Kokkos_Core.hpp>

namespace oktopk::bench {

using Exec = Kokkos::DefaultExecutionSpace;
/// The gradients as drawn (or read from a file): float32, whatever --dtype rounds them into.
using Vector = Kokkos::View<float*, Exec::memory_space>;

}  // namespace oktopk::bench
