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

/// shard(i) = method(i) / divisor + add * magnitudes(begin + i) (a NaN, "either answer",
/// stays NaN), for the expected values (add = 0) and their slack.
template <class Shard, class Method, class Magnitudes>
struct HierarchyShardFromMethod {
  Shard shard;
  Method method;
  Magnitudes magnitudes;
  std::int64_t begin = 0;
  float divisor = 1.0f;
  typename Shard::non_const_value_type add = 0;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    using Real = typename Shard::non_const_value_type;
    shard(i) = method(i) / divisor + (add != Real(0) ? add * magnitudes(begin + i) : Real(0));
  }
};

/// x(i) = |x(i)|.
template <class X>
struct AbsoluteInPlace {
  X x;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const { x(i) = abs(x(i)); }
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
/// ranks per node L. The node sums are formed here by MPI_Allreduce and in the call in local
/// rank order, which may differ: for L >= 3 each node sum may then differ by
/// 2(L - 1)·u·sum over its ranks of |acc|, and the output by that over the nodes / P, which
/// the slack adds (a + b == b + a, so nothing for L <= 2).
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
  const auto P = static_cast<Real>(handle.communicator().size());
  const std::int64_t begin = handle.shard_begin();
  const std::int64_t shard = method.size();

  const auto node_acc = make_uninitialized<Real>(exec, "oktopk::expected_result::node_acc",
                                                 static_cast<std::size_t>(n));
  Kokkos::deep_copy(exec, node_acc, acc);
  mpi_allreduce_in_place(exec, node, node_acc, MPI_SUM);
  const auto magnitudes = make_uninitialized<Real>(exec, "oktopk::expected_result::magnitudes",
                                                   static_cast<std::size_t>(L >= 3 ? n : 0));
  if (L >= 3) {
    Kokkos::deep_copy(exec, magnitudes, acc);
    Kokkos::parallel_for("oktopk::expected_result::magnitudes", RangeOf<ExecSpace>(exec, 0, n),
                         AbsoluteInPlace<OracleVector<ExecSpace, Real>>{magnitudes});
    mpi_allreduce_in_place(exec, handle.communicator(), magnitudes, MPI_SUM);
  }

  const auto range =
      Kokkos::make_pair(static_cast<std::size_t>(begin), static_cast<std::size_t>(begin + shard));
  const auto method_acc = make_uninitialized<Real>(exec, "oktopk::expected_result::method_acc",
                                                   static_cast<std::size_t>(shard));
  Kokkos::deep_copy(exec, method_acc, Kokkos::subview(node_acc, range));
  const auto method_expected = make_uninitialized<Real>(
      exec, "oktopk::expected_result::method_expected", static_cast<std::size_t>(shard));
  const auto method_slack = make_uninitialized<Real>(exec, "oktopk::expected_result::method_slack",
                                                     static_cast<std::size_t>(shard));
  expected_result(exec, method, method_acc, method_expected, tol, method_slack);

  using Shard = decltype(Kokkos::subview(expected, range));
  using Method = OracleVector<ExecSpace, Real>;
  const auto divisor = static_cast<float>(L);
  Kokkos::parallel_for(
      "oktopk::expected_result::shard", RangeOf<ExecSpace>(exec, 0, shard),
      HierarchyShardFromMethod<Shard, Method, Method>{
          Kokkos::subview(expected, range), method_expected, magnitudes, begin, divisor, Real(0)});
  const Real order = L >= 3 ? Real(2) * Real(L - 1) * roundoff_v<Real> / P : Real(0);
  Kokkos::parallel_for(
      "oktopk::expected_result::shard_slack", RangeOf<ExecSpace>(exec, 0, shard),
      HierarchyShardFromMethod<Shard, Method, Method>{Kokkos::subview(slack, range), method_slack,
                                                      magnitudes, begin, divisor, order});
  gather_node_shards(exec, node, n, expected);
  gather_node_shards(exec, node, n, slack);
}

}  // namespace oktopk::impl
