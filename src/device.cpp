// SPDX-License-Identifier: BSD-3-Clause
#include <oktopk/device.hpp>

#include <Kokkos_Core.hpp>

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime_api.h>
#elif defined(KOKKOS_ENABLE_HIP)
#include <hip/hip_runtime_api.h>
#endif

namespace oktopk {

std::string to_string(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::PinnedHost:
      return "page-locked host memory";
    case MemoryKind::Device:
      return "device memory";
    case MemoryKind::Managed:
      return "managed memory";
    case MemoryKind::PageableHost:
      break;
  }
  return "pageable host memory";
}

PointerLocation locate_pointer(const void* pointer) {
  PointerLocation location;
#if defined(KOKKOS_ENABLE_CUDA)
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    // Memory CUDA has never seen (drivers before CUDA 11 report it as an error): clear the
    // error, which the next runtime call would otherwise return.
    (void)cudaGetLastError();
    return location;
  }
  switch (attributes.type) {
    case cudaMemoryTypeDevice:
      location.kind = MemoryKind::Device;
      break;
    case cudaMemoryTypeManaged:
      location.kind = MemoryKind::Managed;
      break;
    case cudaMemoryTypeHost:
      location.kind = MemoryKind::PinnedHost;
      break;
    default:
      return location;
  }
  location.device = attributes.device;
#elif defined(KOKKOS_ENABLE_HIP)
  hipPointerAttribute_t attributes{};
  if (hipPointerGetAttributes(&attributes, pointer) != hipSuccess) {
    // ROCm reports memory it has never seen as an error; clear it for the next runtime call.
    (void)hipGetLastError();
    return location;
  }
#if HIP_VERSION_MAJOR >= 6
  const hipMemoryType type = attributes.type;
  const bool managed = type == hipMemoryTypeManaged;
#else
  const hipMemoryType type = attributes.memoryType;
  const bool managed = attributes.isManaged != 0;
#endif
  if (managed) {
    location.kind = MemoryKind::Managed;
  } else if (type == hipMemoryTypeDevice) {
    location.kind = MemoryKind::Device;
  } else if (type == hipMemoryTypeHost) {
    location.kind = MemoryKind::PinnedHost;
  } else {
    return location;
  }
  location.device = attributes.device;
#else
  (void)pointer;
#endif
  return location;
}

int default_device() {
#if defined(KOKKOS_ENABLE_CUDA)
  return Kokkos::Cuda().cuda_device();
#elif defined(KOKKOS_ENABLE_HIP)
  return impl::HipSpace().hip_device();
#else
  return -1;
#endif
}

}  // namespace oktopk
