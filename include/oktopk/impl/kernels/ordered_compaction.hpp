// SPDX-License-Identifier: BSD-3-Clause
// Stream compaction in index order reading the input once, the selection kernels' shape on
// GPUs. Kokkos's parallel_scan there calls its functor twice per entry (a counting pass, then
// the writing pass) and, at one entry per work item, adds bookkeeping of its own: a threshold
// select over 2^26 floats took 13 times a copy on an H200. Here a first kernel reads the input
// once and keeps a bit per entry (a word of 32 entries per thread, a tile of words per team)
// and each tile's count; the tiles' counts are scanned; a last kernel finds each word's first
// slot from its tile's and writes the kept entries, reading the input again only at them. The
// bits are 1/32 of a float input; no team waits on another.
//
// The first kernel reads a tile in rounds of adjacent entries, one per thread (so that a warp's
// loads in a round are one stretch of memory), and builds each thread's word of 32 adjacent
// entries from those rounds' bits in the team's scratch memory: a thread that read its own 32
// adjacent entries, 128 bytes from its neighbour's, made the warp touch 32 cache lines per load.
#pragma once

#include <oktopk/error.hpp>
#include <oktopk/fwd.hpp>
#include <oktopk/impl/base/half_types.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/base/scratch_pool.hpp>
#include <oktopk/impl/base/value_traits.hpp>
#include <oktopk/impl/kernels/read_rounds.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace oktopk::impl {

/// A packed pair of counts: entries kept for being above (the low 31 bits) and for being tied
/// (from bit 31); each stays below 2^31, as n does.
using PackedCounts = unsigned long long;
inline constexpr int tied_shift = 31;
inline constexpr PackedCounts above_mask = (PackedCounts{1} << tied_shift) - 1;

/// What compact_in_order() asks of an entry.
enum class Kept : int { no = 0, above = 1, tied = 2 };

/// Set bits of a 32-bit word (a loop-free form the compilers turn into one instruction).
KOKKOS_INLINE_FUNCTION int count_bits(std::uint32_t w) {
  w = w - ((w >> 1) & 0x55555555u);
  w = (w & 0x33333333u) + ((w >> 2) & 0x33333333u);
  w = (w + (w >> 4)) & 0x0f0f0f0fu;
  return static_cast<int>((w * 0x01010101u) >> 24);
}

/// The index of the lowest set bit of w != 0.
KOKKOS_INLINE_FUNCTION int lowest_bit(std::uint32_t w) { return count_bits((w & (0u - w)) - 1u); }

/// Where a tile's rows sit in the first kernel's scratch: one word in 33 left empty, so that the
/// words one warp reads at a time fall in different shared-memory banks.
KOKKOS_INLINE_FUNCTION int padded_row(int row) { return row + (row >> 5); }

/// The kernels of compact_in_order(); `keep` answers `Kept keep.kind(i)` and stores with
/// `keep.store(i, above_before, tied_before, kind)`, the kept entries before i of each kind.
template <class Keep>
struct OrderedCompaction {
  using ExecSpace = typename Keep::execution_space;
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using Words = Kokkos::View<std::uint32_t*, typename ExecSpace::memory_space>;
  using Counts = Kokkos::View<PackedCounts*, typename ExecSpace::memory_space>;
  using Rows = Kokkos::View<std::uint32_t*, typename ExecSpace::scratch_memory_space,
                            Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  Keep keep;
  Words above_bits;  // bit b of word w: entry 32 w + b is kept as above
  Words tied_bits;   // ... as tied (empty unless Keep::ties)
  Counts tile_counts;
  std::int64_t n;
  int team_shift;  // log2 of the team size S, a power of two: a tile is S words, 32 S entries

  struct Mark {};
  struct Write {};

  /// Scratch words per row array of a team of 2^team_shift threads.
  KOKKOS_INLINE_FUNCTION static int rows_per_team(int shift) {
    return padded_row((1 << shift) - 1) + 1;
  }
  /// The first kernel's scratch bytes per team: the row arrays of above (and of tied).
  static std::size_t scratch_bytes(int shift) {
    return (Keep::ties ? 2 : 1) * Rows::shmem_size(rows_per_team(shift));
  }

  /// The first kernel's reads for thread t of tile `tile`: in round b, entry 32 S tile + S b + t,
  /// so that the threads' reads in one round are adjacent. Bit b of `above` (`tied`) is that
  /// entry's kind; entries past n are not kept.
  ///
  /// A row that lies wholly below n is read without a test between its reads, so that a GPU
  /// thread issues all 32 before it waits for the first: a loop that stopped at n put a branch
  /// before each read, and the thread waited out each read in turn.
  KOKKOS_INLINE_FUNCTION void mark_row(std::int64_t tile, int t, std::uint32_t& above,
                                       std::uint32_t& tied) const {
    const std::int64_t first = (tile << (team_shift + 5)) + t;
    above = 0;
    tied = 0;
    const auto mark = [&](int b, std::int64_t i) {
      const Kept kind = keep.kind(i);
      above |= kind == Kept::above ? std::uint32_t{1} << b : 0u;
      tied |= kind == Kept::tied ? std::uint32_t{1} << b : 0u;
    };
    if (first + (std::int64_t{31} << team_shift) < n) {
      OKTOPK_IMPL_UNROLL
      for (int b = 0; b < 32; ++b) mark(b, first + (static_cast<std::int64_t>(b) << team_shift));
      return;
    }
    for (int b = 0; b < 32; ++b) {
      const std::int64_t i = first + (static_cast<std::int64_t>(b) << team_shift);
      if (i >= n) break;
      mark(b, i);
    }
  }

  /// Word t of the tile (its entries 32 t to 32 t + 31) from the rows mark_row() made, row r at
  /// rows(padded_row(r)): entry e of the tile is bit e / S of row e mod S.
  template <class RowView>
  KOKKOS_INLINE_FUNCTION std::uint32_t word_from_rows(const RowView& rows, int t) const {
    const int last_row = (1 << team_shift) - 1;
    std::uint32_t word = 0;
    for (int j = 0; j < 32; ++j) {
      const int e = 32 * t + j;
      word |= ((rows(padded_row(e & last_row)) >> (e >> team_shift)) & 1u) << j;
    }
    return word;
  }

  /// The first kernel: rows of adjacent reads into scratch, a word of bits per thread from them,
  /// the tile's count per team.
  KOKKOS_INLINE_FUNCTION void operator()(Mark, const Member& team) const {
    const int t = team.team_rank();
    const int rows = rows_per_team(team_shift);
    const Rows above_rows(team.team_scratch(0), rows);
    const Rows tied_rows(team.team_scratch(0), Keep::ties ? rows : 0);
    std::uint32_t above_row = 0;
    std::uint32_t tied_row = 0;
    mark_row(team.league_rank(), t, above_row, tied_row);
    above_rows(padded_row(t)) = above_row;
    if (Keep::ties) tied_rows(padded_row(t)) = tied_row;
    team.team_barrier();
    const std::int64_t w = (static_cast<std::int64_t>(team.league_rank()) << team_shift) + t;
    PackedCounts mine = 0;
    if (w < static_cast<std::int64_t>(above_bits.extent(0))) {
      const std::uint32_t above = word_from_rows(above_rows, t);
      const std::uint32_t tied = Keep::ties ? word_from_rows(tied_rows, t) : 0u;
      above_bits(w) = above;
      if (Keep::ties) tied_bits(w) = tied;
      mine = static_cast<PackedCounts>(count_bits(above)) +
             (static_cast<PackedCounts>(count_bits(tied)) << tied_shift);
    }
    PackedCounts tile = mine;
    team.team_reduce(Kokkos::Sum<PackedCounts>(tile));
    if (t == 0) tile_counts(team.league_rank()) = tile;
  }

  /// The last kernel: each word's first slot (its tile's, from the scanned counts, and the
  /// words before it in the tile), then its kept entries in index order.
  KOKKOS_INLINE_FUNCTION void operator()(Write, const Member& team) const {
    const std::int64_t w =
        (static_cast<std::int64_t>(team.league_rank()) << team_shift) + team.team_rank();
    const bool real = w < static_cast<std::int64_t>(above_bits.extent(0));
    std::uint32_t above = real ? above_bits(w) : 0u;
    std::uint32_t tied = real && Keep::ties ? tied_bits(w) : 0u;
    const PackedCounts mine = static_cast<PackedCounts>(count_bits(above)) +
                              (static_cast<PackedCounts>(count_bits(tied)) << tied_shift);
    const PackedCounts before = tile_counts(team.league_rank()) + team.team_scan(mine);
    PackedCounts above_before = before & above_mask;
    PackedCounts tied_before = before >> tied_shift;
    std::uint32_t kept = above | tied;
    while (kept != 0) {
      const int b = lowest_bit(kept);
      kept &= kept - 1u;
      const bool is_above = ((above >> b) & 1u) != 0u;
      keep.store(32 * w + b, above_before, tied_before, is_above ? Kept::above : Kept::tied);
      if (is_above) {
        ++above_before;
      } else {
        ++tied_before;
      }
    }
  }
};

/// tile_counts(t) becomes the counts of the tiles before t (an exclusive scan); the last slot,
/// 0 before, becomes the total. A named functor, not a lambda, as every kernel that the public
/// headers reach: a user's program and the library instantiate them with the same types, and
/// nvcc's host-side lambda wrappers do not survive that (scripts/check-lambda-odr.py).
template <class Counts>
struct TileOffsets {
  Counts tile_counts;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t t, PackedCounts& before,
                                         const bool final) const {
    const PackedCounts count = tile_counts(t);
    if (final) tile_counts(t) = before;
    before += count;
  }
};

/// \brief Calls keep.store() for every entry i of [0, n) that keep.kind() keeps, in index
/// order, with the counts of each kind kept before it; returns the counts over all n, packed
/// (PackedCounts). Reads each entry once to classify it and again only where it is kept. Fences
/// `exec` once, at the end. Any space (the tests run it on the host); on GPUs, select_above's
/// kernels. n must be below 2^31, as select_above's check_length makes sure.
template <class ExecSpace, class Keep>
PackedCounts compact_in_order(const ExecSpace& exec, std::int64_t n, const Keep& keep) {
  if (n <= 0) return 0;
  OKTOPK_ASSERT(n <= 2147483647);  // each packed count has 31 bits
  using Kernels = OrderedCompaction<Keep>;
  using Memory = typename ExecSpace::memory_space;
  using MarkPolicy = Kokkos::TeamPolicy<ExecSpace, typename Kernels::Mark>;
  using WritePolicy = Kokkos::TeamPolicy<ExecSpace, typename Kernels::Write>;
  const std::int64_t words = (n + 31) / 32;
  // At most 256 threads, as many as both kernels take, and a power of two: Kokkos 3.x's CUDA
  // team_scan needs one (its team_size_max steps by 32).
  constexpr int largest_shift = 8;  // 256 threads
  const Kernels sizing{keep, {}, {}, {}, n, largest_shift};
  MarkPolicy mark_sizing(exec, 1, Kokkos::AUTO);
  mark_sizing.set_scratch_size(0, Kokkos::PerTeam(Kernels::scratch_bytes(largest_shift)));
  const int most = std::min(
      {1 << largest_shift, mark_sizing.team_size_max(sizing, Kokkos::ParallelForTag()),
       WritePolicy(exec, 1, Kokkos::AUTO).team_size_max(sizing, Kokkos::ParallelForTag())});
  int team_shift = 0;
  while ((2 << team_shift) <= most) ++team_shift;
  const int team_size = 1 << team_shift;
  const std::int64_t tiles = (words + team_size - 1) / team_size;
  const auto above_bits =
      ScratchPool<std::uint32_t, Memory>::acquire(static_cast<std::size_t>(words));
  const auto tied_bits =
      Keep::ties ? ScratchPool<std::uint32_t, Memory>::acquire(static_cast<std::size_t>(words))
                 : typename Kernels::Words();
  // One count per tile and one more, 0, which the scan turns into the total: the host waits
  // once, for the total, after the last kernel.
  const auto tile_counts =
      ScratchPool<PackedCounts, Memory>::acquire(static_cast<std::size_t>(tiles + 1));
  Kokkos::deep_copy(exec, Kokkos::subview(tile_counts, tiles), PackedCounts{0});
  const Kernels kernels{keep, above_bits, tied_bits, tile_counts, n, team_shift};
  MarkPolicy mark(exec, static_cast<int>(tiles), team_size);
  mark.set_scratch_size(0, Kokkos::PerTeam(Kernels::scratch_bytes(team_shift)));
  Kokkos::parallel_for("oktopk::compact_in_order::mark", mark, kernels);
  Kokkos::parallel_scan("oktopk::compact_in_order::tiles", RangeOf<ExecSpace>(exec, 0, tiles + 1),
                        TileOffsets<typename Kernels::Counts>{tile_counts});
  Kokkos::parallel_for("oktopk::compact_in_order::write",
                       WritePolicy(exec, static_cast<int>(tiles), team_size), kernels);
  PackedCounts total = 0;
  Kokkos::deep_copy(exec, Kokkos::View<PackedCounts, Kokkos::HostSpace>(&total),
                    Kokkos::subview(tile_counts, tiles));
  fence(exec, "oktopk::compact_in_order: the outputs and the total are written");
  return total;
}

/// keep() of select_above on GPUs (Ties false: the entries with |x(i)| > threshold) and of
/// select_above_and_ties (Ties true: those and the first `wanted_ties` equal to it). An entry's
/// slot is the entries above before it plus min(tied before it, wanted_ties); entries past the
/// capacity are counted, not written.
template <class ExecSpace, class XView, class IdxView, class ValView, bool Ties>
struct KeepAbove {
  using execution_space = ExecSpace;
  static constexpr bool ties = Ties;
  XView x;
  float threshold;
  PackedCounts wanted_ties;
  IdxView indices;
  ValView values;
  PackedCounts capacity;

  KOKKOS_INLINE_FUNCTION Kept kind(std::int64_t i) const {
    const float m = magnitude(x(i));
    return m > threshold ? Kept::above : (Ties && m == threshold ? Kept::tied : Kept::no);
  }
  KOKKOS_INLINE_FUNCTION void store(std::int64_t i, PackedCounts above_before,
                                    PackedCounts tied_before, Kept kind) const {
    if (kind == Kept::tied && tied_before >= wanted_ties) return;
    const PackedCounts slot =
        above_before + (tied_before < wanted_ties ? tied_before : wanted_ties);
    if (slot < capacity) {
      indices(slot) = static_cast<index_type>(i);
      values(slot) = value_cast<typename ValView::non_const_value_type>(x(i));
    }
  }
};

}  // namespace oktopk::impl
