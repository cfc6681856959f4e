// SPDX-License-Identifier: BSD-3-Clause
// What every family of the result oracle shares: the float roundoff, the tolerance tests
// near a threshold, and the checks every rank agrees on.
#pragma once

#include <oktopk/communicator.hpp>
#include <oktopk/error.hpp>
#include <oktopk/options.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/comm/mpi_mirror.hpp>
#include <oktopk/impl/kernels/vector_ops.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <type_traits>

namespace oktopk::impl {

/// The oracle's vectors hold the handle's arithmetic type, Real (float or double).
template <class ExecSpace, class Real>
using OracleVector = Kokkos::View<Real*, typename ExecSpace::memory_space>;
template <class ExecSpace, class Real>
using OracleConstVector = Kokkos::View<const Real*, typename ExecSpace::memory_space>;

/// 2^-24: the unit roundoff of float.
inline constexpr float float_roundoff = 5.9604645e-8f;

/// The unit roundoff of Real: 2^-24 for float, 2^-53 for double.
template <class Real>
inline constexpr Real roundoff_v = std::is_same_v<Real, double> ? 0x1p-53 : 0x1p-24;

/// What storing an average as Value may add to its error: nothing for the arithmetic types;
/// for the 16-bit types their unit roundoff (relative) and half their smallest subnormal.
template <class Value>
struct OutputRounding {
  static constexpr double unit = 0.0;
  static constexpr double subnormal = 0.0;
};
template <>
struct OutputRounding<bfloat16> {
  static constexpr double unit = 0x1p-8;
  static constexpr double subnormal = 0x1p-134;
};
template <>
struct OutputRounding<float16> {
  static constexpr double unit = 0x1p-11;
  static constexpr double subnormal = 0x1p-25;
};

/// What sending a value on wire w may change it by (OutputRounding's unit and subnormal
/// terms for the wire's type), for w a value_wire() result: Native is as
/// wide as the arithmetic type (zero), Float32 narrows double gradients.
struct WireRounding {
  double unit = 0.0;
  double subnormal = 0.0;
};
inline WireRounding wire_rounding(Wire w) {
  if (w == Wire::BFloat16)
    return {OutputRounding<bfloat16>::unit, OutputRounding<bfloat16>::subnormal};
  if (w == Wire::Float16)
    return {OutputRounding<float16>::unit, OutputRounding<float16>::subnormal};
  if (w == Wire::Float32) return {0x1p-24, 0x1p-150};
  return {};
}

/// How far an average that OkTopk's ring formed on a narrower wire (ring_allreduce_average)
/// may lie from the exact one: scale · (sum over ranks of the terms' magnitudes) + floor.
template <class Real>
struct RingWireBound {
  Real scale = 0;
  Real floor = 0;
};

/// Every term of a ring sum meets at most P roundings to the wire type (its own, those of the
/// P - 2 partial sums sent on, the average's; at P = 1 its own) and P in the type the ring sums
/// in (the P - 1 additions, the division; float for a 16-bit wire, double for fp32): a relative
/// error of at most (1 + u_w)^P (1 + u)^P - 1 of the sum of magnitudes, u_w the wire type's
/// unit roundoff; plus, where a result is subnormal, at most half the type's smallest
/// subnormal per rounding (eta_w, and eta of the sum type), doubled for what later roundings
/// scale it by. An oracle's own sum meets fewer roundings, so it lies within that bound too:
/// the bound is doubled, and raised by (1 + u)^(P+2) for its own evaluation in Real.
template <class Real>
RingWireBound<Real> ring_wire_bound(Wire wire, int P) {
  const WireRounding w = wire_rounding(wire);
  const bool sums_in_double = std::is_same_v<Real, double>;
  const double u = static_cast<double>(roundoff_v<Real>);
  // Half the smallest subnormal; for double the whole one (its half is no double).
  const double eta = sums_in_double ? 0x1p-1074 : 0x1p-150;
  const double growth = std::pow((1.0 + w.unit) * (1.0 + u), P) - 1.0;
  return {static_cast<Real>(2.0 * growth / P * std::pow(1.0 + u, P + 2)),
          static_cast<Real>(2.0 * 4.0 * P * (w.subnormal + eta))};
}

KOKKOS_INLINE_FUNCTION float quiet_nan() { return bits_to_float(0x7fc00000u); }

template <class Real>
KOKKOS_INLINE_FUNCTION Real max_of(Real a, Real b) {
  return a > b ? a : b;
}

/// x (a magnitude) lies within tol of a finite threshold t.
KOKKOS_INLINE_FUNCTION bool near_threshold(float x, float t, float tol) {
  if (!is_finite(t)) return false;
  return abs(x - t) <= tol * max_of(x, abs(t));
}

/// Every rank learns whether any rank's Views have the wrong length, so all throw together.
inline void oracle_check_lengths(const char* where, const Communicator& comm, std::int64_t n,
                                 std::initializer_list<std::size_t> lengths) {
  bool ok = true;
  for (const std::size_t length : lengths) ok = ok && static_cast<std::int64_t>(length) == n;
  std::int64_t bad = ok ? 0 : comm.rank() + 1;
  comm.allreduce_in_place(&bad, 1, MPI_MAX);
  OKTOPK_REQUIRE(bad == 0, std::invalid_argument, where,
                 "the Views must have length " << n << " on every rank; rank " << bad - 1
                                               << " passed other lengths");
}

/// flags(i) = the number of ranks on which acc(i) != 0 lies within tol of their local threshold.
template <class ExecSpace, class Real>
void local_borderline_counts(const ExecSpace& exec, const Communicator& comm,
                             const OracleConstVector<ExecSpace, Real>& acc, float threshold,
                             float tol, const OracleVector<ExecSpace, Real>& flags) {
  Kokkos::parallel_for(
      "oktopk::expected_result::local_borderline", RangeOf<ExecSpace>(exec, 0, acc.extent(0)),
      KOKKOS_LAMBDA(std::int64_t i) {
        const Real a = acc(i);
        flags(i) = (a != 0 && near_threshold(magnitude(a), threshold, tol)) ? 1 : 0;
      });
  mpi_allreduce_in_place(exec, comm, flags, MPI_SUM);
}

}  // namespace oktopk::impl
