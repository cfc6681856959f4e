// SPDX-License-Identifier: BSD-3-Clause
// The factory: the one place that knows every method.
#pragma once

#include <oktopk/algorithm.hpp>
#include <oktopk/communicator.hpp>
#include <oktopk/options.hpp>
#include <oktopk/sparse_allreduce.hpp>
#include <oktopk/impl/algorithms/dense.hpp>
#include <oktopk/impl/algorithms/gaussiank.hpp>
#include <oktopk/impl/algorithms/gtopk.hpp>
#include <oktopk/impl/algorithms/oktopk.hpp>
#include <oktopk/impl/algorithms/s2.hpp>
#include <oktopk/impl/algorithms/topka.hpp>
#include <oktopk/impl/algorithms/topkdsa.hpp>

#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>

namespace oktopk {

/// \brief Collective. A handle running `algorithm` on gradients of length n over `comm`; its
/// buffers are allocated and zeroed on `exec`, which is fenced before the handle is returned.
///
/// Every rank must pass the same algorithm, n and options: a mismatch throws the same
/// std::invalid_argument on every rank (naming what differs) instead of hanging later. Invalid
/// values (n outside [0, 2^31 - 1], options out of range) throw std::invalid_argument too.
template <class ExecSpace,
          std::enable_if_t<Kokkos::is_execution_space<ExecSpace>::value, int> = 0>
std::unique_ptr<SparseAllreduce<ExecSpace>> make_sparse_allreduce(const ExecSpace& exec,
                                                                  Algorithm algorithm,
                                                                  const Communicator& comm,
                                                                  std::int64_t n,
                                                                  const Options& options = {}) {
  constexpr const char* where = "oktopk::make_sparse_allreduce";
  comm.check_agreement(where, {{"algorithm", static_cast<std::int64_t>(algorithm)},
                               {"n", n},
                               {"options", options.digest()}});
  OKTOPK_REQUIRE(n >= 0 && n <= std::numeric_limits<index_type>::max(), std::invalid_argument,
                 where, "n must be in [0, 2^31 - 1], got " << n);
  options.validate();
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
