// SPDX-License-Identifier: BSD-3-Clause
// Allgatherv of sparse (index, value) entries, optionally balanced first: Ok-Topk's phase 2,
// and the gather step of TopkA, TopkDSA and Gaussian-k.
#pragma once

#include <oktopk/communicator.hpp>
#include <oktopk/error.hpp>
#include <oktopk/fwd.hpp>
#include <oktopk/options.hpp>
#include <oktopk/pack.hpp>
#include <oktopk/impl/collectives/wire_values.hpp>
#include <oktopk/impl/comm/fault_injection.hpp>
#include <oktopk/impl/comm/mpi_mirror.hpp>
#include <oktopk/impl/kernels/vector_ops.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <vector>

namespace oktopk::impl {

/// \brief Reusable buffers and the outcome of a sparse allgatherv.
template <class ExecSpace, class Real>
struct SparseGather {
  using Memory = typename ExecSpace::memory_space;
  /// Every rank's entries, in rank order: [0, counts[0]) from rank 0, then rank 1, ...
  Kokkos::View<index_type*, Memory> indices{"oktopk::SparseGather::indices", 0};
  Kokkos::View<Real*, Memory> values{"oktopk::SparseGather::values", 0};
  /// Entries per rank before balancing, and their sum.
  std::vector<std::int64_t> counts;
  /// Where each rank's block starts in indices and values (P + 1), for average_gathered.
  Kokkos::View<std::int64_t*, Memory> block_offsets{"oktopk::SparseGather::block_offsets", 0};
  typename Kokkos::View<std::int64_t*, Memory>::host_mirror_type block_offsets_host;
  std::int64_t total = 0;
  bool balanced = false;
  // Staging for the balancing step.
  Kokkos::View<index_type*, Memory> balanced_indices{"oktopk::SparseGather::balanced_indices", 0};
  Kokkos::View<Real*, Memory> balanced_values{"oktopk::SparseGather::balanced_values", 0};
  // (index, value) pairs as 16-bit words, sent and received by the one allgatherv
  // (gather_pairs).
  Kokkos::View<std::uint16_t*, Memory> send_pairs{"oktopk::SparseGather::send_pairs", 0};
  Kokkos::View<std::uint16_t*, Memory> pairs{"oktopk::SparseGather::pairs", 0};
  /// The type the values travel in (value_wire(); the method sets it), and how many values
  /// this rank sent that rounded to Inf in it, over the calls since the method reset it.
  Wire wire = Wire::Native;
  std::int64_t overflowed = 0;
};

/// Rank r's block when `total` items are split into P nearly equal blocks, the first
/// total mod P one larger: [begin, end).
inline std::pair<std::int64_t, std::int64_t> even_block(std::int64_t total, int parts, int r) {
  const std::int64_t base = total / parts;
  const std::int64_t extra = total % parts;
  const std::int64_t begin = r * base + std::min<std::int64_t>(r, extra);
  return {begin, begin + base + (r < extra ? 1 : 0)};
}

inline std::vector<int> to_int_counts(const char* where, const std::vector<std::int64_t>& counts) {
  std::vector<int> result(counts.size());
  for (std::size_t r = 0; r < counts.size(); ++r) {
    OKTOPK_REQUIRE(counts[r] >= 0 && counts[r] <= INT_MAX, std::runtime_error, where,
                   "rank " << r << " contributes " << counts[r]
                           << " entries, more than one MPI message can carry");
    result[r] = static_cast<int>(counts[r]);
  }
  return result;
}

inline std::vector<int> displacements_of(const std::vector<int>& counts) {
  std::vector<int> displacements(counts.size(), 0);
  std::int64_t running = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    OKTOPK_REQUIRE(running <= INT_MAX, std::runtime_error, "oktopk::impl::displacements_of",
                   "the gathered entries exceed what one MPI call can address");
    displacements[r] = static_cast<int>(running);
    running += counts[r];
  }
  return displacements;
}

/// 16-bit words one gathered entry takes: its index (two), then its value on `wire`.
template <class Real>
constexpr std::int64_t pair_words(Wire wire) {
  return 2 + wire_words<Real>(wire);
}

/// Entry j as words [w·j, w·(j + 1)), w = pair_words: indices(j) (low half first), then
/// values(j) as `wire` carries it, for j < count. Returns how many values rounded to Inf or
/// NaN on the wire. A free function: CUDA forbids device lambdas in private member functions.
template <class ExecSpace, class Idx, class Val, class Pairs>
std::int64_t pack_pairs(const ExecSpace& exec, const Idx& indices, const Val& values,
                        std::int64_t count, const Pairs& pairs, Wire wire) {
  using Real = typename Val::non_const_value_type;
  const std::int64_t words = pair_words<Real>(wire);
  std::int64_t overflowed = 0;
  Kokkos::parallel_reduce(
      "oktopk::sparse_allgatherv::pack", RangeOf<ExecSpace>(exec, 0, count),
      KOKKOS_LAMBDA(const std::int64_t j, std::int64_t& bad) {
        const auto index = static_cast<std::uint32_t>(indices(j));
        pairs(words * j) = static_cast<std::uint16_t>(index);
        pairs(words * j + 1) = static_cast<std::uint16_t>(index >> 16);
        if (!is_finite(put_wire_value(pairs, words * j + 2, values(j), wire))) ++bad;
      },
      overflowed);
  return overflowed;
}

/// The inverse of pack_pairs for `count` pairs.
template <class ExecSpace, class Pairs, class Idx, class Val>
void unpack_pairs(const ExecSpace& exec, const Pairs& pairs, std::int64_t count, const Idx& indices,
                  const Val& values, Wire wire) {
  using Real = typename Val::non_const_value_type;
  const std::int64_t words = pair_words<Real>(wire);
  Kokkos::parallel_for(
      "oktopk::sparse_allgatherv::unpack", RangeOf<ExecSpace>(exec, 0, count),
      KOKKOS_LAMBDA(const std::int64_t j) {
        indices(j) =
            static_cast<index_type>(static_cast<std::uint32_t>(pairs(words * j)) |
                                    (static_cast<std::uint32_t>(pairs(words * j + 1)) << 16));
        Real v;
        get_wire_value(pairs, words * j + 2, wire, v);
        values(j) = v;
      });
}

/// \brief Collective. Gathers `count` (index, value) entries of every rank (counts[r] from
/// rank r, identical on every rank) into gather.indices and gather.values, in rank order, by
/// one allgatherv of (index, value) pairs rather than one each for indices and values: the
/// same bytes in half the collectives, whose rounds' latency is what a call pays on links.
/// The values travel as gather.wire says (rounded to it; gather.overflowed counts those that
/// round to Inf). The packing passes touch the few gathered entries, not n.
template <class ExecSpace, class Real, class Idx, class Val>
void gather_pairs(const ExecSpace& exec, const Communicator& comm, const Idx& indices,
                  const Val& values, std::int64_t count, const std::vector<std::int64_t>& counts,
                  std::int64_t total, SparseGather<ExecSpace, Real>& gather) {
  const auto range = [](std::int64_t b, std::int64_t e) { return Kokkos::make_pair(b, e); };
  const std::int64_t words = pair_words<Real>(gather.wire);
  std::vector<int> word_counts(counts.size());
  for (std::size_t r = 0; r < counts.size(); ++r) {
    OKTOPK_REQUIRE(counts[r] >= 0 && counts[r] <= INT_MAX / words, std::runtime_error,
                   "oktopk::sparse_allgatherv",
                   "rank " << r << " contributes " << counts[r]
                           << " entries, more than one MPI message of (index, value) pairs can "
                              "carry (INT_MAX / "
                           << words << ")");
    word_counts[r] = static_cast<int>(words * counts[r]);
  }
  const auto displacements = displacements_of(word_counts);
  ensure_capacity(exec, gather.send_pairs, words * count);
  ensure_capacity(exec, gather.pairs, words * total);
  gather.overflowed += pack_pairs(exec, indices, values, count, gather.send_pairs, gather.wire);
  const auto send =
      mpi_send_view(exec, Kokkos::subview(gather.send_pairs, range(0, words * count)));
  auto receive = mpi_receive_view(exec, Kokkos::subview(gather.pairs, range(0, words * total)));
  comm.allgatherv(send.data(), words * count, receive.data(), word_counts.data(),
                  displacements.data());
  mpi_received(exec, receive, gather.pairs, 0, words * total);
  unpack_pairs(exec, gather.pairs, total, gather.indices, gather.values, gather.wire);
}

/// \brief Collective. sparse_allgatherv for callers that already hold every rank's count in
/// `gather.counts` (size P, identical on every rank); this rank sends gather.counts[rank].
template <class ExecSpace, class Real, class Idx, class Val, class Timed>
void sparse_allgatherv_counted(const ExecSpace& exec, const Communicator& comm, const Idx& indices,
                               const Val& values, Balancing balancing, double balance_threshold,
                               SparseGather<ExecSpace, Real>& gather, Timed&& timed) {
  const int P = comm.size();
  const int me = comm.rank();
  const auto range = [](std::int64_t b, std::int64_t e) { return Kokkos::make_pair(b, e); };
  OKTOPK_ASSERT(static_cast<int>(gather.counts.size()) == P);
  const std::int64_t count = gather.counts[me];
  std::int64_t total = 0;
  std::int64_t largest = 0;
  for (const auto c : gather.counts) {
    total += c;
    largest = std::max(largest, c);
  }
  gather.total = total;
  ensure_capacity(exec, gather.indices, total);
  ensure_capacity(exec, gather.values, total);
  const double mean = static_cast<double>(total) / P;
  gather.balanced = P > 1 && total > 0 &&
                    (balancing == Balancing::On ||
                     (balancing == Balancing::Adaptive && largest > balance_threshold * mean));

  if (!gather.balanced) {
    auto timer = timed("allgatherv");
    gather_pairs(exec, comm, indices, values, count, gather.counts, total, gather);
    return;
  }

  // Balancing: my entries are positions [mine_begin, mine_end) of the rank-ordered
  // concatenation; rank q's balanced block is even_block(total, P, q). Send each overlap.
  std::vector<std::int64_t> offsets(P + 1, 0);
  for (int r = 0; r < P; ++r) offsets[r + 1] = offsets[r] + gather.counts[r];
  const auto [block_begin, block_end] = even_block(total, P, me);
  const std::int64_t block_size = block_end - block_begin;
  ensure_capacity(exec, gather.balanced_indices, block_size);
  ensure_capacity(exec, gather.balanced_values, block_size);
  {
    auto timer = timed("balance");
    const auto send_idx = mpi_send_view(exec, Kokkos::subview(indices, range(0, count)));
    const auto send_val = mpi_send_view(exec, Kokkos::subview(values, range(0, count)));
    auto recv_idx =
        mpi_receive_view(exec, Kokkos::subview(gather.balanced_indices, range(0, block_size)));
    auto recv_val =
        mpi_receive_view(exec, Kokkos::subview(gather.balanced_values, range(0, block_size)));
    Communicator::Requests requests;
    for (int q = 0; q < P; ++q) {
      // What I send to q: my range intersected with q's block.
      const auto [q_begin, q_end] = even_block(total, P, q);
      const std::int64_t s_begin = std::max(offsets[me], q_begin);
      const std::int64_t s_end = std::min(offsets[me + 1], q_end);
      if (s_end > s_begin) {
        comm.isend(send_val.data() + (s_begin - offsets[me]), s_end - s_begin, q, 1, requests);
        comm.isend(send_idx.data() + (s_begin - offsets[me]), s_end - s_begin, q, 2, requests);
      }
      // What I receive from q: q's range intersected with my block.
      const std::int64_t r_begin = std::max(offsets[q], block_begin);
      const std::int64_t r_end = std::min(offsets[q + 1], block_end);
      if (r_end > r_begin) {
        comm.irecv(recv_val.data() + (r_begin - block_begin), r_end - r_begin, q, 1, requests);
        comm.irecv(recv_idx.data() + (r_begin - block_begin), r_end - r_begin, q, 2, requests);
      }
    }
    OKTOPK_FAULT_POINT(comm, "posted");
    requests.wait_all();
    mpi_received(exec, recv_idx, gather.balanced_indices, 0, block_size);
    mpi_received(exec, recv_val, gather.balanced_values, 0, block_size);
  }
  {
    auto timer = timed("allgatherv");
    std::vector<std::int64_t> blocks(P);
    for (int q = 0; q < P; ++q) {
      const auto [b, e] = even_block(total, P, q);
      blocks[q] = e - b;
    }
    gather_pairs(exec, comm, gather.balanced_indices, gather.balanced_values, block_size, blocks,
                 total, gather);
  }
}

/// \brief Collective. Gathers every rank's `count` entries (indices, values) on every rank, in
/// rank order. With balancing, the entries are first redistributed so every rank holds
/// total/P of them (remainder to the low ranks), keeping their order, so the allgatherv moves
/// equal blocks; the result is the same array either way. `timed(name)` opens a phase.
template <class ExecSpace, class Real, class Idx, class Val, class Timed>
void sparse_allgatherv(const ExecSpace& exec, const Communicator& comm, const Idx& indices,
                       const Val& values, std::int64_t count, Balancing balancing,
                       double balance_threshold, SparseGather<ExecSpace, Real>& gather,
                       Timed&& timed) {
  gather.counts.assign(comm.size(), 0);
  {
    auto timer = timed("allgatherv");
    comm.allgather(&count, 1, gather.counts.data());
  }
  sparse_allgatherv_counted(exec, comm, indices, values, balancing, balance_threshold, gather,
                            timed);
}

/// offsets = the running sums of `counts` from 0 (counts.size() + 1 of them), on the device,
/// with `host` its mirror; both are reallocated when the number of counts changes.
template <class ExecSpace>
void upload_block_offsets(
    const ExecSpace& exec, const std::vector<std::int64_t>& counts,
    Kokkos::View<std::int64_t*, typename ExecSpace::memory_space>& offsets,
    typename Kokkos::View<std::int64_t*, typename ExecSpace::memory_space>::host_mirror_type&
        host) {
  const auto blocks = static_cast<std::int64_t>(counts.size());
  if (static_cast<std::int64_t>(offsets.extent(0)) != blocks + 1) {
    offsets = Kokkos::View<std::int64_t*, typename ExecSpace::memory_space>(
        Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::block_offsets"),
        static_cast<std::size_t>(blocks + 1));
    host = Kokkos::create_mirror_view(offsets);
  }
  host(0) = 0;
  for (std::int64_t r = 0; r < blocks; ++r) host(r + 1) = host(r) + counts[r];
  Kokkos::deep_copy(exec, offsets, host);
}

/// \brief out(i) = (sum of the entries at index first_index + i of every block) / ranks, for
/// i < out.extent(0), in one kernel whatever the number of blocks: each team owns a range of
/// out, zeroes `sums` there (at least out's length of Real; out itself when it holds Real),
/// adds the entries every block holds in that range, block after block, and divides into out,
/// rounded once. Block r is entries [offsets(r), offsets(r + 1)); within a block the indices
/// are distinct and ascending (the methods select in index order), so two binary searches find
/// a block's part of the range and its adds do not race; entries of different blocks may share
/// an index. Every index gets the same additions in block order on every rank and run, at any
/// team size and whatever part of the vector out covers.
template <class ExecSpace, class Idx, class Vals, class Offsets, class Sums, class Out>
void average_blocks(const ExecSpace& exec, const Idx& indices, const Vals& values,
                    const Offsets& offsets, std::int64_t total, std::int64_t first_index,
                    const Sums& sums, const Out& out, int ranks) {
  using Stored = typename Out::non_const_value_type;
  using Policy = Kokkos::TeamPolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
  const auto blocks = static_cast<std::int64_t>(offsets.extent(0)) - 1;
  const auto n = static_cast<std::int64_t>(out.extent(0));
  if (n == 0) return;
  // Each team searches every block twice: ranges wide enough that the searches cost about a
  // sixteenth of the pass over the n entries and the gathered ones.
  const double wide =
      16.0 * static_cast<double>(blocks) * static_cast<double>(n) / static_cast<double>(n + total);
  const std::int64_t width = std::max<std::int64_t>(1024, static_cast<std::int64_t>(wide));
  const std::int64_t teams = (n + width - 1) / width;
  const auto divisor = static_cast<float>(ranks);
  Kokkos::parallel_for(
      "oktopk::average_blocks", Policy(exec, teams, Kokkos::AUTO),
      KOKKOS_LAMBDA(const typename Policy::member_type& team) {
        const std::int64_t lo = static_cast<std::int64_t>(team.league_rank()) * width;
        const std::int64_t hi = lo + width < n ? lo + width : n;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, lo, hi),
                             [&](std::int64_t i) { sums(i) = 0; });
        for (std::int64_t r = 0; r < blocks; ++r) {
          team.team_barrier();
          const std::int64_t first =
              lower_bound(indices, offsets(r), offsets(r + 1), lo + first_index);
          const std::int64_t last = lower_bound(indices, first, offsets(r + 1), hi + first_index);
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, first, last), [&](std::int64_t j) {
            sums(static_cast<std::int64_t>(indices(j)) - first_index) += values(j);
          });
        }
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, lo, hi), [&](std::int64_t i) {
          out(i) = value_cast<Stored>(to_arithmetic(sums(i)) / divisor);
        });
      });
}

/// out = (sum of the gathered entries) / P: average_blocks over every rank's block.
template <class ExecSpace, class Real, class Sums, class Out>
void average_gathered(const ExecSpace& exec, SparseGather<ExecSpace, Real>& gather,
                      const Sums& sums, const Out& out, int ranks) {
  if (out.extent(0) == 0) return;
  upload_block_offsets(exec, gather.counts, gather.block_offsets, gather.block_offsets_host);
  average_blocks(exec, gather.indices, gather.values, gather.block_offsets, gather.total, 0, sums,
                 out, ranks);
}

}  // namespace oktopk::impl
