// SPDX-License-Identifier: BSD-3-Clause
// The apps' counter-based hash: deterministic pseudo-random draws from nothing but a seed and an
// index, so they are the same on every rank, backend and thread count, with no generator state
// to share between threads. The apps' own copy: they use OkTopk's public headers only.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace oktopk::apps {

/// SplitMix64's finalizer (Steele, Lea, Flood 2014; public domain): a bijection on 64-bit words
/// whose output bits all depend on every input bit, so splitmix64(seed ^ splitmix64(i)) or
/// splitmix64(key + i) give independent-looking draws per index.
KOKKOS_INLINE_FUNCTION std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace oktopk::apps
