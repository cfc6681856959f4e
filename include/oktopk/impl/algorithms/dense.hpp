// SPDX-License-Identifier: BSD-3-Clause
// Dense: an allreduce of the whole gradient (MPI_Allreduce, or OkTopk's ring: Options::
// dense_allreduce), then /P. The reference every method is held to.
#pragma once

#include <oktopk/impl/algorithms/method_base.hpp>

namespace oktopk::impl {

template <class ExecSpace, class Value>
class DenseAllreduce final : public MethodBase<ExecSpace, Value> {
  using Base = MethodBase<ExecSpace, Value>;
  using real_vector_type = typename Base::real_vector_type;

 public:
  DenseAllreduce(const ExecSpace& exec, const Communicator& comm, std::int64_t n,
                 const Options& options, const Layout& layout = Layout())
      : Base(exec, Algorithm::Dense, comm, n, options, layout) {}

 protected:
  bool uses_error_feedback() const override { return false; }
  // The allreduce reads the gradient where it lies: no copy into a separate buffer first, and
  // the finiteness check rides on the division by P.
  bool averages_gradient_as_is() const override { return true; }

  // The driver's dense reduce-scatter (dense_reduce_scatter()): every gradient type and wire.
  const char* reduce_scatter_refusal() const override { return nullptr; }

  // Not called (the base averages the gradient itself), but the same thing on acc.
  void reduce_step(const ExecSpace& exec, const real_vector_type& acc,
                   const typename Base::vector_type& out) override {
    this->dense_step(exec, acc, out, false);
  }
};

}  // namespace oktopk::impl

// Compiled once, in liboktopk (src/instantiate/).
OKTOPK_IMPL_DECLARE_INSTANTIATIONS(oktopk::impl::DenseAllreduce)
