// SPDX-License-Identifier: BSD-3-Clause
// The execution spaces and gradient types liboktopk instantiates every method for, as an
// X-macro.
//
// Each method is a class template on the execution space with several thousand lines of
// kernels behind it. Instantiated once in the library (src/instantiate/) and declared extern
// in the headers, a program that makes handles compiles none of it again (nvcc is slow on
// kernels: each is compiled for the device as well). Spaces this list does not name (a backend
// enabled later, a user-defined space) still work in a program that includes
// oktopk/any_space.hpp, which brings the bodies for implicit instantiation.
#pragma once

#include <oktopk/impl/base/half_types.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>

#include <Kokkos_Core.hpp>

#if defined(KOKKOS_ENABLE_CUDA)
#define OKTOPK_IMPL_ON_CUDA(M, Class) M(Class, Kokkos::Cuda)
#else
#define OKTOPK_IMPL_ON_CUDA(M, Class)
#endif
#if defined(KOKKOS_ENABLE_HIP)
#define OKTOPK_IMPL_ON_HIP(M, Class) M(Class, oktopk::impl::HipSpace)
#else
#define OKTOPK_IMPL_ON_HIP(M, Class)
#endif
#if defined(KOKKOS_ENABLE_OPENMP)
#define OKTOPK_IMPL_ON_OPENMP(M, Class) M(Class, Kokkos::OpenMP)
#else
#define OKTOPK_IMPL_ON_OPENMP(M, Class)
#endif
#if defined(KOKKOS_ENABLE_THREADS)
#define OKTOPK_IMPL_ON_THREADS(M, Class) M(Class, Kokkos::Threads)
#else
#define OKTOPK_IMPL_ON_THREADS(M, Class)
#endif
// Serial only where it is the host space: next to OpenMP or Threads it serves as a helper
// space that handles are rarely made for, and four gradient types of every method on it would
// cost a third of the library's compile time. A handle on it still works, compiled where used
// (oktopk/any_space.hpp).
#if defined(KOKKOS_ENABLE_SERIAL) && !defined(KOKKOS_ENABLE_OPENMP) && \
    !defined(KOKKOS_ENABLE_THREADS)
#define OKTOPK_IMPL_ON_SERIAL(M, Class) M(Class, Kokkos::Serial)
#else
#define OKTOPK_IMPL_ON_SERIAL(M, Class)
#endif

/// M(Class, Space) for every execution space of this Kokkos build that the list above knows.
#define OKTOPK_IMPL_FOR_EACH_EXEC_SPACE(M, Class) \
  OKTOPK_IMPL_ON_CUDA(M, Class)                   \
  OKTOPK_IMPL_ON_HIP(M, Class)                    \
  OKTOPK_IMPL_ON_OPENMP(M, Class)                 \
  OKTOPK_IMPL_ON_THREADS(M, Class)                \
  OKTOPK_IMPL_ON_SERIAL(M, Class)

/// Each class is a template on the execution space and the gradient type (ValueTraits).
#define OKTOPK_IMPL_EXTERN_TEMPLATE(Class, Space)         \
  extern template class Class<Space, float>;              \
  extern template class Class<Space, double>;             \
  extern template class Class<Space, ::oktopk::bfloat16>; \
  extern template class Class<Space, ::oktopk::float16>;
#define OKTOPK_IMPL_INSTANTIATE_TEMPLATE(Class, Space) \
  template class Class<Space, float>;                  \
  template class Class<Space, double>;                 \
  template class Class<Space, ::oktopk::bfloat16>;     \
  template class Class<Space, ::oktopk::float16>;

/// Declares Class<Space, Value> instantiated in liboktopk, for every space of the list and every
/// gradient type. A build of the headers with fault injection, a test-only switch, compiles its
/// own copies instead: the library's are built without it.
#if defined(OKTOPK_FAULT_INJECTION)
#define OKTOPK_IMPL_DECLARE_INSTANTIATIONS(Class)
#else
#define OKTOPK_IMPL_DECLARE_INSTANTIATIONS(Class) \
  OKTOPK_IMPL_FOR_EACH_EXEC_SPACE(OKTOPK_IMPL_EXTERN_TEMPLATE, Class)
#endif
/// Instantiates Class<Space, Value> for every space of the list and every gradient type (in
/// src/instantiate/ only).
#define OKTOPK_IMPL_DEFINE_INSTANTIATIONS(Class) \
  OKTOPK_IMPL_FOR_EACH_EXEC_SPACE(OKTOPK_IMPL_INSTANTIATE_TEMPLATE, Class)
