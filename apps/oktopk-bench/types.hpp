// SPDX-License-Identifier: BSD-3-Clause
// oktopk-bench: the execution space, handle and vector types that all its files share.
#pragma once

#include <oktopk/oktopk.hpp>

#include <Kokkos_Core.hpp>

namespace oktopk::bench {

using Exec = Kokkos::DefaultExecutionSpace;
using Handle = oktopk::SparseAllreduce<Exec>;
using Vector = Handle::vector_type;

}  // namespace oktopk::bench
