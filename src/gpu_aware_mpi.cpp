// SPDX-License-Identifier: BSD-3-Clause
#include <oktopk/impl/comm/gpu_aware_mpi.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>
#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>
#endif

namespace oktopk::impl {

namespace {

[[maybe_unused]] GpuAwareness from_flag(int flag, const char* query, std::string& how) {
  how = std::string(query) + " returned " + std::to_string(flag);
  return flag != 0 ? GpuAwareness::Yes : GpuAwareness::No;
}

}  // namespace

GpuAwareness query_gpu_aware_mpi(std::string& how) {
#if defined(KOKKOS_ENABLE_CUDA) && defined(OMPI_HAVE_MPI_EXT_CUDA)
  return from_flag(MPIX_Query_cuda_support(), "MPIX_Query_cuda_support()", how);
#elif defined(KOKKOS_ENABLE_HIP) && defined(OMPI_HAVE_MPI_EXT_ROCM)
  return from_flag(MPIX_Query_rocm_support(), "MPIX_Query_rocm_support()", how);
#elif (defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP)) && defined(MPICH_NUMVERSION) && \
    MPICH_NUMVERSION >= 40000000
#if defined(KOKKOS_ENABLE_CUDA)
  const int gpu_type = MPIX_GPU_SUPPORT_CUDA;
  const char* query = "MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA)";
#else
  const int gpu_type = MPIX_GPU_SUPPORT_HIP;
  const char* query = "MPIX_GPU_query_support(MPIX_GPU_SUPPORT_HIP)";
#endif
  int supported = 0;
  if (MPIX_GPU_query_support(gpu_type, &supported) != MPI_SUCCESS) {
    how = std::string(query) + " failed";
    return GpuAwareness::Unknown;
  }
  return from_flag(supported, query, how);
#else
  how = "this MPI offers no query for GPU support";
  return GpuAwareness::Unknown;
#endif
}

}  // namespace oktopk::impl
