// SPDX-License-Identifier: BSD-3-Clause
// Split-and-reduce, a sparse reduce-scatter: each rank selects its entries above a threshold,
// sends those of region r to rank r, and sums what it receives into its own region. Ok-Topk's
// phase 1 and TopkDSA's first step.
#pragma once

#include <oktopk/communicator.hpp>
#include <oktopk/fwd.hpp>
#include <oktopk/pack.hpp>
#include <oktopk/select.hpp>
#include <oktopk/impl/collectives/wire_values.hpp>
#include <oktopk/impl/comm/fault_injection.hpp>
#include <oktopk/impl/comm/mpi_mirror.hpp>
#include <oktopk/impl/kernels/candidates.hpp>
#include <oktopk/impl/kernels/vector_ops.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace oktopk::impl {

/// \brief Buffers of split_and_reduce, kept across calls, and what the last call produced.
template <class ExecSpace, class Real>
struct SplitReduce {
  using Memory = typename ExecSpace::memory_space;
  /// This rank's selection, grouped by destination region, indices relative to the region.
  Kokkos::View<index_type*, Memory> send_indices{"oktopk::SplitReduce::send_indices", 0};
  Kokkos::View<Real*, Memory> send_values{"oktopk::SplitReduce::send_values", 0};
  Kokkos::View<count_type*, Memory> send_counts_device{"oktopk::SplitReduce::send_counts", 0};
  // host_mirror_type, not the HostMirror alias that Kokkos 4.7 deprecates.
  typename Kokkos::View<count_type*, Memory>::host_mirror_type send_counts_host;
  std::vector<std::int64_t> send_counts;   // per region
  std::vector<std::int64_t> send_offsets;  // start of each region's group, P + 1 entries
  /// send_offsets in the execution space's memory, computed there (no copy from the host).
  Kokkos::View<count_type*, Memory> send_offsets_device{"oktopk::SplitReduce::send_offsets", 0};
  /// What the other ranks sent for my region, grouped by source rank.
  Kokkos::View<index_type*, Memory> recv_indices{"oktopk::SplitReduce::recv_indices", 0};
  Kokkos::View<Real*, Memory> recv_values{"oktopk::SplitReduce::recv_values", 0};
  std::vector<std::int64_t> recv_counts;
  std::vector<std::int64_t> recv_offsets;
  /// My region of the reduced sum, dense: sum over ranks of their selected entries. A view of
  /// the first entries of region_storage, which only grows: region boundaries move at every
  /// repartition, and a new allocation of n/P floats then cost more than the call's passes.
  Kokkos::View<Real*, Memory> region{"oktopk::SplitReduce::region", 0};
  Kokkos::View<Real*, Memory> region_storage{"oktopk::SplitReduce::region", 0};
  /// Entries this rank selected (the sum of send_counts), and what they were
  /// (LocalSelection::took): above the threshold, and the ties below tied_end.
  std::int64_t selected = 0;
  std::int64_t tied_end = 0;
  /// The type the values travel in (value_wire(); the method sets it). For a wire narrower
  /// than Real, the values go as 16-bit words, and send_values holds them rounded as sent.
  Wire wire = Wire::Native;
  Kokkos::View<std::uint16_t*, Memory> send_words{"oktopk::SplitReduce::send_words", 0};
  Kokkos::View<std::uint16_t*, Memory> recv_words{"oktopk::SplitReduce::recv_words", 0};
  /// How many values this rank sent that rounded to Inf on the wire, over the calls since the
  /// method reset it.
  std::int64_t overflowed = 0;
};

/// offsets(0) = 0, offsets(r + 1) = counts(0) + ... + counts(r), computed on the device by one
/// work item (P is small), so nothing waits for the host. A function of its own: nvcc rejects
/// device lambdas in functions templated on a local type, such as split_and_reduce's `timed`.
template <class ExecSpace, class Counts, class Offsets>
void prefix_offsets(const ExecSpace& exec, const Counts& counts, const Offsets& offsets) {
  const auto parts = static_cast<int>(counts.extent(0));
  Kokkos::parallel_for(
      "oktopk::split_and_reduce::send_offsets", RangeOf<ExecSpace>(exec, 0, 1), KOKKOS_LAMBDA(int) {
        count_type running = 0;
        offsets(0) = 0;
        for (int r = 0; r < parts; ++r) {
          running += counts(r);
          offsets(r + 1) = running;
        }
      });
}

/// \brief Collective. Selects {i : |acc(i)| > threshold} (and, where fewer than `fill_to` are
/// and the threshold is finite and above 0, the first entries equal to it in index order up to
/// `fill_to` in all: an exact top-k's ties), splits it by the regions
/// [offsets[r], offsets[r+1]) (host `offsets`, device `offsets_device`, P + 1 entries), and
/// reduces region r on rank r into `state.region`: the rank's own part first, then the others
/// in the order of the rotation below, so the sum is the same on every run.
///
/// `known` lets the selection read acc once instead of twice (the counts per chunk), or only
/// where the candidates spilled (the counts and the candidates).
///
/// Rotation: in step s = 1..P-1 rank r sends to r+s and receives from r-s (mod P), so no rank
/// is the target of everyone at once. Steps go in groups of `throttle` (the messages in
/// flight); while a group travels, the previous group's data is added into the region.
template <class ExecSpace, class Real, class Acc, class Timed>
void split_and_reduce(
    const ExecSpace& exec, const Communicator& comm, const Acc& acc, float threshold,
    std::int64_t fill_to, const KnownAbove<ExecSpace, Real>& known,
    const std::vector<std::int64_t>& offsets,
    const Kokkos::View<count_type*, typename ExecSpace::memory_space>& offsets_device, int throttle,
    SplitReduce<ExecSpace, Real>& state, Timed&& timed) {
  const int P = comm.size();
  const int me = comm.rank();
  using Memory = typename ExecSpace::memory_space;
  if (static_cast<int>(state.send_counts_device.extent(0)) != P) {
    state.send_counts_device = Kokkos::View<count_type*, Memory>(
        Kokkos::view_alloc(exec, "oktopk::SplitReduce::send_counts"), P);
    state.send_counts_host = Kokkos::create_mirror_view(state.send_counts_device);
    state.send_offsets_device = Kokkos::View<count_type*, Memory>(
        Kokkos::view_alloc(exec, "oktopk::SplitReduce::send_offsets"), P + 1);
  }
  {
    auto timer = timed("select");
    const auto grown = [&](std::int64_t count) {
      if (count <= static_cast<std::int64_t>(state.send_indices.extent(0))) return false;
      ensure_capacity(exec, state.send_indices, count);
      ensure_capacity(exec, state.send_values, count);
      return true;
    };
    std::int64_t selected =
        select_known(exec, known, acc, threshold, state.send_indices, state.send_values);
    if (grown(selected)) {
      selected = select_known(exec, known, acc, threshold, state.send_indices, state.send_values);
    }
    state.tied_end = 0;
    if (selected < fill_to && threshold > 0.0f && std::isfinite(threshold)) {
      const std::int64_t ties = fill_to - selected;
      selected =
          select_above_and_ties(exec, acc, threshold, ties, state.send_indices, state.send_values);
      if (grown(selected)) {
        selected = select_above_and_ties(exec, acc, threshold, ties, state.send_indices,
                                         state.send_values);
      }
      state.tied_end =
          tied_end_of(exec, state.send_indices, state.send_values, selected, threshold);
    }
    split_by_region(exec, offsets_device, state.send_indices, state.send_values, selected,
                    state.send_counts_device);
    state.selected = selected;
    prefix_offsets(exec, state.send_counts_device, state.send_offsets_device);
    Kokkos::deep_copy(exec, state.send_counts_host, state.send_counts_device);
    fence(exec, "oktopk::split_and_reduce: counts to host");
    state.send_counts.assign(state.send_counts_host.data(), state.send_counts_host.data() + P);
    state.send_offsets.assign(P + 1, 0);
    for (int r = 0; r < P; ++r)
      state.send_offsets[r + 1] = state.send_offsets[r] + state.send_counts[r];
  }

  auto timer = timed("split_reduce");
  // A narrower wire sends words; send_values then holds what they carry, which my own part
  // adds as the others add theirs.
  const bool narrow = state.wire != Wire::Native;
  const std::int64_t width = wire_words<Real>(state.wire);
  if (narrow) {
    ensure_capacity(exec, state.send_words, width * state.selected);
    state.overflowed +=
        encode_values(exec, state.send_values, state.selected, state.send_words, state.wire);
  }
  state.recv_counts.assign(P, 0);
  comm.alltoall(state.send_counts.data(), state.recv_counts.data(), 1);
  state.recv_offsets.assign(P + 1, 0);
  for (int r = 0; r < P; ++r)
    state.recv_offsets[r + 1] = state.recv_offsets[r] + state.recv_counts[r];
  ensure_capacity(exec, state.recv_indices, state.recv_offsets[P]);
  ensure_capacity(exec, state.recv_values, state.recv_offsets[P]);
  if (narrow) ensure_capacity(exec, state.recv_words, width * state.recv_offsets[P]);
  auto range = [](std::int64_t b, std::int64_t e) { return Kokkos::make_pair(b, e); };
  const std::int64_t region_size = offsets[me + 1] - offsets[me];
  ensure_capacity(exec, state.region_storage, region_size);
  state.region = Kokkos::subview(state.region_storage, range(0, region_size));
  Kokkos::deep_copy(exec, state.region, Real(0));

  auto add_from = [&](const auto& idx, const auto& val, std::int64_t begin, std::int64_t end) {
    if (end > begin) {
      scatter_add_distinct(exec, Kokkos::subview(idx, range(begin, end)),
                           Kokkos::subview(val, range(begin, end)), state.region);
    }
  };
  // My own part needs no message.
  add_from(state.send_indices, state.send_values, state.send_offsets[me],
           state.send_offsets[me + 1]);

  const std::int64_t sent = state.send_offsets[P];
  const std::int64_t received = state.recv_offsets[P];
  const auto send_idx = mpi_send_view(exec, Kokkos::subview(state.send_indices, range(0, sent)));
  // The values' messages: Real values, or `width` words each on a narrower wire.
  const auto send_val =
      mpi_send_view(exec, Kokkos::subview(state.send_values, range(0, narrow ? 0 : sent)));
  const auto send_wire =
      mpi_send_view(exec, Kokkos::subview(state.send_words, range(0, narrow ? width * sent : 0)));
  auto recv_idx = mpi_receive_view(exec, Kokkos::subview(state.recv_indices, range(0, received)));
  auto recv_val =
      mpi_receive_view(exec, Kokkos::subview(state.recv_values, range(0, narrow ? 0 : received)));
  auto recv_wire = mpi_receive_view(
      exec, Kokkos::subview(state.recv_words, range(0, narrow ? width * received : 0)));
  const auto send_values_of = [&](int dst, Communicator::Requests& requests) {
    const std::int64_t at = state.send_offsets[dst];
    const std::int64_t count = state.send_counts[dst];
    if (narrow) {
      comm.isend(send_wire.data() + width * at, width * count, dst, 2, requests);
    } else {
      comm.isend(send_val.data() + at, count, dst, 2, requests);
    }
  };
  const auto receive_values_of = [&](int src, Communicator::Requests& requests) {
    const std::int64_t at = state.recv_offsets[src];
    const std::int64_t count = state.recv_counts[src];
    if (narrow) {
      comm.irecv(recv_wire.data() + width * at, width * count, src, 2, requests);
    } else {
      comm.irecv(recv_val.data() + at, count, src, 2, requests);
    }
  };
  const int group = std::max(1, std::min(throttle, P - 1));
  int pending_first = 1, pending_last = 0;  // steps received but not yet added
  for (int first = 1; first < P; first += group) {
    const int last = std::min(P - 1, first + group - 1);
    Communicator::Requests requests;
    for (int s = first; s <= last; ++s) {
      const int dst = (me + s) % P;
      const int src = (me - s + P) % P;
      if (state.recv_counts[src] > 0) {
        comm.irecv(recv_idx.data() + state.recv_offsets[src], state.recv_counts[src], src, 1,
                   requests);
        receive_values_of(src, requests);
      }
      if (state.send_counts[dst] > 0) {
        comm.isend(send_idx.data() + state.send_offsets[dst], state.send_counts[dst], dst, 1,
                   requests);
        send_values_of(dst, requests);
      }
    }
    OKTOPK_FAULT_POINT(comm, "posted");
    // Overlap: add the previous group's data while this group is in flight.
    for (int s = pending_first; s <= pending_last; ++s) {
      const int src = (me - s + P) % P;
      add_from(state.recv_indices, state.recv_values, state.recv_offsets[src],
               state.recv_offsets[src + 1]);
    }
    requests.wait_all();
    for (int s = first; s <= last; ++s) {
      const int src = (me - s + P) % P;
      mpi_received(exec, recv_idx, state.recv_indices, state.recv_offsets[src],
                   state.recv_offsets[src + 1]);
      if (narrow) {
        mpi_received(exec, recv_wire, state.recv_words, width * state.recv_offsets[src],
                     width * state.recv_offsets[src + 1]);
        decode_values(exec, state.recv_words, state.recv_offsets[src], state.recv_offsets[src + 1],
                      state.recv_values, state.wire);
      } else {
        mpi_received(exec, recv_val, state.recv_values, state.recv_offsets[src],
                     state.recv_offsets[src + 1]);
      }
    }
    pending_first = first;
    pending_last = last;
  }
  for (int s = pending_first; s <= pending_last; ++s) {
    const int src = (me - s + P) % P;
    add_from(state.recv_indices, state.recv_values, state.recv_offsets[src],
             state.recv_offsets[src + 1]);
  }
}

/// \brief The last split_and_reduce call's local selection with global indices:
/// global(j) = send_indices(j) + region_offsets(r) for j in region r's group. One kernel, with
/// no host involvement, whatever P.
template <class ExecSpace, class Real, class OffsetView, class OutIdx>
void selected_global_indices(const ExecSpace& exec, const SplitReduce<ExecSpace, Real>& state,
                             const OffsetView& region_offsets, const OutIdx& global) {
  const auto relative = state.send_indices;
  const auto group_offsets = state.send_offsets_device;
  const auto regions = static_cast<std::int64_t>(group_offsets.extent(0)) - 1;
  Kokkos::parallel_for(
      "oktopk::split_and_reduce::global_indices", impl::RangeOf<ExecSpace>(exec, 0, state.selected),
      KOKKOS_LAMBDA(std::int64_t j) {
        // The last group starting at or before j: empty groups share their start with the next.
        const auto r = upper_bound(group_offsets, regions + 1, j) - 1;
        global(j) = static_cast<index_type>(relative(j) + region_offsets(r));
      });
}

}  // namespace oktopk::impl
