// SPDX-License-Identifier: BSD-3-Clause
// Tuning of the sparse allreduce methods, with the defaults of the Ok-Topk reference (VGG-16)
// where it has one. Every field must be equal on all ranks (checked when a handle is made).
#pragma once

#include <cstdint>
#include <ostream>
#include <string_view>

namespace oktopk {

/// \brief When Ok-Topk redistributes the globally selected entries before the allgatherv.
enum class Balancing {
  Off,      ///< never (the reference's VGG and LSTM runs)
  On,       ///< always (its BERT runs)
  Adaptive  ///< when the largest rank's share exceeds balance_threshold times the mean
};

/// \brief How dense allreduces (method dense, and every method's warm-up calls) sum the ranks'
/// gradients (Options::dense_allreduce).
enum class DenseAlgorithm {
  Mpi,   ///< MPI_Allreduce (the MPI library's own algorithm choice), then a division pass
  Ring,  ///< OkTopk's ring: a reduce-scatter, then an allgather, P - 1 steps each; the division
         ///< by P and the finiteness check ride on the last reduce step, so the output is
         ///< written once. For large vectors, and networks where MPI's default algorithm is
         ///< poor; on GPUs each step waits for the device.
  Auto   ///< the ring on host execution spaces where each rank's chunk, n / P values, holds at
         ///< least dense_ring_min_chunk of them (bandwidth rules there), else MPI_Allreduce
};

/// The smallest chunk (values per rank, n / P) for which DenseAlgorithm::Auto takes the ring:
/// below it the ring's 2 (P - 1) messages cost more than MPI_Allreduce's own algorithm
/// (docs/benchmarks.md, "The default dense path against a bare MPI_Allreduce").
inline constexpr std::int64_t dense_ring_min_chunk = std::int64_t{1} << 14;

/// \brief The type of the values a call sends (Options::wire). Indices stay 32-bit.
enum class Wire {
  Native,    ///< the gradient's own type
  Float32,   ///< float (for float gradients the same as native)
  BFloat16,  ///< bfloat16: half the bytes of float, float's range, 8 bits of precision
  Float16    ///< IEEE binary16: half the bytes of float, 11 bits of precision, |x| <= 65504
};

/// \brief Options of every method; each method reads the fields that concern it.
struct Options {
  // ---- all sparse methods
  /// k = floor(density * n) entries are selected (0 <= density <= 1).
  double density = 0.01;
  /// The first `warmup_iterations` calls are dense allreduces (error feedback restarts after).
  std::int64_t warmup_iterations = 0;
  /// Seed of every pseudo-random choice (sampling, S2's hashes); must match across ranks.
  std::uint64_t seed = 42;
  /// The algorithm of dense allreduces.
  DenseAlgorithm dense_allreduce = DenseAlgorithm::Auto;
  /// The type of the values on the wire: native (the gradient's own), or one narrower than
  /// the arithmetic type, bf16 or fp16 for float gradients and fp32 for double ones; a 16-bit
  /// gradient always travels as itself. A narrower wire rounds each value to it when sending;
  /// the ranks' sums are still formed in the arithmetic type. Dense allreduces on a narrower
  /// wire run on OkTopk's ring whatever dense_allreduce says (MPI has no 16-bit floating
  /// type), and so does S2's sketch table. The methods with error feedback keep each sent
  /// value's rounding error in the sender's residual (gtopk: where the result kept the value).
  Wire wire = Wire::Native;
  /// How the ranks group into nodes (NodeTopology::find): 0, the ranks that share memory;
  /// L > 0, consecutive groups of L ranks (the last smaller when L does not divide P), to test
  /// or emulate several nodes on one machine. A handle finds its nodes when it is made
  /// (SparseAllreduce::node_topology()).
  std::int64_t node_size = 0;
  /// The hierarchical mode (methods dense, topka, topkdsa, gaussiank and oktopk, for float
  /// and double gradients, with or without a layout, on nodes of equal size, wire native or
  /// the gradient's own type): the node's ranks reduce-scatter their gradients, so that each owns
  /// the node's sum over one shard of about n/L entries; the method runs across the nodes,
  /// among the ranks with the same local rank, on that shard (error feedback on the node sum);
  /// the node's ranks allgather the shards' results. The result is the method applied to the
  /// node sums shard by shard, divided by P (docs/algorithms.md, "The hierarchical mode").
  bool hierarchical = false;

  // ---- Ok-Topk
  /// tau': the local and the global threshold are recomputed exactly every this many calls.
  std::int64_t threshold_period = 32;
  /// tau: region boundaries are recomputed from the local selections every this many calls.
  /// The reference's 64 lets regions go stale on training gradients, whose large entries move
  /// between layers: one rank's region then receives most of the others' selections, and the
  /// call exceeds the 6k-word bound. Every 8 calls keeps every call of the replayed training
  /// traces under it (docs/benchmarks.md); a repartition costs one allreduce of P - 1 numbers
  /// and a selection that filters the accumulate pass's candidates (host spaces).
  std::int64_t repartition_period = 8;
  /// Regions fixed at the equal parts [r·n/P, (r+1)·n/P), which are reduce_scatter's default
  /// shards, instead of recomputed from the local selections: what a reduce-scatter without
  /// the balance would do (docs/benchmarks.md measures what it costs on skewed gradients).
  bool equal_regions = false;
  /// Messages in flight per group of the split-and-reduce (min(throttle, P - 1)).
  int throttle = 4;
  Balancing balancing = Balancing::Adaptive;
  /// Adaptive balancing starts when max share > balance_threshold * mean share.
  double balance_threshold = 1.25;
  /// Guard on reused thresholds (local, and global over all ranks): while more than
  /// guard_factor * k entries pass, multiply the threshold by guard_step; while fewer than
  /// guard_low * k pass, divide it (never to where more than guard_factor * k pass); at most
  /// guard_loops steps. The reference raises only (guard_low = 0) and uses guard_factor 4/3
  /// for VGG; 1.1 keeps Ok-Topk's traffic near its bound on gradients that change between
  /// calls, and 0.9 keeps its output near k when the gradient's scale falls, as it does in
  /// training (docs/benchmarks.md).
  double guard_low = 0.9;
  double guard_factor = 1.1;
  double guard_step = 1.03;
  int guard_loops = 5;
  /// When the guard's steps end with the count still outside [guard_low·k, guard_factor·k],
  /// recompute the threshold exactly (as on the calls of threshold_period), so the output
  /// stays near k whatever the gradient does: on training gradients the guard's steps alone
  /// leave it at 0.7 to 0.85 k (docs/benchmarks.md). The global recomputation's histograms
  /// are at most 0.24 k words from k = 512 on. The reference has no such fallback (off).
  bool guard_exact = true;
  /// How the guard finds a reused threshold. On: it counts 16 levels in one pass and takes
  /// the one whose count is nearest k; their spacing follows how steeply the count falls
  /// with the threshold, measured at the previous call, and they centre where the threshold
  /// is heading. The global levels' counts travel with the allgather of counts the call makes
  /// anyway, so the guard costs no message round of its own; the nudges are not used. Off:
  /// the walk above, one guard_step at a time, with the nudges (the spec's guard; the
  /// reference's with guard_low = 0 and guard_exact off). On gradients whose count moves by
  /// tens of percent per 3 % of threshold, the walk's steps jump over the range and
  /// guard_exact then recomputes nearly every call (docs/benchmarks.md).
  bool guard_ladder = true;
  /// The nudges, with guard_ladder off only. After the split phase: fewer than local_low * k
  /// selected -> threshold /= local_step; more than local_high * k -> threshold *= local_step.
  double local_low = 2.0 / 3.0;
  double local_high = 5.0 / 4.0;
  double local_step = 1.012;
  /// After the global selection: fewer than global_low * k -> threshold /= global_step;
  /// more than global_high * k -> threshold *= global_step.
  double global_low = 2.0 / 3.0;
  double global_high = 4.0 / 3.0;
  double global_step = 1.008;

  // ---- Gaussian-k correction loops: while the count is below gaussian_low * k divide the
  // threshold by gaussian_step, while above gaussian_high * k multiply (at most gaussian_loops).
  double gaussian_low = 3.0 / 4.0;
  double gaussian_high = 5.0 / 4.0;
  double gaussian_step = 1.02;
  int gaussian_loops = 20;

  // ---- S2 Reducer: the gradient is read as rows of s2_row_width entries (with a Layout, its
  // SparseRows segments are, each with its own width, and this field is not used)
  std::int64_t s2_row_width = 64;
  /// Rows of the count sketch, 1 to 15 (the decode takes the median over them).
  int s2_sketch_rows = 3;
  /// Columns of the count sketch; 0 means ceil(2 * density * n), where with a Layout n counts
  /// the entries of its SparseRows segments (the sketched ones). A sketch at least as wide as
  /// the entries it holds hashes each one to itself (an exact sketch).
  std::int64_t s2_sketch_columns = 0;
  /// Keep what the sketch lost (own entries minus their decoded estimate) for the next call.
  bool s2_error_feedback = false;

  Options& set_density(double v) {
    density = v;
    return *this;
  }
  Options& set_warmup_iterations(std::int64_t v) {
    warmup_iterations = v;
    return *this;
  }
  Options& set_seed(std::uint64_t v) {
    seed = v;
    return *this;
  }
  Options& set_dense_allreduce(DenseAlgorithm v) {
    dense_allreduce = v;
    return *this;
  }
  Options& set_wire(Wire v) {
    wire = v;
    return *this;
  }
  Options& set_node_size(std::int64_t v) {
    node_size = v;
    return *this;
  }
  Options& set_hierarchical(bool v) {
    hierarchical = v;
    return *this;
  }
  Options& set_threshold_period(std::int64_t v) {
    threshold_period = v;
    return *this;
  }
  Options& set_repartition_period(std::int64_t v) {
    repartition_period = v;
    return *this;
  }
  Options& set_equal_regions(bool v) {
    equal_regions = v;
    return *this;
  }
  Options& set_throttle(int v) {
    throttle = v;
    return *this;
  }
  Options& set_balancing(Balancing v) {
    balancing = v;
    return *this;
  }
  Options& set_balance_threshold(double v) {
    balance_threshold = v;
    return *this;
  }
  Options& set_s2_row_width(std::int64_t v) {
    s2_row_width = v;
    return *this;
  }
  Options& set_s2_sketch_rows(int v) {
    s2_sketch_rows = v;
    return *this;
  }
  Options& set_s2_sketch_columns(std::int64_t v) {
    s2_sketch_columns = v;
    return *this;
  }
  Options& set_s2_error_feedback(bool v) {
    s2_error_feedback = v;
    return *this;
  }
  Options& set_guard_low(double v) {
    guard_low = v;
    return *this;
  }
  Options& set_guard_factor(double v) {
    guard_factor = v;
    return *this;
  }
  Options& set_guard_step(double v) {
    guard_step = v;
    return *this;
  }
  Options& set_guard_loops(int v) {
    guard_loops = v;
    return *this;
  }
  Options& set_guard_exact(bool v) {
    guard_exact = v;
    return *this;
  }
  Options& set_guard_ladder(bool v) {
    guard_ladder = v;
    return *this;
  }
  Options& set_local_low(double v) {
    local_low = v;
    return *this;
  }
  Options& set_local_high(double v) {
    local_high = v;
    return *this;
  }
  Options& set_local_step(double v) {
    local_step = v;
    return *this;
  }
  Options& set_global_low(double v) {
    global_low = v;
    return *this;
  }
  Options& set_global_high(double v) {
    global_high = v;
    return *this;
  }
  Options& set_global_step(double v) {
    global_step = v;
    return *this;
  }
  Options& set_gaussian_low(double v) {
    gaussian_low = v;
    return *this;
  }
  Options& set_gaussian_high(double v) {
    gaussian_high = v;
    return *this;
  }
  Options& set_gaussian_step(double v) {
    gaussian_step = v;
    return *this;
  }
  Options& set_gaussian_loops(int v) {
    gaussian_loops = v;
    return *this;
  }

  /// \brief Sets the field named `key` (a field name above: "density", "balancing",
  /// "s2_error_feedback", ...) from text: numbers as C writes them, balancing as off, on or
  /// adaptive, dense_allreduce as auto, mpi or ring, booleans as on, off, true, false, 1 or 0.
  /// Range checks are validate()'s. Wire as native, fp32, bf16 or fp16. Throws
  /// std::invalid_argument("oktopk::Options::set: ...") for an unknown key (the message lists the
  /// valid ones) or a value that is not a number of the field's type.
  Options& set(std::string_view key, std::string_view value);
  /// \brief set() for each `key=value` in `settings`, separated by spaces, tabs, newlines or
  /// commas (an empty string sets nothing). Throws as set() does, or for an item without '='.
  Options& set_from_string(std::string_view settings);

  /// Throws std::invalid_argument("oktopk::Options::validate: ...") for a value out of range.
  void validate() const;
  /// A digest of every field, for the cross-rank agreement check.
  std::int64_t digest() const;
};

std::ostream& operator<<(std::ostream& os, Balancing balancing);
std::ostream& operator<<(std::ostream& os, DenseAlgorithm algorithm);
/// "native", "fp32", "bf16" or "fp16".
std::ostream& operator<<(std::ostream& os, Wire wire);
/// One line, `key=value` pairs, for logs.
std::ostream& operator<<(std::ostream& os, const Options& options);

/// "off", "on" or "adaptive"; std::invalid_argument otherwise.
Balancing balancing_from_string(const char* name);
/// "auto", "mpi" or "ring"; std::invalid_argument otherwise.
DenseAlgorithm dense_allreduce_from_string(const char* name);
/// "native", "fp32", "bf16" or "fp16"; std::invalid_argument otherwise.
Wire wire_from_string(const char* name);

}  // namespace oktopk
