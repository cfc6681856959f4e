// SPDX-License-Identifier: BSD-3-Clause
// The body of make_sparse_allreduce (include/oktopk/make_sparse_allreduce.hpp): the one place
// that knows every method. liboktopk compiles it, and every method, for the spaces and gradient
// types of include/oktopk/impl/base/explicit_instantiation.hpp; oktopk/any_space.hpp brings it
// to a program that makes handles on other spaces.
#pragma once

#include <oktopk/algorithm.hpp>
#include <oktopk/communicator.hpp>
#include <oktopk/error.hpp>
#include <oktopk/gpu_aware_mpi.hpp>
#include <oktopk/layout.hpp>
#include <oktopk/make_sparse_allreduce.hpp>
#include <oktopk/node_topology.hpp>
#include <oktopk/options.hpp>
#include <oktopk/sparse_allreduce.hpp>
#include <oktopk/impl/algorithms/dense.hpp>
#include <oktopk/impl/algorithms/gaussiank.hpp>
#include <oktopk/impl/algorithms/gtopk.hpp>
#include <oktopk/impl/algorithms/oktopk_method.hpp>
#include <oktopk/impl/algorithms/s2.hpp>
#include <oktopk/impl/algorithms/topka.hpp>
#include <oktopk/impl/algorithms/topkdsa.hpp>
#include <oktopk/impl/base/explicit_instantiation.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/base/value_traits.hpp>
#include <oktopk/impl/base/wire_rounding.hpp>
#include <oktopk/impl/comm/fault_injection.hpp>
#include <oktopk/impl/comm/gpu_aware_mpi_choice.hpp>
#include <oktopk/impl/handle/call_driver.hpp>
#include <oktopk/impl/handle/handle_core.hpp>
#include <oktopk/impl/handle/hierarchical.hpp>

#include <cstdint>
#include <limits>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace oktopk {

namespace impl {
/// The hierarchical mode's handle (Options::hierarchical), for make_sparse_allreduce, after
/// the checks that every rank makes alike: the node's and the local rank's communicators, the
/// method's handle on this rank's shard, and the node level around it, numbered `serial`. A
/// failure on some ranks only throws on every rank.
template <class ExecSpace, class Value>
std::unique_ptr<SparseAllreduce<ExecSpace, Value>> make_hierarchical(
    const ExecSpace& exec, Algorithm algorithm, const Communicator& comm, std::int64_t n,
    const Options& options, const Layout& layout, const NodeTopology& nodes, std::int64_t serial);

/// Throws std::invalid_argument starting with `where` unless the hierarchical mode takes this
/// method, gradient type, wire and node topology. Every rank has the same of each, so
/// every rank throws alike.
template <class Value>
void require_hierarchical_takes(const char* where, Algorithm algorithm, const Options& options,
                                const NodeTopology& nodes) {
  OKTOPK_REQUIRE(algorithm == Algorithm::Dense || algorithm == Algorithm::TopkA ||
                     algorithm == Algorithm::TopkDSA || algorithm == Algorithm::GaussianK ||
                     algorithm == Algorithm::OkTopk,
                 std::invalid_argument, where,
                 "hierarchical=on takes methods dense, topka, topkdsa, gaussiank and oktopk, not "
                     << algorithm);
  // A branch of its own, not OKTOPK_REQUIRE on a constant: nvcc rejects the code after a
  // check whose condition is false at compile time as unreachable (warning 128, an error here).
  if constexpr (!std::is_same_v<Value, float> && !std::is_same_v<Value, double>) {
    (void)options, (void)nodes;
    std::ostringstream what;
    what << where << ": hierarchical=on takes float and double gradients, not "
         << ValueTraits<Value>::name << " (its tests and oracle do not cover the 16-bit types yet)";
    throw std::invalid_argument(what.str());
  } else {
    OKTOPK_REQUIRE(value_wire<Value>(options) == Wire::Native, std::invalid_argument, where,
                   "hierarchical=on sends the gradient's own type, not wire=" << options.wire);
    OKTOPK_REQUIRE(nodes.uniform(), std::invalid_argument, where,
                   "hierarchical=on needs the same number of ranks on every node (the shards of "
                   "a node's ranks meet their peers on the other nodes), but the ranks form "
                       << nodes);
  }
}

template <class ExecSpace, class Value>
std::unique_ptr<SparseAllreduce<ExecSpace, Value>> HandleFactory<ExecSpace, Value>::make(
    const ExecSpace& exec, Algorithm algorithm, const Communicator& comm, std::int64_t n,
    const Options& options, const Layout& layout) {
  constexpr const char* where = "oktopk::make_sparse_allreduce";
  comm.check_agreement(where, {{"algorithm", static_cast<std::int64_t>(algorithm)},
                               {"n", n},
                               {"options", options.digest()},
                               {"layout", layout.digest()},
                               {"gradient type", impl::ValueTraits<Value>::code}});
  // Nodes may run different MPI set-ups: every rank learns of a bad OKTOPK_GPU_AWARE_MPI on
  // any, and a GPU handle's ranks must hand their buffers to MPI alike.
  impl::agree_on_gpu_aware_mpi(comm, where, gpu_aware_mpi(), !impl::runs_on_host_v<ExecSpace>);
  OKTOPK_REQUIRE(n >= 0 && n <= std::numeric_limits<index_type>::max(), std::invalid_argument,
                 where, "n must be in [0, 2^31 - 1], got " << n);
  options.validate();
  // The wires a gradient type takes: float any; double its own or float32; a 16-bit type
  // its own only, named or as native.
  constexpr bool takes_float = std::is_same_v<Value, float>;
  constexpr bool takes_double = std::is_same_v<Value, double>;
  const bool own_type = options.wire == Wire::Native ||
                        (std::is_same_v<Value, bfloat16> && options.wire == Wire::BFloat16) ||
                        (std::is_same_v<Value, float16> && options.wire == Wire::Float16);
  OKTOPK_REQUIRE(takes_float || own_type || (takes_double && options.wire == Wire::Float32),
                 std::invalid_argument, where,
                 "wire=" << options.wire << " does not apply to " << impl::ValueTraits<Value>::name
                         << " gradients, which take wire=native or wire="
                         << (takes_double                      ? Wire::Float32
                             : std::is_same_v<Value, bfloat16> ? Wire::BFloat16
                                                               : Wire::Float16));
  // After the agreement check: every rank has this layout, so every rank throws alike.
  layout.validate(n);
  // Collective, so before build(): a rank that fails there must not leave the others in it.
  const NodeTopology node_topology = NodeTopology::find(comm, options.node_size);
  // The handle's traffic is split inside and between these nodes (ReduceStats).
  const Communicator placed = comm.with_nodes(node_topology.node_of_rank());
  if (options.hierarchical) {
    impl::require_hierarchical_takes<Value>(where, algorithm, options, node_topology);
    const std::int64_t serial = comm.next_serial();
    return impl::make_hierarchical<ExecSpace, Value>(exec, algorithm, placed, n, options, layout,
                                                     node_topology, serial);
  }
  const auto build_core = [&]() -> std::unique_ptr<HandleCore<ExecSpace, Value>> {
    OKTOPK_FAULT_POINT(comm, "construct");
    switch (algorithm) {
      case Algorithm::Dense:
        return std::make_unique<impl::DenseAllreduce<ExecSpace, Value>>(exec, placed, n, options,
                                                                        layout);
      case Algorithm::TopkA:
        return std::make_unique<impl::TopkAllgather<ExecSpace, Value>>(exec, placed, n, options,
                                                                       layout);
      case Algorithm::TopkDSA:
        return std::make_unique<impl::TopkDSA<ExecSpace, Value>>(exec, placed, n, options, layout);
      case Algorithm::GTopk:
        return std::make_unique<impl::GTopk<ExecSpace, Value>>(exec, placed, n, options, layout);
      case Algorithm::GaussianK:
        return std::make_unique<impl::GaussianK<ExecSpace, Value>>(exec, placed, n, options,
                                                                   layout);
      case Algorithm::OkTopk:
        return std::make_unique<impl::OkTopkAllreduce<ExecSpace, Value>>(exec, placed, n, options,
                                                                         layout);
      case Algorithm::S2Reducer:
        return std::make_unique<impl::S2Reducer<ExecSpace, Value>>(exec, placed, n, options,
                                                                   layout);
    }
    throw std::invalid_argument(std::string(where) + ": not an Algorithm value (" +
                                std::to_string(static_cast<int>(algorithm)) + ")");
  };
  // Allocating the buffers can fail on some ranks only (a smaller device, a fuller node): every
  // rank learns of it, with the failing rank's cause (a job's log often keeps rank 0's stderr
  // only), and throws, instead of the others going on to a reduce() that rank never joins.
  // Taken on every rank, whatever happens next, so that the communicator's serials stay equal
  // across ranks.
  const std::int64_t serial = comm.next_serial();
  // The handle around the core allocates too, so it is made inside the agreement.
  return impl::build_on_every_rank(comm, where, [&] {
    auto core = build_core();
    core->set_origin(serial, node_topology);
    return std::make_unique<SparseAllreduce<ExecSpace, Value>>(std::move(core));
  });
}

template <class ExecSpace, class Value>
std::unique_ptr<SparseAllreduce<ExecSpace, Value>> make_hierarchical(
    const ExecSpace& exec, Algorithm algorithm, const Communicator& comm, std::int64_t n,
    const Options& options, const Layout& layout, const NodeTopology& nodes, std::int64_t serial) {
  constexpr const char* where = "oktopk::make_sparse_allreduce";
  const int L = nodes.local_size();
  const int local_rank = nodes.local_rank();
  // The node's ranks by local rank; a local rank's ranks, one per node, by node.
  const Communicator node = comm.split(nodes.node(), local_rank);
  const Communicator across = comm.split(local_rank, nodes.node());
  const std::int64_t shard =
      hierarchy_shard_begin(n, L, local_rank + 1) - hierarchy_shard_begin(n, L, local_rank);
  // The method's handle is flat, among its ranks, each its own node.
  Options method_options = options;
  method_options.hierarchical = false;
  method_options.node_size = 1;
  return build_on_every_rank(comm, where, [&] {
    // Collective among the local rank's ranks only: it throws on all of them alike.
    // Without the layout: the methods the mode takes compute the same without one, and
    // the handle counts the output per segment itself.
    auto method = make_sparse_allreduce<ExecSpace, Value>(exec, algorithm, across, shard,
                                                          method_options, Layout());
    OKTOPK_FAULT_POINT(comm, "construct");
    auto core = std::make_unique<HierarchicalAllreduce<ExecSpace, Value>>(
        exec, algorithm, comm, n, options, layout, node, std::move(method));
    core->set_origin(serial, nodes);
    return std::make_unique<SparseAllreduce<ExecSpace, Value>>(std::move(core));
  });
}
}  // namespace impl

}  // namespace oktopk
