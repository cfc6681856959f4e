// SPDX-License-Identifier: BSD-3-Clause
// The bounds-checked loop of the public kernels that write at given indices (scatter_add,
// clear_at): user indices may be wrong, and a wrong one must be reported, never written.
#pragma once

#include <oktopk/fwd.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace oktopk::impl {

/// apply(i, j) where i = indices(j) + offset lies in [0, n), counting the j where it does not.
/// Like every kernel of the public kernels' headers, a named functor and not a lambda: a user's
/// program and the library instantiate them with the same types, and nvcc's host-side lambda
/// wrappers do not survive that (scripts/check-lambda-odr.py).
template <class IdxView, class Apply>
struct ScatterInRange {
  IdxView indices;
  count_type offset = 0;
  std::int64_t n = 0;
  Apply apply;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t j, std::int64_t& outside) const {
    const std::int64_t i = indices(j) + offset;
    if (i >= 0 && i < n) {
      apply(i, j);
    } else {
      ++outside;
    }
  }
};

/// apply(i, j) for every j whose position i = indices(j) + offset lies in [0, n); returns how
/// many positions fall outside (skipped). One work item per index. Apply is a functor with a
/// const KOKKOS_INLINE_FUNCTION operator()(std::int64_t i, std::int64_t j).
template <class ExecSpace, class IdxView, class Apply>
std::int64_t scatter_in_range(const ExecSpace& exec, const char* label, const IdxView& indices,
                              count_type offset, std::int64_t n, const Apply& apply) {
  std::int64_t outside = 0;
  Kokkos::parallel_reduce(label, RangeOf<ExecSpace>(exec, 0, indices.extent(0)),
                          ScatterInRange<IdxView, Apply>{indices, offset, n, apply}, outside);
  return outside;
}

}  // namespace oktopk::impl
