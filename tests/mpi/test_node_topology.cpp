// SPDX-License-Identifier: BSD-3-Clause
// NodeTopology: nodes forced into groups of node_size ranks (checked against the arithmetic of
// the definition), nodes found from shared memory (checked against the ranks' processor names),
// bad sizes, the printed form, and the topology a handle finds when it is made.
#include "mpi/mpi_test_utils.hpp"
#include <oktopk/any_space.hpp>
#include <oktopk/node_topology.hpp>

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace {

using oktopk::Communicator;
using oktopk::NodeTopology;
using oktopk::test::invalid_argument_of;

std::string printed(const NodeTopology& topology) {
  std::ostringstream os;
  os << topology;
  return os.str();
}

TEST(NodeTopology, DefaultIsOneRankAlone) {
  const NodeTopology alone;
  EXPECT_EQ(alone.ranks(), 1);
  EXPECT_EQ(alone.nodes(), 1);
  EXPECT_EQ(alone.node(), 0);
  EXPECT_EQ(alone.local_rank(), 0);
  EXPECT_EQ(alone.local_size(), 1);
  EXPECT_TRUE(alone.uniform());
}

TEST(NodeTopology, ForcedSizesGroupConsecutiveRanks) {
  const Communicator comm;
  const int P = comm.size();
  const int rank = comm.rank();
  // Sizes that divide P, that do not (the last node smaller), 1, P, and above P.
  for (const int L : {1, 2, 3, 4, 5, P, P + 3}) {
    SCOPED_TRACE("node_size " + std::to_string(L));
    const NodeTopology topology = NodeTopology::find(comm, L);
    const int nodes = (P + L - 1) / L;
    EXPECT_EQ(topology.ranks(), P);
    EXPECT_EQ(topology.nodes(), nodes);
    EXPECT_EQ(topology.node(), rank / L);
    EXPECT_EQ(topology.local_rank(), rank % L);
    EXPECT_EQ(topology.forced_node_size(), L);
    const int last = P - (nodes - 1) * L;
    for (int node = 0; node < nodes; ++node) {
      EXPECT_EQ(topology.size_of(node), node + 1 < nodes ? L : last) << "node " << node;
    }
    for (int r = 0; r < P; ++r) EXPECT_EQ(topology.node_of(r), r / L) << "rank " << r;
    EXPECT_EQ(topology.local_size(), rank / L + 1 < nodes ? L : last);
    EXPECT_EQ(topology.max_local_size(), nodes > 1 ? L : P);
    EXPECT_EQ(topology.min_local_size(), last);
    EXPECT_EQ(topology.uniform(), last == topology.max_local_size());
    EXPECT_EQ(topology, NodeTopology::find(comm, L));
    if (topology.uniform()) {
      EXPECT_EQ(printed(topology), std::to_string(nodes) + (nodes == 1 ? " node x " : " nodes x ") +
                                       std::to_string(last) + (last == 1 ? " rank" : " ranks") +
                                       " (node_size=" + std::to_string(L) + ")");
    } else {
      EXPECT_EQ(printed(topology), std::to_string(nodes) + " nodes of " + std::to_string(last) +
                                       " to " + std::to_string(L) +
                                       " ranks (node_size=" + std::to_string(L) + ")");
    }
  }
}

TEST(NodeTopology, SharedMemoryGroupsTheRanksOfOneMachine) {
  const Communicator comm;
  const NodeTopology topology = NodeTopology::find(comm, 0);
  const std::vector<int> same_node = oktopk::test::ranks_named_like_this_one();
  EXPECT_EQ(topology.forced_node_size(), 0);
  EXPECT_EQ(topology.ranks(), comm.size());
  EXPECT_EQ(topology.local_size(), static_cast<int>(same_node.size()));
  EXPECT_EQ(topology.node_of(same_node.front()), topology.node());
  for (std::size_t i = 0; i < same_node.size(); ++i) {
    EXPECT_EQ(topology.node_of(same_node[i]), topology.node());
    if (same_node[i] == comm.rank()) EXPECT_EQ(topology.local_rank(), static_cast<int>(i));
  }
  // Nodes are numbered in the order of their lowest rank.
  EXPECT_EQ(topology.node_of(0), 0);
  EXPECT_NE(printed(topology).find("(shared memory)"), std::string::npos) << printed(topology);
}

TEST(NodeTopology, RejectsSizesOutsideTheRange) {
  const Communicator comm;
  for (const std::int64_t bad : {std::int64_t{-1}, std::int64_t{1} << 31}) {
    const std::string message = invalid_argument_of([&] { NodeTopology::find(comm, bad); });
    EXPECT_EQ(message.rfind("oktopk::NodeTopology::find: node_size must be in [0, ", 0), 0)
        << message;
  }
}

TEST(NodeTopology, SizesThatDifferAcrossRanksThrowOnEveryRank) {
  const Communicator comm;
  if (comm.size() < 2) GTEST_SKIP() << "needs two ranks";
  // The last rank asks for shared memory, the others for nodes of 2.
  const std::string message = invalid_argument_of(
      [&] { NodeTopology::find(comm, comm.rank() == comm.size() - 1 ? 0 : 2); });
  EXPECT_EQ(message.rfind("oktopk::NodeTopology::find: ", 0), 0) << message;
  EXPECT_NE(message.find("node_size"), std::string::npos) << message;
}

TEST(NodeTopology, AHandleFindsItsNodesWhenItIsMade) {
  const Communicator comm;
  using Exec = Kokkos::DefaultHostExecutionSpace;
  for (const std::int64_t node_size : {0, 2, 3}) {
    SCOPED_TRACE("node_size " + std::to_string(node_size));
    const auto handle = oktopk::make_sparse_allreduce<Exec>(
        oktopk::Algorithm::TopkA, comm, 100, oktopk::Options{}.set_node_size(node_size));
    EXPECT_EQ(handle->node_topology(), NodeTopology::find(comm, node_size));
  }
  // A bad size is the options' error, on every rank, before any collective of the search.
  const std::string message = invalid_argument_of([&] {
    oktopk::make_sparse_allreduce<Exec>(oktopk::Algorithm::TopkA, comm, 100,
                                        oktopk::Options{}.set_node_size(-2));
  });
  EXPECT_EQ(message.rfind("oktopk::Options::validate: node_size must be in [0, ", 0), 0) << message;
}

}  // namespace
