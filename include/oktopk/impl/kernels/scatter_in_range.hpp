// SPDX-License-Identifier: BSD-3-Clause
// The bounds-checked loop of the public kernels that write at given indices (scatter_add,
// clear_at): user indices may be wrong, and a wrong one must be reported, never written.
#pragma once

#include <oktopk/fwd.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace oktopk::impl {

/// apply(i, j) for every j whose position i = indices(j) + offset lies in [0, n); returns how
/// many positions fall outside (skipped). One work item per index.
template <class ExecSpace, class IdxView, class Apply>
std::int64_t scatter_in_range(const ExecSpace& exec, const char* label, const IdxView& indices,
                              count_type offset, std::int64_t n, const Apply& apply) {
  std::int64_t outside = 0;
  Kokkos::parallel_reduce(
      label, RangeOf<ExecSpace>(exec, 0, indices.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t j, std::int64_t& bad) {
        const std::int64_t i = indices(j) + offset;
        if (i >= 0 && i < n) {
          apply(i, j);
        } else {
          ++bad;
        }
      },
      outside);
  return outside;
}

}  // namespace oktopk::impl
