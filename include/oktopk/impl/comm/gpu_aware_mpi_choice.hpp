// SPDX-License-Identifier: BSD-3-Clause
// How the process's GPU-aware MPI choice (oktopk/gpu_aware_mpi.hpp) is made and agreed on:
// handing device pointers to an MPI that cannot read them crashes or, worse, reads host memory
// at the same address, and staging on an MPI that can read them costs two copies per message.
#pragma once

#include <oktopk/communicator.hpp>
#include <oktopk/gpu_aware_mpi.hpp>

#include <string>

namespace oktopk::impl {

enum class GpuAwareness { Yes, No, Unknown };

/// \brief Asks MPI at run time whether it handles memory of the GPU backend this library was
/// built for (CUDA or HIP): MPIX_Query_cuda_support / MPIX_Query_rocm_support (Open MPI),
/// MPIX_GPU_query_support (MPICH 4 and later). Unknown where the MPI offers no such query, or
/// the build has no GPU backend. `how` names the query and what it answered.
GpuAwareness query_gpu_aware_mpi(std::string& how);

/// Everything the choice depends on, so that it can be made (and tested) without MPI.
struct GpuAwareMpiInputs {
  const char* setting = nullptr;       ///< OKTOPK_GPU_AWARE_MPI, or nullptr when unset
  const char* build_default = "auto";  ///< the build's default setting
  bool gpu_backend = false;            ///< whether the build has a GPU backend
  GpuAwareness query = GpuAwareness::Unknown;
  std::string query_how;  ///< what query_gpu_aware_mpi said in `how`
  /// Where the MPI has no query: the environment variable that turns its GPU support on
  /// (MV2_USE_CUDA, MV2_USE_ROCM or MPICH_GPU_SUPPORT_ENABLED), or nullptr for an MPI without
  /// one (Open MPI built without the extension), and that variable's value (nullptr: unset).
  const char* support_variable = nullptr;
  const char* support_value = nullptr;
};

/// The choice GpuAwareMpi documents, from `inputs`; never throws for a bad setting (it fills
/// `error`, and chooses host copies).
GpuAwareMpi decide_gpu_aware_mpi(const GpuAwareMpiInputs& inputs);

/// \brief Collective. Checks that every rank of `comm` read a valid setting and, when
/// `device_buffers` (a handle on a GPU), that every rank made the same choice `local`.
/// Otherwise every rank throws, starting with `where`: std::invalid_argument for a bad setting,
/// naming the lowest rank with one, or std::runtime_error for ranks that chose differently,
/// naming the lowest rank of each side and why it chose so.
void agree_on_gpu_aware_mpi(const Communicator& comm, const char* where, const GpuAwareMpi& local,
                            bool device_buffers);

}  // namespace oktopk::impl
