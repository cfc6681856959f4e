// SPDX-License-Identifier: BSD-3-Clause
// The hierarchical mode (Options::hierarchical): a node's L ranks reduce-scatter their
// gradients over the node's own links, so that each owns the node's sum over one shard; a
// method runs across the N nodes on each shard, among the ranks with the same local rank; the
// node's ranks allgather the shards' results. Only the method's sparse traffic crosses the
// network; the dense traffic stays inside the node.
#pragma once

#include <oktopk/algorithm.hpp>
#include <oktopk/communicator.hpp>
#include <oktopk/error.hpp>
#include <oktopk/layout.hpp>
#include <oktopk/section_file.hpp>
#include <oktopk/sparse_allreduce.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/base/value_traits.hpp>
#include <oktopk/impl/comm/failure.hpp>
#include <oktopk/impl/comm/fault_injection.hpp>
#include <oktopk/impl/comm/mpi_mirror.hpp>
#include <oktopk/impl/handle/call_checks.hpp>
#include <oktopk/impl/handle/call_driver.hpp>
#include <oktopk/impl/handle/segment_counts.hpp>
#include <oktopk/impl/handle/shard_offsets.hpp>
#include <oktopk/impl/handle/sparse_allreduce_members.hpp>
#include <oktopk/impl/kernels/vector_ops.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace oktopk::impl {

/// The first entry of shard s when n entries are cut into L shards (shard L starts at n): the
/// shards differ by at most one entry, so the L calls across the nodes are equally large.
inline std::int64_t hierarchy_shard_begin(std::int64_t n, int L, int s) {
  return static_cast<std::int64_t>(s) * n / L;
}

// The mode's kernels are named functors: nvcc's host-side lambda wrappers break when several
// translation units instantiate one kernel (docs/design.md, rule 5).

/// sums(i) = the sum over the node's local ranks, in their order, of their input at entry
/// begin + i of this rank's shard: this rank's own, residual + grad (summed as the methods'
/// accumulate pass sums them), at its place; the others' gradients (their residuals are zero
/// here) from `pieces`, one block of `length` per other local rank, in local rank order.
/// Counts the sums that are not finite in the same pass.
template <class Sums, class Residual, class Grad, class Pieces>
struct SumNodeParts {
  Sums sums;
  Residual residual;
  Grad grad;
  Pieces pieces;
  std::int64_t begin = 0;
  std::int64_t length = 0;
  int local_ranks = 1;
  int local_rank = 0;
  KOKKOS_INLINE_FUNCTION auto part(const int s, const std::int64_t i) const {
    // Block b of pieces holds local rank b's part below this rank, b + 1's above it.
    return s == local_rank ? residual(begin + i) + to_arithmetic(grad(begin + i))
                           : to_arithmetic(pieces((s < local_rank ? s : s - 1) * length + i));
  }
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i, std::int64_t& nonfinite) const {
    using Stored = typename Sums::non_const_value_type;
    auto sum = part(0, i);
    for (int s = 1; s < local_ranks; ++s) sum += part(s, i);
    const Stored stored = value_cast<Stored>(sum);
    sums(i) = stored;
    if (!is_finite(to_arithmetic(stored))) ++nonfinite;
  }
};

/// How many entries of x are not finite.
template <class X>
struct CountNonfinite {
  X x;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i, std::int64_t& count) const {
    if (!is_finite(to_arithmetic(x(i)))) ++count;
  }
};

/// x(i) = x(i) / divisor, for i < the policy's end (a division, as the methods' averages are).
template <class X>
struct DivideInPlace {
  X x;
  float divisor = 1.0f;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    using Stored = typename X::non_const_value_type;
    x(i) = value_cast<Stored>(to_arithmetic(x(i)) / divisor);
  }
};

/// A sparse shard result made global: indices(j) += offset, values(j) /= divisor.
template <class Indices, class Values>
struct ShardEntriesToNode {
  Indices indices;
  Values values;
  index_type offset = 0;
  float divisor = 1.0f;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t j) const {
    using Stored = typename Values::non_const_value_type;
    indices(j) += offset;
    values(j) = value_cast<Stored>(to_arithmetic(values(j)) / divisor);
  }
};

/// \brief A handle in the hierarchical mode: the node level around a handle of the method
/// (`across`) that runs among the ranks of one local rank, one per node, on this rank's shard.
///
/// Its residual() is n long: the shard's residual (the method's, on the node's sum) in this
/// rank's shard, zero elsewhere, so that the node's ranks' residual() + grad sum to the node's
/// accumulated gradient: each rank adds its residual to its gradient before the node sums,
/// and the method, its own residual cleared, takes the node's sum as its input. stats() are
/// the method's on this rank's shard (k is the handle's), with the node level's phases beside
/// its own: hierarchy_check (on the whole communicator), node_reduce_scatter and
/// node_allgather (inside the node; the node's sums are formed in node_reduce_scatter), and
/// the whole output's count per segment of the layout. The method's handle has no layout: the
/// methods this mode takes compute the same without one.
template <class ExecSpace, class Value>
class HierarchicalAllreduce final : public HandleCore<ExecSpace, Value> {
  using Base = HandleCore<ExecSpace, Value>;

 public:
  using typename Base::const_vector_type;
  using typename Base::index_vector_type;
  using typename Base::memory_space;
  using typename Base::sparse_result_type;
  using typename Base::vector_type;

  /// `node`: the ranks of this rank's node, ranked by local rank; `across`: the method's handle
  /// over this rank's shard, among the ranks of its local rank, ranked by node.
  HierarchicalAllreduce(const ExecSpace& exec, Algorithm algorithm, const Communicator& comm,
                        std::int64_t n, const Options& options, const Layout& layout,
                        const Communicator& node,
                        std::unique_ptr<SparseAllreduce<ExecSpace, Value>> across)
      : Base(exec, algorithm, comm, n, options, layout),
        node_(node),
        across_(std::move(across)),
        shard_sums_(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing,
                                       "oktopk::SparseAllreduce::shard_sums"),
                    static_cast<std::size_t>(across_->size())),
        pieces_(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing,
                                   "oktopk::SparseAllreduce::node_pieces"),
                static_cast<std::size_t>((node.size() - 1) * across_->size())),
        shard_out_(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing,
                                      "oktopk::SparseAllreduce::shard_out"),
                   static_cast<std::size_t>(across_->size())) {
    const int L = node_.size();
    for (int s = 0; s < L; ++s) {
      const std::int64_t begin = hierarchy_shard_begin(n, L, s);
      shard_displacements_.push_back(static_cast<int>(begin));
      shard_counts_.push_back(static_cast<int>(hierarchy_shard_begin(n, L, s + 1) - begin));
    }
    OKTOPK_ASSERT(shard_counts_[node_.rank()] == across_->size());
    fence(exec, "oktopk::HierarchicalAllreduce: buffers ready");
  }

  /// The method's handle on this rank's shard.
  const SparseAllreduce<ExecSpace, Value>& across_nodes() const { return *across_; }
  /// The ranks of this rank's node.
  const Communicator& node_communicator() const { return node_; }
  /// This rank's shard: [shard_begin(), shard_begin() + across_nodes().size()).
  std::int64_t shard_begin() const { return shard_displacements_[node_.rank()]; }

 protected:
  void reduce_now(const ExecSpace& exec, const const_vector_type& grad, const vector_type& out,
                  sparse_result_type* sparse) override;

  /// Refused on every rank: the hierarchical mode has no reduce-scatter. The call agrees first,
  /// so that ranks that make another call at this position fail too instead of waiting.
  void reduce_scatter_now(const ExecSpace& exec, const const_vector_type& grad,
                          const vector_type& shard,
                          const std::vector<std::int64_t>& shard_offsets) override {
    constexpr const char* where = "oktopk::SparseAllreduce::reduce_scatter";
    ScopedRegion region(where);
    CallAgreement agreed(true, this->comm_.rank(), this->serial_, CallKind::ReduceScatter,
                         shard_digest(shard_offsets));
    driver_.run_or_abort(this->iteration_ + 1,
                         [&] { driver_.agree(exec, "hierarchy_check", agreed); });
    require_agreed_call(where, agreed, this->comm_.rank(), this->serial_, this->algorithm_,
                        this->n_, CallKind::ReduceScatter, grad.extent(0), shard.extent(0));
    OKTOPK_REQUIRE(false, std::invalid_argument, where,
                   "a hierarchical handle (hierarchical=on) has no reduce-scatter: make the "
                   "handle with hierarchical=off");
  }

  /// Where this rank's shard lies (ranks per node, local rank, node, shard start and
  /// length), then the method's own checkpoint, whole: its residual, counters and state.
  void save_method_state(SectionPayload& out) const override {
    for (const std::int64_t v : shard_place()) out.put_i64(v);
    std::ostringstream os;
    // On a default instance: reduce_now ends with a fence, so the method's buffers are final.
    across_->save_state(ExecSpace(), os);
    out.put_bytes(os.str());
  }

  /// The method's checkpoint: its residual, and its own sections, with room for the headers.
  std::uint64_t method_state_limit() const override {
    return 4096 +
           sizeof(typename Base::arithmetic_type) *
               static_cast<std::uint64_t>(shard_sums_.extent(0)) +
           across_->implementation().method_state_limit();
  }

  std::function<void(const ExecSpace&)> load_method_state(SectionParser& in) override {
    const auto place = shard_place();
    std::int64_t saved[5] = {};
    for (std::int64_t& v : saved) v = in.i64();
    if (!std::equal(place.begin(), place.end(), saved)) {
      std::ostringstream what;
      what << "checkpoint of another node layout: this rank's shard was " << saved[4]
           << " entries from " << saved[3] << ", local rank " << saved[1] << " of " << saved[0]
           << " on node " << saved[2] << "; here it is " << place[4] << " from " << place[3]
           << ", local rank " << place[1] << " of " << place[0] << " on node " << place[2];
      throw StateError(true, what.str());
    }
    // The head matched this handle's algorithm, n, P, rank and options, and the section (its
    // checksum checked) the shard's place: the method's handle is the one that wrote the
    // rest, so its own checks, run when the state is installed, pass on every rank.
    std::string across_state = in.rest();
    return [this, across_state = std::move(across_state)](const ExecSpace& exec) {
      std::istringstream is(across_state);
      across_->restore_state(exec, is);
    };
  }

 private:
  /// {ranks per node, local rank, node, shard start, shard length}: what a checkpoint's method
  /// state belongs to.
  std::array<std::int64_t, 5> shard_place() const {
    return {node_.size(), node_.rank(), this->node_topology_.node(), shard_begin(),
            across_->size()};
  }

  /// The node's allgather of a sparse shard result into `result`.
  void gather_sparse(const ExecSpace& exec, sparse_result_type& result);

  Communicator node_;
  std::unique_ptr<SparseAllreduce<ExecSpace, Value>> across_;
  std::vector<int> shard_counts_;         // entries of each local rank's shard
  std::vector<int> shard_displacements_;  // and where it starts
  vector_type shard_sums_;                // the node's sum over this rank's shard
  vector_type pieces_;                    // the other local ranks' parts of this rank's shard
  vector_type shard_out_;                 // the method's output on the shard
  sparse_result_type shard_result_;       // the method's sparse output on the shard
  ReduceStats node_stats_;                // the node level's phases in the call
  CallDriver<ExecSpace> driver_{this->comm_, this->algorithm_, node_stats_};
};

template <class ExecSpace, class Value>
void HierarchicalAllreduce<ExecSpace, Value>::reduce_now(const ExecSpace& exec,
                                                         const const_vector_type& grad,
                                                         const vector_type& out,
                                                         sparse_result_type* sparse) {
  const char* const where = sparse != nullptr ? "oktopk::SparseAllreduce::reduce_sparse"
                                              : "oktopk::SparseAllreduce::reduce";
  ScopedRegion region(where);
  const std::int64_t call = this->iteration_ + 1;
  const int rank = this->comm_.rank();
  const int L = node_.size();
  const auto shard = static_cast<std::int64_t>(shard_sums_.extent(0));
  const auto shard_range = Kokkos::make_pair(static_cast<std::size_t>(shard_begin()),
                                             static_cast<std::size_t>(shard_begin() + shard));
  this->comm_.reset_traffic();
  node_.reset_traffic();
  node_stats_ = ReduceStats{};

  // The lengths, the handle and the kind of call first: the node's reduce-scatter must not
  // read a short View, and reduce and reduce_sparse end in different node collectives.
  const bool length_ok =
      static_cast<std::int64_t>(grad.extent(0)) == this->n_ &&
      (sparse != nullptr || static_cast<std::int64_t>(out.extent(0)) == this->n_);
  const CallKind kind = sparse != nullptr ? CallKind::ReduceSparse : CallKind::Reduce;
  CallAgreement agreed(length_ok, rank, this->serial_, kind);
  driver_.run_or_abort(call, [&] { driver_.agree(exec, "hierarchy_check", agreed); });
  require_agreed_call(where, agreed, rank, this->serial_, this->algorithm_, this->n_, kind,
                      grad.extent(0), out.extent(0));

  // What each rank adds to its node's sum is residual() + grad: its gradient, plus the
  // residual of its own shard (zero elsewhere, so the other shards' parts are the gradient as
  // it is). The method then gets the node's sum as its whole input (its own residual is
  // cleared below): error feedback on the node's sum.
  std::int64_t nonfinite_here = 0;
  driver_.run_or_abort(call, [&] {
    auto timer = driver_.phase(exec, node_, "node_reduce_scatter");
    // Each part goes straight to the rank that sums it, one message per pair of local ranks,
    // and the parts are summed in local rank order: on shared memory this took about a third
    // of the time of Open MPI 4.1's MPI_Reduce_scatter (docs/benchmarks.md), and the order is
    // the same on every node and every run.
    const int me = node_.rank();
    {
      const auto send = mpi_send_view(exec, grad);
      auto receive = mpi_receive_view(exec, pieces_);
      Communicator::Requests requests;
      for (int s = 0, block = 0; s < L; ++s) {
        if (s == me) continue;
        node_.irecv(receive.data() + block * shard, shard, s, 0, requests);
        ++block;
      }
      for (int s = 0; s < L; ++s) {
        if (s == me) continue;
        node_.isend(send.data() + shard_displacements_[s], shard_counts_[s], s, 0, requests);
      }
      requests.wait_all();
      mpi_received(exec, receive, pieces_, 0, (L - 1) * shard);
    }
    Kokkos::parallel_reduce(
        "oktopk::HierarchicalAllreduce::node_sums", RangeOf<ExecSpace>(exec, 0, shard),
        SumNodeParts<vector_type, typename Base::residual_vector_type, const_vector_type,
                     vector_type>{shard_sums_, this->residual_, grad, pieces_, shard_begin(), shard,
                                  L, me},
        nonfinite_here);
  });

  // The method's input on this shard, the node's sum, must be finite on every shard (counted
  // as the sums were formed): agreed here, over the whole communicator, so that no method call
  // rejects its input on some shards only (the others would then go on to the node's
  // allgather alone).
  std::int64_t nonfinite_rank = 0;
  driver_.run_or_abort(call, [&] {
    nonfinite_rank = nonfinite_here == 0 ? 0 : rank + 1;
    auto timer = driver_.phase(exec, "hierarchy_check");
    this->comm_.allreduce_in_place(&nonfinite_rank, 1, MPI_MAX);
  });
  if (nonfinite_rank != 0) {
    // Which rank's gradient is to blame takes one more pass and allreduce, on this path only.
    std::int64_t bad_input = 0;
    std::int64_t bad_entries = 0;
    driver_.run_or_abort(
        call,
        [&] {
          Kokkos::parallel_reduce("oktopk::HierarchicalAllreduce::blame",
                                  RangeOf<ExecSpace>(exec, 0, this->n_),
                                  CountNonfinite<const_vector_type>{grad}, bad_entries);
          bad_input = bad_entries == 0 ? 0 : rank + 1;
          this->comm_.allreduce_in_place(&bad_input, 1, MPI_MAX);
        },
        "hierarchy_check");
    OKTOPK_REQUIRE(bad_input == 0, std::invalid_argument, where,
                   "the gradient holds NaN or Inf on rank "
                       << bad_input - 1
                       << (rank + 1 == bad_input ? " (" + std::to_string(bad_entries) + " entries)"
                                                 : std::string()));
    OKTOPK_REQUIRE(false, std::invalid_argument, where,
                   "the sum over a node's ranks (plus the residual) overflows to Inf on the shard "
                   "of rank "
                       << nonfinite_rank - 1
                       << " (every gradient is finite); the call was rejected and the handle "
                          "is as it was");
  }

  // The method's call on the shard. Its input is finite everywhere, so the only rejection
  // left is the dense method's, of a sum across the nodes that overflows, which may happen on
  // some shards only: every rank learns of it, and the shards whose call went through are put
  // back (the dense method's state is its call counter), so the handle stays as it was.
  const bool dense = this->algorithm_ == Algorithm::Dense;
  const std::int64_t across_iteration = across_->implementation().iteration_;
  const ReduceStats across_stats = dense ? across_->implementation().stats_ : ReduceStats();
  std::string rejected;
  try {
    // The node's sum holds the residual already (its own, for the methods without error
    // feedback, stays zero).
    driver_.run_or_abort(
        call,
        [&] {
          Kokkos::deep_copy(exec, across_->implementation().residual_,
                            typename Base::arithmetic_type(0));
        },
        "accumulate");
    across_->implementation().reduce_now(exec, shard_sums_, shard_out_,
                                         sparse != nullptr ? &shard_result_ : nullptr);
  } catch (const std::invalid_argument& e) {
    rejected = e.what();
  }
  if (dense) {
    const AgreedFailure failure =
        driver_.agree_on_failure(exec, call, "hierarchy_check", !rejected.empty(), rejected);
    if (failure) {
      if (rejected.empty()) {
        across_->implementation().iteration_ = across_iteration;
        across_->implementation().stats_ = across_stats;
      }
      throw std::invalid_argument(failure.cause);
    }
  }
  if (!rejected.empty()) {
    // The other methods have no rejection left once their input is finite: should one reject
    // all the same, on some shards only, the others would wait in the node's allgather.
    abort_after_local_failure(this->comm_, rejected.c_str(), "hierarchy_check", this->algorithm_,
                              call);
  }

  driver_.run_or_abort(call, [&] {
    auto timer = driver_.phase(exec, node_, "node_allgather");
    if (sparse != nullptr) {
      gather_sparse(exec, *sparse);
    } else {
      // The method averaged over the N nodes; the result is the average over all P ranks.
      Kokkos::parallel_for("oktopk::HierarchicalAllreduce::divide",
                           RangeOf<ExecSpace>(exec, 0, shard),
                           DivideInPlace<vector_type>{shard_out_, static_cast<float>(L)});
      // As the node's sums came: each shard straight to every other local rank, all at once,
      // rather than MPI_Allgatherv's one peer a step (docs/scaling.md, "Two levels").
      const int me = node_.rank();
      const auto send = mpi_send_view(exec, shard_out_);
      auto receive = mpi_receive_view(exec, out);
      {
        Communicator::Requests requests;
        for (int s = 0; s < L; ++s) {
          if (s == me) continue;
          node_.irecv(receive.data() + shard_displacements_[s], shard_counts_[s], s, 1, requests);
        }
        for (int s = 0; s < L; ++s) {
          if (s == me) continue;
          node_.isend(send.data(), shard, s, 1, requests);
        }
        requests.wait_all();
      }
      for (int s = 0; s < L; ++s) {
        if (s == me) continue;
        mpi_received(exec, receive, out, shard_displacements_[s],
                     shard_displacements_[s] + shard_counts_[s]);
      }
      Kokkos::deep_copy(exec, Kokkos::subview(out, shard_range), shard_out_);
    }
  });

  driver_.run_or_abort(
      call,
      [&] {
        Kokkos::deep_copy(exec, Kokkos::subview(this->residual_, shard_range), across_->residual());
        fence(exec, "oktopk::HierarchicalAllreduce: residual");
      },
      "residual");

  // The whole output per segment of the layout (the method's handle has none).
  std::vector<SegmentStats> segments;
  if (!this->layout_.empty()) {
    driver_.run_or_abort(
        call,
        [&] {
          segments = sparse != nullptr ? segment_entries(exec, this->layout_, this->n_, *sparse)
                                       : segment_nonzeros(exec, this->layout_, out);
        },
        "segments");
  }

  ++this->iteration_;
  // The method's numbers on this shard, with the node level's phases beside its own (their
  // names differ): their times, and their traffic inside the node and over the communicator.
  ReduceStats result = across_->stats();
  for (const auto& [name, phase] : node_stats_.phases) result.phases[name].seconds += phase.seconds;
  for (const auto& [name, traffic] : node_.traffic()) result.phases[name].traffic += traffic;
  for (const auto& [name, traffic] : this->comm_.traffic()) result.phases[name].traffic += traffic;
  result.iteration = this->iteration_;
  result.k = this->k_;
  result.segments = std::move(segments);
  this->stats_ = std::move(result);
  this->last_out_ = out;
  this->last_sparse_ = sparse != nullptr ? *sparse : sparse_result_type();
  this->last_was_sparse_ = sparse != nullptr;
}

template <class ExecSpace, class Value>
void HierarchicalAllreduce<ExecSpace, Value>::gather_sparse(const ExecSpace& exec,
                                                            sparse_result_type& result) {
  const int L = node_.size();
  const std::int64_t mine = shard_result_.size;
  Kokkos::parallel_for("oktopk::HierarchicalAllreduce::shard_entries",
                       RangeOf<ExecSpace>(exec, 0, mine),
                       ShardEntriesToNode<index_vector_type, vector_type>{
                           shard_result_.indices, shard_result_.values,
                           static_cast<index_type>(shard_begin()), static_cast<float>(L)});
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(L));
  node_.allgather(&mine, 1, sizes.data());
  std::vector<int> counts(static_cast<std::size_t>(L));
  std::vector<int> displacements(static_cast<std::size_t>(L));
  std::int64_t total = 0;
  for (int s = 0; s < L; ++s) {
    // The shards' entries are at most its length each, n < 2^31 in all.
    counts[s] = static_cast<int>(sizes[s]);
    displacements[s] = static_cast<int>(total);
    total += sizes[s];
  }
  // Grown, not shrunk: one SparseResult serves a whole run.
  if (result.indices.extent(0) == 0)
    result.indices = index_vector_type("oktopk::SparseResult::indices", 0);
  if (result.values.extent(0) == 0) result.values = vector_type("oktopk::SparseResult::values", 0);
  ensure_capacity(exec, result.indices, total);
  ensure_capacity(exec, result.values, total);
  result.size = total;
  const auto part = Kokkos::make_pair(std::size_t{0}, static_cast<std::size_t>(mine));
  const auto all = Kokkos::make_pair(std::size_t{0}, static_cast<std::size_t>(total));
  {
    const auto send = mpi_send_view(exec, Kokkos::subview(shard_result_.indices, part));
    const auto target = Kokkos::subview(result.indices, all);
    auto receive = mpi_receive_view(exec, target);
    node_.allgatherv(send.data(), mine, receive.data(), counts.data(), displacements.data());
    mpi_received(exec, receive, target, 0, total);
  }
  {
    const auto send = mpi_send_view(exec, Kokkos::subview(shard_result_.values, part));
    const auto target = Kokkos::subview(result.values, all);
    auto receive = mpi_receive_view(exec, target);
    node_.allgatherv(send.data(), mine, receive.data(), counts.data(), displacements.data());
    mpi_received(exec, receive, target, 0, total);
  }
}

}  // namespace oktopk::impl

// Compiled once, in liboktopk (src/instantiate/).
OKTOPK_IMPL_DECLARE_INSTANTIATIONS(oktopk::impl::HierarchicalAllreduce)
