// SPDX-License-Identifier: BSD-3-Clause
// Error feedback: the residual keeps what was not communicated, and is added to the next
// gradient (acc = residual + scale·grad); entries that were communicated are cleared.
#pragma once

#include <oktopk/error.hpp>
#include <oktopk/fwd.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/kernels/scatter_in_range.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace oktopk {

namespace impl {

// The kernels are named functors, not lambdas: a user's program and the library instantiate
// them with the same types, and nvcc's host-side lambda wrappers do not survive that
// (scripts/check-lambda-odr.py).

/// acc(i) = residual(i) + scale·grad(i).
template <class ResidualView, class GradView, class AccView>
struct AccumulateResidual {
  ResidualView residual;
  GradView grad;
  float scale = 1.0f;
  AccView acc;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    acc(i) = residual(i) + scale * to_arithmetic(grad(i));
  }
};

/// v(i) = 0, for scatter_in_range.
template <class VectorView>
struct ClearPosition {
  VectorView v;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i, std::int64_t) const {
    v(i) = typename VectorView::non_const_value_type{};
  }
};

/// v(indices(j) + offset) = 0.
template <class VectorView, class IdxView>
struct ClearAtUnchecked {
  VectorView v;
  IdxView indices;
  count_type offset = 0;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t j) const {
    v(indices(j) + offset) = 0.0f;
  }
};

}  // namespace impl

/// \brief acc(i) = residual(i) + scale·grad(i), in acc's type (float or double; grad may be
/// a 16-bit type, widened exactly). `acc` may be the same View as `residual`.
template <class ExecSpace, class ResidualView, class GradView, class AccView>
void accumulate_residual(const ExecSpace& exec, const ResidualView& residual, const GradView& grad,
                         float scale, const AccView& acc) {
  constexpr const char* where = "oktopk::accumulate_residual";
  OKTOPK_STATIC_CHECK_SUMS(ExecSpace, ResidualView, "oktopk::accumulate_residual: residual");
  OKTOPK_STATIC_CHECK_VALUES(ExecSpace, GradView, "oktopk::accumulate_residual: grad");
  OKTOPK_STATIC_CHECK_SUMS(ExecSpace, AccView, "oktopk::accumulate_residual: acc");
  OKTOPK_STATIC_CHECK_WRITABLE(AccView, "oktopk::accumulate_residual: acc");
  OKTOPK_REQUIRE(residual.extent(0) == grad.extent(0) && acc.extent(0) == grad.extent(0),
                 std::invalid_argument, where,
                 "lengths differ: residual " << residual.extent(0) << ", grad " << grad.extent(0)
                                             << ", acc " << acc.extent(0));
  impl::ScopedRegion region("oktopk::accumulate_residual");
  Kokkos::parallel_for(
      "oktopk::accumulate_residual", impl::RangeOf<ExecSpace>(exec, 0, grad.extent(0)),
      impl::AccumulateResidual<ResidualView, GradView, AccView>{residual, grad, scale, acc});
}

/// \brief v(indices(j) + offset) = 0 for every j: clears the residual where entries were
/// communicated. `offset` turns region-relative indices into positions of v. Indices that fall
/// outside v are skipped, and reported by std::invalid_argument after the others are cleared.
template <class ExecSpace, class VectorView, class IdxView>
void clear_at(const ExecSpace& exec, const VectorView& v, const IdxView& indices,
              count_type offset = 0) {
  OKTOPK_STATIC_CHECK_VALUES(ExecSpace, VectorView, "oktopk::clear_at: v");
  OKTOPK_STATIC_CHECK_VIEW(ExecSpace, IdxView, index_type, "oktopk::clear_at: indices");
  OKTOPK_STATIC_CHECK_WRITABLE(VectorView, "oktopk::clear_at: v");
  impl::ScopedRegion region("oktopk::clear_at");
  const auto n = static_cast<std::int64_t>(v.extent(0));
  const std::int64_t outside = impl::scatter_in_range(exec, "oktopk::clear_at", indices, offset, n,
                                                      impl::ClearPosition<VectorView>{v});
  OKTOPK_REQUIRE(outside == 0, std::invalid_argument, "oktopk::clear_at",
                 outside << " indices (after adding offset " << offset
                         << ") fall outside the vector of length " << n);
}

namespace impl {

/// clear_at for callers whose indices are in range by construction: no check, so no reduction
/// into a host scalar.
template <class ExecSpace, class VectorView, class IdxView>
void clear_at_unchecked(const ExecSpace& exec, const VectorView& v, const IdxView& indices,
                        count_type offset = 0) {
  Kokkos::parallel_for("oktopk::clear_at_unchecked",
                       impl::RangeOf<ExecSpace>(exec, 0, indices.extent(0)),
                       ClearAtUnchecked<VectorView, IdxView>{v, indices, offset});
}

}  // namespace impl

}  // namespace oktopk
