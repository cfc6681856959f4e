// SPDX-License-Identifier: BSD-3-Clause
// Every difference between the Kokkos versions the programs in apps/ build with (3.4 up to 4.x):
// the programs see OkTopk's public headers only, so they keep their own few here, in one place
// as the library keeps its own in impl/base/kokkos_compat.hpp.
#pragma once

#include <Kokkos_Core.hpp>
#include <Kokkos_Sort.hpp>
#if __has_include(<KokkosBlas3_gemm.hpp>)
#include <KokkosBlas3_gemm.hpp>
#endif

#include <string>

namespace oktopk::apps {

/// Math in kernels: Kokkos::Experimental in 3.4-3.6, Kokkos from 3.7.
#if KOKKOS_VERSION >= 30700
namespace kmath = Kokkos;
#else
namespace kmath = Kokkos::Experimental;
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

/// Sorts a rank-1 View on `exec` (Kokkos::sort takes the instance from 4.1; before, it runs on
/// the View's default instance, so `exec` is fenced first). Not named sort: argument-dependent
/// lookup would find Kokkos::sort as well.
template <class ExecSpace, class ViewType>
void sort_ascending(const ExecSpace& exec, const ViewType& view) {
#if KOKKOS_VERSION >= 40100
  Kokkos::sort(exec, view);
#else
  exec.fence();
  Kokkos::sort(view);
#endif
}

#if __has_include(<KokkosBlas3_gemm.hpp>)
/// C = alpha op(A) op(B) + beta C on `exec`, for the programs built with Kokkos Kernels. Kokkos
/// Kernels 4 takes the instance; 3.x runs on the default instance, so `exec` is fenced before
/// and the default instance after (on a GPU, two host synchronisations per product).
template <class ExecSpace, class A, class B, class C>
void gemm_on(const ExecSpace& exec, const char* trans_a, const char* trans_b,
             typename C::const_value_type alpha, const A& a, const B& b,
             typename C::const_value_type beta, const C& c) {
#if defined(KOKKOSKERNELS_VERSION) && KOKKOSKERNELS_VERSION >= 40000
  KokkosBlas::gemm(exec, trans_a, trans_b, alpha, a, b, beta, c);
#else
  fence(exec, "oktopk::apps::gemm_on: before");
  KokkosBlas::gemm(trans_a, trans_b, alpha, a, b, beta, c);
  fence(ExecSpace(), "oktopk::apps::gemm_on: after");
#endif
}
#endif

}  // namespace oktopk::apps
