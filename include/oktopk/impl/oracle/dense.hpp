// SPDX-License-Identifier: BSD-3-Clause
// The oracle of a dense call: the average over ranks, as MPI_Allreduce computes it.
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

/// A dense call (the Dense method, or a warm-up call): the library's MPI path, an
/// out-of-place SUM allreduce, then a division by P; slack only for the ring's order.
template <class ExecSpace>
void expected_dense(const ExecSpace& exec, const SparseAllreduce<ExecSpace>& handle,
                    const OracleConstVector<ExecSpace>& acc,
                    const OracleVector<ExecSpace>& expected, const OracleVector<ExecSpace>& bound) {
  const Communicator& comm = handle.communicator();
  const auto n = static_cast<std::size_t>(handle.size());
  const int P = comm.size();
  {
    const auto send = mpi_send_view(exec, acc);
    auto receive = mpi_receive_view(exec, expected);
    comm.allreduce(send.data(), receive.data(), static_cast<count_type>(n), MPI_SUM);
    mpi_received(exec, receive, expected, 0, static_cast<std::int64_t>(n));
  }
  divide(exec, expected, expected, static_cast<float>(P));
  if (handle.options().dense_allreduce == DenseAlgorithm::Ring && P > 2) {
    // The ring adds the same P floats in another order: first-order bound, doubled.
    Kokkos::parallel_for(
        "oktopk::expected_result::abs", RangeOf<ExecSpace>(exec, 0, n),
        KOKKOS_LAMBDA(std::int64_t i) { bound(i) = abs(acc(i)); });
    mpi_allreduce_in_place(exec, comm, bound, MPI_SUM);
    const float scale = 2.0f * static_cast<float>(P - 1) * float_roundoff / static_cast<float>(P);
    Kokkos::parallel_for(
        "oktopk::expected_result::ring_slack", RangeOf<ExecSpace>(exec, 0, n),
        KOKKOS_LAMBDA(std::int64_t i) { bound(i) *= scale; });
  } else {
    Kokkos::deep_copy(exec, bound, 0.0f);
  }
}

}  // namespace oktopk::impl
