// SPDX-License-Identifier: BSD-3-Clause
// The handle: a persistent object that turns each rank's dense gradient into the same
// averaged, sparsified gradient on every rank. It holds the library's side of the handle,
// impl::HandleCore (impl/handle/handle_core.hpp: the state, and the call every method
// implements), and forwards to it; the bodies are in impl/handle/sparse_allreduce_members.hpp.
#pragma once

#include <oktopk/algorithm.hpp>
#include <oktopk/communicator.hpp>
#include <oktopk/fwd.hpp>
#include <oktopk/layout.hpp>
#include <oktopk/node_topology.hpp>
#include <oktopk/options.hpp>
#include <oktopk/progress.hpp>
#include <oktopk/shards.hpp>
#include <oktopk/stats.hpp>
#include <oktopk/impl/base/explicit_instantiation.hpp>
#include <oktopk/impl/base/value_traits.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <istream>
#include <memory>
#include <ostream>
#include <vector>

namespace oktopk {

namespace impl {
template <class ExecSpace, class Value>
class HandleCore;
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

  /// Made by make_sparse_allreduce, which gives it the library's side of the handle.
  explicit SparseAllreduce(std::unique_ptr<impl::HandleCore<ExecSpace, Value>> core);
  ~SparseAllreduce();
  SparseAllreduce(const SparseAllreduce&) = delete;
  SparseAllreduce& operator=(const SparseAllreduce&) = delete;

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

  /// \brief Collective. Writes into `shard` this rank's shard of what reduce() would write into
  /// `out` on the same inputs: entries [shard_offsets[rank], shard_offsets[rank + 1]) of the
  /// average, with the same error feedback (the residual ends as reduce() would leave it), for
  /// methods oktopk, topka, topkdsa, gaussiank and dense; each rank receives only its own
  /// shard, so no allgather is made.
  /// `shard_offsets`: P + 1 boundaries from 0 to n, never decreasing, the same on every rank;
  /// empty gives equal_shard_offsets(size(), P). `shard` must have the rank's shard's length.
  ///
  /// Method oktopk reduces in its balanced regions as reduce() does, then sends each selected
  /// entry to the owner of its shard, and each region's owner tells every rank which of the
  /// entries it sent were selected (one byte each), for the error feedback: its shards are
  /// reduce()'s output bit for bit. TopkA and Gaussian-k send each selected entry to its
  /// shard's owner, which sums them in rank order as reduce() does; TopkDSA sends its regions'
  /// non-zeros after reduce()'s split-and-reduce: their shards too are reduce()'s output bit
  /// for bit. Dense warm-up calls average the whole vector, as reduce() does, and copy the
  /// shard out. Method dense, where reduce() runs on OkTopk's ring (Options::dense_allreduce,
  /// 16-bit gradients, a narrower wire), is the ring's reduce-scatter with the shards as its
  /// chunks, with equal shards reduce()'s slice bit for bit; where reduce() runs
  /// MPI_Allreduce, it is one MPI_Reduce_scatter, then /P, equal to reduce()'s slice up to the
  /// order of MPI's sums.
  /// Methods gtopk and s2 are refused on every rank with std::invalid_argument saying why, as
  /// are hierarchical handles (Options::hierarchical).
  ///
  /// Errors and failures are those of reduce(), with bad shard offsets or lengths, or offsets
  /// that differ between ranks, refused on every rank alike. stats() count the call's traffic
  /// per phase (oktopk: "shard_exchange" and "feedback" instead of "allgatherv"); `segments`
  /// is left empty and result() is empty until the next reduce() or reduce_sparse(). Runs after
  /// every call launched before it in this process (reduce_async's queue).
  void reduce_scatter(const ExecSpace& exec, const const_vector_type& grad,
                      const vector_type& shard,
                      const std::vector<std::int64_t>& shard_offsets = {});

  Algorithm algorithm() const;
  std::int64_t size() const;
  /// floor(density * n).
  std::int64_t k() const;
  const Options& options() const;
  /// The segments of the fused buffer the handle was made for (empty: none given).
  const Layout& layout() const;
  const Communicator& communicator() const;
  /// How the communicator's ranks group into nodes, found when the handle was made
  /// (Options::node_size); the same on every rank.
  const NodeTopology& node_topology() const;
  const ReduceStats& stats() const;
  /// What error feedback carries to the next call (all zeros for methods without it).
  const_residual_vector_type residual() const;

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

  /// The library's side of the handle (oktopk::impl): for the result oracle and the library's
  /// tests, not part of the API.
  const impl::HandleCore<ExecSpace, Value>& implementation() const { return *core_; }
  impl::HandleCore<ExecSpace, Value>& implementation() { return *core_; }

 private:
  std::unique_ptr<impl::HandleCore<ExecSpace, Value>> core_;
};

}  // namespace oktopk

// Compiled once, in liboktopk (src/instantiate/); the member bodies are in
// oktopk/impl/handle/sparse_allreduce_members.hpp (oktopk/any_space.hpp for other spaces).
OKTOPK_IMPL_DECLARE_INSTANTIATIONS(oktopk::SparseAllreduce)
