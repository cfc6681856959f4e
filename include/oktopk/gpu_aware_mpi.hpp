// SPDX-License-Identifier: BSD-3-Clause
// Whether this process hands GPU buffers to MPI as they are or through page-locked host copies.
#pragma once

#include <string>

namespace oktopk {

/// \brief How OkTopk hands buffers in GPU memory to MPI in this process (docs/operations.md,
/// "GPU-aware MPI"). Decided once per process, at the first call of gpu_aware_mpi(), from the
/// environment variable OKTOPK_GPU_AWARE_MPI (`on`, `off` or `auto`; unset, the build's default,
/// CMake's OKTOPK_GPU_AWARE_MPI, itself `auto` unless changed):
///   on    device pointers go to MPI, whatever MPI says of itself;
///   off   every message goes through a page-locked host copy;
///   auto  device pointers where MPI says it reads GPU memory: the answer of
///         MPIX_Query_cuda_support / MPIX_Query_rocm_support (Open MPI) or
///         MPIX_GPU_query_support (MPICH 4); where the MPI has no such query, MV2_USE_CUDA=1
///         (MV2_USE_ROCM=1 in a HIP build) on MVAPICH2 and MPICH_GPU_SUPPORT_ENABLED=1 on the
///         rest of the MPICH family (Cray MPICH); host copies otherwise.
/// make_sparse_allreduce throws on every rank when the variable holds another word on some rank
/// and, for a handle on a GPU, when the ranks of its communicator did not all choose alike.
/// Host memory always goes to MPI as it is: in a build without a GPU backend the choice
/// changes nothing (`reason` says so, or names a bad word).
struct GpuAwareMpi {
  bool device_pointers = false;  ///< whether MPI gets device pointers (else host copies)
  std::string setting;  ///< "on", "off" or "auto": the variable's value, or the build's default
  std::string reason;   ///< why, in words: the setting, the query and its answer, or the variable
  std::string error;    ///< empty, or why the variable's value is not one of the three words
};

/// \brief This process's choice (see GpuAwareMpi), made at the first call; call it after
/// MPI_Init, since `auto` asks MPI. Thread-safe.
const GpuAwareMpi& gpu_aware_mpi();

}  // namespace oktopk
