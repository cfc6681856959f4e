// SPDX-License-Identifier: BSD-3-Clause
// Hands Views in an execution space's memory to MPI: directly when MPI can read that memory
// (host spaces, or GPU-aware MPI), otherwise through host copies.
#pragma once

#include <oktopk/config.hpp>
#include <oktopk/impl/kokkos_compat.hpp>
#include <oktopk/impl/kokkos_ext.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace oktopk::impl {

/// Whether MPI reads and writes Views of ExecSpace in place. Tests define
/// OKTOPK_TEST_HOST_STAGING to stage every buffer through a separate host copy even on host
/// spaces, so CPU-only runs check the copies that CUDA and HIP builds without GPU-aware MPI make.
template <class ExecSpace>
inline constexpr bool mpi_uses_view_memory_v =
#if defined(OKTOPK_TEST_HOST_STAGING)
    false;
#else
    runs_on_host_v<ExecSpace> || (OKTOPK_ENABLE_GPU_AWARE_MPI != 0);
#endif

/// A host buffer for `view`'s extent, never aliasing it (create_mirror_view would return a host
/// View itself), left uninitialized: the caller fills it or MPI does.
template <class View>
Kokkos::View<typename View::non_const_value_type*, Kokkos::HostSpace> mpi_staging_buffer(
    const View& view) {
  return Kokkos::View<typename View::non_const_value_type*, Kokkos::HostSpace>(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "OkTopk::mpi_staging"), view.extent(0));
}

/// The memory MPI reads and writes for Views of ExecSpace.
template <class ExecSpace>
using mpi_memory_space_t = std::conditional_t<mpi_uses_view_memory_v<ExecSpace>,
                                              typename ExecSpace::memory_space, Kokkos::HostSpace>;

/// A View MPI may send from, holding `view`'s contents: `view` itself when MPI can read it, a
/// host copy otherwise. Fences `exec` either way, since MPI does not wait for Kokkos work.
/// Pass only the part that is sent (a subview), so a staging copy moves no unused capacity.
template <class ExecSpace, class View>
Kokkos::View<typename View::non_const_value_type*, mpi_memory_space_t<ExecSpace>> mpi_send_view(
    const ExecSpace& exec, const View& view) {
  if constexpr (mpi_uses_view_memory_v<ExecSpace>) {
    fence(exec, "OkTopk::mpi_send_view");
    return view;
  } else {
    auto host = mpi_staging_buffer(view);
    Kokkos::deep_copy(exec, host, view);
    fence(exec, "OkTopk::mpi_send_view");
    return host;
  }
}

/// A View MPI may receive into, for data that belongs in `view`: `view` itself when MPI can
/// write it, a host buffer otherwise (then call mpi_received). Fences `exec`, so that no
/// Kokkos work still touches `view` while MPI writes it. As with mpi_send_view, pass only the
/// part that receives.
template <class ExecSpace, class View>
Kokkos::View<typename View::non_const_value_type*, mpi_memory_space_t<ExecSpace>> mpi_receive_view(
    const ExecSpace& exec, const View& view) {
  fence(exec, "OkTopk::mpi_receive_view");
  if constexpr (mpi_uses_view_memory_v<ExecSpace>) {
    return view;
  } else {
    return mpi_staging_buffer(view);
  }
}

/// Moves received entries [begin, end) from the MPI-side View into `view` (nothing to do
/// when they are the same View).
template <class ExecSpace, class View, class MpiView>
void mpi_received(const ExecSpace& exec, const MpiView& received, const View& view,
                  std::int64_t begin, std::int64_t end) {
  if constexpr (!mpi_uses_view_memory_v<ExecSpace>) {
    if (end > begin) {
      const auto range = Kokkos::make_pair(begin, end);
      Kokkos::deep_copy(exec, Kokkos::subview(view, range), Kokkos::subview(received, range));
    }
  } else {
    (void)exec, (void)received, (void)view, (void)begin, (void)end;
  }
}

}  // namespace oktopk::impl
