// SPDX-License-Identifier: BSD-3-Clause
// The factory: a handle for any method, made through one guarded path. Its body, the one place
// that knows every method, is impl/factory/handle_factory.hpp, compiled in liboktopk.
#pragma once

#include <oktopk/algorithm.hpp>
#include <oktopk/communicator.hpp>
#include <oktopk/layout.hpp>
#include <oktopk/options.hpp>
#include <oktopk/sparse_allreduce.hpp>
#include <oktopk/impl/base/explicit_instantiation.hpp>
#include <oktopk/impl/base/value_traits.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <memory>
#include <type_traits>

namespace oktopk {

namespace impl {
/// make_sparse_allreduce's body for one execution space and gradient type, as a class template
/// that liboktopk instantiates: a program that makes handles parses none of the methods.
template <class ExecSpace, class Value>
class HandleFactory {
 public:
  static std::unique_ptr<SparseAllreduce<ExecSpace, Value>> make(
      const ExecSpace& exec, Algorithm algorithm, const Communicator& comm, std::int64_t n,
      const Options& options, const Layout& layout);
};
}  // namespace impl

/// \brief Collective. A handle running `algorithm` on gradients of length n and type Value
/// (float, the default, or double: make_sparse_allreduce<ExecSpace, double>(...)) over `comm`;
/// its buffers are allocated and zeroed on `exec`, which is fenced before the handle is returned.
/// `layout` describes the fused buffer's segments (docs/reference.md, "Fused buffers: layouts"):
/// S2 sketches only its SparseRows segments and averages its Dense ones exactly; the other
/// methods compute what they compute without one, and count the output's non-zeros per
/// segment in stats().segments. The empty layout is the same as none.
///
/// Every rank must pass the same algorithm, n, gradient type, options and layout: a mismatch
/// throws the same std::invalid_argument on every rank (naming what differs) instead of hanging
/// later. Invalid values (n outside [0, 2^31 - 1], options out of range, a layout that does not
/// cover [0, n) exactly, a wire the gradient type does not take) throw std::invalid_argument
/// too.
/// OKTOPK_GPU_AWARE_MPI holding another word than on, off or auto on some rank throws
/// std::invalid_argument on every rank; for a device ExecSpace, ranks that chose differently
/// whether MPI gets device pointers (gpu_aware_mpi()) throw std::runtime_error. If building the
/// handle fails on some ranks only (its buffers do not fit in memory), every rank throws the
/// same std::runtime_error, naming the lowest failing rank and its cause ("rank R could not
/// build the handle: <cause>": for an allocation, Kokkos's message with the View's label, or
/// "out of memory (std::bad_alloc)").
template <class ExecSpace, class Value = value_type,
          std::enable_if_t<Kokkos::is_execution_space<ExecSpace>::value, int> = 0>
std::unique_ptr<SparseAllreduce<ExecSpace, Value>> make_sparse_allreduce(
    const ExecSpace& exec, Algorithm algorithm, const Communicator& comm, std::int64_t n,
    const Options& options, const Layout& layout) {
  static_assert(
      impl::is_gradient_value_v<Value>,
      "oktopk::make_sparse_allreduce: the gradient type must be float, double, oktopk::bfloat16 or "
      "oktopk::float16");
  return impl::HandleFactory<ExecSpace, Value>::make(exec, algorithm, comm, n, options, layout);
}

/// \brief make_sparse_allreduce for a buffer without a layout (the empty Layout).
template <class ExecSpace, class Value = value_type,
          std::enable_if_t<Kokkos::is_execution_space<ExecSpace>::value, int> = 0>
std::unique_ptr<SparseAllreduce<ExecSpace, Value>> make_sparse_allreduce(
    const ExecSpace& exec, Algorithm algorithm, const Communicator& comm, std::int64_t n,
    const Options& options = {}) {
  return make_sparse_allreduce<ExecSpace, Value>(exec, algorithm, comm, n, options, Layout());
}

/// \brief make_sparse_allreduce on a default-constructed instance of ExecSpace.
template <class ExecSpace = Kokkos::DefaultExecutionSpace, class Value = value_type>
std::unique_ptr<SparseAllreduce<ExecSpace, Value>> make_sparse_allreduce(
    Algorithm algorithm, const Communicator& comm, std::int64_t n, const Options& options = {},
    const Layout& layout = {}) {
  return make_sparse_allreduce<ExecSpace, Value>(ExecSpace(), algorithm, comm, n, options, layout);
}

}  // namespace oktopk

// Compiled once, in liboktopk (src/instantiate/), for the spaces of
// impl/base/explicit_instantiation.hpp; oktopk/any_space.hpp for other spaces.
OKTOPK_IMPL_DECLARE_INSTANTIATIONS(oktopk::impl::HandleFactory)
