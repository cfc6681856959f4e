// SPDX-License-Identifier: BSD-3-Clause
// Small kernels the collectives share: checked accumulation, averaging, and moves between
// dense and sparse forms. Internal: callers guarantee lengths and index ranges.
#pragma once

#include <oktopk/fwd.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/base/value_traits.hpp>
#include <oktopk/impl/base/wire_rounding.hpp>
#include <oktopk/impl/kernels/count_levels.hpp>
#include <oktopk/impl/kernels/read_rounds.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <limits>

namespace oktopk::impl {

KOKKOS_INLINE_FUNCTION bool is_finite(float x) {
  return (float_to_bits(x) & 0x7f800000u) != 0x7f800000u;
}
KOKKOS_INLINE_FUNCTION bool is_finite(double x) {
  constexpr std::uint64_t exponent = 0x7ff0000000000000u;
  return (double_to_bits(x) & exponent) != exponent;
}
KOKKOS_INLINE_FUNCTION bool is_finite(bfloat16 x) { return (x.bits & 0x7f80u) != 0x7f80u; }
KOKKOS_INLINE_FUNCTION bool is_finite(float16 x) { return (x.bits & 0x7c00u) != 0x7c00u; }

/// Whether a call takes x = residual + gradient, for gradients of type Value: x is finite and,
/// for a 16-bit type, does not round to Inf in it. An average of such values cannot either
/// (it is no larger than the largest of them), so a 16-bit output stays finite.
template <class Value, class Real>
KOKKOS_INLINE_FUNCTION bool fits_value(Real x) {
  if constexpr (is_half_v<Value>) {
    // NaN fails the comparison, as it should.
    return magnitude(x) < rounds_to_inf_v<Value>;
  } else {
    return is_finite(x);
  }
}

/// What accumulate_counting() found in acc.
struct AccumulateCounts {
  std::int64_t nonfinite = 0;                 ///< entries that are NaN or +-Inf
  std::int64_t above[max_count_levels] = {};  ///< entries with |acc| > each level's threshold
};

// accumulate_counting's and count_above_by_chunk's kernels are named functors, not lambdas: a
// user's program and the library instantiate them with the same types (through
// select_above_counted's callers), and nvcc's host-side lambda wrappers do not survive that
// (scripts/check-lambda-odr.py).

/// The step of accumulate_counting on every space: acc(i) = residual(i) + grad(i), returned.
template <class Residual, class Grad, class Acc>
KOKKOS_INLINE_FUNCTION typename Acc::non_const_value_type accumulate_entry(const Residual& residual,
                                                                           const Grad& grad,
                                                                           const Acc& acc,
                                                                           const std::int64_t i) {
  const typename Acc::non_const_value_type a = residual(i) + to_arithmetic(grad(i));
  acc(i) = a;
  return a;
}

/// accumulate_counting() on GPUs: work item c of `items` (n / reads, rounded up) takes the
/// entries c + j items, j < reads, reading a round of them before it writes any
/// (read_in_rounds: at one entry per item, each thread waited out every read); the counts in a
/// reduction over an array (see clear_counts()), the non-finite entries first, then every
/// level's.
template <class Residual, class Grad, class Acc>
struct AccumulateCountingLevels {
  using value_type = std::int64_t[];
  using Real = typename Acc::non_const_value_type;
  static constexpr int reads = reads_in_flight(sizeof(typename Residual::non_const_value_type));
  unsigned value_count;
  Residual residual;
  Grad grad;
  Acc acc;
  CountLevels levels;
  std::int64_t items = 1;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t c, value_type counts) const {
    const auto n = static_cast<std::int64_t>(grad.extent(0));
    read_in_rounds<reads>(
        0, n, c, items,
        [&](std::int64_t i) { return static_cast<Real>(residual(i) + to_arithmetic(grad(i))); },
        [&](std::int64_t i, Real a) {
          acc(i) = a;
          counts[0] += fits_value<typename Grad::non_const_value_type>(a) ? 0 : 1;
          add_to_levels(magnitude(a), levels, counts + 1);
        });
  }
  KOKKOS_INLINE_FUNCTION void init(value_type counts) const { clear_counts(counts, value_count); }
  KOKKOS_INLINE_FUNCTION void join(OKTOPK_JOIN_QUALIFIER value_type into,
                                   const OKTOPK_JOIN_QUALIFIER value_type from) const {
    add_counts(into, from, value_count);
  }
};

/// accumulate_counting() in its GPU shape on any space (the tests run it on the host):
/// totals[0] = the non-finite entries of acc, totals[1 + j] = those above level j.
template <class ExecSpace, class Residual, class Grad, class Acc>
void accumulate_counting_strided(const ExecSpace& exec, const Residual& residual, const Grad& grad,
                                 const Acc& acc, const CountLevels& levels, std::int64_t* totals) {
  using Kernel = AccumulateCountingLevels<Residual, Grad, Acc>;
  const auto n = static_cast<std::int64_t>(grad.extent(0));
  const std::int64_t items = (n + Kernel::reads - 1) / Kernel::reads;
  const auto count = static_cast<unsigned>(1 + levels.count);
  Kokkos::parallel_reduce(
      "oktopk::accumulate_counting", RangeOf<ExecSpace>(exec, 0, items),
      Kernel{count, residual, grad, acc, levels, items},
      Kokkos::View<std::int64_t*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(totals, count));
}

/// accumulate_counting() on the host: chunk c's entries accumulated by a loop the compiler
/// vectorizes, then counted at the `counted` levels of `thresholds` while in cache (stored in
/// chunk_counts when `record`); adds the first level's count plus the non-finite count << 32.
template <class Residual, class Grad, class Acc, class ChunkCounts>
struct AccumulateCountingChunks {
  Residual residual;
  Grad grad;
  Acc acc;
  CountLevels thresholds;
  ChunkCounts chunk_counts;
  std::int64_t chunk = 1;
  bool record = false;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t c, std::int64_t& sum) const {
    const auto n = static_cast<std::int64_t>(grad.extent(0));
    const std::int64_t begin = c * chunk;
    const std::int64_t end = begin + chunk < n ? begin + chunk : n;
    std::int64_t bad = 0;
    for (std::int64_t i = begin; i < end; ++i) {
      const auto a = accumulate_entry(residual, grad, acc, i);
      bad += fits_value<typename Grad::non_const_value_type>(a) ? 0 : 1;
    }
    std::int64_t above[max_count_levels] = {};
    count_levels_in(acc, thresholds, begin, end, above);
    if (record) {
      for (int j = 0; j < thresholds.count; ++j) chunk_counts(j, c) = above[j];
    }
    sum += above[0] + (bad << 32);
  }
};

/// Entries of chunk c with |x| > threshold, added to the sum and stored in chunk_counts(c)
/// when `record`.
template <class X, class ChunkCounts>
struct CountAboveByChunk {
  X x;
  float threshold = 0.0f;
  ChunkCounts chunk_counts;
  std::int64_t chunk = 1;
  bool record = false;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t c, std::int64_t& sum) const {
    const auto n = static_cast<std::int64_t>(x.extent(0));
    const std::int64_t begin = c * chunk;
    const std::int64_t end = begin + chunk < n ? begin + chunk : n;
    std::int64_t above = 0;
    for (std::int64_t i = begin; i < end; ++i) above += magnitude(x(i)) > threshold ? 1 : 0;
    if (record) chunk_counts(c) = above;
    sum += above;
  }
};

/// \brief acc = residual + grad in one pass, counting the entries of acc that are not finite
/// and those with |acc| above each of `levels`' thresholds (none above NaN).
///
/// On the host the pass goes by chunks of chunk_length_v entries, a loop the compiler
/// vectorizes, then the counts over the chunk while it is in cache. When `chunk_counts`
/// (levels × chunks, chunk_count<ExecSpace>(n) columns) has a row for every level, each
/// chunk's counts are stored there, so that select_above_counted() compacts at any of the
/// thresholds in one pass instead of two, and every level is counted (their totals are sums
/// over their rows); without rows, the first level alone. On GPUs every level is counted, in
/// rounds of entries spread over the vector (AccumulateCountingLevels), and `chunk_counts` is
/// not used.
template <class ExecSpace, class Residual, class Grad, class Acc, class ChunkCounts>
AccumulateCounts accumulate_counting(const ExecSpace& exec, const Residual& residual,
                                     const Grad& grad, const Acc& acc, const CountLevels& levels,
                                     const ChunkCounts& chunk_counts) {
  static_assert(ChunkCounts::rank == 2, "chunk_counts: one row per level");
  const auto n = static_cast<std::int64_t>(grad.extent(0));
  if constexpr (!runs_on_host_v<ExecSpace>) {
    std::int64_t totals[1 + max_count_levels] = {};
    accumulate_counting_strided(exec, residual, grad, acc, levels, totals);
    AccumulateCounts counts;
    counts.nonfinite = totals[0];
    for (int j = 0; j < levels.count; ++j) counts.above[j] = totals[1 + j];
    return counts;
  } else {
    const std::int64_t chunks = chunk_count<ExecSpace>(n);
    const std::int64_t chunk = chunk_length_v<ExecSpace>;
    const bool record = static_cast<std::int64_t>(chunk_counts.extent(0)) >= levels.count &&
                        static_cast<std::int64_t>(chunk_counts.extent(1)) == chunks;
    const int counted = record ? levels.count : (levels.count < 1 ? levels.count : 1);
    CountLevels thresholds = levels;
    thresholds.count = counted;
    // The non-finite count and the first level's in one sum: above in the low 32 bits (it never
    // reaches 2^31), non-finite above.
    std::int64_t packed = 0;
    Kokkos::parallel_reduce("oktopk::accumulate_counting", RangeOf<ExecSpace>(exec, 0, chunks),
                            AccumulateCountingChunks<Residual, Grad, Acc, ChunkCounts>{
                                residual, grad, acc, thresholds, chunk_counts, chunk, record},
                            packed);
    AccumulateCounts counts;
    counts.nonfinite = packed >> 32;
    counts.above[0] = packed & 0xffffffff;
    // The other levels' totals: sums of their rows, which are host memory here.
    for (int j = 1; j < counted; ++j) {
      for (std::int64_t c = 0; c < chunks; ++c) counts.above[j] += chunk_counts(j, c);
    }
    return counts;
  }
}

/// How many entries have |x| > threshold, also stored per chunk in `chunk_counts` when it has
/// one entry per chunk (as accumulate_counting() does), for select_above_counted().
template <class ExecSpace, class X, class ChunkCounts>
std::int64_t count_above_by_chunk(const ExecSpace& exec, const X& x, float threshold,
                                  const ChunkCounts& chunk_counts) {
  const auto n = static_cast<std::int64_t>(x.extent(0));
  const std::int64_t chunks = chunk_count<ExecSpace>(n);
  const std::int64_t chunk = chunk_length_v<ExecSpace>;
  const bool record = static_cast<std::int64_t>(chunk_counts.extent(0)) == chunks;
  std::int64_t total = 0;
  Kokkos::parallel_reduce(
      "oktopk::count_above_by_chunk", RangeOf<ExecSpace>(exec, 0, chunks),
      CountAboveByChunk<X, ChunkCounts>{x, threshold, chunk_counts, chunk, record}, total);
  return total;
}

/// to = from (converted to to's type: value_cast), returning how many entries are not finite
/// (one pass; from may be to).
template <class ExecSpace, class From, class To>
std::int64_t copy_counting_nonfinite(const ExecSpace& exec, const From& from, const To& to) {
  using Stored = typename To::non_const_value_type;
  std::int64_t bad = 0;
  Kokkos::parallel_reduce(
      "oktopk::copy_counting_nonfinite", RangeOf<ExecSpace>(exec, 0, from.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t i, std::int64_t& count) {
        const Stored x = value_cast<Stored>(from(i));
        to(i) = x;
        if (!is_finite(x)) ++count;
      },
      bad);
  return bad;
}

/// How many entries of x are not finite (one pass).
template <class ExecSpace, class X>
std::int64_t count_nonfinite(const ExecSpace& exec, const X& x) {
  std::int64_t bad = 0;
  Kokkos::parallel_reduce(
      "oktopk::count_nonfinite", RangeOf<ExecSpace>(exec, 0, x.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t i, std::int64_t& count) {
        if (!is_finite(x(i))) ++count;
      },
      bad);
  return bad;
}

/// out(i) = in(i) / divisor as divide() does, counting the results that are not finite; work
/// item c covers [c * chunk, (c + 1) * chunk), a run the compiler vectorizes on the host, one
/// entry on GPUs (chunk = 1). A named functor, not a lambda: several translation units
/// instantiate it with the same types, and nvcc's host-side lambda wrappers do not survive that
/// (scripts/check-lambda-odr.py).
template <class In, class Out>
struct DivideCountingNonfinite {
  In in;
  Out out;
  std::int64_t chunk = 1;
  float divisor = 1.0f;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t c, std::int64_t& count) const {
    using Stored = typename Out::non_const_value_type;
    const auto n = static_cast<std::int64_t>(out.extent(0));
    const std::int64_t first = c * chunk;
    const std::int64_t last = first + chunk < n ? first + chunk : n;
    std::int64_t bad = 0;
    for (std::int64_t i = first; i < last; ++i) {
      const Stored average = value_cast<Stored>(to_arithmetic(in(i)) / divisor);
      out(i) = average;
      bad += is_finite(average) ? 0 : 1;
    }
    count += bad;
  }
};

/// out = in / divisor as divide() does, returning how many results are not finite (one pass;
/// in may be out).
template <class ExecSpace, class In, class Out>
std::int64_t divide_counting_nonfinite(const ExecSpace& exec, const In& in, const Out& out,
                                       float divisor) {
  std::int64_t bad = 0;
  Kokkos::parallel_reduce(
      "oktopk::divide_counting_nonfinite",
      RangeOf<ExecSpace>(exec, 0, chunk_count<ExecSpace>(static_cast<std::int64_t>(out.extent(0)))),
      DivideCountingNonfinite<In, Out>{in, out, chunk_length_v<ExecSpace>, divisor}, bad);
  return bad;
}

/// out = in / divisor (a division, not a multiplication by 1/divisor, so that every method
/// rounds its average exactly like the dense reference), computed in in's arithmetic type and
/// stored as out's (value_cast).
template <class ExecSpace, class In, class Out>
void divide(const ExecSpace& exec, const In& in, const Out& out, float divisor) {
  using Stored = typename Out::non_const_value_type;
  Kokkos::parallel_for(
      "oktopk::divide", RangeOf<ExecSpace>(exec, 0, out.extent(0)), KOKKOS_LAMBDA(std::int64_t i) {
        out(i) = value_cast<Stored>(to_arithmetic(in(i)) / divisor);
      });
}

/// out(indices(j) + offset) = values(j) / divisor for j < count; indices must be distinct.
template <class ExecSpace, class Idx, class Val, class Out>
void scatter_divided(const ExecSpace& exec, const Idx& indices, const Val& values,
                     std::int64_t count, const Out& out, float divisor, std::int64_t offset = 0) {
  using Stored = typename Out::non_const_value_type;
  Kokkos::parallel_for(
      "oktopk::scatter_divided", RangeOf<ExecSpace>(exec, 0, count), KOKKOS_LAMBDA(std::int64_t j) {
        out(indices(j) + offset) = value_cast<Stored>(to_arithmetic(values(j)) / divisor);
      });
}

/// \brief Which entries a rank's local selection took: those with |acc| > threshold, and those
/// equal to it below index tied_end (the ties that completed its k, taken in index order; 0
/// when none were).
struct LocalSelection {
  float threshold = 0.0f;
  std::int64_t tied_end = 0;

  template <class Real>
  KOKKOS_INLINE_FUNCTION bool took(Real a, std::int64_t i) const {
    const float m = magnitude(a);
    return m > threshold || (m == threshold && i < tied_end);
  }
};

/// One past the largest index(j), j < count, whose |value(j)| equals `threshold`; 0 if none:
/// the tied_end of a selection that took ties in index order.
template <class ExecSpace, class Idx, class Val>
std::int64_t tied_end_of(const ExecSpace& exec, const Idx& indices, const Val& values,
                         std::int64_t count, float threshold) {
  std::int64_t end = 0;
  Kokkos::parallel_reduce(
      "oktopk::tied_end", RangeOf<ExecSpace>(exec, 0, count),
      KOKKOS_LAMBDA(std::int64_t j, std::int64_t & last) {
        const std::int64_t past = static_cast<std::int64_t>(indices(j)) + 1;
        if (magnitude(values(j)) == threshold && past > last) last = past;
      },
      Kokkos::Max<std::int64_t>(end));
  return end;
}

/// \brief A sparse result written as a dense average, with its error feedback in the same pass:
/// out = 0 except out(indices(j)) = values(j) / divisor for j < count, and at those positions
/// acc(i) = 0 where `selected` took acc(i), i.e. where this rank selected the entry, so the
/// residual keeps what the result did not carry; with a narrower `wire`, acc(i) keeps the
/// rounding error of what this rank sent, acc(i) - wire_rounded(acc(i)). Indices rise strictly.
///
/// On the host, out is written once, in order, by chunks: each chunk is zeroed and then filled
/// from its run of indices (a binary search for the run's start), where a zeroing pass and a
/// scatter would write the entries twice. On GPUs, the zeroing and one thread per entry.
template <class ExecSpace, class Idx, class Val, class Out, class Acc>
void write_average_clearing(const ExecSpace& exec, const Idx& indices, const Val& values,
                            std::int64_t count, const Out& out, float divisor, const Acc& acc,
                            LocalSelection selected, Wire wire) {
  using Stored = typename Out::non_const_value_type;
  if constexpr (runs_on_host_v<ExecSpace>) {
    const auto n = static_cast<std::int64_t>(out.extent(0));
    const std::int64_t chunk = chunk_length_v<ExecSpace>;
    Kokkos::parallel_for(
        "oktopk::write_average_clearing", RangeOf<ExecSpace>(exec, 0, chunk_count<ExecSpace>(n)),
        KOKKOS_LAMBDA(std::int64_t c) {
          const std::int64_t begin = c * chunk;
          const std::int64_t end = begin + chunk < n ? begin + chunk : n;
          for (std::int64_t i = begin; i < end; ++i) out(i) = Stored{};
          for (std::int64_t j = lower_bound(indices, count, begin); j < count && indices(j) < end;
               ++j) {
            const std::int64_t i = indices(j);
            out(i) = value_cast<Stored>(to_arithmetic(values(j)) / divisor);
            if (selected.took(acc(i), i)) acc(i) -= wire_rounded(acc(i), wire);
          }
        });
  } else {
    Kokkos::deep_copy(exec, out, Stored{});
    Kokkos::parallel_for(
        "oktopk::write_average_clearing", RangeOf<ExecSpace>(exec, 0, count),
        KOKKOS_LAMBDA(std::int64_t j) {
          const std::int64_t i = indices(j);
          out(i) = value_cast<Stored>(to_arithmetic(values(j)) / divisor);
          if (selected.took(acc(i), i)) acc(i) -= wire_rounded(acc(i), wire);
        });
  }
}

/// \brief A sparse result written as it is, with its error feedback: out_indices(j) =
/// indices(j) and out_values(j) = values(j) / divisor for j < count, and acc(indices(j)) = 0
/// (or its rounding error on `wire`) where `selected` took acc, as write_average_clearing
/// does, without touching the other n - count entries of anything.
template <class ExecSpace, class Idx, class Val, class OutIdx, class OutVal, class Acc>
void copy_average_clearing(const ExecSpace& exec, const Idx& indices, const Val& values,
                           std::int64_t count, const OutIdx& out_indices, const OutVal& out_values,
                           float divisor, const Acc& acc, LocalSelection selected, Wire wire) {
  using Stored = typename OutVal::non_const_value_type;
  Kokkos::parallel_for(
      "oktopk::copy_average_clearing", RangeOf<ExecSpace>(exec, 0, count),
      KOKKOS_LAMBDA(std::int64_t j) {
        const auto i = indices(j);
        out_indices(j) = i;
        out_values(j) = value_cast<Stored>(to_arithmetic(values(j)) / divisor);
        if (selected.took(acc(i), i)) acc(i) -= wire_rounded(acc(i), wire);
      });
}

/// keys(s) = how many of sorted(0 .. size - 1) are below keys(s), for every s (a binary search
/// each: keys are few, sorted is long).
template <class ExecSpace, class Sorted, class Keys>
void count_below(const ExecSpace& exec, const Sorted& sorted, std::int64_t size, const Keys& keys) {
  Kokkos::parallel_for(
      "oktopk::count_below", RangeOf<ExecSpace>(exec, 0, keys.extent(0)),
      KOKKOS_LAMBDA(std::int64_t s) { keys(s) = lower_bound(sorted, size, keys(s)); });
}

/// Compacts the pairs with |values(j)| > threshold (j < count), and the first `ties` pairs with
/// |values(j)| == threshold, into the outputs, keeping their order; returns how many there
/// are, writing at most the outputs' capacity. The scan carries the two counts in one word
/// (select_above_and_ties()): above in the low 32 bits, equal in the high 32.
template <class ExecSpace, class Idx, class Val, class OutIdx, class OutVal>
std::int64_t select_pairs_above(const ExecSpace& exec, const Idx& indices, const Val& values,
                                std::int64_t count, float threshold, std::int64_t ties,
                                const OutIdx& out_indices, const OutVal& out_values) {
  const auto capacity = static_cast<std::int64_t>(
      out_indices.extent(0) < out_values.extent(0) ? out_indices.extent(0) : out_values.extent(0));
  std::int64_t packed = 0;
  Kokkos::parallel_scan(
      "oktopk::select_pairs_above", RangeOf<ExecSpace>(exec, 0, count),
      KOKKOS_LAMBDA(const std::int64_t j, std::int64_t& prefix, bool final) {
        const auto v = values(j);
        const float m = magnitude(v);
        const std::int64_t above = prefix & 0xffffffff;
        const std::int64_t equal = prefix >> 32;
        if (m > threshold || (m == threshold && equal < ties)) {
          const std::int64_t slot = above + (equal < ties ? equal : ties);
          if (final && slot < capacity) {
            out_indices(slot) = indices(j);
            out_values(slot) = value_cast<typename OutVal::non_const_value_type>(v);
          }
        }
        if (m > threshold) prefix += 1;
        if (m == threshold) prefix += std::int64_t{1} << 32;
      },
      packed);
  const std::int64_t equal = packed >> 32;
  return (packed & 0xffffffff) + (equal < ties ? equal : ties);
}

/// indices(j) += offset for j in [begin, end).
template <class ExecSpace, class Idx>
void add_offset(const ExecSpace& exec, const Idx& indices, std::int64_t begin, std::int64_t end,
                std::int64_t offset) {
  Kokkos::parallel_for(
      "oktopk::add_offset", RangeOf<ExecSpace>(exec, begin, end),
      KOKKOS_LAMBDA(std::int64_t j) { indices(j) = static_cast<index_type>(indices(j) + offset); });
}

/// Grows a rank-1 View to hold at least `size` entries (contents are not kept), with 25%
/// headroom so that slowly growing counts do not reallocate every call. The allocation is
/// ordered on `exec`.
template <class ExecSpace, class View>
void ensure_capacity(const ExecSpace& exec, View& view, std::int64_t size) {
  if (static_cast<std::int64_t>(view.extent(0)) >= size) return;
  const auto grown = static_cast<std::size_t>(size + size / 4 + 16);
  view = View(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, view.label()), grown);
}

}  // namespace oktopk::impl
