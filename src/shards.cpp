// SPDX-License-Identifier: BSD-3-Clause
// Equal shard boundaries for reduce_scatter.
#include <oktopk/error.hpp>
#include <oktopk/shards.hpp>

#include <stdexcept>

namespace oktopk {

std::vector<std::int64_t> equal_shard_offsets(std::int64_t n, int parts) {
  OKTOPK_REQUIRE(n >= 0, std::invalid_argument, "oktopk::equal_shard_offsets",
                 "n = " << n << " is negative");
  OKTOPK_REQUIRE(parts >= 1, std::invalid_argument, "oktopk::equal_shard_offsets",
                 "parts = " << parts << " must be at least 1");
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(parts) + 1);
  for (int r = 0; r <= parts; ++r) offsets[static_cast<std::size_t>(r)] = r * n / parts;
  return offsets;
}

}  // namespace oktopk
