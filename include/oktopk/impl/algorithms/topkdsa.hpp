// SPDX-License-Identifier: BSD-3-Clause
// PLACEHOLDER (being implemented): TopkDSA.
#pragma once

#include <oktopk/sparse_allreduce.hpp>

#include <stdexcept>

namespace oktopk::impl {

template <class ExecSpace>
class TopkDSA final : public SparseAllreduce<ExecSpace> {
  using Base = SparseAllreduce<ExecSpace>;

 public:
  TopkDSA(const Communicator& comm, std::int64_t n, const Options& options)
      : Base(Algorithm::TopkDSA, comm, n, options) {}

 protected:
  void reduce_step(const ExecSpace&, const typename Base::vector_type&,
                   const typename Base::vector_type&) override {
    throw std::logic_error("TopkDSA: not implemented yet");
  }
};

}  // namespace oktopk::impl
