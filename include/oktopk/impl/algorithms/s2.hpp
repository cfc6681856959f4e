// SPDX-License-Identifier: BSD-3-Clause
// PLACEHOLDER (being implemented): S2Reducer.
#pragma once

#include <oktopk/sparse_allreduce.hpp>

#include <stdexcept>

namespace oktopk::impl {

template <class ExecSpace>
class S2Reducer final : public SparseAllreduce<ExecSpace> {
  using Base = SparseAllreduce<ExecSpace>;

 public:
  S2Reducer(const Communicator& comm, std::int64_t n, const Options& options)
      : Base(Algorithm::S2Reducer, comm, n, options) {}

 protected:
  void reduce_step(const ExecSpace&, const typename Base::vector_type&,
                   const typename Base::vector_type&) override {
    throw std::logic_error("S2Reducer: not implemented yet");
  }
};

}  // namespace oktopk::impl
