// SPDX-License-Identifier: BSD-3-Clause
// Hashes: a counter-based one for deterministic pseudo-random choices inside kernels, and a
// host-side checksum for checkpoints.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstddef>
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

/// 64-bit FNV-1a over bytes, fed incrementally (host only): the checkpoint checksum. Not
/// cryptographic; it catches truncation, flipped bytes and mixed-up sections, which is its job.
class Fnv1a64 {
 public:
  void update(const void* data, std::size_t size) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    std::uint64_t h = hash_;
    for (std::size_t i = 0; i < size; ++i) {
      h ^= bytes[i];
      h *= 1099511628211ULL;
    }
    hash_ = h;
  }
  std::uint64_t value() const { return hash_; }

 private:
  std::uint64_t hash_ = 14695981039346656037ULL;
};

}  // namespace oktopk::impl
