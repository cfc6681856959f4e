// SPDX-License-Identifier: BSD-3-Clause
// TopkA: each rank's exact top-k, allgathered as (index, value) pairs and summed.
#pragma once

#include <oktopk/pack.hpp>
#include <oktopk/residual.hpp>
#include <oktopk/impl/algorithms/method_base.hpp>
#include <oktopk/impl/collectives/sparse_allgatherv.hpp>

namespace oktopk::impl {

template <class ExecSpace, class Value>
class TopkAllgather final : public MethodBase<ExecSpace, Value> {
  using Base = MethodBase<ExecSpace, Value>;
  using real_vector_type = typename Base::real_vector_type;
  using Real = typename Base::arithmetic_type;
  using vector_type = typename Base::vector_type;

 public:
  TopkAllgather(const ExecSpace& exec, const Communicator& comm, std::int64_t n,
                const Options& options, const Layout& layout = Layout())
      : Base(exec, Algorithm::TopkA, comm, n, options, layout) {}

 protected:
  void reduce_step(const ExecSpace& exec, const real_vector_type& acc,
                   const vector_type& out) override {
    auto& stats = this->stats_;
    std::int64_t selected = 0;
    {
      auto timer = this->phase(exec, "select");
      stats.local_threshold = this->topk_threshold(exec, acc, this->k_);
      stats.local_threshold_exact = true;
      selected = this->select_into(exec, acc, stats.local_threshold, indices_, values_);
    }
    stats.local_selected = selected;
    sparse_allgatherv(exec, this->comm_, indices_, values_, selected, Balancing::Off, 1.0, gather_,
                      this->timed(exec));
    {
      auto timer = this->phase(exec, "reduce");
      average_gathered(exec, gather_, this->sums_for(exec, out), out, this->comm_.size());
    }
    stats.global_threshold = -std::numeric_limits<float>::infinity();
    stats.global_selected = gather_.total;
    {
      auto timer = this->phase(exec, "residual");
      clear_at_unchecked(exec, acc,
                         Kokkos::subview(indices_, Kokkos::make_pair(std::int64_t{0}, selected)));
    }
  }

 private:
  typename Base::index_vector_type indices_{"oktopk::TopkA::indices", 0};
  real_vector_type values_{"oktopk::TopkA::values", 0};
  SparseGather<ExecSpace, Real> gather_;
};

}  // namespace oktopk::impl
