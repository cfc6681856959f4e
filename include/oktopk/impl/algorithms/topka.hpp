// SPDX-License-Identifier: BSD-3-Clause
// TopkA: each rank's exact top-k (ties in index order), allgathered as (index, value) pairs and
// summed; for reduce_scatter, each pair sent only to its shard's owner.
#pragma once

#include <oktopk/pack.hpp>
#include <oktopk/residual.hpp>
#include <oktopk/impl/algorithms/method_base.hpp>
#include <oktopk/impl/collectives/shard_exchange.hpp>
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
    gather_.wire = shards_.wire = wire_;
  }

 protected:
  const char* reduce_scatter_refusal() const override { return nullptr; }

  void reduce_step(const ExecSpace& exec, const real_vector_type& acc,
                   const vector_type& out) override {
    const std::int64_t selected = select(exec, acc);
    sparse_allgatherv(exec, this->comm_, indices_, values_, selected, Balancing::Off, 1.0, gather_,
                      this->timed(exec));
    {
      auto timer = this->phase(exec, "reduce");
      average_gathered(exec, gather_, this->sums_for(exec, out), out, this->comm_.size());
    }
    this->stats_.global_selected = gather_.total;
    clear_sent(exec, acc, selected);
  }

  void reduce_step_scatter(const ExecSpace& exec, const real_vector_type& acc,
                           const typename Base::ShardTarget& target) override {
    const std::int64_t selected = select(exec, acc);
    this->stats_.global_selected = sparse_reduce_scatter(
        exec, this->comm_, indices_, values_, selected, target.offsets, shards_,
        this->sums_for(exec, target.shard), target.shard, this->timed(exec));
    clear_sent(exec, acc, selected);
  }

  std::int64_t wire_overflows() const override { return gather_.overflowed + shards_.overflowed; }

 private:
  /// The exact local top-k into indices_ and values_; returns how many.
  std::int64_t select(const ExecSpace& exec, const real_vector_type& acc) {
    auto& stats = this->stats_;
    gather_.overflowed = shards_.overflowed = 0;
    auto timer = this->phase(exec, "select");
    stats.local_threshold = this->topk_threshold(exec, acc, this->k_);
    stats.local_threshold_exact = true;
    stats.global_threshold = -std::numeric_limits<float>::infinity();
    stats.local_selected =
        this->select_top_k_into(exec, acc, stats.local_threshold, this->k_, indices_, values_);
    return stats.local_selected;
  }

  /// What the others received leaves the residual; a narrower wire's rounding error stays.
  void clear_sent(const ExecSpace& exec, const real_vector_type& acc, std::int64_t selected) {
    auto timer = this->phase(exec, "residual");
    keep_wire_error_at(exec, acc, indices_, selected, wire_);
  }

  /// The type the values travel in (value_wire()).
  const Wire wire_ = value_wire<Value>(this->options_);
  typename Base::index_vector_type indices_{"oktopk::TopkA::indices", 0};
  real_vector_type values_{"oktopk::TopkA::values", 0};
  SparseGather<ExecSpace, Real> gather_;
  ShardExchange<ExecSpace, Real> shards_;
};

}  // namespace oktopk::impl

// Compiled once, in liboktopk (src/instantiate/).
OKTOPK_IMPL_DECLARE_INSTANTIATIONS(oktopk::impl::TopkAllgather)
