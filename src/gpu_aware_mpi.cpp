// SPDX-License-Identifier: BSD-3-Clause
#include <oktopk/config.hpp>
#include <oktopk/error.hpp>
#include <oktopk/gpu_aware_mpi.hpp>
#include <oktopk/impl/comm/gpu_aware_mpi_choice.hpp>
#include <oktopk/impl/comm/mpi_mirror.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>
#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>
#endif

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>

namespace oktopk {

namespace impl {

bool stage_host_views_for_tests = false;

namespace {

[[maybe_unused]] GpuAwareness from_flag(int flag, const char* query, std::string& how) {
  how = std::string(query) + " returned " + std::to_string(flag);
  return flag != 0 ? GpuAwareness::Yes : GpuAwareness::No;
}

std::string lowercase(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

}  // namespace

GpuAwareness query_gpu_aware_mpi(std::string& how) {
#if defined(KOKKOS_ENABLE_CUDA) && defined(OMPI_HAVE_MPI_EXT_CUDA) && OMPI_HAVE_MPI_EXT_CUDA
  return from_flag(MPIX_Query_cuda_support(), "MPIX_Query_cuda_support()", how);
#elif defined(KOKKOS_ENABLE_HIP) && defined(OMPI_HAVE_MPI_EXT_ROCM) && OMPI_HAVE_MPI_EXT_ROCM
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

GpuAwareMpi decide_gpu_aware_mpi(const GpuAwareMpiInputs& inputs) {
  GpuAwareMpi choice;
  const bool from_variable = inputs.setting != nullptr && inputs.setting[0] != '\0';
  choice.setting = lowercase(from_variable ? inputs.setting : inputs.build_default);
  const std::string source =
      from_variable ? "OKTOPK_GPU_AWARE_MPI=" + choice.setting
                    : "OKTOPK_GPU_AWARE_MPI unset, the build's default " + choice.setting;
  if (choice.setting != "on" && choice.setting != "off" && choice.setting != "auto") {
    choice.error = std::string(from_variable ? "OKTOPK_GPU_AWARE_MPI" : "the build's default") +
                   " is '" + (from_variable ? inputs.setting : inputs.build_default) +
                   "', not on, off or auto";
    choice.reason = choice.error + ": host copies";
    return choice;
  }
  if (!inputs.gpu_backend) {
    choice.reason = "this build has no GPU backend: MPI reads host memory as it is";
    return choice;
  }
  if (choice.setting != "auto") {
    choice.device_pointers = choice.setting == "on";
    choice.reason = source + (choice.device_pointers ? ": device pointers" : ": host copies");
    if (!inputs.query_how.empty()) choice.reason += " (" + inputs.query_how + ")";
    return choice;
  }
  choice.reason = source + ": " + inputs.query_how;
  if (inputs.query != GpuAwareness::Unknown) {
    choice.device_pointers = inputs.query == GpuAwareness::Yes;
  } else if (inputs.support_variable != nullptr) {
    const std::string value = inputs.support_value != nullptr ? inputs.support_value : "";
    choice.device_pointers = value == "1";
    choice.reason += std::string("; ") + inputs.support_variable +
                     (inputs.support_value != nullptr ? "=" + value : " is unset");
  }
  choice.reason += choice.device_pointers ? ": device pointers" : ": host copies";
  if (!choice.device_pointers && inputs.query != GpuAwareness::No) {
    choice.reason += " (OKTOPK_GPU_AWARE_MPI=on if this MPI reads GPU memory)";
  }
  return choice;
}

void agree_on_gpu_aware_mpi(const Communicator& comm, const char* where, const GpuAwareMpi& local,
                            bool device_buffers) {
  const AgreedFailure bad_setting = comm.agree_on_failure(!local.error.empty(), local.error);
  OKTOPK_REQUIRE(!bad_setting, std::invalid_argument, where,
                 "rank " << bad_setting.rank << ": " << bad_setting.cause);
  if (!device_buffers) return;
  // Whether some rank hands device pointers, and whether some rank stages: one reduction when
  // they agree, the reasons only when they do not.
  std::int64_t sides[2] = {local.device_pointers ? 1 : 0, local.device_pointers ? 0 : 1};
  comm.allreduce_in_place(sides, 2, MPI_MAX);
  if (sides[0] == 0 || sides[1] == 0) return;
  const AgreedFailure direct = comm.agree_on_failure(local.device_pointers, local.reason);
  const AgreedFailure staged = comm.agree_on_failure(!local.device_pointers, local.reason);
  std::ostringstream message;
  message << where << ": the ranks differ on handing GPU memory to MPI: rank " << direct.rank
          << " gives it device pointers (" << direct.cause << "), rank " << staged.rank
          << " host copies (" << staged.cause << "); set OKTOPK_GPU_AWARE_MPI alike on every rank";
  throw std::runtime_error(message.str());
}

}  // namespace impl

const GpuAwareMpi& gpu_aware_mpi() {
  static const GpuAwareMpi choice = [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    OKTOPK_REQUIRE(initialized != 0, std::runtime_error, "oktopk::gpu_aware_mpi",
                   "MPI is not initialized: call MPI_Init first");
    impl::GpuAwareMpiInputs inputs;
    inputs.setting = std::getenv("OKTOPK_GPU_AWARE_MPI");
    inputs.build_default = OKTOPK_GPU_AWARE_MPI_DEFAULT;
#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP) || defined(KOKKOS_ENABLE_SYCL)
    inputs.gpu_backend = true;
    inputs.query = impl::query_gpu_aware_mpi(inputs.query_how);
#endif
    // MPIs without a query that turn their GPU support on by a variable.
#if defined(MVAPICH2_NUMVERSION) && defined(KOKKOS_ENABLE_HIP)
    inputs.support_variable = "MV2_USE_ROCM";
#elif defined(MVAPICH2_NUMVERSION)
    inputs.support_variable = "MV2_USE_CUDA";
#elif defined(MPICH_NUMVERSION)
    inputs.support_variable = "MPICH_GPU_SUPPORT_ENABLED";
#endif
    if (inputs.support_variable != nullptr) {
      inputs.support_value = std::getenv(inputs.support_variable);
    }
    return impl::decide_gpu_aware_mpi(inputs);
  }();
  return choice;
}

}  // namespace oktopk
