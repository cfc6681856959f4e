// SPDX-License-Identifier: BSD-3-Clause
// The oracle of the masked-sum methods (TopkA, TopkDSA, Gaussian-k, Ok-Topk): every rank
// masks its input at its local threshold, the masked vectors are summed, and the sum is
// masked again at the global threshold (spec §6.1).
#pragma once

#include <oktopk/communicator.hpp>
#include <oktopk/sparse_allreduce.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/comm/mpi_mirror.hpp>
#include <oktopk/impl/kernels/vector_ops.hpp>
#include <oktopk/impl/oracle/common.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace oktopk::impl {

/// Masked-sum methods (TopkA, TopkDSA, GaussianK, OkTopk): spec §6.1.
template <class ExecSpace>
void expected_masked_sum(const ExecSpace& exec, const SparseAllreduce<ExecSpace>& handle,
                         const OracleConstVector<ExecSpace>& acc,
                         const OracleVector<ExecSpace>& expected,
                         const OracleVector<ExecSpace>& slack, float tol) {
  const Communicator& comm = handle.communicator();
  const ReduceStats& stats = handle.stats();
  const auto n = static_cast<std::size_t>(handle.size());
  // expected first holds R, the masked sum; beside it sum|terms| (in slack), the count of
  // non-zero terms, and the number of ranks on which the entry is locally borderline.
  const auto terms = make_uninitialized<float>(exec, "oktopk::expected_result::terms", n);
  const auto borderline = make_uninitialized<float>(exec, "oktopk::expected_result::borderline", n);
  const float local_threshold = stats.local_threshold;
  Kokkos::parallel_for(
      "oktopk::expected_result::mask", RangeOf<ExecSpace>(exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i) {
        const float a = acc(i);
        const float m = abs(a);
        const bool selected = m > local_threshold;
        expected(i) = selected ? a : 0.0f;
        slack(i) = selected ? m : 0.0f;
        terms(i) = (selected && a != 0.0f) ? 1.0f : 0.0f;
        borderline(i) = (a != 0.0f && near_threshold(m, local_threshold, tol)) ? 1.0f : 0.0f;
      });
  mpi_allreduce_in_place(exec, comm, expected, MPI_SUM);
  mpi_allreduce_in_place(exec, comm, slack, MPI_SUM);
  mpi_allreduce_in_place(exec, comm, terms, MPI_SUM);
  mpi_allreduce_in_place(exec, comm, borderline, MPI_SUM);

  const float global_threshold = stats.global_threshold;
  const auto ranks = static_cast<float>(comm.size());
  Kokkos::parallel_for(
      "oktopk::expected_result::select", RangeOf<ExecSpace>(exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i) {
        const float r = expected(i);
        const float m = abs(r);
        const float c = terms(i);
        const float order = c > 2.0f ? 2.0f * (c - 1.0f) * float_roundoff * slack(i) : 0.0f;
        const bool keep = m > global_threshold;
        bool undecided = borderline(i) > 0.0f;
        if (is_finite(global_threshold)) {
          const float g = global_threshold;
          if (abs(m - g) <= max_of(tol * max_of(m, abs(g)), order)) undecided = true;
        }
        expected(i) = undecided ? quiet_nan() : (keep ? r / ranks : 0.0f);
        slack(i) = keep ? order / ranks : 0.0f;
      });
}

}  // namespace oktopk::impl
