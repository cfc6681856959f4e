// SPDX-License-Identifier: BSD-3-Clause
// The interface every method implements: a persistent handle that turns each rank's dense
// gradient into the same averaged, sparsified gradient on every rank. The bodies are in
// impl/handle/sparse_allreduce_members.hpp; what the methods share to implement it is
// impl::MethodBase (impl/algorithms/method_base.hpp).
#pragma once

#include <oktopk/algorithm.hpp>
#include <oktopk/communicator.hpp>
#include <oktopk/fwd.hpp>
#include <oktopk/layout.hpp>
#include <oktopk/node_topology.hpp>
#include <oktopk/options.hpp>
#include <oktopk/progress.hpp>
#include <oktopk/stats.hpp>
#include <oktopk/impl/base/explicit_instantiation.hpp>
#include <oktopk/impl/base/value_traits.hpp>
#include <oktopk/impl/handle/state_io.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <functional>
#include <istream>
#include <ostream>

namespace oktopk {

namespace impl {
template <class ExecSpace, class Value>
struct HandleCreation;
template <class ExecSpace, class Value>
class HierarchicalAllreduce;
}  // namespace impl

/// \brief A call's result in sparse form: `size` entries, indices ascending and distinct, values
/// averaged (equal to the dense output at those indices, which is zero at every other index),
/// of the handle's gradient type. The Views may hold more than `size` entries: calls that fill
/// a SparseResult grow them when needed and reuse them otherwise, so one SparseResult serves a
/// whole training run.
template <class MemorySpace, class Value = value_type>
struct SparseResult {
  Kokkos::View<index_type*, MemorySpace> indices;
  Kokkos::View<Value*, MemorySpace> values;
  std::int64_t size = 0;
};

/// \brief A sparse allreduce handle for gradients of length n and type Value (float, double,
/// bfloat16 or float16; made by make_sparse_allreduce).
///
/// Owns the residual (error feedback), thresholds, region boundaries and reusable buffers, so
/// one handle serves every iteration of a training run. Sums, averages and the residual are
/// computed in arithmetic_type (Value itself for float and double); selections compare
/// magnitudes rounded to float (docs/reference.md, "Gradient types"). Not copyable; not
/// thread-safe.
template <class ExecSpace, class Value = value_type>
class SparseAllreduce {
  static_assert(
      impl::is_gradient_value_v<Value>,
      "oktopk::SparseAllreduce: the gradient type must be float, double, oktopk::bfloat16 or "
      "oktopk::float16");

 public:
  using execution_space = ExecSpace;
  using memory_space = typename ExecSpace::memory_space;
  /// The gradient's and the output's type.
  using gradient_type = Value;
  /// The type of sums, averages and the residual.
  using arithmetic_type = impl::arithmetic_t<Value>;
  using vector_type = Kokkos::View<Value*, memory_space>;
  using const_vector_type = Kokkos::View<const Value*, memory_space>;
  using residual_vector_type = Kokkos::View<arithmetic_type*, memory_space>;
  using const_residual_vector_type = Kokkos::View<const arithmetic_type*, memory_space>;
  using index_vector_type = Kokkos::View<index_type*, memory_space>;
  using sparse_result_type = SparseResult<memory_space, Value>;

  SparseAllreduce(const SparseAllreduce&) = delete;
  SparseAllreduce& operator=(const SparseAllreduce&) = delete;
  virtual ~SparseAllreduce() = default;

  /// \brief Collective. Writes into `out` the average over ranks of the sparsified gradients
  /// (mostly zeros), bit-identical on every rank; `grad` is not modified. Every rank throws the
  /// same std::invalid_argument if any rank passes Views whose length is not size(), if some
  /// ranks call reduce_sparse where the others call reduce, if any
  /// rank's gradient (plus residual) holds NaN or Inf, or (method dense, which checks the
  /// average rather than its input) if the sum over ranks overflows; the handle is then
  /// unchanged (`out` is not: it may hold a copy of the gradient or the average). Any other
  /// failure (an allocation, an MPI error, a broken invariant) may happen on some ranks only,
  /// while the others wait inside MPI: the failing rank then prints
  /// "oktopk: rank R: <cause> in phase <phase> of <method> call <t>" to stderr and ends the job
  /// with MPI_Abort (docs/reference.md, "Failures").
  ///
  /// A wait on reduce_async: it runs after every call launched before it in this process.
  void reduce(const ExecSpace& exec, const const_vector_type& grad, const vector_type& out);

  /// \brief Collective. Launches reduce(exec, grad, out) and returns at once. Calls run one at
  /// a time in launch order (over every handle of this process): on OkTopk's progress thread
  /// while the caller goes on, when one runs (initialize_kokkos_on_progress_thread), or else
  /// on the caller's thread inside the request's test() or wait(). `grad` and `out` must stay
  /// untouched, and the handle alive, until the request completes; the request reports the
  /// call's errors. Every
  /// rank must launch in the same order: a call whose handle is not the one its peers' call
  /// at the same position belongs to fails on every rank with std::invalid_argument (the
  /// handle unchanged) instead of mixing two handles' data, provided the handles were made
  /// from one Communicator (or its copies).
  ReduceRequest reduce_async(const ExecSpace& exec, const const_vector_type& grad,
                             const vector_type& out);

  /// \brief Collective. reduce(), with the result returned in sparse form instead of written
  /// as n floats: `result` receives the average's entries, indices ascending, the same bits on
  /// every rank and the same numbers that reduce() would have written at those indices (every
  /// other entry of that output is zero). Method oktopk writes them straight from what it
  /// gathered, without a pass over n; the other methods, and every method's dense warm-up
  /// calls, compact a dense average into them (on a scratch vector of n values that the handle
  /// allocates at its first such call, for methods other than oktopk). Errors, failures and
  /// the handle's state are those of reduce(); `result`'s Views are grown when too short and
  /// reused otherwise. An entry may be zero (an average that rounds to zero, or k = n).
  void reduce_sparse(const ExecSpace& exec, const const_vector_type& grad,
                     sparse_result_type& result);

  /// \brief Collective. reduce_sparse() launched as reduce_async() launches reduce(): `grad`
  /// untouched and `result` alive (and not read) until the request completes.
  ReduceRequest reduce_sparse_async(const ExecSpace& exec, const const_vector_type& grad,
                                    sparse_result_type& result);

  Algorithm algorithm() const { return algorithm_; }
  std::int64_t size() const { return n_; }
  /// floor(density * n).
  std::int64_t k() const { return k_; }
  const Options& options() const { return options_; }
  /// The segments of the fused buffer the handle was made for (empty: none given).
  const Layout& layout() const { return layout_; }
  const Communicator& communicator() const { return comm_; }
  /// How the communicator's ranks group into nodes, found when the handle was made
  /// (Options::node_size); the same on every rank.
  const NodeTopology& node_topology() const { return node_topology_; }
  const ReduceStats& stats() const { return stats_; }
  /// What error feedback carries to the next call (all zeros for methods without it).
  const_residual_vector_type residual() const { return residual_; }

  /// The non-zero entries of the last reduce()'s output View, as it is now (computed on
  /// demand); after a reduce_sparse(), the SparseResult it filled, as it is now.
  sparse_result_type result(const ExecSpace& exec) const;

  /// \brief Writes this rank's state to `os`: what the next calls depend on (the residual, the
  /// call counter, the method's thresholds and region boundaries), in the versioned binary
  /// format of docs/reference.md ("Checkpoint and restart"), with the algorithm, n, P, rank,
  /// options digest and (for a handle with a layout) layout digest it belongs to. Not
  /// collective: every rank saves its own state (residuals differ). Fences `exec`. Throws
  /// std::runtime_error if the stream fails.
  void save_state(const ExecSpace& exec, std::ostream& os) const;

  /// \brief Collective. Replaces this handle's state by what save_state wrote on this rank, so
  /// that later calls return exactly what the saved handle's later calls would have. Each rank
  /// checks its stream (magic, version, lengths, checksums, and that algorithm, n, P, rank,
  /// options and layout are this handle's), then the ranks agree: if any rank's check fails,
  /// every rank throws the same exception naming the first such rank and the cause
  /// (std::invalid_argument for a checkpoint of another handle or call count,
  /// std::runtime_error for a truncated, damaged or unreadable one), and the handle is
  /// unchanged. Reads exactly the checkpoint's bytes from `is` (on failure, an unspecified
  /// number). Afterwards stats() are reset (but for iteration and k) and result() is empty,
  /// until the next reduce().
  void restore_state(const ExecSpace& exec, std::istream& is);

 protected:
  /// Allocates and zeroes the residual on `exec`, and fences it. `layout` must be valid for n
  /// (make_sparse_allreduce checks it).
  SparseAllreduce(const ExecSpace& exec, Algorithm algorithm, const Communicator& comm,
                  std::int64_t n, const Options& options, const Layout& layout);

  /// One collective call, on the thread that works the queue: what reduce() promises, or with
  /// `sparse` not null what reduce_sparse() promises (`out` is then empty).
  /// impl::MethodBase implements it for every method.
  virtual void reduce_now(const ExecSpace& exec, const const_vector_type& grad,
                          const vector_type& out, sparse_result_type* sparse) = 0;

  /// Appends the method's own state carried between calls (beyond the residual and the call
  /// counter, which save_state writes) to `out`; methods with such state override both hooks.
  virtual void save_method_state(SectionPayload& out) const { (void)out; }

  /// The most bytes save_method_state writes, so that restore_state refuses a damaged length
  /// before it reads that many. The methods' sections are small: thresholds and P + 1 region
  /// boundaries.
  virtual std::uint64_t method_state_limit() const {
    return 4096 + 16 * static_cast<std::uint64_t>(comm_.size() + 1);
  }

  /// Parses what save_method_state wrote, throwing impl::StateError for content this handle
  /// cannot take, and returns what installs it (empty: nothing to install). restore_state calls
  /// the result only once every rank's checkpoint checked out, so it must not fail; until then
  /// the handle must stay unchanged.
  virtual std::function<void(const ExecSpace&)> load_method_state(SectionParser& in) {
    in.expect_end();
    return {};
  }

  Algorithm algorithm_;
  Communicator comm_;
  std::int64_t n_;
  std::int64_t k_;
  Options options_;
  Layout layout_;
  residual_vector_type residual_;
  ReduceStats stats_;
  std::int64_t iteration_ = 0;
  /// The last call's output, for result(): the dense one (last_out_) or the sparse one
  /// (last_sparse_, when last_was_sparse_); empty before the first call and after a restore.
  vector_type last_out_;
  sparse_result_type last_sparse_;
  bool last_was_sparse_ = false;
  /// Communicator::next_serial() of the handle, the same on every rank (set by
  /// make_sparse_allreduce): calls check it to detect ranks that launch in different orders.
  std::int64_t serial_ = 0;
  /// Set by make_sparse_allreduce, which finds it before any rank builds the handle.
  NodeTopology node_topology_;

 private:
  friend struct impl::HandleCreation<ExecSpace, Value>;
  /// The hierarchical mode drives a method's handle on its shard from inside its own call.
  friend class impl::HierarchicalAllreduce<ExecSpace, Value>;
};

namespace impl {
/// make_sparse_allreduce's access to what it finds for a new handle outside its constructor.
template <class ExecSpace, class Value>
struct HandleCreation {
  static void set(SparseAllreduce<ExecSpace, Value>& handle, std::int64_t serial,
                  const NodeTopology& node_topology) {
    handle.serial_ = serial;
    handle.node_topology_ = node_topology;
  }
};
}  // namespace impl

}  // namespace oktopk

#include <oktopk/impl/handle/sparse_allreduce_members.hpp>

// Compiled once, in liboktopk (src/instantiate/).
OKTOPK_IMPL_DECLARE_INSTANTIATIONS(oktopk::SparseAllreduce)
