// SPDX-License-Identifier: BSD-3-Clause
// NodeTopology: the ranks of a communicator grouped into nodes.
#include <oktopk/communicator.hpp>
#include <oktopk/error.hpp>
#include <oktopk/node_topology.hpp>
#include <oktopk/impl/comm/mpi_check.hpp>

#include <algorithm>
#include <climits>
#include <stdexcept>

namespace oktopk {

namespace {
constexpr const char* kFind = "oktopk::NodeTopology::find";
}  // namespace

NodeTopology::NodeTopology() : node_of_rank_{0}, node_sizes_{1} {}

NodeTopology NodeTopology::find(const Communicator& comm, std::int64_t node_size) {
  // Ranks that were given different sizes would take different paths below and wait for each
  // other: every rank learns of it first.
  comm.check_agreement(kFind, {{"node_size", node_size}});
  OKTOPK_REQUIRE(node_size >= 0 && node_size <= INT_MAX, std::invalid_argument, kFind,
                 "node_size must be in [0, "
                     << INT_MAX << "] (0: the ranks that share memory), got " << node_size);
  const int P = comm.size();
  // Every rank names its node by the node's lowest rank; one allgather tells every rank all
  // of them, so every rank builds the same topology.
  int lowest_on_node = 0;
  if (node_size > 0) {
    lowest_on_node = comm.rank() - comm.rank() % static_cast<int>(node_size);
  } else {
    const Communicator node = comm.split_shared_memory();
    // Ranked as in comm: local rank 0 is the node's lowest rank, which it tells the others.
    lowest_on_node = comm.rank();
    node.bcast(&lowest_on_node, 1, 0);
  }
  std::vector<int> lowest(P);
  comm.allgather(&lowest_on_node, 1, lowest.data());

  NodeTopology topology;
  topology.forced_node_size_ = node_size;
  topology.node_of_rank_.assign(P, -1);
  topology.node_sizes_.clear();
  std::vector<int> node_of_lowest(P, -1);  // by a node's lowest rank: its number
  for (int r = 0; r < P; ++r) {
    const int leader = lowest[r];
    // A rank's node starts at a rank no higher than its own, and that rank agrees.
    OKTOPK_REQUIRE(leader >= 0 && leader <= r && lowest[leader] == leader, std::runtime_error,
                   kFind,
                   "MPI_Comm_split_type grouped rank " << r << " with rank " << leader
                                                       << ", which does not group with itself");
    if (node_of_lowest[leader] < 0) {
      node_of_lowest[leader] = static_cast<int>(topology.node_sizes_.size());
      topology.node_sizes_.push_back(0);
    }
    const int node = node_of_lowest[leader];
    if (r == comm.rank()) {
      topology.node_ = node;
      topology.local_rank_ = topology.node_sizes_[node];
    }
    topology.node_of_rank_[r] = node;
    ++topology.node_sizes_[node];
  }
  return topology;
}

int NodeTopology::min_local_size() const {
  return *std::min_element(node_sizes_.begin(), node_sizes_.end());
}

int NodeTopology::max_local_size() const {
  return *std::max_element(node_sizes_.begin(), node_sizes_.end());
}

bool operator==(const NodeTopology& a, const NodeTopology& b) {
  return a.node_of_rank_ == b.node_of_rank_ && a.node_ == b.node_ &&
         a.local_rank_ == b.local_rank_ && a.forced_node_size_ == b.forced_node_size_;
}

bool operator!=(const NodeTopology& a, const NodeTopology& b) { return !(a == b); }

std::ostream& operator<<(std::ostream& os, const NodeTopology& topology) {
  const int nodes = topology.nodes();
  os << nodes << (nodes == 1 ? " node" : " nodes");
  if (topology.uniform()) {
    os << " x " << topology.max_local_size()
       << (topology.max_local_size() == 1 ? " rank" : " ranks");
  } else {
    os << " of " << topology.min_local_size() << " to " << topology.max_local_size() << " ranks";
  }
  if (topology.forced_node_size() > 0) {
    return os << " (node_size=" << topology.forced_node_size() << ")";
  }
  return os << " (shared memory)";
}

}  // namespace oktopk
