// SPDX-License-Identifier: BSD-3-Clause
// The oracle of the masked-sum methods (TopkA, TopkDSA, Gaussian-k, Ok-Topk): every rank
// masks its input at its local threshold, the masked vectors are summed, and the sum is
// masked again at the global threshold (spec §6.1).
#pragma once

#include <oktopk/communicator.hpp>
#include <oktopk/sparse_allreduce.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/collectives/wire_values.hpp>
#include <oktopk/impl/comm/mpi_mirror.hpp>
#include <oktopk/impl/kernels/vector_ops.hpp>
#include <oktopk/impl/oracle/common.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace oktopk::impl {

/// Masked-sum methods (TopkA, TopkDSA, GaussianK, OkTopk): spec §6.1.
template <class ExecSpace, class Value, class Real = arithmetic_t<Value>>
void expected_masked_sum(const ExecSpace& exec, const SparseAllreduce<ExecSpace, Value>& handle,
                         const OracleConstVector<ExecSpace, Real>& acc,
                         const OracleVector<ExecSpace, Real>& expected,
                         const OracleVector<ExecSpace, Real>& slack, float tol) {
  const Communicator& comm = handle.communicator();
  const ReduceStats& stats = handle.stats();
  const auto n = static_cast<std::size_t>(handle.size());
  // expected first holds R, the masked sum; beside it sum|terms| (in slack), the count of
  // non-zero terms, and the number of ranks on which the entry is locally borderline.
  const auto terms = make_uninitialized<Real>(exec, "oktopk::expected_result::terms", n);
  const auto borderline = make_uninitialized<Real>(exec, "oktopk::expected_result::borderline", n);
  const float local_threshold = stats.local_threshold;
  Kokkos::parallel_for(
      "oktopk::expected_result::mask", RangeOf<ExecSpace>(exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i) {
        const Real a = acc(i);
        const float m = magnitude(a);
        const bool selected = m > local_threshold;
        expected(i) = selected ? a : Real(0);
        slack(i) = selected ? abs(a) : Real(0);
        terms(i) = (selected && a != 0) ? 1 : 0;
        borderline(i) = (a != 0 && near_threshold(m, local_threshold, tol)) ? 1 : 0;
      });
  mpi_allreduce_in_place(exec, comm, expected, MPI_SUM);
  mpi_allreduce_in_place(exec, comm, slack, MPI_SUM);
  mpi_allreduce_in_place(exec, comm, terms, MPI_SUM);
  mpi_allreduce_in_place(exec, comm, borderline, MPI_SUM);

  const float global_threshold = stats.global_threshold;
  const auto ranks = static_cast<float>(comm.size());
  const Real u = roundoff_v<Real>;
  // A narrower wire (value_wire()) rounds each term as it is sent, by at most
  // u_w·|a| + eta_w, and the methods that send sums (TopkDSA, Ok-Topk) round the sum R' of the
  // rounded terms once more, by at most u_w·|R'| + eta_w <= u_w(1 + u_w)·sum|a| + u_w·c·eta_w +
  // eta_w: together (2u_w + u_w^2)·sum|a| + (c + 1)(1 + u_w)·eta_w, doubled for safety.
  const WireRounding wire = wire_rounding(value_wire<Value>(handle.options()));
  const auto wire_unit = static_cast<Real>(wire.unit);
  const auto wire_subnormal = static_cast<Real>(wire.subnormal);
  Kokkos::parallel_for(
      "oktopk::expected_result::select", RangeOf<ExecSpace>(exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i) {
        const Real r = expected(i);
        const float m = magnitude(r);
        const Real c = terms(i);
        const Real rounded =
            c > 0 ? Real(2) * ((Real(2) * wire_unit + wire_unit * wire_unit) * slack(i) +
                               (c + 1) * (1 + wire_unit) * wire_subnormal)
                  : Real(0);
        const Real order = (c > 2 ? Real(2) * (c - 1) * u * slack(i) : Real(0)) + rounded;
        const bool keep = m > global_threshold;
        bool undecided = borderline(i) > 0;
        if (is_finite(global_threshold)) {
          const Real g = global_threshold;
          const Real exact = abs(r);
          if (abs(exact - g) <= max_of(Real(tol) * max_of(exact, abs(g)), order)) undecided = true;
          // The selection compares |R| rounded to float (magnitude()): a double R that the
          // summation order moves by `order` may round to either side of the threshold.
          if ((magnitude(exact - order) > g) != (magnitude(exact + order) > g)) undecided = true;
        }
        expected(i) = undecided ? Real(quiet_nan()) : (keep ? r / ranks : Real(0));
        slack(i) = keep ? order / ranks : Real(0);
      });
}

}  // namespace oktopk::impl
