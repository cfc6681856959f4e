// SPDX-License-Identifier: BSD-3-Clause
// What one SparseAllreduce::reduce call did: time and traffic per phase, selection counts and
// the thresholds it used (so a checker can rebuild its result from dense data).
#pragma once

#include <oktopk/communicator.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace oktopk {

/// \brief Time and traffic of one phase of one call, on this rank.
struct PhaseStats {
  double seconds = 0.0;
  PhaseTraffic traffic;
};

/// \brief One segment of a handle's Layout in the last call's output.
struct SegmentStats {
  std::string name;
  /// Non-zero entries of the output in the segment (the same on every rank).
  std::int64_t nonzeros = 0;
};

/// \brief Statistics of the last reduce call, on this rank.
struct ReduceStats {
  /// Calls made so far, this one included.
  std::int64_t iteration = 0;
  /// This call was a dense allreduce (a warm-up call, or the dense method).
  bool dense = false;
  /// The k this handle aims at: floor(density * n).
  std::int64_t k = 0;
  /// Entries this rank contributed (|acc| > local_threshold, or its share of the tree).
  std::int64_t local_selected = 0;
  /// Entries of the global result: the entries allgathered (topka and gaussiank: every rank's
  /// pairs, so an index chosen by several ranks counts several times), the globally selected
  /// entries (oktopk, topkdsa, gtopk), n (dense), or the entries decoded (s2).
  std::int64_t global_selected = 0;
  /// This rank's entries were those with |acc| > local_threshold (-Inf: all of them).
  float local_threshold = 0.0f;
  /// Entries of the reduced sum with |sum| > global_threshold were kept (-Inf: all of them).
  float global_threshold = 0.0f;
  /// The local and global thresholds were recomputed exactly in this call.
  bool local_threshold_exact = false;
  bool global_threshold_exact = false;
  /// Ok-Topk: region boundaries were recomputed, and the result was balanced, in this call.
  bool repartitioned = false;
  bool balanced = false;
  /// TopkDSA: the allgather carried the dense regions.
  bool dense_switch = false;
  /// The call was a reduce_scatter: this rank received its shard only.
  bool reduce_scatter = false;
  /// A top-k method (topka, topkdsa, gaussiank, oktopk, gtopk) selected nothing on any rank
  /// although some rank's input had a non-zero entry: the output is all zero and the whole
  /// input stays in the residual. The methods' tie rules (docs/algorithms.md) keep this from
  /// happening; a training loop can check it. The same on every rank.
  bool selected_nothing = false;
  /// Time and traffic by phase (selection, split_reduce, allgatherv, ...).
  std::map<std::string, PhaseStats> phases;
  /// Per segment of the handle's Layout, in its order: the output's non-zeros (one count per
  /// segment after the call). Empty for handles without a layout.
  std::vector<SegmentStats> segments;

  double total_seconds() const;
  PhaseTraffic total_traffic() const;
};

}  // namespace oktopk
