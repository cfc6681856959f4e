// SPDX-License-Identifier: BSD-3-Clause
// The accumulate pass, acc = residual + grad, and what it learns of acc on the way: it reads
// every entry anyway, so counting |acc| above the thresholds the method will select at (and,
// on host spaces, keeping the few entries above the lowest of them) costs no extra pass. The
// method's selections in the same call then start from what the pass knows.
#pragma once

#include <oktopk/fwd.hpp>
#include <oktopk/select.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/base/value_traits.hpp>
#include <oktopk/impl/kernels/candidates.hpp>
#include <oktopk/impl/kernels/count_levels.hpp>
#include <oktopk/impl/kernels/vector_ops.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <limits>

namespace oktopk::impl {

/// \brief One handle's accumulate pass and what the current call's pass counted: the levels
/// (thresholds), how many entries of acc lie above each, per chunk too on host spaces (a row
/// per level; on GPUs the totals alone), and the candidates above the lowest level where
/// keeping them saves a pass (host spaces). For gradients of type Value; acc and the residual
/// are of its arithmetic type.
template <class ExecSpace, class Value>
class AccumulatePass {
 public:
  using memory_space = typename ExecSpace::memory_space;
  using arithmetic_type = arithmetic_t<Value>;
  using vector_type = Kokkos::View<arithmetic_type*, memory_space>;
  using const_gradient_type = Kokkos::View<const Value*, memory_space>;

  /// Forgets what the last call counted: nothing is known of the next acc.
  void forget() {
    levels_ = CountLevels{};
    candidates_.threshold = std::numeric_limits<float>::quiet_NaN();
  }

  /// acc = residual + grad, counting |acc| above `levels` (rising thresholds), and keeping
  /// the candidates above the lowest level where that is worth it (host spaces, k well below
  /// n). Returns how many entries of acc are not finite. acc may be residual.
  std::int64_t run(const ExecSpace& exec, const vector_type& residual,
                   const const_gradient_type& grad, const vector_type& acc,
                   const CountLevels& levels, std::int64_t k) {
    const auto n = static_cast<std::int64_t>(acc.extent(0));
    if (runs_on_host_v<ExecSpace> && levels.count > 0 &&
        static_cast<int>(chunk_counts_.extent(0)) < levels.count) {
      chunk_counts_ = ChunkCounts(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing,
                                                     "oktopk::AccumulatePass::chunk_counts"),
                                  static_cast<std::size_t>(max_count_levels),
                                  static_cast<std::size_t>(chunk_count<ExecSpace>(n)));
    }
    const AccumulateCounts counts = accumulate(exec, residual, grad, acc, levels, k);
    levels_ = levels;
    for (int j = 0; j < levels.count; ++j) above_[j] = counts.above[j];
    return counts.nonfinite;
  }

  /// The level counted at threshold t, or -1.
  int level(float t) const {
    for (int j = 0; j < levels_.count; ++j) {
      if (levels_.threshold[j] == t) return j;
    }
    return -1;
  }

  /// How many entries of acc (this call's) lie above t: counted by the pass, or else counted
  /// now, per chunk on host spaces, which then replaces the levels known.
  std::int64_t count_above(const ExecSpace& exec, const vector_type& acc, float t) {
    int j = level(t);
    if (j < 0) {
      Kokkos::View<count_type*, memory_space> first_row;  // stays empty on GPUs
      if (chunk_counts_.extent(0) != 0) first_row = Kokkos::subview(chunk_counts_, 0, Kokkos::ALL);
      levels_ = CountLevels{};
      levels_.count = 1;
      levels_.threshold[0] = t;
      above_[0] = count_above_by_chunk(exec, acc, t, first_row);
      j = 0;
    }
    return above_[j];
  }

  /// What is known of acc above t, for a selection there: the counts per chunk of a counted
  /// level at t, with the candidates when they cover it (host spaces; nothing on GPUs).
  KnownAbove<ExecSpace, arithmetic_type> known_above(float t) const {
    KnownAbove<ExecSpace, arithmetic_type> known;
    const int j = level(t);
    if (j < 0 || chunk_counts_.extent(0) == 0) return known;
    known.chunk_counts = Kokkos::subview(chunk_counts_, j, Kokkos::ALL);
    if (known.chunk_counts.extent(0) != 0 && candidates_.cover(t)) known.candidates = &candidates_;
    return known;
  }

 private:
  using ChunkCounts = Kokkos::View<count_type**, Kokkos::LayoutRight, memory_space>;

  AccumulateCounts accumulate(const ExecSpace& exec, const vector_type& residual,
                              const const_gradient_type& grad, const vector_type& acc,
                              const CountLevels& levels, std::int64_t k) {
    if constexpr (runs_on_host_v<ExecSpace>) {
      const auto n = static_cast<std::int64_t>(acc.extent(0));
      // Room for a whole chunk (k above about n/8) would keep as much as acc itself, twice its
      // memory, to save nothing: such handles read acc.
      const bool worth_keeping = candidate_capacity<ExecSpace>(n, k) < chunk_length_v<ExecSpace>;
      if (levels.count > 0 && worth_keeping) {
        if (candidates_.capacity == 0) allocate_candidates(exec, n, k);
        return accumulate_keeping_candidates(exec, residual, grad, acc, levels, chunk_counts_,
                                             candidates_);
      }
    }
    return accumulate_counting(exec, residual, grad, acc, levels, chunk_counts_);
  }

  void allocate_candidates(const ExecSpace& exec, std::int64_t n, std::int64_t k) {
    candidates_.capacity = candidate_capacity<ExecSpace>(n, k);
    const auto chunks = static_cast<std::size_t>(chunk_count<ExecSpace>(n));
    const auto kept = chunks * static_cast<std::size_t>(candidates_.stride());
    candidates_.indices = decltype(candidates_.indices)(
        Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::Candidates::indices"), kept);
    candidates_.values = decltype(candidates_.values)(
        Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::Candidates::values"), kept);
    candidates_.counts = decltype(candidates_.counts)(
        Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::Candidates::counts"),
        chunks);
  }

  CountLevels levels_;
  std::int64_t above_[max_count_levels] = {};
  ChunkCounts chunk_counts_;
  Candidates<ExecSpace, arithmetic_type> candidates_;
};

}  // namespace oktopk::impl
