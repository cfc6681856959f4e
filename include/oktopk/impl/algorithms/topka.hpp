// SPDX-License-Identifier: BSD-3-Clause
// TopkA: each rank's exact top-k (ties in index order), allgathered as (index, value) pairs and
// summed.
#pragma once

#include <oktopk/pack.hpp>
#include <oktopk/residual.hpp>
#include <oktopk/impl/algorithms/method_base.hpp>
#include <oktopk/impl/collectives/sparse_allgatherv.hpp>
#include <oktopk/impl/collectives/wire_values.hpp>

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
      : Base(exec, Algorithm::TopkA, comm, n, options, layout) {
    gather_.wire = wire_;
  }

 protected:
  void reduce_step(const ExecSpace& exec, const real_vector_type& acc,
                   const vector_type& out) override {
    auto& stats = this->stats_;
    gather_.overflowed = 0;
    std::int64_t selected = 0;
    {
      auto timer = this->phase(exec, "select");
      stats.local_threshold = this->topk_threshold(exec, acc, this->k_);
      stats.local_threshold_exact = true;
      selected =
          this->select_top_k_into(exec, acc, stats.local_threshold, this->k_, indices_, values_);
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
      // What the others received leaves the residual; a narrower wire's rounding error stays.
      keep_wire_error_at(exec, acc, indices_, selected, wire_);
    }
  }

  std::int64_t wire_overflows() const override { return gather_.overflowed; }

 private:
  /// The type the values travel in (value_wire()).
  const Wire wire_ = value_wire<Value>(this->options_);
  typename Base::index_vector_type indices_{"oktopk::TopkA::indices", 0};
  real_vector_type values_{"oktopk::TopkA::values", 0};
  SparseGather<ExecSpace, Real> gather_;
};

}  // namespace oktopk::impl

// Compiled once, in liboktopk (src/instantiate/).
OKTOPK_IMPL_DECLARE_INSTANTIATIONS(oktopk::impl::TopkAllgather)
