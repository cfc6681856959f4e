// SPDX-License-Identifier: BSD-3-Clause
// What the MPI library says about reading and writing GPU memory, for builds with
// OKTOPK_ENABLE_GPU_AWARE_MPI=ON: handing device pointers to an MPI that cannot read them
// crashes or, worse, reads host memory at the same address.
#pragma once

#include <string>

namespace oktopk::impl {

enum class GpuAwareness { Yes, No, Unknown };

/// \brief Asks MPI at run time whether it handles memory of the GPU backend this library was
/// built for (CUDA or HIP): MPIX_Query_cuda_support / MPIX_Query_rocm_support (Open MPI),
/// MPIX_GPU_query_support (MPICH 4 and Cray MPICH, which also needs MPICH_GPU_SUPPORT_ENABLED=1).
/// Unknown where the MPI offers no such query, or the build has no GPU backend. `how` names the
/// query and what it answered, for error messages.
GpuAwareness query_gpu_aware_mpi(std::string& how);

}  // namespace oktopk::impl
