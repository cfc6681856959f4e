// SPDX-License-Identifier: BSD-3-Clause
// Dense: MPI_Allreduce of the whole gradient, then /P. The reference every method is held to.
#pragma once

#include <oktopk/sparse_allreduce.hpp>

namespace oktopk::impl {

template <class ExecSpace>
class DenseAllreduce final : public SparseAllreduce<ExecSpace> {
  using Base = SparseAllreduce<ExecSpace>;

 public:
  DenseAllreduce(const ExecSpace& exec, const Communicator& comm, std::int64_t n, const Options& options)
      : Base(exec, Algorithm::Dense, comm, n, options) {}

 protected:
  bool uses_error_feedback() const override { return false; }
  // MPI sums the input where it lies: no copy into a separate buffer first.
  bool reads_input_in_output() const override { return true; }

  void reduce_step(const ExecSpace& exec, const typename Base::vector_type& acc,
                   const typename Base::vector_type& out) override {
    this->dense_step(exec, acc, out);
  }
};

}  // namespace oktopk::impl
