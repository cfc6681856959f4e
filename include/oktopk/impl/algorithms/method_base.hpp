// SPDX-License-Identifier: BSD-3-Clause
// What every method shares to implement SparseAllreduce: one call's sequence (accumulate pass,
// warm-up, the method's step, error feedback, rejections) inside the protocol of CallDriver,
// and the toolkit the methods' steps use (timed phases, dense averages, selections, exact
// top-k thresholds, and what the accumulate pass counted).
#pragma once

#include <oktopk/error.hpp>
#include <oktopk/layout.hpp>
#include <oktopk/select.hpp>
#include <oktopk/sparse_allreduce.hpp>
#include <oktopk/topk.hpp>
#include <oktopk/impl/base/explicit_instantiation.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/collectives/ring_allreduce.hpp>
#include <oktopk/impl/collectives/wire_values.hpp>
#include <oktopk/impl/comm/failure.hpp>
#include <oktopk/impl/comm/fault_injection.hpp>
#include <oktopk/impl/comm/mpi_mirror.hpp>
#include <oktopk/impl/handle/call_checks.hpp>
#include <oktopk/impl/handle/call_driver.hpp>
#include <oktopk/impl/handle/segment_counts.hpp>
#include <oktopk/impl/handle/shard_offsets.hpp>
#include <oktopk/impl/handle/sparse_allreduce_members.hpp>
#include <oktopk/impl/kernels/accumulate_pass.hpp>
#include <oktopk/impl/kernels/candidates.hpp>
#include <oktopk/impl/kernels/count_levels.hpp>
#include <oktopk/impl/kernels/vector_ops.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace oktopk::impl {

/// \brief The base of every method: reduce_now for all of them, over the hooks a method
/// overrides (reduce_step at least), and the tools its step uses.
template <class ExecSpace, class Value>
class MethodBase : public HandleCore<ExecSpace, Value> {
  using Base = HandleCore<ExecSpace, Value>;

 public:
  using typename Base::arithmetic_type;
  using typename Base::const_vector_type;
  using typename Base::index_vector_type;
  using typename Base::memory_space;
  using typename Base::sparse_result_type;
  using typename Base::vector_type;
  /// acc, the residual and the methods' value buffers: arithmetic_type, whatever the gradient's.
  using real_vector_type = typename Base::residual_vector_type;

 protected:
  /// Allocates the handle's buffers on `exec` and fences it.
  MethodBase(const ExecSpace& exec, Algorithm algorithm, const Communicator& comm, std::int64_t n,
             const Options& options, const Layout& layout)
      : Base(exec, algorithm, comm, n, options, layout),
        kth_workspace_(exec),
        acc_(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::SparseAllreduce::acc"),
             static_cast<std::size_t>(n)) {
    fence(exec, "oktopk::MethodBase: buffers ready");
  }

  void reduce_now(const ExecSpace& exec, const const_vector_type& grad, const vector_type& out,
                  sparse_result_type* sparse) final {
    run_call(exec, grad, out, sparse, nullptr);
  }

  void reduce_scatter_now(const ExecSpace& exec, const const_vector_type& grad,
                          const vector_type& shard,
                          const std::vector<std::int64_t>& shard_offsets) final {
    const ShardTarget target{shard, shard_offsets};
    run_call(exec, grad, vector_type(), nullptr, &target);
  }

  /// A reduce_scatter call's output: this rank's shard, and every rank's shard boundaries.
  struct ShardTarget {
    vector_type shard;
    const std::vector<std::int64_t>& offsets;
  };

  /// Why the method has no reduce_scatter (nullptr: it has one, reduce_step_scatter, or for
  /// the Dense method the driver's dense reduce-scatter). The same on every rank of a handle.
  virtual const char* reduce_scatter_refusal() const = 0;

  /// reduce_step for reduce_scatter, for a method whose reduce_scatter_refusal() is nullptr:
  /// `target.shard` receives this rank's shard of what reduce_step would write into `out`, and
  /// acc what reduce_step would leave in it.
  virtual void reduce_step_scatter(const ExecSpace& exec, const real_vector_type& acc,
                                   const ShardTarget& target) {
    (void)exec, (void)acc, (void)target;
    OKTOPK_ASSERT(false && "reduce_scatter_refusal() refuses this method's reduce_scatter");
  }

  /// The method's body, for calls after the warm-up. `acc` holds residual + grad; on return
  /// `out` holds the averaged result and `acc` what stays in the residual (the method clears
  /// the entries it communicated). `stats_` is reset before the call, except `phases`,
  /// which reduce_now fills from phase() scopes and the communicator.
  virtual void reduce_step(const ExecSpace& exec, const real_vector_type& acc,
                           const vector_type& out) = 0;

  /// reduce_step with the result in sparse form (reduce_sparse): `result` receives the entries
  /// reduce_step would have written into `out`. The default runs reduce_step into a scratch
  /// vector of n and compacts its non-zeros, one more pass over n; a method whose result is
  /// sparse before it is dense overrides it and skips the dense output altogether.
  virtual void reduce_step_sparse(const ExecSpace& exec, const real_vector_type& acc,
                                  sparse_result_type& result);

  /// Whether the method keeps a residual (error feedback): without one, the residual stays
  /// zero and acc is a copy of the gradient.
  virtual bool uses_error_feedback() const { return true; }

  /// Thresholds the method wants the call's accumulate pass to count |acc| above, for free
  /// (the pass reads acc anyway): accumulated_ then knows them. None (the default): nothing
  /// counted. Asked before the call counter moves, so the
  /// call it is for is iteration_ + 1.
  virtual impl::CountLevels accumulate_count_levels() const { return {}; }

  /// How many values this rank sent in this call's step that rounded to Inf on a wire narrower
  /// than the arithmetic type (value_wire()): beyond float16's 65504, say (S2: the entries of
  /// the table chunk this rank finished on the ring that are not finite). The driver then
  /// rejects the call on every rank.
  virtual std::int64_t wire_overflows() const { return 0; }

  /// Whether every call is a dense average of the gradient as it is (the Dense method): the
  /// driver then reduces `grad` straight into `out`, without reduce_step and without a copy,
  /// and checks the average for NaN and Inf instead of the input, passes fewer.
  virtual bool averages_gradient_as_is() const { return false; }

  /// A timed phase of the call (CallDriver::Phase): its traffic and time are counted to `name`
  /// in stats_, and a failure inside it names it.
  typename CallDriver<ExecSpace>::Phase phase(const ExecSpace& exec, const char* name) {
    return driver_.phase(exec, name);
  }

  /// Dense allreduce of `in` (SUM) into `out`, then out /= P, by options_.dense_allreduce
  /// (on the ring whatever it says for a narrowing wire: see dense_on_ring()). `in` and `out` may
  /// be the same. With `count_nonfinite`, returns how many averages this rank found not finite:
  /// all of them with MPI_Allreduce, those of the chunk it finished with the ring (0
  /// otherwise: warm-up calls do not wait for a count they do not use).
  template <class In, class Out>
  std::int64_t dense_average(const ExecSpace& exec, const In& in, const Out& out,
                             bool count_nonfinite);

  /// OkTopk's ring on the wire's type (ring_average): with `shards`, its reduce-scatter into
  /// out[shard of this rank] (the rest of out is scratch), else its allreduce into all of out.
  /// Returns how many averages of the chunk this rank finished are not finite.
  template <class In, class Out>
  std::int64_t ring_step(const ExecSpace& exec, const In& in, const Out& out,
                         const std::vector<std::int64_t>* shards);

  /// The dense reduce_scatter of the Dense method: target.shard = this rank's shard of the sum
  /// over ranks of `grad`, / P: the ring's reduce-scatter where reduce() runs on the ring (then
  /// with equal shards the same bits as reduce()'s output there), else one MPI_Reduce_scatter.
  /// Returns how many of the shard's averages are not finite.
  std::int64_t dense_reduce_scatter(const ExecSpace& exec, const const_vector_type& grad,
                                    const ShardTarget& target);

  /// A whole dense call (warm-up calls, and the Dense method): dense_average plus its stats.
  template <class In, class Out>
  std::int64_t dense_step(const ExecSpace& exec, const In& in, const Out& out,
                          bool count_nonfinite);

  /// Stream-compacts {i : |x(i)| > threshold} into (indices, values), growing them if needed;
  /// returns the count. `known`: what the accumulate pass knows of x = acc at the threshold
  /// (accumulated_.known_above()), so that fewer passes read x. X and Values: Views of the
  /// arithmetic type, or of the gradient type (a dense output compacted into a SparseResult).
  template <class X, class Values>
  std::int64_t select_into(
      const ExecSpace& exec, const X& x, float threshold, index_vector_type& indices,
      Values& values,
      const impl::KnownAbove<ExecSpace, typename X::non_const_value_type>& known = {});

  /// select_into() that also takes the first `ties` entries with |x| == threshold
  /// (select_above_and_ties()), growing the buffers if needed; returns the count.
  template <class X, class Values>
  std::int64_t select_with_ties_into(const ExecSpace& exec, const X& x, float threshold,
                                     std::int64_t ties, index_vector_type& indices, Values& values);

  /// The k largest |x| into (indices, values), ascending, given the (k+1)-th largest as
  /// `threshold` (topk_threshold()): the entries above it, then, where fewer than k are and
  /// the threshold is above 0, the first of those equal to it in index order. Returns the count.
  template <class Values>
  std::int64_t select_top_k_into(const ExecSpace& exec, const real_vector_type& x, float threshold,
                                 std::int64_t k, index_vector_type& indices, Values& values);

  /// Collective, after a top-k method's step: where no rank selected anything (global_selected
  /// is 0 on every rank) although k > 0, sets stats_.selected_nothing if some rank's acc held a
  /// non-zero entry. One count and one allreduce, on such calls only.
  void report_empty_selection(const ExecSpace& exec) {
    const Algorithm a = this->algorithm_;
    const bool top_k = a == Algorithm::TopkA || a == Algorithm::TopkDSA ||
                       a == Algorithm::GaussianK || a == Algorithm::OkTopk || a == Algorithm::GTopk;
    if (!top_k || this->k_ == 0 || this->stats_.global_selected != 0) return;
    auto timer = phase(exec, "check");
    // Nothing was sent, so acc_ still holds every entry of the call's input.
    std::int64_t nonzero = count_above(exec, acc_, 0.0f);
    this->comm_.allreduce_in_place(&nonzero, 1, MPI_MAX);
    this->stats_.selected_nothing = nonzero > 0;
  }

  /// A phase factory for the shared collectives: timed(name) opens phase(exec, name).
  auto timed(const ExecSpace& exec) {
    return [this, exec](const char* name) { return phase(exec, name); };
  }

  /// Where a method sums an average before it divides: `out` itself when the gradient type is
  /// the arithmetic type, else a scratch vector of n arithmetic values (allocated at its first
  /// use), so that a 16-bit output is rounded once, from the finished average.
  auto sums_for(const ExecSpace& exec, const vector_type& out) {
    if constexpr (std::is_same_v<Value, arithmetic_type>) {
      return out;
    } else {
      if (sums_scratch_.extent(0) == 0) {
        sums_scratch_ = real_vector_type(
            Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::SparseAllreduce::sums"),
            static_cast<std::size_t>(this->n_));
      }
      return sums_scratch_;
    }
  }

  /// result = the non-zeros of x (|x(i)| > 0), growing its Views if needed.
  template <class X>
  void compact_nonzeros(const ExecSpace& exec, const X& x, sparse_result_type& result);

  /// Grows result's Views to hold `size` entries (contents are not kept) and sets its size.
  static void size_result(const ExecSpace& exec, sparse_result_type& result, std::int64_t size);

  /// The k-th largest |x| threshold for "exactly the k largest": selecting |x| > result keeps
  /// k entries when magnitudes are distinct (-Inf when k >= n keeps all, +Inf when k == 0).
  float topk_threshold(const ExecSpace& exec, const real_vector_type& x, std::int64_t k);

  /// What this call's accumulate pass counted of acc_, for the method's selections.
  AccumulatePass<ExecSpace, Value> accumulated_;
  KthLargestWorkspace<ExecSpace> kth_workspace_;

 private:
  /// One call of reduce(), reduce_sparse() (`sparse` not null) or reduce_scatter() (`scatter`
  /// not null; `out` is then empty).
  void run_call(const ExecSpace& exec, const const_vector_type& grad, const vector_type& out,
                sparse_result_type* sparse, const ShardTarget* scatter);

  /// The dense output of n values that reduce_step_sparse's default compacts, and that
  /// reduce_scatter's warm-up calls copy their shard from (allocated at its first use).
  const vector_type& dense_scratch(const ExecSpace& exec) {
    if (sparse_scratch_.extent(0) == 0) {
      sparse_scratch_ = vector_type(
          Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::SparseAllreduce::scratch"),
          static_cast<std::size_t>(this->n_));
    }
    return sparse_scratch_;
  }

  real_vector_type acc_;
  /// dense_scratch().
  vector_type sparse_scratch_;
  /// sums_for()'s scratch, for 16-bit gradients.
  real_vector_type sums_scratch_;
  RingBuffers<arithmetic_type, memory_space> ring_native_;
  RingBuffers<bfloat16, memory_space> ring_bfloat16_;
  RingBuffers<float16, memory_space> ring_float16_;
  RingBuffers<float, memory_space> ring_float_;  // double gradients on a float wire
  CallDriver<ExecSpace> driver_{this->comm_, this->algorithm_, this->stats_};
};

template <class ExecSpace, class Value>
void MethodBase<ExecSpace, Value>::run_call(const ExecSpace& exec, const const_vector_type& grad,
                                            const vector_type& out, sparse_result_type* sparse,
                                            const ShardTarget* scatter) {
  const CallKind kind = scatter != nullptr  ? CallKind::ReduceScatter
                        : sparse != nullptr ? CallKind::ReduceSparse
                                            : CallKind::Reduce;
  const char* const where = scatter != nullptr  ? "oktopk::SparseAllreduce::reduce_scatter"
                            : sparse != nullptr ? "oktopk::SparseAllreduce::reduce_sparse"
                                                : "oktopk::SparseAllreduce::reduce";
  ScopedRegion region(where);
  const ReduceStats previous_stats = this->stats_;  // restored if the call is rejected
  accumulated_.forget();
  this->comm_.reset_traffic();
  this->stats_ = ReduceStats{};
  this->stats_.k = this->k_;

  // Local problems become collective ones: every rank learns of any rank's bad input, so all
  // throw together instead of some waiting forever in the next collective. Anything else that
  // fails on some ranks only ends the job (CallDriver::run_or_abort): see docs/reference.md,
  // "Failures".
  const int me = this->comm_.rank();
  const std::string offsets_problem =
      scatter != nullptr ? shard_offsets_problem(scatter->offsets, this->n_, this->comm_.size())
                         : std::string();
  const std::int64_t shard_length = scatter != nullptr && offsets_problem.empty()
                                        ? scatter->offsets[static_cast<std::size_t>(me) + 1] -
                                              scatter->offsets[static_cast<std::size_t>(me)]
                                        : 0;
  const bool length_ok =
      static_cast<std::int64_t>(grad.extent(0)) == this->n_ &&
      (scatter != nullptr
           ? offsets_problem.empty() &&
                 static_cast<std::int64_t>(scatter->shard.extent(0)) == shard_length
           : sparse != nullptr || static_cast<std::int64_t>(out.extent(0)) == this->n_);
  // A refused reduce_scatter still agrees first: ranks that make another call here must fail
  // too, not wait. The refusal is the same on every rank of the handle.
  const char* const refusal = scatter != nullptr ? reduce_scatter_refusal() : nullptr;
  std::int64_t nonfinite = 0;
  CallAgreement agreed(length_ok, me, this->serial_, kind,
                       scatter != nullptr ? shard_digest(scatter->offsets) : 0);
  const std::int64_t call = this->iteration_ + 1;
  // The call's input (residual + gradient) goes into acc_, checked on the way, unless the
  // method averages the gradient as it is: then the average is checked instead (below).
  const bool as_is = averages_gradient_as_is();
  driver_.run_or_abort(call, [&] {
    if (length_ok && !as_is && refusal == nullptr) {
      auto timer = phase(exec, "accumulate");
      if (uses_error_feedback()) {
        nonfinite = accumulated_.run(exec, this->residual_, grad, acc_, accumulate_count_levels(),
                                     this->k_);
      } else {
        nonfinite = copy_counting_nonfinite(exec, grad, acc_);
      }
    }
    agreed.values[1] = nonfinite == 0 ? 0 : this->comm_.rank() + 1;
    driver_.agree(exec, "check", agreed);
  });
  if (!agreed.accepted() || refusal != nullptr) this->stats_ = previous_stats;
  require_agreed_call(where, agreed, me, this->serial_, this->algorithm_, this->n_, kind,
                      grad.extent(0), scatter != nullptr ? scatter->shard.extent(0) : out.extent(0),
                      shard_length, offsets_problem);
  OKTOPK_REQUIRE(refusal == nullptr, std::invalid_argument, where,
                 "method " << this->algorithm_ << " has no reduce-scatter: " << refusal);
  OKTOPK_REQUIRE(agreed.nonfinite_rank() < 0, std::invalid_argument, where,
                 "the gradient (plus residual) holds NaN or Inf"
                     << (is_half_v<Value> ? std::string(", or values that round to Inf as ") +
                                                ValueTraits<Value>::name
                                          : std::string())
                     << " on rank " << agreed.nonfinite_rank()
                     << (this->comm_.rank() == agreed.nonfinite_rank()
                             ? " (" + std::to_string(nonfinite) + " entries)"
                             : std::string()));

  // Non-finite averages of an as-is call, counted over all ranks: NaN or Inf in some rank's
  // gradient, or a sum that overflows. The same on every rank, so all throw below.
  std::int64_t nonfinite_averages = 0;
  // {rank + 1 of a rank whose values overflowed the sparse wire, how many there}, by MPI_MAX.
  std::int64_t wire_overflow[2] = {0, 0};
  driver_.run_or_abort(call, [&] {
    ++this->iteration_;
    this->stats_.iteration = this->iteration_;
    this->stats_.reduce_scatter = scatter != nullptr;
    if (as_is && scatter != nullptr) {
      nonfinite_averages = dense_reduce_scatter(exec, grad, *scatter);
      auto timer = phase(exec, "check");
      // Each rank counted its own shard.
      this->comm_.allreduce_in_place(&nonfinite_averages, 1, MPI_SUM);
    } else if (as_is) {
      // A sparse call averages into acc_, which an as-is method does not otherwise use.
      nonfinite_averages = sparse != nullptr ? dense_step(exec, grad, acc_, true)
                                             : dense_step(exec, grad, out, true);
      auto timer = phase(exec, "check");
      // MPI_Allreduce leaves every rank the whole average, the ring each rank its own chunk.
      this->comm_.allreduce_in_place(
          &nonfinite_averages, 1,
          dense_on_ring<Value, ExecSpace>(this->options_, this->n_, this->comm_.size()) ? MPI_SUM
                                                                                        : MPI_MAX);
      if (sparse != nullptr && nonfinite_averages == 0) {
        auto output = phase(exec, "output");
        compact_nonzeros(exec, acc_, *sparse);
      }
    } else if (this->iteration_ <= this->options_.warmup_iterations) {
      // Inputs are finite, but a narrow wire's partial sums can still overflow: count them
      // then, as the Dense method does, so that every rank rejects the call.
      const bool narrow = value_wire<Value>(this->options_) != Wire::Native;
      // In place for a sparse result: the next call's accumulate pass overwrites acc_ anyway.
      // A reduce_scatter averages the whole vector as reduce() does, for the same bits, and
      // copies its shard out.
      nonfinite_averages = sparse != nullptr ? dense_step(exec, acc_, acc_, narrow)
                           : scatter != nullptr
                               ? dense_step(exec, acc_, dense_scratch(exec), narrow)
                               : dense_step(exec, acc_, out, narrow);
      if (narrow) {
        auto timer = phase(exec, "check");
        this->comm_.allreduce_in_place(&nonfinite_averages, 1, MPI_SUM);
      }
      if (nonfinite_averages == 0) {
        if (sparse != nullptr) compact_nonzeros(exec, acc_, *sparse);
        if (scatter != nullptr) {
          auto output = phase(exec, "output");
          const auto begin = scatter->offsets[static_cast<std::size_t>(me)];
          Kokkos::deep_copy(
              exec, scatter->shard,
              Kokkos::subview(sparse_scratch_, Kokkos::make_pair(begin, begin + shard_length)));
        }
        Kokkos::deep_copy(exec, this->residual_, arithmetic_type(0));
      }
    } else {
      if (sparse != nullptr) {
        reduce_step_sparse(exec, acc_, *sparse);
      } else if (scatter != nullptr) {
        reduce_step_scatter(exec, acc_, *scatter);
      } else {
        reduce_step(exec, acc_, out);
      }
      report_empty_selection(exec);
      if (value_wire<Value>(this->options_) != Wire::Native) {
        auto timer = phase(exec, "check");
        const std::int64_t mine = wire_overflows();
        wire_overflow[0] = mine > 0 ? this->comm_.rank() + 1 : 0;
        wire_overflow[1] = mine;
        this->comm_.allreduce_in_place(wire_overflow, 2, MPI_MAX);
      }
      // A rejected call leaves the residual as it was (acc_ is scratch).
      if (uses_error_feedback() && wire_overflow[0] == 0) std::swap(this->residual_, acc_);
    }
    for (const auto& [name, traffic] : this->comm_.traffic())
      this->stats_.phases[name].traffic = traffic;
    if (!this->layout_.empty() && scatter == nullptr) {
      this->stats_.segments = sparse != nullptr
                                  ? segment_entries(exec, this->layout_, this->n_, *sparse)
                                  : segment_nonzeros(exec, this->layout_, out);
    }
  });
  if (nonfinite_averages != 0) {
    // Rejected, as a non-finite input is: the handle stays as it was. Which rank's gradient is
    // to blame takes one more pass and allreduce, on this error path only.
    --this->iteration_;
    this->stats_ = previous_stats;
    std::int64_t bad_input = 0;
    driver_.run_or_abort(call, [&] {
      nonfinite = count_nonfinite(exec, grad);
      bad_input = nonfinite == 0 ? 0 : this->comm_.rank() + 1;
      this->comm_.allreduce_in_place(&bad_input, 1, MPI_MAX);
    });
    OKTOPK_REQUIRE(
        bad_input == 0, std::invalid_argument, where,
        "the gradient holds NaN or Inf on rank "
            << bad_input - 1
            << (this->comm_.rank() + 1 == bad_input ? " (" + std::to_string(nonfinite) + " entries)"
                                                    : std::string()));
    OKTOPK_REQUIRE(false, std::invalid_argument, where,
                   "the sum over ranks overflows to Inf at "
                       << nonfinite_averages << " entries (every gradient is finite"
                       << (value_wire<Value>(this->options_) == Wire::Float16
                               ? "; with float16 on the wire, every value and partial sum sent "
                                 "must stay within float16's 65504"
                           : value_wire<Value>(this->options_) == Wire::Float32
                               ? "; with float32 on the wire, every value and partial sum sent "
                                 "must stay within float's 3.4e38"
                               : "")
                       << ")");
  }
  if (wire_overflow[0] != 0) {
    --this->iteration_;
    this->stats_ = previous_stats;
    const Wire sent = value_wire<Value>(this->options_);
    OKTOPK_REQUIRE(false, std::invalid_argument, where,
                   "values sent as "
                       << sent << " round to Inf beyond "
                       << (sent == Wire::Float16   ? "float16's 65504"
                           : sent == Wire::Float32 ? "float's 3.4e38"
                                                   : "bfloat16's 3.39e38")
                       << " on rank " << wire_overflow[0] - 1 << " (up to " << wire_overflow[1]
                       << " on one rank): scale the gradient "
                       << (is_half_v<Value>        ? "down"
                           : sent == Wire::Float16 ? "down, or send wire=bf16 or native"
                                                   : "down, or send wire=native")
                       << "; the call was rejected and the residual is as it was");
  }
  this->last_out_ = out;
  this->last_sparse_ = sparse != nullptr ? *sparse : sparse_result_type();
  this->last_was_sparse_ = sparse != nullptr;
}

template <class ExecSpace, class Value>
void MethodBase<ExecSpace, Value>::reduce_step_sparse(const ExecSpace& exec,
                                                      const real_vector_type& acc,
                                                      sparse_result_type& result) {
  reduce_step(exec, acc, dense_scratch(exec));
  auto timer = phase(exec, "output");
  compact_nonzeros(exec, sparse_scratch_, result);
}

template <class ExecSpace, class Value>
template <class X>
void MethodBase<ExecSpace, Value>::compact_nonzeros(const ExecSpace& exec, const X& x,
                                                    sparse_result_type& result) {
  // A first guess from the stats, so that most calls compact once.
  size_result(exec, result,
              std::max<std::int64_t>(static_cast<std::int64_t>(result.indices.extent(0)),
                                     std::min(this->stats_.global_selected, this->n_)));
  result.size = select_into(exec, x, 0.0f, result.indices, result.values);
}

template <class ExecSpace, class Value>
void MethodBase<ExecSpace, Value>::size_result(const ExecSpace& exec, sparse_result_type& result,
                                               std::int64_t size) {
  // Views the caller left empty get the library's labels, which ensure_capacity keeps.
  if (result.indices.extent(0) == 0)
    result.indices = index_vector_type("oktopk::SparseResult::indices", 0);
  if (result.values.extent(0) == 0) result.values = vector_type("oktopk::SparseResult::values", 0);
  ensure_capacity(exec, result.indices, size);
  ensure_capacity(exec, result.values, size);
  result.size = size;
}

template <class ExecSpace, class Value>
template <class In, class Out>
std::int64_t MethodBase<ExecSpace, Value>::dense_average(const ExecSpace& exec, const In& in,
                                                         const Out& out, bool count_nonfinite) {
  if (dense_on_ring<Value, ExecSpace>(this->options_, this->n_, this->comm_.size())) {
    // The ring's count rides on a pass it makes anyway.
    const std::int64_t nonfinite = ring_step(exec, in, out, nullptr);
    return count_nonfinite ? nonfinite : 0;
  }
  if constexpr (is_half_v<Value>) {
    assert(false && "a 16-bit gradient's dense allreduce runs on the ring");
    return 0;
  } else {
    if (in.data() == out.data()) {
      mpi_allreduce_in_place(exec, this->comm_, out, MPI_SUM);
    } else {
      // Out of place: MPI reads `in` where it lies, no copy into `out` first.
      const auto length = static_cast<std::int64_t>(out.extent(0));
      const auto send = mpi_send_view(exec, in);
      auto receive = mpi_receive_view(exec, out);
      this->comm_.allreduce(send.data(), receive.data(), length, MPI_SUM);
      mpi_received(exec, receive, out, 0, length);
    }
    const auto P = static_cast<float>(this->comm_.size());
    if (count_nonfinite) return divide_counting_nonfinite(exec, out, out, P);
    divide(exec, out, out, P);
    return 0;
  }
}

template <class ExecSpace, class Value>
template <class In, class Out>
std::int64_t MethodBase<ExecSpace, Value>::ring_step(const ExecSpace& exec, const In& in,
                                                     const Out& out,
                                                     const std::vector<std::int64_t>* shards) {
  // A 16-bit wire carries float and 16-bit gradients only, whose arithmetic is float, and
  // a float wire narrows double gradients only (make_sparse_allreduce refuses the others).
  constexpr bool float_values = std::is_same_v<arithmetic_type, float>;
  const Wire wire = value_wire<Value>(this->options_);
  const auto run = [&](auto& buffers) {
    return shards != nullptr
               ? ring_reduce_scatter_average(exec, this->comm_, in, out, buffers, *shards)
               : ring_allreduce_average(exec, this->comm_, in, out, buffers);
  };
  if (float_values && wire == Wire::BFloat16) {
    if constexpr (float_values) return run(ring_bfloat16_);
  } else if (float_values && wire == Wire::Float16) {
    if constexpr (float_values) return run(ring_float16_);
  } else if (!float_values && wire == Wire::Float32) {
    if constexpr (!float_values) return run(ring_float_);
  } else if constexpr (!is_half_v<Value>) {
    return run(ring_native_);
  }
  return 0;
}

template <class ExecSpace, class Value>
std::int64_t MethodBase<ExecSpace, Value>::dense_reduce_scatter(const ExecSpace& exec,
                                                                const const_vector_type& grad,
                                                                const ShardTarget& target) {
  this->stats_.dense = true;
  this->stats_.local_threshold = this->stats_.global_threshold =
      -std::numeric_limits<float>::infinity();
  this->stats_.local_selected = this->stats_.global_selected = this->n_;
  auto timer = phase(exec, "dense_reduce_scatter");
  if (dense_on_ring<Value, ExecSpace>(this->options_, this->n_, this->comm_.size())) {
    // The ring's reduce-scatter leaves this rank's shard in the scratch, and partial sums of
    // other shards around it.
    const auto& scratch = dense_scratch(exec);
    const std::int64_t nonfinite = ring_step(exec, grad, scratch, &target.offsets);
    const auto begin = target.offsets[static_cast<std::size_t>(this->comm_.rank())];
    const auto length = static_cast<std::int64_t>(target.shard.extent(0));
    Kokkos::deep_copy(exec, target.shard,
                      Kokkos::subview(scratch, Kokkos::make_pair(begin, begin + length)));
    return nonfinite;
  }
  if constexpr (is_half_v<Value>) {
    OKTOPK_ASSERT(false && "a 16-bit gradient's dense reduce-scatter runs on the ring");
    return 0;
  } else {
    const int P = this->comm_.size();
    std::vector<int> counts(static_cast<std::size_t>(P));
    for (int r = 0; r < P; ++r) {
      const std::int64_t count = target.offsets[static_cast<std::size_t>(r) + 1] -
                                 target.offsets[static_cast<std::size_t>(r)];
      OKTOPK_REQUIRE(
          count <= std::numeric_limits<int>::max(), std::runtime_error,
          "oktopk::SparseAllreduce::reduce_scatter",
          "shard " << r << " holds " << count << " entries, more than one MPI call can address");
      counts[static_cast<std::size_t>(r)] = static_cast<int>(count);
    }
    const auto send = mpi_send_view(exec, grad);
    auto receive = mpi_receive_view(exec, target.shard);
    this->comm_.reduce_scatter(send.data(), receive.data(), counts.data(), MPI_SUM);
    const auto length = static_cast<std::int64_t>(target.shard.extent(0));
    mpi_received(exec, receive, target.shard, 0, length);
    return divide_counting_nonfinite(exec, target.shard, target.shard, static_cast<float>(P));
  }
}

template <class ExecSpace, class Value>
template <class In, class Out>
std::int64_t MethodBase<ExecSpace, Value>::dense_step(const ExecSpace& exec, const In& in,
                                                      const Out& out, bool count_nonfinite) {
  this->stats_.dense = true;
  this->stats_.local_threshold = this->stats_.global_threshold =
      -std::numeric_limits<float>::infinity();
  this->stats_.local_selected = this->stats_.global_selected = this->n_;
  auto timer = phase(exec, "dense_allreduce");
  return dense_average(exec, in, out, count_nonfinite);
}

template <class ExecSpace, class Value>
template <class X, class Values>
std::int64_t MethodBase<ExecSpace, Value>::select_into(
    const ExecSpace& exec, const X& x, float threshold, index_vector_type& indices, Values& values,
    const KnownAbove<ExecSpace, typename X::non_const_value_type>& known) {
  std::int64_t count = select_known(exec, known, x, threshold, indices, values);
  if (count > static_cast<std::int64_t>(std::min(indices.extent(0), values.extent(0)))) {
    ensure_capacity(exec, indices, count);
    ensure_capacity(exec, values, count);
    count = select_known(exec, known, x, threshold, indices, values);
  }
  return count;
}

template <class ExecSpace, class Value>
template <class X, class Values>
std::int64_t MethodBase<ExecSpace, Value>::select_with_ties_into(const ExecSpace& exec, const X& x,
                                                                 float threshold, std::int64_t ties,
                                                                 index_vector_type& indices,
                                                                 Values& values) {
  std::int64_t count = select_above_and_ties(exec, x, threshold, ties, indices, values);
  if (count > static_cast<std::int64_t>(std::min(indices.extent(0), values.extent(0)))) {
    ensure_capacity(exec, indices, count);
    ensure_capacity(exec, values, count);
    count = select_above_and_ties(exec, x, threshold, ties, indices, values);
  }
  return count;
}

template <class ExecSpace, class Value>
template <class Values>
std::int64_t MethodBase<ExecSpace, Value>::select_top_k_into(const ExecSpace& exec,
                                                             const real_vector_type& x,
                                                             float threshold, std::int64_t k,
                                                             index_vector_type& indices,
                                                             Values& values) {
  const std::int64_t above = select_into(exec, x, threshold, indices, values);
  if (above >= k || !(threshold > 0.0f) || !std::isfinite(threshold)) return above;
  return select_with_ties_into(exec, x, threshold, k - above, indices, values);
}

template <class ExecSpace, class Value>
float MethodBase<ExecSpace, Value>::topk_threshold(const ExecSpace& exec, const real_vector_type& x,
                                                   std::int64_t k) {
  const auto n = static_cast<std::int64_t>(x.extent(0));
  if (k <= 0) return std::numeric_limits<float>::infinity();
  if (k >= n) return -std::numeric_limits<float>::infinity();
  return kth_largest_abs(exec, x, k + 1, kth_workspace_);
}

}  // namespace oktopk::impl

// Compiled once, in liboktopk (src/instantiate/).
OKTOPK_IMPL_DECLARE_INSTANTIATIONS(oktopk::impl::MethodBase)
