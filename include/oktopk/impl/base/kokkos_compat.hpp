// SPDX-License-Identifier: BSD-3-Clause
// Every difference between the Kokkos versions OkTopk supports (3.4 up to 4.x) lives here.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>

namespace oktopk::impl {

/// |x|: Kokkos::Experimental::fabs in 3.4-3.6, Kokkos::abs from 3.7.
KOKKOS_INLINE_FUNCTION float abs(float x) {
#if KOKKOS_VERSION >= 30700
  return Kokkos::abs(x);
#else
  return Kokkos::Experimental::fabs(x);
#endif
}

KOKKOS_INLINE_FUNCTION double abs(double x) {
#if KOKKOS_VERSION >= 30700
  return Kokkos::abs(x);
#else
  return Kokkos::Experimental::fabs(x);
#endif
}

KOKKOS_INLINE_FUNCTION bool isnan(float x) {
#if KOKKOS_VERSION >= 30700
  return Kokkos::isnan(x);
#else
  return Kokkos::Experimental::isnan(x);
#endif
}

/// How a reduction functor's join() takes its arguments: Kokkos before 3.7 joins through
/// volatile ones, later releases through plain ones (4.x deprecates the volatile form).
#if KOKKOS_VERSION >= 30700
#define OKTOPK_JOIN_QUALIFIER
#else
#define OKTOPK_JOIN_QUALIFIER volatile
#endif

/// The IEEE-754 bit pattern of x (Kokkos::bit_cast exists from 4.1 only).
KOKKOS_INLINE_FUNCTION std::uint32_t float_to_bits(float x) {
#if KOKKOS_VERSION >= 40100
  return Kokkos::bit_cast<std::uint32_t>(x);
#else
  union {
    float f;
    std::uint32_t u;
  } pun{x};
  return pun.u;
#endif
}

KOKKOS_INLINE_FUNCTION float bits_to_float(std::uint32_t u) {
#if KOKKOS_VERSION >= 40100
  return Kokkos::bit_cast<float>(u);
#else
  union {
    std::uint32_t u;
    float f;
  } pun{u};
  return pun.f;
#endif
}

/// The IEEE-754 bit pattern of a double.
KOKKOS_INLINE_FUNCTION std::uint64_t double_to_bits(double x) {
#if KOKKOS_VERSION >= 40100
  return Kokkos::bit_cast<std::uint64_t>(x);
#else
  union {
    double d;
    std::uint64_t u;
  } pun{x};
  return pun.u;
#endif
}

KOKKOS_INLINE_FUNCTION double bits_to_double(std::uint64_t u) {
#if KOKKOS_VERSION >= 40100
  return Kokkos::bit_cast<double>(u);
#else
  union {
    std::uint64_t u;
    double d;
  } pun{u};
  return pun.d;
#endif
}

/// |x| as a float: what every selection compares with its (float) threshold and ranks by.
/// A double is rounded to nearest, which keeps the order (a <= b gives magnitude(a) <=
/// magnitude(b)), so counts, radix keys and comparisons agree; doubles whose magnitudes round
/// to the same float are ties for selection, as equal floats are.
KOKKOS_INLINE_FUNCTION float magnitude(float x) { return abs(x); }
KOKKOS_INLINE_FUNCTION float magnitude(double x) { return abs(static_cast<float>(x)); }

/// The position of the lowest set bit of x, which must not be 0: a single instruction on every
/// backend (Kokkos 3.4 has no 64-bit bit scan, and Kokkos 4's countr_zero came in 4.1).
KOKKOS_INLINE_FUNCTION int lowest_set_bit(std::uint64_t x) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __ffsll(static_cast<long long>(x)) - 1;
#elif defined(__GNUC__) || defined(__clang__)
  return __builtin_ctzll(x);
#else
  int bit = 0;
  while ((x & 1u) == 0) {
    x >>= 1;
    ++bit;
  }
  return bit;
#endif
}

/// Kokkos's HIP execution space, where the build has one (it left Kokkos::Experimental in 4.0).
#if defined(KOKKOS_ENABLE_HIP) && KOKKOS_VERSION >= 40000
using HipSpace = Kokkos::HIP;
#elif defined(KOKKOS_ENABLE_HIP)
using HipSpace = Kokkos::Experimental::HIP;
#endif

/// Host memory that GPUs copy from and to at full speed and without an extra staging copy by
/// the driver (page-locked), where the build has a GPU backend; plain HostSpace otherwise.
/// The HIP space left Kokkos::Experimental in 4.0.
#if defined(KOKKOS_ENABLE_CUDA)
using PinnedHostSpace = Kokkos::CudaHostPinnedSpace;
#elif defined(KOKKOS_ENABLE_HIP) && KOKKOS_VERSION >= 40000
using PinnedHostSpace = Kokkos::HIPHostPinnedSpace;
#elif defined(KOKKOS_ENABLE_HIP)
using PinnedHostSpace = Kokkos::Experimental::HIPHostPinnedSpace;
#else
using PinnedHostSpace = Kokkos::HostSpace;
#endif

/// Fences one execution space instance, with a label where Kokkos takes one (from 3.6).
template <class ExecSpace>
void fence(const ExecSpace& exec, const std::string& label) {
#if KOKKOS_VERSION >= 30600
  exec.fence(label);
#else
  (void)label;
  exec.fence();
#endif
}

/// RAII profiling region (Kokkos::Profiling::ScopedRegion only exists from 4.1). It pops on
/// every exit path, so a throwing call cannot leave a region open.
class ScopedRegion {
 public:
  explicit ScopedRegion(const std::string& name) { Kokkos::Profiling::pushRegion(name); }
  ~ScopedRegion() { Kokkos::Profiling::popRegion(); }
  ScopedRegion(const ScopedRegion&) = delete;
  ScopedRegion& operator=(const ScopedRegion&) = delete;
};

}  // namespace oktopk::impl
