// SPDX-License-Identifier: BSD-3-Clause
// Every difference between the Kokkos versions the programs in apps/ build with (3.4 up to 4.x):
// the programs see OkTopk's public headers only, so they keep their own few here, in one place
// as the library keeps its own in impl/base/kokkos_compat.hpp.
#pragma once

#include <Kokkos_Core.hpp>
#include <Kokkos_Sort.hpp>

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

}  // namespace oktopk::apps
