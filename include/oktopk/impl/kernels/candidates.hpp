// SPDX-License-Identifier: BSD-3-Clause
// Candidates: the entries of acc above the lowest threshold a guard may visit, kept by the
// accumulate pass per chunk while the chunk is in cache (host spaces). Ok-Topk's selection at
// whichever threshold the guard keeps then filters these few entries instead of reading the
// whole of acc again, and the guard's counts at every level come from them too.
#pragma once

#include <oktopk/fwd.hpp>
#include <oktopk/select.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/kernels/count_levels.hpp>
#include <oktopk/impl/kernels/vector_ops.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <limits>
#include <type_traits>

namespace oktopk::impl {

/// Per chunk, the entries with |acc| > threshold, in ascending order: chunk c's are at
/// [c·stride(), c·stride() + counts(c)). A chunk with more than `capacity` such entries keeps
/// none (counts(c) > capacity), and its selections read acc. Values of acc's type, Real.
template <class ExecSpace, class Real>
struct Candidates {
  using Memory = typename ExecSpace::memory_space;
  Kokkos::View<index_type*, Memory> indices{"oktopk::Candidates::indices", 0};
  Kokkos::View<Real*, Memory> values{"oktopk::Candidates::values", 0};
  Kokkos::View<count_type*, Memory> counts{"oktopk::Candidates::counts", 0};
  std::int64_t capacity = 0;  ///< per chunk
  /// Slots per chunk: room for `capacity` entries.
  std::int64_t stride() const { return capacity; }
  /// What they were kept above; NaN: none kept for the current acc.
  float threshold = std::numeric_limits<float>::quiet_NaN();

  /// Whether a selection at t can filter these (t at or above what they were kept above).
  bool cover(float t) const { return threshold == threshold && t >= threshold; }
};

/// What the accumulate pass already knows of acc at the selection's threshold (host spaces):
/// its count per chunk (empty: not known) and, when these are known, candidates that cover it
/// (null: none).
template <class ExecSpace, class Real>
struct KnownAbove {
  Kokkos::View<const count_type*, typename ExecSpace::memory_space> chunk_counts;
  const Candidates<ExecSpace, Real>* candidates = nullptr;
};

/// Room per chunk for a selection of about k entries out of n: several times the average
/// share, so that only chunks far denser than the average spill (those then read acc).
template <class ExecSpace>
std::int64_t candidate_capacity(std::int64_t n, std::int64_t k) {
  const std::int64_t chunk = chunk_length_v<ExecSpace>;
  const std::int64_t chunks = chunk_count<ExecSpace>(n);
  const std::int64_t per_chunk = chunks == 0 ? 0 : (k + chunks - 1) / chunks;
  const std::int64_t room = 8 * per_chunk < 32 ? 32 : 8 * per_chunk;
  return room < chunk ? room : chunk;
}

/// One chunk of accumulate_keeping_candidates(): acc = residual + grad over `length` entries,
/// with flags[i] = 1 where |acc[i]| > `first`, else 0. Returns the non-finite count and sets
/// `above` to the flags set. One loop without branches over pointers that do not alias, so it
/// vectorizes, and what it adds to the plain sum is a byte store per entry.
template <class Real, class Grad>
KOKKOS_INLINE_FUNCTION int accumulate_chunk(const Real* KOKKOS_RESTRICT residual,
                                            const Grad* KOKKOS_RESTRICT grad,
                                            Real* KOKKOS_RESTRICT acc, int length, float first,
                                            unsigned char* KOKKOS_RESTRICT flags, int& above) {
  int bad = 0;
  int hits = 0;
  for (int i = 0; i < length; ++i) {
    const Real a = residual[i] + to_arithmetic(grad[i]);
    acc[i] = a;
    const int hit = magnitude(a) > first ? 1 : 0;
    flags[i] = static_cast<unsigned char>(hit);
    bad += fits_value<std::remove_const_t<Grad>>(a) ? 0 : 1;
    hits += hit;
  }
  above = hits;
  return bad;
}

/// The flags of entries [8q, 8q + 8) as one word, entry 8q + j in bits 8j to 8j + 7: built
/// byte by byte, so the bit order does not depend on the target's byte order.
KOKKOS_INLINE_FUNCTION std::uint64_t flag_word(const unsigned char* flags, int q) {
  std::uint64_t word = 0;
  for (int j = 0; j < 8; ++j) word |= static_cast<std::uint64_t>(flags[8 * q + j]) << (8 * j);
  return word;
}

/// \brief accumulate_counting() that also keeps the candidates above levels.threshold[0]
/// (host spaces only, levels.count >= 1; chunk_counts as there, one row per level).
///
/// One loop over each chunk writes acc and a flag per entry above the lowest level
/// (accumulate_chunk()); it vectorizes. The flags are then read eight at a time, and only the
/// set ones go back to acc, in cache, for the entries to keep; the levels are counted over the
/// kept entries alone. A chunk with more than `capacity` entries above the lowest level keeps none
/// and is counted from acc (count_levels_in).
template <class ExecSpace, class Residual, class Grad, class Acc, class ChunkCounts>
AccumulateCounts accumulate_keeping_candidates(
    const ExecSpace& exec, const Residual& residual, const Grad& grad, const Acc& acc,
    const CountLevels& levels, const ChunkCounts& chunk_counts,
    Candidates<ExecSpace, typename Acc::value_type>& candidates) {
  static_assert(runs_on_host_v<ExecSpace>, "candidates are kept on host execution spaces");
  constexpr std::int64_t chunk = chunk_length_v<ExecSpace>;
  const auto n = static_cast<std::int64_t>(grad.extent(0));
  const std::int64_t chunks = chunk_count<ExecSpace>(n);
  OKTOPK_ASSERT(levels.count >= 1 && static_cast<int>(chunk_counts.extent(0)) >= levels.count &&
                static_cast<std::int64_t>(chunk_counts.extent(1)) == chunks);
  const std::int64_t capacity = candidates.capacity;
  const std::int64_t stride = candidates.stride();
  OKTOPK_ASSERT(static_cast<std::int64_t>(candidates.indices.extent(0)) >= chunks * stride &&
                static_cast<std::int64_t>(candidates.values.extent(0)) >= chunks * stride &&
                static_cast<std::int64_t>(candidates.counts.extent(0)) >= chunks);
  const CountLevels thresholds = levels;
  const float first = levels.threshold[0];
  const auto kept_indices = candidates.indices;
  const auto kept_values = candidates.values;
  const auto kept_counts = candidates.counts;
  // Contiguous: the handle's own buffers and a View of the default layout.
  const auto* residual_data = residual.data();
  const auto* grad_data = grad.data();
  auto* acc_data = acc.data();
  std::int64_t packed = 0;  // as in accumulate_counting: non-finite count above bit 32
  Kokkos::parallel_reduce(
      "oktopk::accumulate_keeping_candidates", RangeOf<ExecSpace>(exec, 0, chunks),
      KOKKOS_LAMBDA(const std::int64_t c, std::int64_t& sum) {
        const std::int64_t begin = c * chunk;
        const std::int64_t end = begin + chunk < n ? begin + chunk : n;
        const int length = static_cast<int>(end - begin);
        unsigned char flags[chunk];
        int above = 0;
        const std::int64_t bad = accumulate_chunk(residual_data + begin, grad_data + begin,
                                                  acc_data + begin, length, first, flags, above);
        std::int64_t counts[max_count_levels] = {};
        if (above <= capacity) {
          // Whole words: the flags past a short last chunk's end are 0.
          const int words = (length + 7) / 8;
          for (int i = length; i < 8 * words; ++i) flags[i] = 0;
          std::int64_t kept = c * stride;
          // Set flags are a few in a hundred: most words are 0 and skipped whole.
          for (int q = 0; q < words; ++q) {
            std::uint64_t word = flag_word(flags, q);
            while (word != 0) {
              const std::int64_t i = begin + 8 * q + lowest_set_bit(word) / 8;
              word &= word - 1;
              kept_indices(kept) = static_cast<index_type>(i);
              kept_values(kept) = acc_data[i];
              ++kept;
            }
          }
          counts[0] = above;
          for (std::int64_t j = c * stride; j < kept; ++j) {
            const float m = magnitude(kept_values(j));
            for (int l = 1; l < thresholds.count; ++l) {
              counts[l] += m > thresholds.threshold[l] ? 1 : 0;
            }
          }
        } else {
          count_levels_in(acc, thresholds, begin, end, counts);
        }
        kept_counts(c) = above;
        for (int l = 0; l < thresholds.count; ++l) chunk_counts(l, c) = counts[l];
        sum += above + (bad << 32);
      },
      packed);
  AccumulateCounts counts;
  counts.nonfinite = packed >> 32;
  counts.above[0] = packed & 0xffffffff;
  for (int l = 1; l < levels.count; ++l) {
    for (std::int64_t c = 0; c < chunks; ++c) counts.above[l] += chunk_counts(l, c);
  }
  candidates.threshold = first;
  return counts;
}

/// select_above_counted() from the candidates: `chunk_counts` holds each chunk's count above
/// `threshold` (which the candidates must cover), chunks that kept their candidates are
/// filtered, and only the others read x. Same results and capacity rule.
template <class ExecSpace, class XView, class CountView, class IdxView, class ValView>
std::int64_t select_candidates(
    const ExecSpace& exec,
    const Candidates<ExecSpace, typename XView::non_const_value_type>& candidates, const XView& x,
    float threshold, const CountView& chunk_counts, const IdxView& indices, const ValView& values) {
  OKTOPK_ASSERT(candidates.cover(threshold));
  const auto n = static_cast<std::int64_t>(x.extent(0));
  const std::int64_t chunks = chunk_count<ExecSpace>(n);
  const auto capacity = static_cast<std::int64_t>(
      indices.extent(0) < values.extent(0) ? indices.extent(0) : values.extent(0));
  const auto first_slot = make_uninitialized<std::int64_t>(
      exec, "oktopk::select_candidates::first_slot", static_cast<std::size_t>(chunks));
  std::int64_t count = 0;
  Kokkos::parallel_scan(
      "oktopk::select_candidates::offsets", RangeOf<ExecSpace>(exec, 0, chunks),
      KOKKOS_LAMBDA(const std::int64_t c, std::int64_t& slot, bool final) {
        if (final) first_slot(c) = slot;
        slot += chunk_counts(c);
      },
      count);
  const SelectAboveFunctor<XView, IdxView, ValView> from_x{
      x, threshold, indices, values, capacity, n, chunk_length_v<ExecSpace>};
  const auto kept_indices = candidates.indices;
  const auto kept_values = candidates.values;
  const auto kept_counts = candidates.counts;
  const std::int64_t room = candidates.capacity;
  const std::int64_t stride = candidates.stride();
  Kokkos::parallel_for(
      "oktopk::select_candidates::compact", RangeOf<ExecSpace>(exec, 0, chunks),
      KOKKOS_LAMBDA(std::int64_t c) {
        std::int64_t slot = first_slot(c);
        if (kept_counts(c) > room) {
          from_x(c, slot, true);
          return;
        }
        for (std::int64_t j = c * stride; j < c * stride + kept_counts(c); ++j) {
          const auto v = kept_values(j);
          if (!(magnitude(v) > threshold)) continue;
          if (slot < capacity) {
            indices(slot) = kept_indices(j);
            values(slot) = value_cast<typename ValView::non_const_value_type>(v);
          }
          ++slot;
        }
      });
  return count;
}

/// \brief The entries of x with |x| > threshold, compacted in ascending order into
/// (indices, values), from what is known of x there: the candidates' filter, else one pass with
/// the chunk counts, else select_above()'s two. Returns the count; as select_above(), only
/// what fits is written when it exceeds the outputs' capacity.
template <class ExecSpace, class XView, class IdxView, class ValView>
std::int64_t select_known(const ExecSpace& exec,
                          const KnownAbove<ExecSpace, typename XView::non_const_value_type>& known,
                          const XView& x, float threshold, const IdxView& indices,
                          const ValView& values) {
  if (known.chunk_counts.extent(0) == 0) return select_above(exec, x, threshold, indices, values);
  if (known.candidates != nullptr) {
    return select_candidates(exec, *known.candidates, x, threshold, known.chunk_counts, indices,
                             values);
  }
  return select_above_counted(exec, x, threshold, known.chunk_counts, indices, values);
}

}  // namespace oktopk::impl
