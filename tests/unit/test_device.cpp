// SPDX-License-Identifier: BSD-3-Clause
// oktopk/device.hpp: what locate_pointer says of each kind of memory, which device the default
// execution space runs on, and execution space instances over a caller's stream. A CPU build
// checks the host answers and the refusal of a stream; a GPU build (CUDA or HIP) checks every
// kind of memory and a kernel ordered after a slow one on a stream of the caller's.
#include <oktopk/device.hpp>

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime_api.h>
#elif defined(KOKKOS_ENABLE_HIP)
#include <hip/hip_runtime_api.h>
#endif

namespace {

using Default = Kokkos::DefaultExecutionSpace;

TEST(Device, MemoryKindsHaveNames) {
  EXPECT_EQ(oktopk::to_string(oktopk::MemoryKind::PageableHost), "pageable host memory");
  EXPECT_EQ(oktopk::to_string(oktopk::MemoryKind::PinnedHost), "page-locked host memory");
  EXPECT_EQ(oktopk::to_string(oktopk::MemoryKind::Device), "device memory");
  EXPECT_EQ(oktopk::to_string(oktopk::MemoryKind::Managed), "managed memory");
}

TEST(Device, OrdinaryHostMemoryIsPageableHost) {
  std::vector<float> host(100);
  const oktopk::PointerLocation at = oktopk::locate_pointer(host.data());
  EXPECT_EQ(at.kind, oktopk::MemoryKind::PageableHost);
  EXPECT_EQ(at.device, -1);
}

// Kernels in free functions: CUDA takes no device lambda in a test body (a private member).
template <class Exec>
int write_indices_and_read_last(const Exec& instance) {
  Kokkos::View<int*, typename Exec::memory_space> x("x", 10);
  Kokkos::parallel_for(
      Kokkos::RangePolicy<Exec>(instance, 0, 10), KOKKOS_LAMBDA(int i) { x(i) = i; });
  instance.fence();
  int last = -1;
  Kokkos::deep_copy(last, Kokkos::subview(x, 9));
  return last;
}

TEST(Device, HostSpacesTakeNoStream) {
  using Host = Kokkos::DefaultHostExecutionSpace;
  static_assert(!oktopk::runs_on_streams_v<Host>);
  EXPECT_EQ(write_indices_and_read_last(oktopk::execution_space_on_stream<Host>(nullptr)), 9);
  int token = 0;
  try {
    (void)oktopk::execution_space_on_stream<Host>(&token);
    FAIL() << "a stream for a host space was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(
        std::string(e.what()).rfind("oktopk::execution_space_on_stream: a stream was given", 0), 0u)
        << e.what();
  }
}

#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP)
#if defined(KOKKOS_ENABLE_CUDA)
using NativeStream = cudaStream_t;
bool make_stream(NativeStream* s) {
  return cudaStreamCreateWithFlags(s, cudaStreamNonBlocking) == cudaSuccess;
}
void destroy_stream(NativeStream s) { (void)cudaStreamDestroy(s); }
using PinnedSpace = Kokkos::CudaHostPinnedSpace;
using ManagedSpace = Kokkos::CudaUVMSpace;
#else
using NativeStream = hipStream_t;
bool make_stream(NativeStream* s) {
  return hipStreamCreateWithFlags(s, hipStreamNonBlocking) == hipSuccess;
}
void destroy_stream(NativeStream s) { (void)hipStreamDestroy(s); }
using PinnedSpace = Kokkos::HIPHostPinnedSpace;
using ManagedSpace = Kokkos::HIPManagedSpace;
#endif

TEST(Device, EveryKindOfGpuMemoryIsNamed) {
  const int device = oktopk::default_device();
  ASSERT_GE(device, 0);
  Kokkos::View<float*, Default::memory_space> on_device("on_device", 100);
  Kokkos::View<float*, PinnedSpace> pinned("pinned", 100);
  Kokkos::View<float*, ManagedSpace> managed("managed", 100);
  const oktopk::PointerLocation d = oktopk::locate_pointer(on_device.data());
  EXPECT_EQ(d.kind, oktopk::MemoryKind::Device);
  EXPECT_EQ(d.device, device);
  EXPECT_EQ(oktopk::locate_pointer(pinned.data()).kind, oktopk::MemoryKind::PinnedHost);
  EXPECT_EQ(oktopk::locate_pointer(managed.data()).kind, oktopk::MemoryKind::Managed);
}

// A slow kernel on the caller's non-blocking stream, then a fast one on another instance over
// the same stream: the second must see everything the first wrote, with no device-wide sync.
// Returns how many entries the consumer saw written.
std::int64_t produce_slowly_then_count(NativeStream stream, int n) {
  const Default producer = oktopk::execution_space_on_stream<Default>(stream);
  Kokkos::View<std::int64_t*, Default::memory_space> produced("produced", n);
  // The producer spins per entry, so that a consumer not ordered after it reads zeros.
  Kokkos::parallel_for(
      Kokkos::RangePolicy<Default>(producer, 0, n), KOKKOS_LAMBDA(int i) {
        std::int64_t v = i;
        for (int spin = 0; spin < 2000; ++spin) v = (v * 6364136223846793005LL + 1) ^ spin;
        produced(i) = (v & 1) + 1;
      });
  const Default consumer = oktopk::execution_space_on_stream<Default>(stream);
  std::int64_t seen = 0;
  Kokkos::parallel_reduce(
      Kokkos::RangePolicy<Default>(consumer, 0, n),
      KOKKOS_LAMBDA(int i, std::int64_t& s) { s += produced(i) > 0 ? 1 : 0; }, seen);
  consumer.fence();
  return seen;
}

TEST(Device, AnInstanceOverTheCallersStreamRunsAfterItsWork) {
  static_assert(oktopk::runs_on_streams_v<Default>);
  NativeStream stream{};
  ASSERT_TRUE(make_stream(&stream));
  constexpr int n = 1 << 20;
  EXPECT_EQ(produce_slowly_then_count(stream, n), n);
  destroy_stream(stream);
}
#endif

}  // namespace
