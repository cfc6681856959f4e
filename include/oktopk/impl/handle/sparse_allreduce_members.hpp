// SPDX-License-Identifier: BSD-3-Clause
// The bodies of impl::HandleCore (handle_core.hpp): the queue entry points, the sparse view of
// the output, and checkpoint save and restore; then SparseAllreduce's, which forward to it. What
// one call does is impl::MethodBase::reduce_now (or impl::HierarchicalAllreduce's).
#pragma once

#include <oktopk/error.hpp>
#include <oktopk/select.hpp>
#include <oktopk/shards.hpp>
#include <oktopk/sparse_allreduce.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>
#include <oktopk/impl/handle/handle_core.hpp>
#include <oktopk/impl/kernels/vector_ops.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <istream>
#include <iterator>
#include <ostream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace oktopk {

template <class ExecSpace, class Value>
impl::HandleCore<ExecSpace, Value>::HandleCore(const ExecSpace& exec, Algorithm algorithm,
                                               const Communicator& comm, std::int64_t n,
                                               const Options& options, const Layout& layout)
    : algorithm_(algorithm),
      comm_(comm),
      n_(n),
      k_(static_cast<std::int64_t>(std::floor(options.density * static_cast<double>(n)))),
      options_(options),
      layout_(layout),
      residual_(Kokkos::view_alloc(exec, "oktopk::SparseAllreduce::residual"),
                static_cast<std::size_t>(n)) {
  if (k_ > n_) k_ = n_;
  impl::fence(exec, "oktopk::SparseAllreduce: buffers ready");
}

template <class ExecSpace, class Value>
void impl::HandleCore<ExecSpace, Value>::reduce(const ExecSpace& exec,
                                                const const_vector_type& grad,
                                                const vector_type& out) {
  // A queued call that reduces (the C interface's) is already where the queue is worked.
  if (impl::in_progress_task()) {
    reduce_now(exec, grad, out, nullptr);
  } else {
    reduce_async(exec, grad, out).wait();
  }
}

template <class ExecSpace, class Value>
ReduceRequest impl::HandleCore<ExecSpace, Value>::reduce_async(const ExecSpace& exec,
                                                               const const_vector_type& grad,
                                                               const vector_type& out) {
  return ReduceRequest(
      impl::enqueue([this, exec, grad, out] { reduce_now(exec, grad, out, nullptr); }));
}

template <class ExecSpace, class Value>
void impl::HandleCore<ExecSpace, Value>::reduce_sparse(const ExecSpace& exec,
                                                       const const_vector_type& grad,
                                                       sparse_result_type& result) {
  if (impl::in_progress_task()) {
    reduce_now(exec, grad, vector_type(), &result);
  } else {
    reduce_sparse_async(exec, grad, result).wait();
  }
}

template <class ExecSpace, class Value>
ReduceRequest impl::HandleCore<ExecSpace, Value>::reduce_sparse_async(const ExecSpace& exec,
                                                                      const const_vector_type& grad,
                                                                      sparse_result_type& result) {
  sparse_result_type* target = &result;
  return ReduceRequest(
      impl::enqueue([this, exec, grad, target] { reduce_now(exec, grad, vector_type(), target); }));
}

template <class ExecSpace, class Value>
void impl::HandleCore<ExecSpace, Value>::reduce_scatter(
    const ExecSpace& exec, const const_vector_type& grad, const vector_type& shard,
    const std::vector<std::int64_t>& shard_offsets) {
  const std::vector<std::int64_t> offsets =
      shard_offsets.empty() ? equal_shard_offsets(n_, comm_.size()) : shard_offsets;
  if (impl::in_progress_task()) {
    reduce_scatter_now(exec, grad, shard, offsets);
  } else {
    ReduceRequest(impl::enqueue([this, exec, grad, shard, offsets] {
      reduce_scatter_now(exec, grad, shard, offsets);
    })).wait();
  }
}

template <class ExecSpace, class Value>
void impl::HandleCore<ExecSpace, Value>::save_state(const ExecSpace& exec, std::ostream& os) const {
  impl::ScopedRegion region("oktopk::SparseAllreduce::save_state");
  SectionWriter out(os, "oktopk::SparseAllreduce::save_state");
  // Handles for float gradients without a layout write version 1, which has no layout digest,
  // and with one version 2, which has no gradient type, so that older readers read them too.
  const bool typed = !std::is_same_v<Value, float>;
  const bool with_layout = typed || !layout_.empty();
  out.header(impl::state_magic, typed         ? impl::state_format_version
                                : with_layout ? impl::state_format_version_with_layout
                                              : impl::state_format_version_without_layout);
  SectionPayload head;
  head.put_u32(static_cast<std::uint32_t>(algorithm_));
  head.put_i64(n_);
  head.put_i32(comm_.size());
  head.put_i32(comm_.rank());
  head.put_i64(options_.digest());
  head.put_i64(iteration_);
  if (with_layout) head.put_i64(layout_.digest());
  if (typed) head.put_u32(impl::ValueTraits<Value>::code);
  out.section("HEAD", head.bytes());
  auto host = Kokkos::create_mirror_view(Kokkos::HostSpace(), residual_);
  Kokkos::deep_copy(exec, host, residual_);
  impl::fence(exec, "oktopk::SparseAllreduce::save_state: residual to host");
  out.section_floats("RESD", host.data(), host.extent(0));
  SectionPayload method;
  save_method_state(method);
  out.section("METH", method.bytes());
}

template <class ExecSpace, class Value>
void impl::HandleCore<ExecSpace, Value>::restore_state(const ExecSpace& exec, std::istream& is) {
  constexpr const char* where = "oktopk::SparseAllreduce::restore_state";
  impl::ScopedRegion region("oktopk::SparseAllreduce::restore_state");
  const int P = comm_.size();
  const int me = comm_.rank();

  // 1. Parse everything into temporaries; the handle is untouched until every rank agrees.
  Kokkos::View<arithmetic_type*, Kokkos::HostSpace> residual;
  std::int64_t iteration = 0;
  std::function<void(const ExecSpace&)> install_method;
  int failure = 0;  // 0: none, 1: mismatch (invalid_argument), 2: damaged (runtime_error)
  std::string message;
  try {
    SectionReader in(is);
    if (!in.magic(impl::state_magic)) {
      throw impl::StateError(false, "not an OkTopk SparseAllreduce checkpoint (wrong magic bytes)");
    }
    const std::uint32_t version = in.version();
    if (version < impl::state_format_version_without_layout ||
        version > impl::state_format_version) {
      throw impl::StateError(false, "checkpoint format version " + std::to_string(version) +
                                        " is not one this library reads (" +
                                        std::to_string(impl::state_format_version_without_layout) +
                                        " to " + std::to_string(impl::state_format_version) + ")");
    }
    SectionParser head = in.section("HEAD", "header", 64);
    const std::uint32_t algorithm = head.u32();
    const std::int64_t n = head.i64();
    const std::int32_t size = head.i32();
    const std::int32_t rank = head.i32();
    const std::int64_t digest = head.i64();
    iteration = head.i64();
    // Version 1 predates layouts: it was written by a handle without one.
    const std::int64_t layout_digest =
        version == impl::state_format_version_without_layout ? Layout().digest() : head.i64();
    // Versions 1 and 2 predate gradient types: they were written by handles for floats.
    const std::uint32_t value_code =
        version < impl::state_format_version ? impl::ValueTraits<float>::code : head.u32();
    head.expect_end();
    if (algorithm >= all_algorithms.size()) {
      throw impl::StateError(
          false, "checkpoint is corrupt: unknown algorithm number " + std::to_string(algorithm));
    }
    const auto written_for = all_algorithms[algorithm];
    if (written_for != algorithm_) {
      throw impl::StateError(true, "checkpoint was written for algorithm " +
                                       to_string(written_for) + ", this handle runs " +
                                       to_string(algorithm_));
    }
    constexpr std::uint32_t value_codes = std::size(impl::value_type_names);
    if (value_code >= value_codes) {
      throw impl::StateError(false, "checkpoint is corrupt: unknown gradient type number " +
                                        std::to_string(value_code));
    }
    if (value_code != impl::ValueTraits<Value>::code) {
      throw impl::StateError(true, std::string("checkpoint was written by a handle for ") +
                                       impl::value_type_names[value_code] +
                                       " gradients, this handle takes " +
                                       impl::ValueTraits<Value>::name);
    }
    if (n != n_) {
      throw impl::StateError(true, "checkpoint was written for n = " + std::to_string(n) +
                                       ", this handle has n = " + std::to_string(n_));
    }
    if (size != P) {
      throw impl::StateError(true, "checkpoint was written on " + std::to_string(size) +
                                       " ranks, this handle's communicator has " +
                                       std::to_string(P));
    }
    if (rank != me) {
      throw impl::StateError(true, "checkpoint was written by rank " + std::to_string(rank));
    }
    if (digest != options_.digest()) {
      throw impl::StateError(true,
                             "checkpoint was written with other options than this "
                             "handle's (options digest " +
                                 std::to_string(digest) + ", this handle's " +
                                 std::to_string(options_.digest()) + ")");
    }
    if (layout_digest != layout_.digest()) {
      throw impl::StateError(true,
                             "checkpoint was written by a handle with another layout than "
                             "this handle's (layout digest " +
                                 std::to_string(layout_digest) + ", this handle's " +
                                 std::to_string(layout_.digest()) + ")");
    }
    if (iteration < 0) {
      throw impl::StateError(
          false, "checkpoint is corrupt: negative call counter " + std::to_string(iteration));
    }
    residual = Kokkos::View<arithmetic_type*, Kokkos::HostSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing,
                           "oktopk::SparseAllreduce::restored_residual"),
        static_cast<std::size_t>(n_));
    in.section_floats("RESD", "residual", residual.data(), residual.extent(0));
    SectionParser method = in.section("METH", "method state", method_state_limit());
    install_method = load_method_state(method);
  } catch (const SectionError& e) {
    failure = 2;
    message = std::string("checkpoint ") + e.what();
  } catch (const impl::StateError& e) {
    failure = e.mismatch() ? 1 : 2;
    message = e.what();
  } catch (const std::exception& e) {
    failure = 2;
    message = e.what();
  }

  // 2. Agree: the first failing rank's message, or unequal call counters, throw everywhere.
  std::int64_t agreed[3] = {failure != 0 ? P - me : 0, failure != 0 ? 0 : iteration,
                            failure != 0 ? ~std::int64_t{0} : ~iteration};
  comm_.allreduce_in_place(agreed, 3, MPI_MAX);
  if (agreed[0] != 0) {
    const int root = P - static_cast<int>(agreed[0]);
    std::int64_t kind_length[2] = {failure, static_cast<std::int64_t>(message.size())};
    comm_.bcast(kind_length, 2, root);
    message.resize(static_cast<std::size_t>(kind_length[1]));
    comm_.bcast(message.data(), kind_length[1], root);
    const std::string text = std::string(where) + ": rank " + std::to_string(root) + ": " + message;
    if (kind_length[0] == 1) throw std::invalid_argument(text);
    throw std::runtime_error(text);
  }
  const std::int64_t largest = agreed[1];
  const std::int64_t smallest = ~agreed[2];
  OKTOPK_REQUIRE(smallest == largest, std::invalid_argument, where,
                 "the ranks' checkpoints were written after different numbers of calls "
                 "(smallest "
                     << smallest << ", largest " << largest << ")");

  // 3. Install.
  Kokkos::deep_copy(exec, residual_, residual);
  iteration_ = iteration;
  stats_ = ReduceStats{};
  stats_.k = k_;
  stats_.iteration = iteration_;
  last_out_ = vector_type();
  last_sparse_ = sparse_result_type();
  last_was_sparse_ = false;
  if (install_method) install_method(exec);
  impl::fence(exec, "oktopk::SparseAllreduce::restore_state: state installed");
}

template <class ExecSpace, class Value>
SparseResult<typename ExecSpace::memory_space, Value> impl::HandleCore<ExecSpace, Value>::result(
    const ExecSpace& exec) const {
  if (last_was_sparse_) return last_sparse_;
  sparse_result_type r;
  const auto capacity =
      static_cast<std::size_t>(last_out_.extent(0) == 0 ? 0 : stats_.global_selected + 1);
  r.indices = index_vector_type(
      Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::SparseResult::indices"),
      capacity);
  r.values = vector_type(
      Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::SparseResult::values"),
      capacity);
  r.size = select_above(exec, last_out_, 0.0f, r.indices, r.values);
  if (r.size > static_cast<std::int64_t>(capacity)) {
    impl::ensure_capacity(exec, r.indices, r.size);
    impl::ensure_capacity(exec, r.values, r.size);
    r.size = select_above(exec, last_out_, 0.0f, r.indices, r.values);
  }
  return r;
}

template <class ExecSpace, class Value>
SparseAllreduce<ExecSpace, Value>::SparseAllreduce(
    std::unique_ptr<impl::HandleCore<ExecSpace, Value>> core)
    : core_(std::move(core)) {}

template <class ExecSpace, class Value>
SparseAllreduce<ExecSpace, Value>::~SparseAllreduce() = default;

template <class ExecSpace, class Value>
void SparseAllreduce<ExecSpace, Value>::reduce(const ExecSpace& exec, const const_vector_type& grad,
                                               const vector_type& out) {
  core_->reduce(exec, grad, out);
}

template <class ExecSpace, class Value>
ReduceRequest SparseAllreduce<ExecSpace, Value>::reduce_async(const ExecSpace& exec,
                                                              const const_vector_type& grad,
                                                              const vector_type& out) {
  return core_->reduce_async(exec, grad, out);
}

template <class ExecSpace, class Value>
void SparseAllreduce<ExecSpace, Value>::reduce_sparse(const ExecSpace& exec,
                                                      const const_vector_type& grad,
                                                      sparse_result_type& result) {
  core_->reduce_sparse(exec, grad, result);
}

template <class ExecSpace, class Value>
void SparseAllreduce<ExecSpace, Value>::reduce_scatter(
    const ExecSpace& exec, const const_vector_type& grad, const vector_type& shard,
    const std::vector<std::int64_t>& shard_offsets) {
  core_->reduce_scatter(exec, grad, shard, shard_offsets);
}

template <class ExecSpace, class Value>
ReduceRequest SparseAllreduce<ExecSpace, Value>::reduce_sparse_async(const ExecSpace& exec,
                                                                     const const_vector_type& grad,
                                                                     sparse_result_type& result) {
  return core_->reduce_sparse_async(exec, grad, result);
}

template <class ExecSpace, class Value>
Algorithm SparseAllreduce<ExecSpace, Value>::algorithm() const {
  return core_->algorithm();
}

template <class ExecSpace, class Value>
std::int64_t SparseAllreduce<ExecSpace, Value>::size() const {
  return core_->size();
}

template <class ExecSpace, class Value>
std::int64_t SparseAllreduce<ExecSpace, Value>::k() const {
  return core_->k();
}

template <class ExecSpace, class Value>
const Options& SparseAllreduce<ExecSpace, Value>::options() const {
  return core_->options();
}

template <class ExecSpace, class Value>
const Layout& SparseAllreduce<ExecSpace, Value>::layout() const {
  return core_->layout();
}

template <class ExecSpace, class Value>
const Communicator& SparseAllreduce<ExecSpace, Value>::communicator() const {
  return core_->communicator();
}

template <class ExecSpace, class Value>
const NodeTopology& SparseAllreduce<ExecSpace, Value>::node_topology() const {
  return core_->node_topology();
}

template <class ExecSpace, class Value>
const ReduceStats& SparseAllreduce<ExecSpace, Value>::stats() const {
  return core_->stats();
}

template <class ExecSpace, class Value>
typename SparseAllreduce<ExecSpace, Value>::const_residual_vector_type
SparseAllreduce<ExecSpace, Value>::residual() const {
  return core_->residual();
}

template <class ExecSpace, class Value>
SparseResult<typename ExecSpace::memory_space, Value> SparseAllreduce<ExecSpace, Value>::result(
    const ExecSpace& exec) const {
  return core_->result(exec);
}

template <class ExecSpace, class Value>
void SparseAllreduce<ExecSpace, Value>::save_state(const ExecSpace& exec, std::ostream& os) const {
  core_->save_state(exec, os);
}

template <class ExecSpace, class Value>
void SparseAllreduce<ExecSpace, Value>::restore_state(const ExecSpace& exec, std::istream& is) {
  core_->restore_state(exec, is);
}

}  // namespace oktopk
