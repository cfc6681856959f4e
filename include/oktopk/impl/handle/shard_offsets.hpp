// SPDX-License-Identifier: BSD-3-Clause
// reduce_scatter's shard offsets, checked on each rank and digested for the call's agreement.
#pragma once

#include <oktopk/impl/base/hash.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace oktopk::impl {

/// What is wrong with `offsets` as the shard boundaries of n entries over P ranks (empty:
/// nothing): they must be P + 1 values from 0 to n, never decreasing.
inline std::string shard_offsets_problem(const std::vector<std::int64_t>& offsets, std::int64_t n,
                                         int P) {
  if (offsets.size() != static_cast<std::size_t>(P) + 1) {
    return "shard offsets of " + std::to_string(offsets.size()) +
           " entries (P + 1 = " + std::to_string(P + 1) + " boundaries expected)";
  }
  if (offsets.front() != 0 || offsets.back() != n) {
    return "shard offsets from " + std::to_string(offsets.front()) + " to " +
           std::to_string(offsets.back()) + " (they must run from 0 to n = " + std::to_string(n) +
           ")";
  }
  for (std::size_t r = 0; r + 1 < offsets.size(); ++r) {
    if (offsets[r + 1] < offsets[r]) {
      return "shard offsets that decrease at entry " + std::to_string(r + 1) + " (" +
             std::to_string(offsets[r]) + " then " + std::to_string(offsets[r + 1]) + ")";
    }
  }
  return std::string();
}

/// A digest of the offsets for the call's agreement, in [1, 2^62): positive, so that its
/// negation cannot overflow, and never the 0 of the other calls.
inline std::int64_t shard_digest(const std::vector<std::int64_t>& offsets) {
  Fnv1a64 hash;
  hash.update(offsets.data(), offsets.size() * sizeof(std::int64_t));
  const auto digest = static_cast<std::int64_t>(hash.value() & ((std::uint64_t{1} << 62) - 1));
  return digest == 0 ? 1 : digest;
}

}  // namespace oktopk::impl
