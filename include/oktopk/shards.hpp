// SPDX-License-Identifier: BSD-3-Clause
// Shard boundaries for reduce_scatter: which contiguous part of the n-entry output each rank
// receives, as sharded data parallelism (ZeRO, FSDP) lays out a flat parameter.
#pragma once

#include <cstdint>
#include <vector>

namespace oktopk {

/// \brief The P + 1 boundaries of `parts` nearly equal shards of n entries: shard r is
/// [r·n/P, (r + 1)·n/P) (integer division), so the first entries of the last shards are one
/// fewer when P does not divide n. What reduce_scatter uses when it is given no offsets.
/// Throws std::invalid_argument for n < 0 or parts < 1.
std::vector<std::int64_t> equal_shard_offsets(std::int64_t n, int parts);

}  // namespace oktopk
