// SPDX-License-Identifier: BSD-3-Clause
// Radix select on float bit patterns: the k-th largest |x| without sorting.
//
// For non-negative floats the IEEE-754 bit pattern, read as an unsigned integer, orders like
// the value, and clearing the sign bit gives |x|. So the k-th largest |x| is the k-th largest
// 31-bit key, found digit by digit from the top: a histogram of the current digit among the
// keys that match the digits fixed so far tells which digit value holds the k-th largest.
// Three passes (11 + 11 + 9 bits) read x three times and never write it. On GPUs the middle
// pass can also gather the few entries in the first digit's bin, and the last digit is then
// counted over those alone.
#pragma once

#include <oktopk/error.hpp>
#include <oktopk/fwd.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/base/value_traits.hpp>
#include <oktopk/impl/kernels/read_rounds.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>

namespace oktopk::impl {

/// Keys above this are NaN (exponent all ones, mantissa non-zero) once the sign is cleared.
inline constexpr std::uint32_t abs_key_infinity = 0x7f800000u;
inline constexpr int radix_max_bits = 11;
inline constexpr int radix_passes = 3;
inline constexpr int radix_shift[radix_passes] = {20, 9, 0};
inline constexpr int radix_bits[radix_passes] = {11, 11, 9};

KOKKOS_INLINE_FUNCTION std::uint32_t abs_key(float x) { return float_to_bits(x) & 0x7fffffffu; }
/// A double's key is its magnitude's (magnitude()): the rounding keeps the order.
KOKKOS_INLINE_FUNCTION std::uint32_t abs_key(double x) { return abs_key(static_cast<float>(x)); }
/// A 16-bit value's key is its float's: exact, so keys of every type compare alike.
KOKKOS_INLINE_FUNCTION std::uint32_t abs_key(bfloat16 x) { return abs_key(magnitude(x)); }
KOKKOS_INLINE_FUNCTION std::uint32_t abs_key(float16 x) { return abs_key(magnitude(x)); }

/// What one histogram pass needs to know about the digit it counts.
struct RadixDigit {
  int shift;             // position of the digit's lowest bit in the key
  int bins;              // 2^(digit width)
  int prefix_shift;      // key >> prefix_shift are the digits fixed by earlier passes
  std::uint32_t prefix;  // their value
  bool first_pass;       // nothing fixed yet: count every non-NaN key

  KOKKOS_INLINE_FUNCTION bool counts(std::uint32_t key) const {
    // NaN keys exceed the infinity key. Some NaNs share +Inf's leading digits, so a prefix
    // match alone does not exclude them.
    return key <= abs_key_infinity && (first_pass || (key >> prefix_shift) == prefix);
  }
  KOKKOS_INLINE_FUNCTION int bin(std::uint32_t key) const {
    return static_cast<int>((key >> shift) & static_cast<std::uint32_t>(bins - 1));
  }
};

inline RadixDigit radix_digit(int pass, std::uint32_t prefix) {
  const int shift = radix_shift[pass];
  return RadixDigit{shift, 1 << radix_bits[pass], shift + radix_bits[pass], prefix, pass == 0};
}

/// \brief Digit widths, from the top, that together cover the 31 bits of a key.
///
/// Where the histograms travel (the distributed select), their size is traffic: narrower
/// digits mean smaller histograms and more passes (more rounds of latency).
struct RadixSchedule {
  static constexpr int key_bits = 31;
  int passes = 0;
  int bits[key_bits] = {};
  int shift[key_bits] = {};

  /// The fewest digits of at most `width` bits (1 to radix_max_bits), as equal as can be,
  /// wider ones first: ceil(31 / width) passes.
  static RadixSchedule of_width(int width) {
    OKTOPK_ASSERT(width >= 1 && width <= radix_max_bits);
    RadixSchedule s;
    s.passes = (key_bits + width - 1) / width;
    int covered = 0;
    for (int p = 0; p < s.passes; ++p) {
      const int w = key_bits / s.passes + (p < key_bits % s.passes ? 1 : 0);
      covered += w;
      s.bits[p] = w;
      s.shift[p] = key_bits - covered;
    }
    return s;
  }

  /// Histogram bins over all passes.
  std::int64_t total_bins() const {
    std::int64_t total = 0;
    for (int p = 0; p < passes; ++p) total += std::int64_t{1} << bits[p];
    return total;
  }

  RadixDigit digit(int pass, std::uint32_t prefix) const {
    return RadixDigit{shift[pass], 1 << bits[pass], shift[pass] + bits[pass], prefix, pass == 0};
  }
};

// The histogram kernels are named functors, not lambdas, as every kernel that the public
// headers reach (kth_largest_abs): a user's program and the library instantiate them with the
// same types, and nvcc's host-side lambda wrappers do not survive that
// (scripts/check-lambda-odr.py).

/// Host shape: one contiguous stretch per thread, counted into a private array on the thread's
/// stack. The array holds several interleaved copies of the bins so that runs of equal digits
/// do not serialize on one counter. After the first pass few keys match the prefix, so entries
/// are tested a group at a time (a loop that vectorizes) and walked one by one only in groups
/// that hold a match.
template <class XView, class HistView>
struct RadixHistogramHost {
  static constexpr int copies = 4;
  static constexpr std::int64_t group = 16;
  XView x;
  RadixDigit digit;
  HistView histogram;
  std::int64_t stretches = 1;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t s) const {
    const auto n = static_cast<std::int64_t>(x.extent(0));
    int local[copies << radix_max_bits];
    for (int b = 0; b < copies * digit.bins; ++b) local[b] = 0;
    const std::int64_t begin = n * s / stretches;
    const std::int64_t end = n * (s + 1) / stretches;
    const int bins = digit.bins;
    const int shift = digit.shift;
    auto count = [&](std::int64_t i, std::uint32_t key) {
      const int bin = static_cast<int>((key >> shift) & static_cast<std::uint32_t>(bins - 1));
      ++local[bin + bins * static_cast<int>(i & (copies - 1))];
    };
    for (std::int64_t i = begin; digit.first_pass && i < end; ++i) {
      const std::uint32_t key = abs_key(x(i));
      if (key <= abs_key_infinity) count(i, key);
    }
    for (std::int64_t g = begin; !digit.first_pass && g < end; g += group) {
      const std::int64_t g_end = g + group < end ? g + group : end;
      // The prefix test alone, branch-free so it vectorizes; counts() then drops NaNs.
      int matches = 0;
      for (std::int64_t i = g; i < g_end; ++i) {
        matches += (abs_key(x(i)) >> digit.prefix_shift) == digit.prefix ? 1 : 0;
      }
      if (matches == 0) continue;
      for (std::int64_t i = g; i < g_end; ++i) {
        const std::uint32_t key = abs_key(x(i));
        if (digit.counts(key)) count(i, key);
      }
    }
    for (int b = 0; b < digit.bins; ++b) {
      std::int64_t total = 0;
      for (int c = 0; c < copies; ++c) total += local[b + digit.bins * c];
      if (total != 0) Kokkos::atomic_add(&histogram(b), total);
    }
  }
};

template <class ExecSpace, class XView, class HistView>
void radix_histogram_host(const ExecSpace& exec, const XView& x, const RadixDigit digit,
                          const HistView& histogram) {
  const auto n = static_cast<std::int64_t>(x.extent(0));
  const std::int64_t stretches =
      std::max<std::int64_t>(1, std::min<std::int64_t>(exec.concurrency(), n));
  Kokkos::parallel_for("oktopk::kth_largest_abs::histogram_host",
                       impl::RangeOf<ExecSpace>(exec, 0, stretches),
                       RadixHistogramHost<XView, HistView>{x, digit, histogram, stretches});
}

/// Device shape: teams of up to 256 threads, each team counting a long stretch into bins in
/// scratch (shared) memory with atomics, then adding them to the global bins. A thread reads
/// its entries in rounds (read_in_rounds): with an atomic after each read, it waited out every
/// read in turn.
template <class ExecSpace, class XView, class HistView>
struct RadixHistogramDevice {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using ScratchBins =
      Kokkos::View<int*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  static constexpr int reads = reads_in_flight(sizeof(typename XView::non_const_value_type));
  XView x;
  RadixDigit digit;
  HistView histogram;

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const auto n = static_cast<std::int64_t>(x.extent(0));
    ScratchBins local(team.team_scratch(0), digit.bins);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, digit.bins), [&](int b) { local(b) = 0; });
    team.team_barrier();
    const std::int64_t begin = n * team.league_rank() / team.league_size();
    const std::int64_t end = n * (team.league_rank() + 1) / team.league_size();
    read_in_rounds<reads>(
        begin, end, team.team_rank(), team.team_size(),
        [&](std::int64_t i) { return abs_key(x(i)); },
        [&](std::int64_t, std::uint32_t key) {
          if (digit.counts(key)) Kokkos::atomic_add(&local(digit.bin(key)), 1);
        });
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, digit.bins), [&](int b) {
      if (local(b) != 0) Kokkos::atomic_add(&histogram(b), static_cast<std::int64_t>(local(b)));
    });
  }
};

/// Launches a device-shaped histogram kernel over n entries: teams of up to 256 threads, with
/// `scratch` bytes each, one team per 64 rounds of a full team's reads (at most 4096 teams).
template <class ExecSpace, class Kernel>
void launch_radix_teams(const ExecSpace& exec, const char* label, const Kernel& kernel,
                        std::int64_t n, std::size_t scratch) {
  using Policy = Kokkos::TeamPolicy<ExecSpace>;
  constexpr int largest_team = 256;
  constexpr std::int64_t max_teams = 4096;
  const std::int64_t per_team_min = 64 * largest_team;
  const std::int64_t league =
      std::max<std::int64_t>(1, std::min(max_teams, (n + per_team_min - 1) / per_team_min));
  Policy sizing(exec, 1, Kokkos::AUTO);
  sizing.set_scratch_size(0, Kokkos::PerTeam(scratch));
  const int team_size =
      std::min(largest_team, sizing.team_size_max(kernel, Kokkos::ParallelForTag()));
  Policy policy(exec, static_cast<int>(league), team_size);
  policy.set_scratch_size(0, Kokkos::PerTeam(scratch));
  Kokkos::parallel_for(label, policy, kernel);
}

/// The device shape on any space (the tests run it on the host, with the teams the host allows).
template <class ExecSpace, class XView, class HistView>
void radix_histogram_device(const ExecSpace& exec, const XView& x, const RadixDigit digit,
                            const HistView& histogram) {
  using Kernel = RadixHistogramDevice<ExecSpace, XView, HistView>;
  launch_radix_teams(exec, "oktopk::kth_largest_abs::histogram_device", Kernel{x, digit, histogram},
                     static_cast<std::int64_t>(x.extent(0)),
                     Kernel::ScratchBins::shmem_size(digit.bins));
}

/// Which kernels a radix select runs: the host's (a stretch per thread, private bins) or the
/// GPUs' (teams, bins in scratch memory, and the gathering middle pass).
enum class RadixShape { host, device };

template <class ExecSpace>
inline constexpr RadixShape radix_shape_v =
    runs_on_host_v<ExecSpace> ? RadixShape::host : RadixShape::device;

/// Histogram of one radix digit over the keys of x whose higher digits equal digit.prefix.
template <RadixShape Shape, class ExecSpace, class XView, class HistView>
void radix_histogram(const ExecSpace& exec, const XView& x, const RadixDigit& digit,
                     const HistView& histogram) {
  Kokkos::deep_copy(exec, Kokkos::subview(histogram, Kokkos::make_pair(0, digit.bins)), 0);
  if constexpr (Shape == RadixShape::host) {
    radix_histogram_host(exec, x, digit, histogram);
  } else {
    radix_histogram_device(exec, x, digit, histogram);
  }
}

template <class ExecSpace, class XView, class HistView>
void radix_histogram(const ExecSpace& exec, const XView& x, const RadixDigit& digit,
                     const HistView& histogram) {
  radix_histogram<radix_shape_v<ExecSpace>>(exec, x, digit, histogram);
}

/// \brief The device histogram that also gathers what it counts: |x| (as a float, whose key is
/// the entry's) of every key matching digit.prefix goes to `gathered`, in no particular order,
/// and `count()` (zero on entry) ends as their number; entries beyond gathered's extent are
/// counted, not written.
///
/// A team walks its stretch in steps of one round per thread. After a step's reads, the
/// threads with matches take their offsets within the step from a count in scratch memory;
/// after a barrier one thread reserves the step's room in `gathered` with a single atomic on
/// `count()` (one global atomic per step, not per match) and resets the step's count; after a
/// second barrier each thread writes its matches there.
template <class ExecSpace, class XView, class HistView, class GatheredView, class CountView>
struct RadixHistogramGathering {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using ScratchBins =
      Kokkos::View<int*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  using ScratchStep = Kokkos::View<std::int64_t[2], typename ExecSpace::scratch_memory_space,
                                   Kokkos::MemoryUnmanaged>;
  static constexpr int reads = reads_in_flight(sizeof(typename XView::non_const_value_type));
  /// A NaN's key: what the reads past the end of x stand for, which no digit counts.
  static constexpr std::uint32_t no_key = 0xffffffffu;
  static constexpr int step_matches = 0;  // ScratchStep's words: the step's matches so far,
  static constexpr int step_base = 1;     // and the step's first place in `gathered`
  XView x;
  RadixDigit digit;
  HistView histogram;
  GatheredView gathered;
  CountView count;

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const auto n = static_cast<std::int64_t>(x.extent(0));
    const auto capacity = static_cast<std::int64_t>(gathered.extent(0));
    ScratchStep step_words(team.team_scratch(0));
    ScratchBins local(team.team_scratch(0), digit.bins);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, digit.bins), [&](int b) { local(b) = 0; });
    Kokkos::single(Kokkos::PerTeam(team), [&]() { step_words(step_matches) = 0; });
    team.team_barrier();
    const std::int64_t begin = n * team.league_rank() / team.league_size();
    const std::int64_t end = n * (team.league_rank() + 1) / team.league_size();
    const std::int64_t threads = team.team_size();
    const std::int64_t span = reads * threads;
    for (std::int64_t step = begin; step < end; step += span) {
      const std::int64_t first = step + team.team_rank();
      std::uint32_t keys[reads];
      if (step + span <= end) {
        OKTOPK_IMPL_UNROLL
        for (int j = 0; j < reads; ++j) keys[j] = abs_key(x(first + j * threads));
      } else {
        for (int j = 0; j < reads; ++j) {
          keys[j] = first + j * threads < end ? abs_key(x(first + j * threads)) : no_key;
        }
      }
      std::int64_t matches = 0;
      OKTOPK_IMPL_UNROLL
      for (int j = 0; j < reads; ++j) {
        if (digit.counts(keys[j])) {
          Kokkos::atomic_add(&local(digit.bin(keys[j])), 1);
          ++matches;
        }
      }
      std::int64_t place =
          matches == 0 ? 0 : Kokkos::atomic_fetch_add(&step_words(step_matches), matches);
      team.team_barrier();
      Kokkos::single(Kokkos::PerTeam(team), [&]() {
        const std::int64_t in_step = step_words(step_matches);
        step_words(step_base) = in_step == 0 ? 0 : Kokkos::atomic_fetch_add(&count(), in_step);
        step_words(step_matches) = 0;
      });
      team.team_barrier();
      if (matches == 0) continue;
      place += step_words(step_base);
      for (int j = 0; j < reads; ++j) {
        if (!digit.counts(keys[j])) continue;
        if (place < capacity) gathered(place) = bits_to_float(keys[j]);
        ++place;
      }
    }
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, digit.bins), [&](int b) {
      if (local(b) != 0) Kokkos::atomic_add(&histogram(b), static_cast<std::int64_t>(local(b)));
    });
  }
};

/// Histogram of one digit (as radix_histogram) that also gathers the |x| it counts into
/// `gathered` and their number into `count()` (RadixHistogramGathering). The device shape, on
/// any space (the tests run it on the host).
template <class ExecSpace, class XView, class HistView, class GatheredView, class CountView>
void radix_histogram_gathering(const ExecSpace& exec, const XView& x, const RadixDigit& digit,
                               const HistView& histogram, const GatheredView& gathered,
                               const CountView& count) {
  using Kernel = RadixHistogramGathering<ExecSpace, XView, HistView, GatheredView, CountView>;
  Kokkos::deep_copy(exec, Kokkos::subview(histogram, Kokkos::make_pair(0, digit.bins)), 0);
  Kokkos::deep_copy(exec, count, 0);
  launch_radix_teams(
      exec, "oktopk::kth_largest_abs::histogram_gathering",
      Kernel{x, digit, histogram, gathered, count}, static_cast<std::int64_t>(x.extent(0)),
      Kernel::ScratchStep::shmem_size() + Kernel::ScratchBins::shmem_size(digit.bins));
}

/// The middle pass gathers when the first digit's bin holds at most 1/radix_gather_share of
/// x: writing those entries and reading them again then costs at most an eighth of the pass
/// over x that it saves.
inline constexpr std::int64_t radix_gather_share = 16;

/// \brief kth_largest_abs's selection (arguments checked, k >= 1) with the kernels of `Shape`,
/// in the buffers of a KthLargestWorkspace.
///
/// In the device shape, for values of 32 bits or more (three digits), when
/// workspace.gather_candidates is set and the first digit's bin holds at most
/// n / radix_gather_share keys, the middle pass gathers them
/// (radix_histogram_gathering) into workspace.candidates and the last digit is counted over
/// them alone: two passes over x instead of three. The candidates are allocated, at n /
/// radix_gather_share floats for this call's n, when the bin does not fit in those there are.
template <RadixShape Shape, class ExecSpace, class XView, class Workspace>
float radix_kth_largest_abs(const ExecSpace& exec, const XView& x, std::int64_t k,
                            Workspace& workspace) {
  OKTOPK_ASSERT(k >= 1 && x.extent(0) > 0);
  constexpr float infinity = std::numeric_limits<float>::infinity();
  const auto n = static_cast<std::int64_t>(x.extent(0));
  // A 16-bit value's key is a float's with at least the 13 low bits zero: the last pass, over
  // the 9 lowest bits, would find every candidate at digit 0, so it is skipped.
  constexpr bool half = is_half_v<typename XView::non_const_value_type>;
  constexpr int passes = half ? radix_passes - 1 : radix_passes;
  const auto& hist = workspace.histogram_host;
  std::uint32_t prefix = 0;
  std::int64_t remaining = k;  // rank of the wanted key among keys matching `prefix`
  // After a pass's histogram: its digit joins the prefix; returns how many keys match it.
  auto settle = [&](int pass) {
    Kokkos::deep_copy(exec, workspace.histogram_host, workspace.histogram);
    fence(exec, "oktopk::kth_largest_abs: histogram to host");
    const int bins = 1 << radix_bits[pass];
    if (pass == 0) {
      std::int64_t non_nan = 0;
      for (int b = 0; b < bins; ++b) non_nan += hist(b);
      if (remaining > non_nan) remaining = non_nan;
      if (non_nan == 0) return std::int64_t{0};
    }
    int digit = bins - 1;
    while (hist(digit) < remaining) {
      remaining -= hist(digit);
      --digit;
      OKTOPK_ASSERT(digit >= 0);
    }
    prefix = (prefix << radix_bits[pass]) | static_cast<std::uint32_t>(digit);
    return hist(digit);
  };
  radix_histogram<Shape>(exec, x, radix_digit(0, 0), workspace.histogram);
  const std::int64_t in_first_bin = settle(0);
  if (in_first_bin == 0) return infinity;  // every entry is NaN
  bool gathered = false;
  if constexpr (Shape == RadixShape::device && passes == 3) {
    if (workspace.gather_candidates && in_first_bin <= n / radix_gather_share) {
      if (static_cast<std::int64_t>(workspace.candidates.extent(0)) < in_first_bin) {
        workspace.candidates = decltype(workspace.candidates)(
            Kokkos::view_alloc(exec, Kokkos::WithoutInitializing,
                               "oktopk::kth_largest_abs::candidates"),
            static_cast<std::size_t>(n / radix_gather_share));
        workspace.gathered_count = decltype(workspace.gathered_count)(
            Kokkos::view_alloc(exec, "oktopk::kth_largest_abs::gathered_count"));
      }
      radix_histogram_gathering(exec, x, radix_digit(1, prefix), workspace.histogram,
                                workspace.candidates, workspace.gathered_count);
      settle(1);
      std::int64_t counted = 0;
      for (int b = 0; b < (1 << radix_bits[1]); ++b) counted += hist(b);
      OKTOPK_ASSERT(counted == in_first_bin);
      const auto candidates =
          Kokkos::subview(workspace.candidates, Kokkos::make_pair(std::int64_t{0}, in_first_bin));
      radix_histogram<Shape>(exec, candidates, radix_digit(2, prefix), workspace.histogram);
      settle(2);
      gathered = true;
    }
  }
  for (int pass = 1; pass < passes && !gathered; ++pass) {
    radix_histogram<Shape>(exec, x, radix_digit(pass, prefix), workspace.histogram);
    settle(pass);
  }
  if constexpr (half) prefix <<= radix_bits[radix_passes - 1];
  return bits_to_float(prefix);
}

}  // namespace oktopk::impl
