// SPDX-License-Identifier: BSD-3-Clause
// Where a caller's memory and work live on a GPU: which device OkTopk runs on, what kind of
// memory a pointer points to, and a Kokkos execution space instance over the caller's own
// CUDA or HIP stream, so that a call is ordered with the work that produced its input.
#pragma once

#include <oktopk/impl/base/kokkos_compat.hpp>

#include <Kokkos_Core.hpp>

#include <stdexcept>
#include <string>
#include <type_traits>

namespace oktopk {

/// What kind of memory a pointer points to, as the GPU runtime reports it.
enum class MemoryKind {
  PageableHost,  ///< ordinary host memory (and every pointer in a build without a GPU backend)
  PinnedHost,    ///< page-locked host memory (cudaHostAlloc, cudaHostRegister, hipHostMalloc)
  Device,        ///< memory of one GPU (cudaMalloc, hipMalloc)
  Managed,       ///< memory the driver migrates between host and GPUs (cudaMallocManaged)
};

/// A pointer's memory kind and, for GPU memory, the device it belongs to.
struct PointerLocation {
  MemoryKind kind = MemoryKind::PageableHost;
  int device = -1;  ///< the GPU of Device memory (of Managed and PinnedHost: as reported), or -1
};

/// "pageable host memory", "page-locked host memory", "device memory", "managed memory".
std::string to_string(MemoryKind kind);

/// \brief Where `pointer` points, asked of the CUDA or HIP runtime of a build with that backend
/// (cudaPointerGetAttributes, hipPointerGetAttributes). In a build without a GPU backend every
/// pointer is PageableHost: the host cannot tell more, and there is nothing else to reach.
PointerLocation locate_pointer(const void* pointer);

/// \brief The GPU that Kokkos's default execution space runs on, the device every handle of
/// Kokkos::DefaultExecutionSpace (the C, Fortran and Python interfaces' handles) uses: chosen
/// when Kokkos is initialised (Kokkos's `--kokkos-device-id`, or by local rank with
/// `--kokkos-map-device-id-by=mpi_rank`; docs/reference.md, "GPU users"). -1 in a build without
/// a GPU backend.
int default_device();

/// Whether instances of ExecSpace run on a native stream that the caller can hand over.
template <class ExecSpace>
inline constexpr bool runs_on_streams_v =
#if defined(KOKKOS_ENABLE_CUDA)
    std::is_same_v<ExecSpace, Kokkos::Cuda> ||
#endif
#if defined(KOKKOS_ENABLE_HIP)
    std::is_same_v<ExecSpace, impl::HipSpace> ||
#endif
    false;

/// \brief An instance of ExecSpace whose kernels and copies go to `stream`, the caller's
/// cudaStream_t (Kokkos::Cuda) or hipStream_t (Kokkos::HIP) passed as void*: work on the
/// instance starts after what the caller queued on that stream before, and fencing the
/// instance waits for that stream only, never for the whole device. NULL is the stream the
/// runtime's NULL handle names (the legacy default stream). The instance does not own the
/// stream, which must outlive it. Creating one allocates Kokkos's per-instance scratch:
/// keep it for as long as the stream is used.
///
/// For an ExecSpace without streams (the host spaces) `stream` must be NULL, and the result
/// is a default instance. Throws std::invalid_argument otherwise; for CUDA's and HIP's
/// per-thread stream handle (cudaStreamPerThread, hipStreamPerThread), which names a different
/// stream on every thread while OkTopk's calls may run on its progress thread; and for a
/// stream of another GPU than the default instance's (Kokkos 4 reads it from the stream, ROCm
/// from 5.6), whose kernels could not use memory of the default instance's GPU. Kokkos makes
/// the stream's GPU current on the calling thread; on that refusal the default instance's is
/// made current again.
template <class ExecSpace>
ExecSpace execution_space_on_stream(void* stream) {
  constexpr const char* where = "oktopk::execution_space_on_stream";
  if constexpr (!runs_on_streams_v<ExecSpace>) {
    if (stream != nullptr)
      throw std::invalid_argument(
          std::string(where) + ": a stream was given, but " + ExecSpace::name() +
          " runs on the host: pass NULL (or use a build of OkTopk for CUDA or HIP)");
    return ExecSpace();
  }
#if defined(KOKKOS_ENABLE_CUDA)
  else if constexpr (std::is_same_v<ExecSpace, Kokkos::Cuda>) {
    const auto native = static_cast<cudaStream_t>(stream);
    if (native == cudaStreamPerThread)
      throw std::invalid_argument(std::string(where) +
                                  ": cudaStreamPerThread names another stream on every thread; "
                                  "pass a stream made by cudaStreamCreate");
    const int device = Kokkos::Cuda().cuda_device();
    int stream_device = device;
    {
      Kokkos::Cuda instance(native);
      stream_device = instance.cuda_device();
      if (stream_device == device) return instance;
    }
    // After the refused instance is gone, which may use its own device while it frees.
    (void)cudaSetDevice(device);
    throw std::invalid_argument(
        std::string(where) + ": the stream belongs to GPU " + std::to_string(stream_device) +
        ", Kokkos's default execution space runs on GPU " + std::to_string(device));
  }
#endif
#if defined(KOKKOS_ENABLE_HIP)
  else if constexpr (std::is_same_v<ExecSpace, impl::HipSpace>) {
    const auto native = static_cast<hipStream_t>(stream);
#if defined(hipStreamPerThread)
    if (native == hipStreamPerThread)
      throw std::invalid_argument(std::string(where) +
                                  ": hipStreamPerThread names another stream on every thread; "
                                  "pass a stream made by hipStreamCreate");
#endif
    const int device = impl::HipSpace().hip_device();
    int stream_device = device;
    {
      impl::HipSpace instance(native);
      stream_device = instance.hip_device();
      if (stream_device == device) return instance;
    }
    // After the refused instance is gone, which may use its own device while it frees.
    (void)hipSetDevice(device);
    throw std::invalid_argument(
        std::string(where) + ": the stream belongs to GPU " + std::to_string(stream_device) +
        ", Kokkos's default execution space runs on GPU " + std::to_string(device));
  }
#endif
}

}  // namespace oktopk
