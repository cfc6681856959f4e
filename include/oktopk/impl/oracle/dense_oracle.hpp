// SPDX-License-Identifier: BSD-3-Clause
// The oracle of a dense call: the average over ranks, as MPI_Allreduce computes it.
#pragma once

#include <oktopk/communicator.hpp>
#include <oktopk/sparse_allreduce.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/collectives/ring_allreduce.hpp>
#include <oktopk/impl/comm/mpi_mirror.hpp>
#include <oktopk/impl/kernels/vector_ops.hpp>
#include <oktopk/impl/oracle/common.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace oktopk::impl {

/// A dense call (the Dense method, or a warm-up call): the library's MPI path, an
/// out-of-place SUM allreduce, then a division by P; slack for the ring's order and a
/// reduce_scatter's, and for the roundings of a 16-bit wire.
template <class ExecSpace, class Value, class Real = arithmetic_t<Value>>
void expected_dense(const ExecSpace& exec, const SparseAllreduce<ExecSpace, Value>& handle,
                    const OracleConstVector<ExecSpace, Real>& acc,
                    const OracleVector<ExecSpace, Real>& expected,
                    const OracleVector<ExecSpace, Real>& bound) {
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
  const Wire wire = value_wire<Value>(handle.options());
  const bool narrow_wire = wire != Wire::Native;
  // The ring, and the Dense method's reduce_scatter (MPI_Reduce_scatter), add the P values in
  // another order than this allreduce.
  const bool reordered = dense_on_ring<Value, ExecSpace>(handle.options(), handle.size(), P) ||
                         (handle.stats().reduce_scatter && handle.algorithm() == Algorithm::Dense);
  if (!narrow_wire && !(reordered && P > 2)) {
    Kokkos::deep_copy(exec, bound, 0.0f);
    return;
  }
  // bound = scale * sum over ranks of |acc| + floor.
  Kokkos::parallel_for(
      "oktopk::expected_result::abs", RangeOf<ExecSpace>(exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i) { bound(i) = abs(acc(i)); });
  mpi_allreduce_in_place(exec, comm, bound, MPI_SUM);
  Real scale = 0;
  Real floor = 0;
  if (narrow_wire) {
    const RingWireBound<Real> ring = ring_wire_bound<Real>(wire, P);
    scale = ring.scale;
    floor = ring.floor;
  } else {
    // The same P values added in another order: first-order bound, doubled.
    scale = Real(2) * static_cast<Real>(P - 1) * roundoff_v<Real> / static_cast<Real>(P);
  }
  Kokkos::parallel_for(
      "oktopk::expected_result::ring_slack", RangeOf<ExecSpace>(exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i) { bound(i) = bound(i) * scale + floor; });
}

}  // namespace oktopk::impl
