// SPDX-License-Identifier: BSD-3-Clause
// The factory: the one place that knows every method.
#pragma once

#include <oktopk/algorithm.hpp>
#include <oktopk/communicator.hpp>
#include <oktopk/error.hpp>
#include <oktopk/options.hpp>
#include <oktopk/sparse_allreduce.hpp>
#include <oktopk/impl/algorithms/dense.hpp>
#include <oktopk/impl/algorithms/gaussiank.hpp>
#include <oktopk/impl/algorithms/gtopk.hpp>
#include <oktopk/impl/algorithms/oktopk.hpp>
#include <oktopk/impl/algorithms/s2.hpp>
#include <oktopk/impl/algorithms/topka.hpp>
#include <oktopk/impl/algorithms/topkdsa.hpp>
#include <oktopk/impl/fault_injection.hpp>
#include <oktopk/impl/gpu_aware_mpi.hpp>
#include <oktopk/impl/kokkos_ext.hpp>
#include <oktopk/impl/mpi_mirror.hpp>

#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace oktopk {

/// \brief Collective. A handle running `algorithm` on gradients of length n over `comm`; its
/// buffers are allocated and zeroed on `exec`, which is fenced before the handle is returned.
///
/// Every rank must pass the same algorithm, n and options: a mismatch throws the same
/// std::invalid_argument on every rank (naming what differs) instead of hanging later. Invalid
/// values (n outside [0, 2^31 - 1], options out of range) throw std::invalid_argument too.
/// Built with OKTOPK_ENABLE_GPU_AWARE_MPI=ON, a device ExecSpace throws std::runtime_error on
/// every rank when MPI says it cannot read GPU memory (where MPI can be asked). If building the
/// handle fails on any rank (its buffers do not fit in memory), every rank throws the same
/// std::runtime_error naming that rank.
template <class ExecSpace,
          std::enable_if_t<Kokkos::is_execution_space<ExecSpace>::value, int> = 0>
std::unique_ptr<SparseAllreduce<ExecSpace>> make_sparse_allreduce(const ExecSpace& exec,
                                                                  Algorithm algorithm,
                                                                  const Communicator& comm,
                                                                  std::int64_t n,
                                                                  const Options& options = {}) {
  constexpr const char* where = "oktopk::make_sparse_allreduce";
  impl::GpuAwareness gpu_aware = impl::GpuAwareness::Unknown;
  std::string gpu_query;
  if constexpr (impl::mpi_uses_view_memory_v<ExecSpace> && !impl::runs_on_host_v<ExecSpace>) {
    gpu_aware = impl::query_gpu_aware_mpi(gpu_query);
  }
  // Nodes may run different MPI set-ups: agreeing on the answer makes every rank throw alike.
  comm.check_agreement(where, {{"algorithm", static_cast<std::int64_t>(algorithm)},
                               {"n", n},
                               {"options", options.digest()},
                               {"GPU-aware MPI", static_cast<std::int64_t>(gpu_aware)}});
  OKTOPK_REQUIRE(gpu_aware != impl::GpuAwareness::No, std::runtime_error, where,
                 "this copy of OkTopk hands GPU memory to MPI (OKTOPK_ENABLE_GPU_AWARE_MPI=ON), "
                 "but MPI cannot read it ("
                     << gpu_query
                     << "); use a GPU-aware MPI (Cray MPICH: export MPICH_GPU_SUPPORT_ENABLED=1) "
                        "or rebuild with -DOKTOPK_ENABLE_GPU_AWARE_MPI=OFF");
  OKTOPK_REQUIRE(n >= 0 && n <= std::numeric_limits<index_type>::max(), std::invalid_argument,
                 where, "n must be in [0, 2^31 - 1], got " << n);
  options.validate();
  const auto build = [&]() -> std::unique_ptr<SparseAllreduce<ExecSpace>> {
    OKTOPK_FAULT_POINT(comm, "construct");
    switch (algorithm) {
      case Algorithm::Dense:
        return std::make_unique<impl::DenseAllreduce<ExecSpace>>(exec, comm, n, options);
      case Algorithm::TopkA:
        return std::make_unique<impl::TopkAllgather<ExecSpace>>(exec, comm, n, options);
      case Algorithm::TopkDSA:
        return std::make_unique<impl::TopkDSA<ExecSpace>>(exec, comm, n, options);
      case Algorithm::GTopk:
        return std::make_unique<impl::GTopk<ExecSpace>>(exec, comm, n, options);
      case Algorithm::GaussianK:
        return std::make_unique<impl::GaussianK<ExecSpace>>(exec, comm, n, options);
      case Algorithm::OkTopk:
        return std::make_unique<impl::OkTopkAllreduce<ExecSpace>>(exec, comm, n, options);
      case Algorithm::S2Reducer:
        return std::make_unique<impl::S2Reducer<ExecSpace>>(exec, comm, n, options);
    }
    throw std::invalid_argument(std::string(where) + ": not an Algorithm value (" +
                                std::to_string(static_cast<int>(algorithm)) + ")");
  };
  // Allocating the buffers can fail on some ranks only (a smaller device, a fuller node): every
  // rank learns of it and throws, instead of the others going on to a reduce() that rank never
  // joins.
  std::unique_ptr<SparseAllreduce<ExecSpace>> handle;
  std::string failure;
  try {
    handle = build();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  std::int64_t failed_rank = failure.empty() ? 0 : comm.rank() + 1;
  comm.allreduce_in_place(&failed_rank, 1, MPI_MAX);
  OKTOPK_REQUIRE(failed_rank == 0, std::runtime_error, where,
                 "rank " << failed_rank - 1 << " could not build the handle"
                         << (failure.empty() ? std::string() : ": " + failure));
  return handle;
}

/// \brief make_sparse_allreduce on a default-constructed instance of ExecSpace.
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
std::unique_ptr<SparseAllreduce<ExecSpace>> make_sparse_allreduce(Algorithm algorithm,
                                                                  const Communicator& comm,
                                                                  std::int64_t n,
                                                                  const Options& options = {}) {
  return make_sparse_allreduce(ExecSpace(), algorithm, comm, n, options);
}

}  // namespace oktopk
