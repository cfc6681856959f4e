// SPDX-License-Identifier: BSD-3-Clause
// Scratch buffers kept from one call to the next: a fresh allocation per call costs, on the
// host, page faults about as dear as the work, and on GPUs a cudaMalloc or hipMalloc and, at
// its free, a synchronisation of the whole device.
#pragma once

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <mutex>
#include <vector>

namespace oktopk::impl {

/// \brief Uninitialized buffers of T in MemorySpace, shared by the whole process.
///
/// A block is free while the pool holds its only reference; acquire() hands out a subview,
/// which holds one more until the caller drops it: drop it only once no work that uses it is
/// still queued (fence first). Blocks grow when a larger request comes, and the pool empties
/// itself at Kokkos::finalize (a hook, registered whenever the pool goes from empty to
/// non-empty, so it also works after a re-initialization).
template <class T, class MemorySpace>
class ScratchPool {
 public:
  using Buffer = Kokkos::View<T*, MemorySpace>;

  /// A buffer of `count` entries that no other live buffer shares.
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
      if (state.blocks.empty()) Kokkos::push_finalize_hook(&ScratchPool::release);
      state.blocks.emplace_back();
      free_block = &state.blocks.back();
    }
    // Grow by at least a quarter, so slowly rising counts do not reallocate every call.
    const std::size_t size = std::max(count, free_block->extent(0) + free_block->extent(0) / 4);
    *free_block = Buffer(Kokkos::view_alloc(Kokkos::WithoutInitializing, "oktopk::scratch"), size);
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

}  // namespace oktopk::impl
