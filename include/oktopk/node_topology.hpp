// SPDX-License-Identifier: BSD-3-Clause
// Which node each rank of a communicator runs on: found from shared memory, or forced into
// groups of a given size (for tests, and to emulate nodes on one machine). The level below it,
// a node's ranks, is where a hierarchical allreduce keeps its dense work.
#pragma once

#include <oktopk/fwd.hpp>

#include <cstdint>
#include <ostream>
#include <vector>

namespace oktopk {

/// \brief The ranks of a communicator grouped into nodes, the same on every rank.
///
/// Nodes are numbered 0, 1, ... in the order of their lowest rank, and a node's ranks have
/// local ranks 0, 1, ... in the order of their rank. A node's ranks need not be consecutive
/// (a launcher that deals ranks round-robin over the nodes puts rank r on node r mod N).
class NodeTopology {
 public:
  /// The topology of a communicator of one rank: one node, holding that rank.
  NodeTopology();

  /// \brief Collective over `comm`. `node_size` = 0: the ranks that can share memory form a
  /// node (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED); `node_size` = L > 0: ranks
  /// 0..L-1 form node 0, L..2L-1 node 1 and so on, the last node smaller when L does not
  /// divide the communicator's size (one node when L >= size). Throws
  /// std::invalid_argument("oktopk::NodeTopology::find: ...") on every rank if the ranks pass
  /// different node sizes, or a negative one or one above 2^31 - 1, and std::runtime_error if
  /// an MPI call fails.
  static NodeTopology find(const Communicator& comm, std::int64_t node_size);

  /// Ranks of the communicator (P).
  int ranks() const { return static_cast<int>(node_of_rank_.size()); }
  /// Nodes (N).
  int nodes() const { return static_cast<int>(node_sizes_.size()); }
  /// This rank's node.
  int node() const { return node_; }
  /// This rank's position among its node's ranks.
  int local_rank() const { return local_rank_; }
  /// Ranks on this rank's node.
  int local_size() const { return node_sizes_[node_]; }
  /// The node of `rank` (0 <= rank < ranks()).
  int node_of(int rank) const { return node_of_rank_.at(rank); }
  /// Every rank's node, by rank (Communicator::with_nodes takes it).
  const std::vector<int>& node_of_rank() const { return node_of_rank_; }
  /// Ranks on `node` (0 <= node < nodes()).
  int size_of(int node) const { return node_sizes_.at(node); }
  /// The fewest and the most ranks on one node.
  int min_local_size() const;
  int max_local_size() const;
  /// Whether every node has the same number of ranks.
  bool uniform() const { return min_local_size() == max_local_size(); }
  /// The node_size find() was given: 0 when the nodes come from shared memory.
  std::int64_t forced_node_size() const { return forced_node_size_; }

  friend bool operator==(const NodeTopology& a, const NodeTopology& b);

 private:
  std::vector<int> node_of_rank_;
  std::vector<int> node_sizes_;
  int node_ = 0;
  int local_rank_ = 0;
  std::int64_t forced_node_size_ = 0;
};

bool operator!=(const NodeTopology& a, const NodeTopology& b);

/// One line for logs: "2 nodes x 4 ranks (shared memory)", "3 nodes of 2 to 3 ranks
/// (node_size=3)".
std::ostream& operator<<(std::ostream& os, const NodeTopology& topology);

}  // namespace oktopk
