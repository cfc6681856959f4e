// SPDX-License-Identifier: BSD-3-Clause
// Hands Views in an execution space's memory to MPI: directly when MPI can read that memory
// (host spaces, or GPU-aware MPI), otherwise through host copies.
#pragma once

#include <oktopk/communicator.hpp>
#include <oktopk/config.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

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

/// \brief Host staging buffers of T, kept from one message to the next: a fresh host allocation
/// per message would be page-faulted in on every call, costing about as much as the copy.
/// In CUDA and HIP builds they are page-locked (PinnedHostSpace), so copies between them and
/// the GPU run at full speed and in stream order, without a bounce through a driver buffer.
///
/// A block is free while the pool holds its only reference; acquire() hands out a subview,
/// which holds one more until the caller drops it. Blocks grow when a larger message comes,
/// and the pool empties itself at Kokkos::finalize (a hook, registered whenever the pool goes
/// from empty to non-empty, so it also works after a re-initialization).
template <class T>
class HostStagingPool {
 public:
  using Buffer = Kokkos::View<T*, PinnedHostSpace>;

  /// An uninitialized host buffer of `count` entries that no other live buffer shares.
  static Buffer acquire(std::size_t count) {
    if (count == 0) return Buffer();
    State& state = get();
    std::lock_guard<std::mutex> lock(state.mutex);
    const auto first = Kokkos::make_pair(std::size_t{0}, count);
    Buffer* free_block = nullptr;
    for (auto& block : state.blocks) {
      if (block.use_count() != 1) continue;
      if (block.extent(0) >= count) return Kokkos::subview(block, first);
      free_block = &block;
    }
    if (free_block == nullptr) {
      if (state.blocks.empty()) Kokkos::push_finalize_hook(&HostStagingPool::release);
      state.blocks.emplace_back();
      free_block = &state.blocks.back();
    }
    // Grow by at least a quarter, so slowly rising counts do not reallocate every call.
    const std::size_t size = std::max(count, free_block->extent(0) + free_block->extent(0) / 4);
    *free_block =
        Buffer(Kokkos::view_alloc(Kokkos::WithoutInitializing, "oktopk::mpi_staging"), size);
    return Kokkos::subview(*free_block, first);
  }

 private:
  struct State {
    std::mutex mutex;
    std::vector<Buffer> blocks;
  };
  static State& get() {
    static State state;
    return state;
  }
  static void release() {
    State& state = get();
    std::lock_guard<std::mutex> lock(state.mutex);
    state.blocks.clear();
  }
};

/// A host buffer for `view`'s extent, never aliasing it (create_mirror_view would return a host
/// View itself), left uninitialized: the caller fills it or MPI does.
template <class View>
Kokkos::View<typename View::non_const_value_type*, PinnedHostSpace> mpi_staging_buffer(
    const View& view) {
  return HostStagingPool<typename View::non_const_value_type>::acquire(view.extent(0));
}

/// The memory MPI reads and writes for Views of ExecSpace.
template <class ExecSpace>
using mpi_memory_space_t = std::conditional_t<mpi_uses_view_memory_v<ExecSpace>,
                                              typename ExecSpace::memory_space, PinnedHostSpace>;

/// A View MPI may send from, holding `view`'s contents: `view` itself when MPI can read it, a
/// host copy otherwise. Fences `exec` either way, since MPI does not wait for Kokkos work.
/// Pass only the part that is sent (a subview), so a staging copy moves no unused capacity.
/// The result's entries are const when `view`'s are.
template <class ExecSpace, class View>
Kokkos::View<typename View::value_type*, mpi_memory_space_t<ExecSpace>> mpi_send_view(
    const ExecSpace& exec, const View& view) {
  if constexpr (mpi_uses_view_memory_v<ExecSpace>) {
    fence(exec, "oktopk::mpi_send_view");
    return view;
  } else {
    auto host = mpi_staging_buffer(view);
    Kokkos::deep_copy(exec, host, view);
    fence(exec, "oktopk::mpi_send_view");
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
  fence(exec, "oktopk::mpi_receive_view");
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

/// \brief Collective. view := op over the ranks of view, in place (through a host copy when MPI
/// cannot read view's memory).
template <class ExecSpace, class View>
void mpi_allreduce_in_place(const ExecSpace& exec, const Communicator& comm, const View& view,
                            MPI_Op op) {
  const auto n = static_cast<std::int64_t>(view.extent(0));
  auto buffer = mpi_send_view(exec, view);
  comm.allreduce_in_place(buffer.data(), n, op);
  mpi_received(exec, buffer, view, 0, n);
}

}  // namespace oktopk::impl
