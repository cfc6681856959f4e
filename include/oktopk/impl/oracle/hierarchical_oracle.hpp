// SPDX-License-Identifier: BSD-3-Clause
// The oracle of the hierarchical mode, from its definition (docs/algorithms.md, "The
// hierarchical mode"): on each shard, the flat method's oracle over the node sums of the
// ranks' inputs, divided by the ranks per node.
#pragma once

#include <oktopk/communicator.hpp>
#include <oktopk/oracle.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/comm/mpi_mirror.hpp>
#include <oktopk/impl/handle/hierarchical.hpp>
#include <oktopk/impl/oracle/common.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <vector>

namespace oktopk::impl {

/// shard(i) = method(i) / divisor (a NaN, "either answer", stays NaN), for the expected values
/// and their slack.
template <class Shard, class Method>
struct HierarchyShardFromMethod {
  Shard shard;
  Method method;
  float divisor = 1.0f;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    shard(i) = method(i) / divisor;
  }
};

/// sums(i) = the node's ranks' acc at entry begin + i, summed left to right in local rank
/// order (`gathered` holds local rank s's n entries at s·n), as the call sums them.
template <class Sums, class Gathered>
struct NodeSumInRankOrder {
  Sums sums;
  Gathered gathered;
  std::int64_t n = 0;
  std::int64_t begin = 0;
  int local_ranks = 1;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    auto sum = gathered(begin + i);
    for (int s = 1; s < local_ranks; ++s) sum += gathered(s * n + begin + i);
    sums(i) = sum;
  }
};

/// The node's allgather of each rank's shard of `shards` (n entries, this rank's own filled)
/// into all of it.
template <class ExecSpace, class View>
void gather_node_shards(const ExecSpace& exec, const Communicator& node, std::int64_t n,
                        const View& shards) {
  const int L = node.size();
  std::vector<int> counts(static_cast<std::size_t>(L));
  std::vector<int> displacements(static_cast<std::size_t>(L));
  for (int s = 0; s < L; ++s) {
    displacements[s] = static_cast<int>(hierarchy_shard_begin(n, L, s));
    counts[s] = static_cast<int>(hierarchy_shard_begin(n, L, s + 1)) - displacements[s];
  }
  const int mine = node.rank();
  const auto own = Kokkos::subview(
      shards, Kokkos::make_pair(static_cast<std::size_t>(displacements[mine]),
                                static_cast<std::size_t>(displacements[mine] + counts[mine])));
  // MPI reads the own shard from a copy: the receive buffer holds it too.
  const auto copy = make_uninitialized<typename View::non_const_value_type>(
      exec, "oktopk::expected_result::own_shard", own.extent(0));
  Kokkos::deep_copy(exec, copy, own);
  const auto send = mpi_send_view(exec, copy);
  auto receive = mpi_receive_view(exec, shards);
  node.allgatherv(send.data(), counts[mine], receive.data(), counts.data(), displacements.data());
  mpi_received(exec, receive, shards, 0, n);
}

/// The hierarchical mode's expected output and slack: on each shard, the flat oracle of the
/// method (expected_result on the method's handle) over the node sums of acc, divided by the
/// ranks per node L. The node sums are added in local rank order, as the call adds them, so
/// they are the method's very input.
template <class ExecSpace, class Value, class Real = arithmetic_t<Value>>
void expected_hierarchical(const ExecSpace& exec,
                           const HierarchicalAllreduce<ExecSpace, Value>& handle,
                           const OracleConstVector<ExecSpace, Real>& acc,
                           const OracleVector<ExecSpace, Real>& expected,
                           const OracleVector<ExecSpace, Real>& slack, float tol) {
  const Communicator& node = handle.node_communicator();
  const auto& method = handle.across_nodes();
  const std::int64_t n = handle.size();
  const int L = node.size();
  const std::int64_t begin = handle.shard_begin();
  const std::int64_t shard = method.size();

  // Every rank of the node gets every rank's acc, then sums this rank's shard.
  const auto gathered = make_uninitialized<Real>(exec, "oktopk::expected_result::node_acc",
                                                 static_cast<std::size_t>(n * L));
  {
    const auto send = mpi_send_view(exec, acc);
    auto receive = mpi_receive_view(exec, gathered);
    node.allgather(send.data(), n, receive.data());
    mpi_received(exec, receive, gathered, 0, n * L);
  }
  const auto method_acc = make_uninitialized<Real>(exec, "oktopk::expected_result::method_acc",
                                                   static_cast<std::size_t>(shard));
  Kokkos::parallel_for(
      "oktopk::expected_result::node_sums", RangeOf<ExecSpace>(exec, 0, shard),
      NodeSumInRankOrder<OracleVector<ExecSpace, Real>, OracleVector<ExecSpace, Real>>{
          method_acc, gathered, n, begin, L});
  const auto method_expected = make_uninitialized<Real>(
      exec, "oktopk::expected_result::method_expected", static_cast<std::size_t>(shard));
  const auto method_slack = make_uninitialized<Real>(exec, "oktopk::expected_result::method_slack",
                                                     static_cast<std::size_t>(shard));
  expected_result(exec, method, method_acc, method_expected, tol, method_slack);

  const auto range =
      Kokkos::make_pair(static_cast<std::size_t>(begin), static_cast<std::size_t>(begin + shard));
  using Shard = decltype(Kokkos::subview(expected, range));
  using Method = OracleVector<ExecSpace, Real>;
  const auto divisor = static_cast<float>(L);
  Kokkos::parallel_for("oktopk::expected_result::shard", RangeOf<ExecSpace>(exec, 0, shard),
                       HierarchyShardFromMethod<Shard, Method>{Kokkos::subview(expected, range),
                                                               method_expected, divisor});
  Kokkos::parallel_for("oktopk::expected_result::shard_slack", RangeOf<ExecSpace>(exec, 0, shard),
                       HierarchyShardFromMethod<Shard, Method>{Kokkos::subview(slack, range),
                                                               method_slack, divisor});
  gather_node_shards(exec, node, n, expected);
  gather_node_shards(exec, node, n, slack);
}

}  // namespace oktopk::impl
