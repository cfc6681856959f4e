// SPDX-License-Identifier: BSD-3-Clause
// What a sparse reduce-scatter puts in place of the allgather that replicates a result: each
// entry goes to the owner of the fixed shard it falls in. Ok-Topk and TopkDSA send their
// regions' reduced entries, and Ok-Topk's region owners tell every rank which of the entries it
// sent were selected, for its error feedback; TopkA and Gaussian-k send every rank's selection,
// which each shard's owner sums.
#pragma once

#include <oktopk/communicator.hpp>
#include <oktopk/error.hpp>
#include <oktopk/fwd.hpp>
#include <oktopk/pack.hpp>
#include <oktopk/impl/collectives/sparse_allgatherv.hpp>
#include <oktopk/impl/collectives/split_and_reduce.hpp>
#include <oktopk/impl/collectives/wire_values.hpp>
#include <oktopk/impl/comm/fault_injection.hpp>
#include <oktopk/impl/comm/mpi_mirror.hpp>
#include <oktopk/impl/kernels/vector_ops.hpp>

#include <Kokkos_Core.hpp>

#include <climits>
#include <cstdint>
#include <vector>

namespace oktopk::impl {

/// \brief Buffers of send_to_shards and return_selection, kept across calls, and what the last
/// call received.
template <class ExecSpace, class Real>
struct ShardExchange {
  using Memory = typename ExecSpace::memory_space;
  /// Where each shard's entries start among the entries sent (P + 1), found on the device.
  Kokkos::View<std::int64_t*, Memory> cuts{"oktopk::ShardExchange::cuts", 0};
  typename Kokkos::View<std::int64_t*, Memory>::host_mirror_type cuts_host;
  std::vector<std::int64_t> send_counts, recv_counts, recv_offsets;
  /// (index, value) pairs as 16-bit words (pack_pairs), sent and received.
  Kokkos::View<std::uint16_t*, Memory> send_pairs{"oktopk::ShardExchange::send_pairs", 0};
  Kokkos::View<std::uint16_t*, Memory> recv_pairs{"oktopk::ShardExchange::recv_pairs", 0};
  /// The entries of this rank's shard, in blocks by sender in rank order, each block ascending
  /// (the whole ascending when the senders' entries lie in regions that ascend with rank).
  Kokkos::View<index_type*, Memory> indices{"oktopk::ShardExchange::indices", 0};
  Kokkos::View<Real*, Memory> values{"oktopk::ShardExchange::values", 0};
  std::int64_t received = 0;
  /// Where each sender's entries start among those received (P + 1), for average_received.
  Kokkos::View<std::int64_t*, Memory> block_offsets{"oktopk::ShardExchange::block_offsets", 0};
  typename Kokkos::View<std::int64_t*, Memory>::host_mirror_type block_offsets_host;
  /// Per entry of split_and_reduce's messages: 1 where the region's owner selected it globally.
  Kokkos::View<std::uint8_t*, Memory> received_flags{"oktopk::ShardExchange::received_flags", 0};
  Kokkos::View<std::uint8_t*, Memory> sent_flags{"oktopk::ShardExchange::sent_flags", 0};
  /// The local selection with global indices (selected_global_indices).
  Kokkos::View<index_type*, Memory> selected_indices{"oktopk::ShardExchange::selected_indices", 0};
  /// The type the values travel in, and how many this rank sent that rounded to Inf on it, over
  /// the calls since the method reset it.
  Wire wire = Wire::Native;
  std::int64_t overflowed = 0;
};

/// cuts(q) = how many of sorted(0 .. count - 1) lie below offsets[q], for the P + 1 offsets.
template <class ExecSpace, class Sorted>
void cut_at_offsets(const ExecSpace& exec, const Sorted& sorted, std::int64_t count,
                    const Kokkos::View<std::int64_t*, typename ExecSpace::memory_space>& cuts) {
  Kokkos::parallel_for(
      "oktopk::shard_exchange::cuts", RangeOf<ExecSpace>(exec, 0, cuts.extent(0)),
      KOKKOS_LAMBDA(std::int64_t q) { cuts(q) = lower_bound(sorted, count, cuts(q)); });
}

/// \brief Collective. Sends this rank's `count` (index, value) entries (global indices
/// ascending; values as state.wire carries them, as the allgather would) to the ranks whose
/// shards [shard_offsets[q], shard_offsets[q + 1]) hold them, and receives the entries of its
/// own shard from every rank into state.indices and state.values (state.received of them), in
/// rank order: ascending when the senders' entries lie in regions that ascend with their rank
/// (Ok-Topk, TopkDSA), else ascending within each sender's block (TopkA, Gaussian-k).
template <class ExecSpace, class Real, class Idx, class Val>
void send_to_shards(const ExecSpace& exec, const Communicator& comm, const Idx& indices,
                    const Val& values, std::int64_t count,
                    const std::vector<std::int64_t>& shard_offsets,
                    ShardExchange<ExecSpace, Real>& state) {
  using Memory = typename ExecSpace::memory_space;
  const int P = comm.size();
  const auto range = [](std::int64_t b, std::int64_t e) { return Kokkos::make_pair(b, e); };
  if (static_cast<int>(state.cuts.extent(0)) != P + 1) {
    state.cuts = Kokkos::View<std::int64_t*, Memory>(
        Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::ShardExchange::cuts"),
        static_cast<std::size_t>(P + 1));
    state.cuts_host = Kokkos::create_mirror_view(state.cuts);
  }
  for (int q = 0; q <= P; ++q) state.cuts_host(q) = shard_offsets[static_cast<std::size_t>(q)];
  Kokkos::deep_copy(exec, state.cuts, state.cuts_host);
  cut_at_offsets(exec, indices, count, state.cuts);
  Kokkos::deep_copy(exec, state.cuts_host, state.cuts);
  fence(exec, "oktopk::send_to_shards: cuts to host");
  state.send_counts.assign(P, 0);
  for (int q = 0; q < P; ++q) state.send_counts[q] = state.cuts_host(q + 1) - state.cuts_host(q);
  state.recv_counts.assign(P, 0);
  comm.alltoall(state.send_counts.data(), state.recv_counts.data(), 1);
  state.recv_offsets.assign(P + 1, 0);
  for (int q = 0; q < P; ++q)
    state.recv_offsets[q + 1] = state.recv_offsets[q] + state.recv_counts[q];
  state.received = state.recv_offsets[P];

  const std::int64_t words = pair_words<Real>(state.wire);
  OKTOPK_REQUIRE(count <= INT_MAX / words && state.received <= INT_MAX / words, std::runtime_error,
                 "oktopk::SparseAllreduce::reduce_scatter",
                 "a shard's entries exceed what one MPI message of (index, value) pairs can carry");
  ensure_capacity(exec, state.send_pairs, words * count);
  ensure_capacity(exec, state.recv_pairs, words * state.received);
  ensure_capacity(exec, state.indices, state.received);
  ensure_capacity(exec, state.values, state.received);
  state.overflowed += pack_pairs(exec, indices, values, count, state.send_pairs, state.wire);
  const auto send = mpi_send_view(exec, Kokkos::subview(state.send_pairs, range(0, words * count)));
  auto receive =
      mpi_receive_view(exec, Kokkos::subview(state.recv_pairs, range(0, words * state.received)));
  Communicator::Requests requests;
  const int me = comm.rank();
  for (int s = 0; s < P; ++s) {
    // The same rotation as split_and_reduce's: no rank is everyone's target at once.
    const int src = (me - s + P) % P;
    const int dst = (me + s) % P;
    if (state.recv_counts[src] > 0) {
      comm.irecv(receive.data() + words * state.recv_offsets[src], words * state.recv_counts[src],
                 src, 3, requests);
    }
    if (state.send_counts[dst] > 0) {
      comm.isend(send.data() + words * state.cuts_host(dst), words * state.send_counts[dst], dst, 3,
                 requests);
    }
  }
  OKTOPK_FAULT_POINT(comm, "posted");
  requests.wait_all();
  mpi_received(exec, receive, state.recv_pairs, 0, words * state.received);
  unpack_pairs(exec, state.recv_pairs, state.received, state.indices, state.values, state.wire);
}

/// \brief shard(i) = (the sum of the entries send_to_shards received at index first_index + i)
/// / ranks. Each sender's entries are a block, in rank order, so every index gets its additions
/// in the order average_gathered gives them in reduce().
template <class ExecSpace, class Real, class Sums, class Shard>
void average_received(const ExecSpace& exec, ShardExchange<ExecSpace, Real>& state,
                      std::int64_t first_index, const Sums& sums, const Shard& shard, int ranks) {
  if (shard.extent(0) == 0) return;
  upload_block_offsets(exec, state.recv_counts, state.block_offsets, state.block_offsets_host);
  average_blocks(exec, state.indices, state.values, state.block_offsets, state.received,
                 first_index, sums, shard, ranks);
}

/// \brief Collective: a sparse reduce-scatter of every rank's `count` selected entries (global
/// indices ascending, values as the allgather would carry them): send_to_shards, then
/// average_received into this rank's shard, phases "shard_exchange" and "reduce" (`timed(name)`
/// opens one). `sums`: average_blocks'. Returns the entries over all ranks, reduce()'s gathered
/// total.
template <class ExecSpace, class Real, class Idx, class Val, class Sums, class Shard, class Timed>
std::int64_t sparse_reduce_scatter(const ExecSpace& exec, const Communicator& comm,
                                   const Idx& indices, const Val& values, std::int64_t count,
                                   const std::vector<std::int64_t>& shard_offsets,
                                   ShardExchange<ExecSpace, Real>& state, const Sums& sums,
                                   const Shard& shard, Timed&& timed) {
  std::int64_t total = count;
  {
    auto timer = timed("shard_exchange");
    comm.allreduce_in_place(&total, 1, MPI_SUM);
    send_to_shards(exec, comm, indices, values, count, shard_offsets, state);
  }
  auto timer = timed("reduce");
  average_received(exec, state, shard_offsets[static_cast<std::size_t>(comm.rank())], sums, shard,
                   comm.size());
  return total;
}

/// flags(j) = 1 where relative(j) + region_begin is one of selected(0 .. count - 1) (ascending),
/// else 0, for j in [begin, end).
template <class ExecSpace, class Relative, class Selected, class Flags>
void flag_selected(const ExecSpace& exec, const Relative& relative, std::int64_t begin,
                   std::int64_t end, std::int64_t region_begin, const Selected& selected,
                   std::int64_t count, const Flags& flags) {
  Kokkos::parallel_for(
      "oktopk::shard_exchange::flag_selected", RangeOf<ExecSpace>(exec, begin, end),
      KOKKOS_LAMBDA(std::int64_t j) {
        const std::int64_t i = static_cast<std::int64_t>(relative(j)) + region_begin;
        const std::int64_t at = lower_bound(selected, count, i);
        flags(j) = at < count && static_cast<std::int64_t>(selected(at)) == i ? 1 : 0;
      });
}

/// acc(global(j)) -= wire_rounded(acc(global(j))) where flags(j) is set, j < count: the
/// clearing of what was both selected here and selected globally (0 left on the native wire).
template <class ExecSpace, class Acc, class Global, class Flags>
void clear_flagged(const ExecSpace& exec, const Acc& acc, const Global& global, const Flags& flags,
                   std::int64_t count, Wire wire) {
  Kokkos::parallel_for(
      "oktopk::shard_exchange::clear_flagged", RangeOf<ExecSpace>(exec, 0, count),
      KOKKOS_LAMBDA(std::int64_t j) {
        if (flags(j) == 0) return;
        const std::int64_t i = global(j);
        acc(i) -= wire_rounded(acc(i), wire);
      });
}

/// \brief Collective, after split_and_reduce (`split`, regions by `region_offsets`, host and
/// device) and the global selection of this rank's region (`selected`, `count` global indices
/// ascending): tells every rank which entries of its local selection were selected globally,
/// one byte per entry sent to another rank, and clears those entries in `acc` as reduce()'s
/// output phase does (clear_flagged).
template <class ExecSpace, class Real, class Acc, class Selected>
void return_selection(
    const ExecSpace& exec, const Communicator& comm, const SplitReduce<ExecSpace, Real>& split,
    const std::vector<std::int64_t>& region_offsets,
    const Kokkos::View<count_type*, typename ExecSpace::memory_space>& region_offsets_device,
    const Selected& selected, std::int64_t count, const Acc& acc, Wire wire,
    ShardExchange<ExecSpace, Real>& state) {
  const int P = comm.size();
  const int me = comm.rank();
  const auto range = [](std::int64_t b, std::int64_t e) { return Kokkos::make_pair(b, e); };
  const std::int64_t received = split.recv_offsets[P];
  const std::int64_t sent = split.selected;
  ensure_capacity(exec, state.received_flags, received);
  ensure_capacity(exec, state.sent_flags, sent);
  ensure_capacity(exec, state.selected_indices, sent);
  const std::int64_t region_begin = region_offsets[static_cast<std::size_t>(me)];
  flag_selected(exec, split.recv_indices, 0, received, region_begin, selected, count,
                state.received_flags);
  // My own part of my region needs no message.
  flag_selected(exec, split.send_indices, split.send_offsets[me], split.send_offsets[me + 1],
                region_begin, selected, count, state.sent_flags);
  const auto send = mpi_send_view(exec, Kokkos::subview(state.received_flags, range(0, received)));
  auto receive = mpi_receive_view(exec, Kokkos::subview(state.sent_flags, range(0, sent)));
  Communicator::Requests requests;
  for (int s = 1; s < P; ++s) {
    const int src = (me - s + P) % P;  // whose entries I reduced: their flags go back to them
    const int dst = (me + s) % P;      // whose region my entries went to
    if (split.send_counts[dst] > 0) {
      comm.irecv(receive.data() + split.send_offsets[dst], split.send_counts[dst], dst, 4,
                 requests);
    }
    if (split.recv_counts[src] > 0) {
      comm.isend(send.data() + split.recv_offsets[src], split.recv_counts[src], src, 4, requests);
    }
  }
  OKTOPK_FAULT_POINT(comm, "posted");
  requests.wait_all();
  for (int r = 0; r < P; ++r) {
    if (r != me)
      mpi_received(exec, receive, state.sent_flags, split.send_offsets[r],
                   split.send_offsets[r + 1]);
  }
  selected_global_indices(exec, split, region_offsets_device, state.selected_indices);
  clear_flagged(exec, acc, state.selected_indices, state.sent_flags, sent, wire);
}

}  // namespace oktopk::impl
