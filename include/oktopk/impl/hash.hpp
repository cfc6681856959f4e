// SPDX-License-Identifier: BSD-3-Clause
// A counter-based hash for deterministic pseudo-random choices inside kernels.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace oktopk::impl {

/// SplitMix64's finalizer (Steele, Lea, Flood 2014): a bijection on 64-bit words whose output
/// bits all depend on every input bit, so hash(seed ^ hash(i)) gives independent-looking draws
/// with no generator state to share between threads.
KOKKOS_INLINE_FUNCTION std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace oktopk::impl
