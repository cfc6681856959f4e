// SPDX-License-Identifier: BSD-3-Clause
// PLACEHOLDER (being implemented): OkTopk.
#pragma once

#include <oktopk/sparse_allreduce.hpp>

#include <stdexcept>

namespace oktopk::impl {

template <class ExecSpace>
class OkTopkAllreduce final : public SparseAllreduce<ExecSpace> {
  using Base = SparseAllreduce<ExecSpace>;

 public:
  OkTopkAllreduce(const Communicator& comm, std::int64_t n, const Options& options)
      : Base(Algorithm::OkTopk, comm, n, options) {}

 protected:
  void reduce_step(const ExecSpace&, const typename Base::vector_type&,
                   const typename Base::vector_type&) override {
    throw std::logic_error("OkTopk: not implemented yet");
  }
};

}  // namespace oktopk::impl
