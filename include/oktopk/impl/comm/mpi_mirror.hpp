// SPDX-License-Identifier: BSD-3-Clause
// Hands Views in an execution space's memory to MPI: directly when MPI can read that memory
// (host spaces, or GPU-aware MPI as this process chose it: oktopk/gpu_aware_mpi.hpp), otherwise
// through page-locked host copies.
#pragma once

#include <oktopk/communicator.hpp>
#include <oktopk/error.hpp>
#include <oktopk/gpu_aware_mpi.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/base/scratch_pool.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace oktopk::impl {

/// Test switch: when on, MPI gets a separate host copy of every buffer, host Views included, so
/// that CPU-only runs check the copies that CUDA and HIP builds without GPU-aware MPI make (the
/// `*_host_staging_np*` tests: their main turns it on when given --host-staging). A
/// runtime switch rather than a build flag, so that those tests run the library's compiled
/// methods instead of compiling their own. Off unless a test program sets it, before any call
/// (so a plain bool); defined once, in liboktopk (src/gpu_aware_mpi.cpp), so that the library's
/// compiled methods and the test read the same variable however the library is linked.
extern bool stage_host_views_for_tests;

/// Whether MPI reads and writes Views of ExecSpace in place: for host spaces always (unless the
/// test switch above is on), and for device spaces where this process chose device pointers.
template <class ExecSpace>
bool mpi_uses_view_memory() {
  if (stage_host_views_for_tests) return false;
  if constexpr (runs_on_host_v<ExecSpace>) {
    return true;
  } else {
    return gpu_aware_mpi().device_pointers;
  }
}

/// Host staging buffers of T, kept from one message to the next (ScratchPool). In CUDA and HIP
/// builds they are page-locked (PinnedHostSpace), so copies between them and the GPU run at full
/// speed and in stream order, without a bounce through a driver buffer.
template <class T>
using HostStagingPool = ScratchPool<T, PinnedHostSpace>;

/// \brief Where MPI reads or writes a View's entries: the View's own memory, or a page-locked
/// host copy that the buffer holds. Made by mpi_send_view and mpi_receive_view; T is const for
/// a send of const entries. In place, the buffer points into the View without holding it: keep
/// the View alive while MPI uses the buffer.
template <class T>
class MpiBuffer {
 public:
  using Staging = Kokkos::View<std::remove_const_t<T>*, PinnedHostSpace>;

  MpiBuffer() = default;
  /// The entries of a View MPI reads in place.
  MpiBuffer(T* data, std::size_t size) : data_(data), size_(size) {}
  /// A host copy.
  explicit MpiBuffer(Staging staging)
      : data_(staging.data()),
        size_(staging.extent(0)),
        staged_(true),
        staging_(std::move(staging)) {}
  /// A buffer of non-const entries as one of const entries (to send it).
  template <class U, std::enable_if_t<std::is_same_v<const U, T> && !std::is_same_v<U, T>, int> = 0>
  MpiBuffer(const MpiBuffer<U>& other)  // NOLINT(google-explicit-constructor): as T* to const T*
      : data_(other.data()),
        size_(other.size()),
        staged_(other.staged()),
        staging_(other.staging()) {}

  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  /// Whether the entries are a host copy (then staging() holds them).
  bool staged() const noexcept { return staged_; }
  const Staging& staging() const noexcept { return staging_; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
  bool staged_ = false;
  Staging staging_;
};

/// A buffer MPI may send from, holding `view`'s contents: `view` itself when MPI can read it, a
/// host copy otherwise. Fences `exec` either way, since MPI does not wait for Kokkos work.
/// Pass only the part that is sent (a subview), so a staging copy moves no unused capacity.
/// The buffer's entries are const when `view`'s are.
template <class ExecSpace, class View>
MpiBuffer<typename View::value_type> mpi_send_view(const ExecSpace& exec, const View& view) {
  if (mpi_uses_view_memory<ExecSpace>()) {
    OKTOPK_ASSERT(view.span_is_contiguous());
    fence(exec, "oktopk::mpi_send_view");
    return MpiBuffer<typename View::value_type>(view.data(), view.extent(0));
  }
  auto host = HostStagingPool<typename View::non_const_value_type>::acquire(view.extent(0));
  Kokkos::deep_copy(exec, host, view);
  fence(exec, "oktopk::mpi_send_view");
  return MpiBuffer<typename View::value_type>(std::move(host));
}

/// A buffer MPI may receive into, for data that belongs in `view`: `view` itself when MPI can
/// write it, a host buffer otherwise (then call mpi_received). Fences `exec`, so that no
/// Kokkos work still touches `view` while MPI writes it. As with mpi_send_view, pass only the
/// part that receives.
template <class ExecSpace, class View>
MpiBuffer<typename View::non_const_value_type> mpi_receive_view(const ExecSpace& exec,
                                                                const View& view) {
  using T = typename View::non_const_value_type;
  fence(exec, "oktopk::mpi_receive_view");
  if (mpi_uses_view_memory<ExecSpace>()) {
    OKTOPK_ASSERT(view.span_is_contiguous());
    return MpiBuffer<T>(view.data(), view.extent(0));
  }
  return MpiBuffer<T>(HostStagingPool<T>::acquire(view.extent(0)));
}

/// Moves received entries [begin, end) from the buffer MPI wrote into `view` (nothing to do
/// when MPI wrote `view` itself).
template <class ExecSpace, class View, class T>
void mpi_received(const ExecSpace& exec, const MpiBuffer<T>& received, const View& view,
                  std::int64_t begin, std::int64_t end) {
  if (received.staged() && end > begin) {
    const auto range = Kokkos::make_pair(begin, end);
    Kokkos::deep_copy(exec, Kokkos::subview(view, range),
                      Kokkos::subview(received.staging(), range));
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
