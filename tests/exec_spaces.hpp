// SPDX-License-Identifier: BSD-3-Clause
// The execution spaces this Kokkos build enables, as a GoogleTest type list.
#pragma once

#include <oktopk/impl/base/kokkos_compat.hpp>

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>

namespace oktopk::test {

using EnabledSpaces = ::testing::Types<
#if defined(KOKKOS_ENABLE_CUDA)
    Kokkos::Cuda,
#endif
#if defined(KOKKOS_ENABLE_HIP)
    oktopk::impl::HipSpace,
#endif
#if defined(KOKKOS_ENABLE_OPENMP)
    Kokkos::OpenMP,
#endif
#if defined(KOKKOS_ENABLE_THREADS)
    Kokkos::Threads,
#endif
#if defined(KOKKOS_ENABLE_SERIAL)
    Kokkos::Serial
#else
    Kokkos::DefaultHostExecutionSpace
#endif
    >;

}  // namespace oktopk::test
