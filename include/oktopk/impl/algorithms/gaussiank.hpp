// SPDX-License-Identifier: BSD-3-Clause
// Gaussian-k (Shi et al., arXiv 1911.08772): a threshold from a normal fit of the gradient,
// corrected by a few counting passes, then an allgatherv of every rank's selection, summed; for
// reduce_scatter, each selected entry sent only to its shard's owner.
#pragma once

#include <oktopk/pack.hpp>
#include <oktopk/residual.hpp>
#include <oktopk/select.hpp>
#include <oktopk/topk.hpp>
#include <oktopk/impl/algorithms/method_base.hpp>
#include <oktopk/impl/collectives/shard_exchange.hpp>
#include <oktopk/impl/collectives/sparse_allgatherv.hpp>
#include <oktopk/impl/collectives/wire_values.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

namespace oktopk::impl {

/// Every selected entry reaches the result, so the residual keeps exactly what was not
/// selected. Ranks select between gaussian_low·k and gaussian_high·k entries each (or exactly
/// k, by the exact fallback), so the result holds up to about P·k.
template <class ExecSpace, class Value>
class GaussianK final : public MethodBase<ExecSpace, Value> {
  using Base = MethodBase<ExecSpace, Value>;
  using real_vector_type = typename Base::real_vector_type;
  using Real = typename Base::arithmetic_type;
  using vector_type = typename Base::vector_type;

 public:
  GaussianK(const ExecSpace& exec, const Communicator& comm, std::int64_t n, const Options& options,
            const Layout& layout = Layout())
      : Base(exec, Algorithm::GaussianK, comm, n, options, layout) {
    gather_.wire = shards_.wire = wire_;
  }

 protected:
  const char* reduce_scatter_refusal() const override { return nullptr; }

  void reduce_step(const ExecSpace& exec, const real_vector_type& acc,
                   const vector_type& out) override {
    const std::int64_t selected = select(exec, acc);
    sparse_allgatherv(exec, this->comm_, indices_, values_, selected, Balancing::Off, 1.0, gather_,
                      this->timed(exec));
    this->stats_.global_selected = gather_.total;
    {
      auto timer = this->phase(exec, "reduce");
      average_gathered(exec, gather_, this->sums_for(exec, out), out, this->comm_.size());
    }
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
  /// The local selection at the corrected threshold into indices_ and values_; returns how
  /// many.
  std::int64_t select(const ExecSpace& exec, const real_vector_type& acc) {
    auto& stats = this->stats_;
    gather_.overflowed = shards_.overflowed = 0;
    const Options& options = this->options_;
    const std::int64_t k = this->k_;
    std::int64_t selected = 0;
    {
      auto timer = this->phase(exec, "select");
      float threshold = estimate_threshold_gaussian(exec, acc, k);
      // Gradients are heavier-tailed than a normal distribution, so the fit is corrected by
      // counting. k == 0 (+Inf) and k >= n (-Inf) need no correction; a zero threshold (a
      // constant gradient) cannot be scaled.
      if (std::isfinite(threshold) && threshold > 0.0f) {
        const double low = options.gaussian_low * static_cast<double>(k);
        const double high = options.gaussian_high * static_cast<double>(k);
        for (int loop = 0; loop < options.gaussian_loops; ++loop) {
          const auto count = static_cast<double>(count_above(exec, acc, threshold));
          if (count < low) {
            threshold = static_cast<float>(threshold / options.gaussian_step);
          } else if (count > high) {
            threshold = static_cast<float>(threshold * options.gaussian_step);
          } else {
            break;
          }
        }
      }
      selected = this->select_into(exec, acc, threshold, indices_, values_);
      // No scaling of the estimate separates magnitudes that tie at it (a constant or
      // quantized gradient): a count still outside [low·k, high·k] takes the exact top-k
      // instead, ties in index order, as TopkA selects.
      const auto count = static_cast<double>(selected);
      const bool exact = k > 0 && k < this->n_ &&
                         (count < options.gaussian_low * static_cast<double>(k) ||
                          count > options.gaussian_high * static_cast<double>(k));
      if (exact) {
        threshold = this->topk_threshold(exec, acc, k);
        selected = this->select_top_k_into(exec, acc, threshold, k, indices_, values_);
      }
      stats.local_threshold = threshold;
      stats.local_threshold_exact = exact;
    }
    stats.local_selected = selected;
    stats.global_threshold = -std::numeric_limits<float>::infinity();
    return selected;
  }

  /// What the others received leaves the residual; a narrower wire's rounding error stays.
  void clear_sent(const ExecSpace& exec, const real_vector_type& acc, std::int64_t selected) {
    auto timer = this->phase(exec, "residual");
    keep_wire_error_at(exec, acc, indices_, selected, wire_);
  }

  /// The type the values travel in (value_wire()).
  const Wire wire_ = value_wire<Value>(this->options_);
  typename Base::index_vector_type indices_{"oktopk::GaussianK::indices", 0};
  real_vector_type values_{"oktopk::GaussianK::values", 0};
  SparseGather<ExecSpace, Real> gather_;
  ShardExchange<ExecSpace, Real> shards_;
};

}  // namespace oktopk::impl

// Compiled once, in liboktopk (src/instantiate/).
OKTOPK_IMPL_DECLARE_INSTANTIATIONS(oktopk::impl::GaussianK)
