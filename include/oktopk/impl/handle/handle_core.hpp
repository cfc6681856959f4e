// SPDX-License-Identifier: BSD-3-Clause
// The library's side of a handle: what SparseAllreduce (include/oktopk/sparse_allreduce.hpp)
// holds and forwards to. It owns the handle's state and declares the hooks every method
// implements; impl::MethodBase (impl/algorithms/method_base.hpp) implements one call for the
// flat methods, impl::HierarchicalAllreduce (hierarchical.hpp) for the hierarchical mode. The
// bodies are in sparse_allreduce_members.hpp.
#pragma once

#include <oktopk/algorithm.hpp>
#include <oktopk/communicator.hpp>
#include <oktopk/fwd.hpp>
#include <oktopk/layout.hpp>
#include <oktopk/node_topology.hpp>
#include <oktopk/options.hpp>
#include <oktopk/progress.hpp>
#include <oktopk/section_file.hpp>
#include <oktopk/sparse_allreduce.hpp>
#include <oktopk/stats.hpp>
#include <oktopk/impl/base/explicit_instantiation.hpp>
#include <oktopk/impl/base/value_traits.hpp>
#include <oktopk/impl/handle/state_io.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <functional>
#include <istream>
#include <ostream>
#include <vector>

namespace oktopk::impl {

template <class ExecSpace, class Value>
class HierarchicalAllreduce;

/// The state and the call of one handle. Its public functions do what SparseAllreduce's of
/// the same names promise (sparse_allreduce.hpp documents them).
template <class ExecSpace, class Value>
class HandleCore {
 public:
  // The same types as SparseAllreduce's.
  using execution_space = ExecSpace;
  using memory_space = typename ExecSpace::memory_space;
  using gradient_type = Value;
  using arithmetic_type = arithmetic_t<Value>;
  using vector_type = Kokkos::View<Value*, memory_space>;
  using const_vector_type = Kokkos::View<const Value*, memory_space>;
  using residual_vector_type = Kokkos::View<arithmetic_type*, memory_space>;
  using const_residual_vector_type = Kokkos::View<const arithmetic_type*, memory_space>;
  using index_vector_type = Kokkos::View<index_type*, memory_space>;
  using sparse_result_type = SparseResult<memory_space, Value>;

  HandleCore(const HandleCore&) = delete;
  HandleCore& operator=(const HandleCore&) = delete;
  virtual ~HandleCore() = default;

  void reduce(const ExecSpace& exec, const const_vector_type& grad, const vector_type& out);
  ReduceRequest reduce_async(const ExecSpace& exec, const const_vector_type& grad,
                             const vector_type& out);
  void reduce_sparse(const ExecSpace& exec, const const_vector_type& grad,
                     sparse_result_type& result);
  ReduceRequest reduce_sparse_async(const ExecSpace& exec, const const_vector_type& grad,
                                    sparse_result_type& result);
  void reduce_scatter(const ExecSpace& exec, const const_vector_type& grad,
                      const vector_type& shard, const std::vector<std::int64_t>& shard_offsets);

  Algorithm algorithm() const { return algorithm_; }
  std::int64_t size() const { return n_; }
  std::int64_t k() const { return k_; }
  const Options& options() const { return options_; }
  const Layout& layout() const { return layout_; }
  const Communicator& communicator() const { return comm_; }
  const NodeTopology& node_topology() const { return node_topology_; }
  const ReduceStats& stats() const { return stats_; }
  const_residual_vector_type residual() const { return residual_; }

  sparse_result_type result(const ExecSpace& exec) const;
  void save_state(const ExecSpace& exec, std::ostream& os) const;
  void restore_state(const ExecSpace& exec, std::istream& is);

  /// What make_sparse_allreduce finds for a new handle outside its constructor: the handle's
  /// serial and the node topology, the same on every rank.
  void set_origin(std::int64_t serial, const NodeTopology& node_topology) {
    serial_ = serial;
    node_topology_ = node_topology;
  }

 protected:
  /// Allocates and zeroes the residual on `exec`, and fences it. `layout` must be valid for n
  /// (make_sparse_allreduce checks it).
  HandleCore(const ExecSpace& exec, Algorithm algorithm, const Communicator& comm, std::int64_t n,
             const Options& options, const Layout& layout);

  /// One collective call, on the thread that works the queue: what reduce() promises, or with
  /// `sparse` not null what reduce_sparse() promises (`out` is then empty).
  /// impl::MethodBase implements it for every method.
  virtual void reduce_now(const ExecSpace& exec, const const_vector_type& grad,
                          const vector_type& out, sparse_result_type* sparse) = 0;

  /// One reduce_scatter call, on the thread that works the queue: what reduce_scatter()
  /// promises, with `shard_offsets` already P + 1 boundaries (equal ones where the caller gave
  /// none), though not yet checked.
  virtual void reduce_scatter_now(const ExecSpace& exec, const const_vector_type& grad,
                                  const vector_type& shard,
                                  const std::vector<std::int64_t>& shard_offsets) = 0;

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
  /// The hierarchical mode drives a method's handle on its shard from inside its own call.
  friend class HierarchicalAllreduce<ExecSpace, Value>;
};

}  // namespace oktopk::impl

// Compiled once, in liboktopk (src/instantiate/); the bodies are in
// sparse_allreduce_members.hpp (oktopk/any_space.hpp for other spaces).
OKTOPK_IMPL_DECLARE_INSTANTIATIONS(oktopk::impl::HandleCore)
