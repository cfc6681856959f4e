// SPDX-License-Identifier: BSD-3-Clause
// A ring allreduce that averages (Options::dense_allreduce = ring, and every dense allreduce
// on a wire narrower than the arithmetic type): a reduce-scatter in P - 1 steps, then an allgather
// in P - 1 steps, each step one message of about n/P values to the right-hand neighbour, so every
// rank sends 2(P-1)/P n values, the bandwidth optimum. The reduce-scatter alone is the Dense
// method's reduce_scatter on the ring, with the shards as its chunks. The division by P and the
// count of non-finite results ride on the last reduce step: a call reads its input once and
// writes its output once, where MPI_Allreduce followed by a division pass writes and reads the
// output once more.
#pragma once

#include <oktopk/communicator.hpp>
#include <oktopk/fwd.hpp>
#include <oktopk/options.hpp>
#include <oktopk/shards.hpp>
#include <oktopk/impl/base/half_types.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/base/value_traits.hpp>
#include <oktopk/impl/base/wire_rounding.hpp>
#include <oktopk/impl/comm/fault_injection.hpp>
#include <oktopk/impl/comm/mpi_mirror.hpp>
#include <oktopk/impl/kernels/vector_ops.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace oktopk::impl {

/// The values of one message of the ring: 2^19 (2 MiB of floats). Each message costs a
/// rendezvous between the neighbours: with Open MPI's shared-memory transport, messages of 2^15
/// values made the call slower at n = 2^20 to 2^24 (docs/benchmarks.md, "The default dense
/// path against a bare MPI_Allreduce"). A larger chunk still travels in pieces, each added
/// while the next arrives.
inline constexpr std::int64_t ring_segment_values = std::int64_t{1} << 19;

/// Whether a handle for Value gradients of length n on P ranks, running on ExecSpace, makes
/// its dense allreduces on the ring: when asked to (Ring, or Auto on a host space with chunks
/// of at least dense_ring_min_chunk values), and with a wire narrower than the arithmetic type,
/// since MPI has no 16-bit floating type to sum and its float sums of double gradients would
/// not be formed in double.
template <class Value, class ExecSpace>
bool dense_on_ring(const Options& options, std::int64_t n, int P) {
  if (value_wire<Value>(options) != Wire::Native) return true;
  switch (options.dense_allreduce) {
    case DenseAlgorithm::Ring:
      return true;
    case DenseAlgorithm::Auto:
      return runs_on_host_v<ExecSpace> && P > 1 && n / P >= dense_ring_min_chunk;
    default:
      return false;
  }
}

/// Whether a ring whose messages carry W rounds the values of type Value it sends: W is
/// narrower than Value's arithmetic type (a 16-bit type, or float for double values).
template <class W, class Value>
inline constexpr bool ring_narrows_v = is_half_v<W> ||
                                       (std::is_same_v<W, float> &&
                                        std::is_same_v<arithmetic_t<Value>, double>);

/// The type a narrowing ring on W forms its sums in: float for the 16-bit types, double for
/// float.
template <class W>
using ring_sum_t = std::conditional_t<is_half_v<W>, float, double>;

/// The ring's scratch for values of type W on the wire: `received` grows to the longest chunk;
/// `wire` (n entries, for a narrowing wire only) holds the values as they are sent, and the
/// allgather moves them in place.
template <class W, class MemorySpace>
struct RingBuffers {
  Kokkos::View<W*, MemorySpace> received{"oktopk::SparseAllreduce::ring_received", 0};
  Kokkos::View<W*, MemorySpace> wire{"oktopk::SparseAllreduce::ring_wire", 0};
};

/// x (of the ring's sum type) rounded to the wire type W and back: what a value is worth once
/// sent as W.
template <class W, class Sum>
KOKKOS_INLINE_FUNCTION Sum as_sent(Sum x) {
  return static_cast<Sum>(to_arithmetic(value_cast<W>(x)));
}

/// partial[begin, begin + count) = in[...] as sent + received[0, count): for a narrowing wire
/// summed in ring_sum_t<W> and stored as the wire type (a partial sum is only ever sent on, so
/// it is rounded once, where it is made); otherwise summed in the arithmetic type (float or
/// double). `in` holds the gradient's type or the arithmetic type.
template <class W, class ExecSpace, class In, class Partial, class Received>
void ring_add(const ExecSpace& exec, const In& in, const Partial& partial, const Received& received,
              std::int64_t begin, std::int64_t count) {
  using Stored = typename Partial::non_const_value_type;
  if constexpr (!ring_narrows_v<W, typename In::non_const_value_type>) {
    // The wire is the arithmetic type (float or double): a plain sum.
    Kokkos::parallel_for(
        "oktopk::ring_allreduce::add", RangeOf<ExecSpace>(exec, 0, count),
        KOKKOS_LAMBDA(std::int64_t i) { partial(begin + i) = in(begin + i) + received(i); });
  } else {
    using Sum = ring_sum_t<W>;
    Kokkos::parallel_for(
        "oktopk::ring_allreduce::add", RangeOf<ExecSpace>(exec, 0, count),
        KOKKOS_LAMBDA(std::int64_t i) {
          partial(begin + i) =
              value_cast<Stored>(as_sent<W>(static_cast<Sum>(to_arithmetic(in(begin + i)))) +
                                 static_cast<Sum>(to_arithmetic(received(i))));
        });
  }
}

// The kernels of ring_add_average, ring_add_average_rounded and round_counting_nonfinite are
// named functors, not lambdas: several translation units instantiate them with the same types,
// and nvcc's host-side lambda wrappers do not survive that (scripts/check-lambda-odr.py).

/// out[begin + i] = (in[begin + i] + received(i)) / divisor for i < count, counting the results
/// that are not finite. Work item c covers i in [c * chunk, (c + 1) * chunk): on the host a run
/// the compiler vectorizes, its count in a register (one entry a call, the count in memory, ran
/// one entry at a time and made the ring 1.17x a bare MPI_Allreduce at P = 2, n = 2^20); on
/// GPUs chunk = 1.
template <class In, class Out, class Received>
struct AddAverage {
  In in;
  Out out;
  Received received;
  std::int64_t begin = 0;
  std::int64_t count = 0;
  std::int64_t chunk = 1;
  float divisor = 1.0f;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t c, std::int64_t& nonfinite) const {
    using Real = typename Out::non_const_value_type;
    const std::int64_t first = c * chunk;
    const std::int64_t last = first + chunk < count ? first + chunk : count;
    std::int64_t bad = 0;
    for (std::int64_t i = first; i < last; ++i) {
      const Real average = (in(begin + i) + received(i)) / divisor;
      out(begin + i) = average;
      bad += is_finite(average) ? 0 : 1;
    }
    nonfinite += bad;
  }
};

/// out[begin, begin + count) = (in[...] + received[0, count)) / divisor, returning how many of
/// those results are not finite.
template <class ExecSpace, class In, class Out, class Received>
std::int64_t ring_add_average(const ExecSpace& exec, const In& in, const Out& out,
                              const Received& received, std::int64_t begin, std::int64_t count,
                              float divisor) {
  std::int64_t bad = 0;
  Kokkos::parallel_reduce("oktopk::ring_allreduce::add_average",
                          RangeOf<ExecSpace>(exec, 0, chunk_count<ExecSpace>(count)),
                          AddAverage<In, Out, Received>{in, out, received, begin, count,
                                                        chunk_length_v<ExecSpace>, divisor},
                          bad);
  return bad;
}

/// AddAverage for a narrowing wire: the average rounded to W goes to wire(begin + i) and,
/// converted, to out(begin + i); work items by chunks as AddAverage's.
template <class In, class Out, class Received, class WireView>
struct AddAverageRounded {
  In in;
  Out out;
  Received received;
  WireView wire;
  std::int64_t begin = 0;
  std::int64_t count = 0;
  std::int64_t chunk = 1;
  float divisor = 1.0f;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t c, std::int64_t& nonfinite) const {
    using W = typename WireView::non_const_value_type;
    using Stored = typename Out::non_const_value_type;
    using Sum = ring_sum_t<W>;
    const std::int64_t first = c * chunk;
    const std::int64_t last = first + chunk < count ? first + chunk : count;
    std::int64_t bad = 0;
    for (std::int64_t i = first; i < last; ++i) {
      const W rounded = value_cast<W>((as_sent<W>(static_cast<Sum>(to_arithmetic(in(begin + i)))) +
                                       static_cast<Sum>(to_arithmetic(received(i)))) /
                                      static_cast<Sum>(divisor));
      const Sum average = static_cast<Sum>(to_arithmetic(rounded));
      wire(begin + i) = rounded;
      out(begin + i) = value_cast<Stored>(average);
      bad += is_finite(average) ? 0 : 1;
    }
    nonfinite += bad;
  }
};

/// ring_add_average for a narrowing wire (`in` as sent): each average is rounded to the wire's
/// type, which goes into wire[begin, begin + count) for the allgather and, converted, into
/// out (of the gradient's or the arithmetic type); counts the results that are not finite (an
/// input, partial sum or average beyond the wire type's range among them).
template <class ExecSpace, class In, class Out, class Received, class WireView>
std::int64_t ring_add_average_rounded(const ExecSpace& exec, const In& in, const Out& out,
                                      const Received& received, const WireView& wire,
                                      std::int64_t begin, std::int64_t count, float divisor) {
  std::int64_t bad = 0;
  Kokkos::parallel_reduce(
      "oktopk::ring_allreduce::add_average_rounded",
      RangeOf<ExecSpace>(exec, 0, chunk_count<ExecSpace>(count)),
      AddAverageRounded<In, Out, Received, WireView>{in, out, received, wire, begin, count,
                                                     chunk_length_v<ExecSpace>, divisor},
      bad);
  return bad;
}

/// out(i) = in(i) as sent (rounded to W and back), counting the results that are not finite.
template <class W, class In, class Out>
struct RoundCountingNonfinite {
  In in;
  Out out;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i, std::int64_t& nonfinite) const {
    using Stored = typename Out::non_const_value_type;
    using Sum = ring_sum_t<W>;
    const Sum x = as_sent<W>(static_cast<Sum>(to_arithmetic(in(i))));
    out(i) = value_cast<Stored>(x);
    if (!is_finite(x)) ++nonfinite;
  }
};

/// out = in as sent (rounded to W and back), returning how many results are not finite.
template <class W, class ExecSpace, class In, class Out>
std::int64_t round_counting_nonfinite(const ExecSpace& exec, const In& in, const Out& out) {
  std::int64_t bad = 0;
  Kokkos::parallel_reduce("oktopk::ring_allreduce::round_counting_nonfinite",
                          RangeOf<ExecSpace>(exec, 0, out.extent(0)),
                          RoundCountingNonfinite<W, In, Out>{in, out}, bad);
  return bad;
}

/// wire[begin, begin + count) = x[...] rounded to the wire's type.
template <class ExecSpace, class X, class WireView>
void ring_round(const ExecSpace& exec, const X& x, const WireView& wire, std::int64_t begin,
                std::int64_t count) {
  using W = typename WireView::non_const_value_type;
  Kokkos::parallel_for(
      "oktopk::ring_allreduce::round", RangeOf<ExecSpace>(exec, 0, count),
      KOKKOS_LAMBDA(std::int64_t i) { wire(begin + i) = value_cast<W>(x(begin + i)); });
}

/// out[begin, begin + count) = wire[...] as out's type (exact: out is the wire's type or wider).
template <class ExecSpace, class WireView, class Out>
void ring_widen(const ExecSpace& exec, const WireView& wire, const Out& out, std::int64_t begin,
                std::int64_t count) {
  using Stored = typename Out::non_const_value_type;
  Kokkos::parallel_for(
      "oktopk::ring_allreduce::widen", RangeOf<ExecSpace>(exec, 0, count),
      KOKKOS_LAMBDA(std::int64_t i) { out(begin + i) = value_cast<Stored>(wire(begin + i)); });
}

/// \brief Collective. The ring's reduce-scatter and, with `gather`, its allgather: chunk c is
/// [bounds[c], bounds[c + 1]) (P + 1 boundaries from 0 to n, the same on every rank), and rank
/// c finishes it: out[chunk c] = (sum over ranks of in[chunk c]) / P on rank c, on every rank
/// with `gather`, bit-identical on all of them. Without `gather` the rest of out is scratch.
/// `in` and `out` may be the same View. Returns how many entries of the chunk this rank finished
/// hold NaN or Inf (the other ranks count the other chunks).
///
/// Rank r sends to r + 1 and receives from r - 1. Reduce-scatter step s = 0..P-2: send chunk
/// r - 1 - s (this rank's own input at s = 0, its partial sum after), receive chunk r - 2 - s
/// and add this rank's input to it; after the last step chunk r holds the whole sum, added in
/// ring order from rank r + 1 on. Allgather step s: send chunk r - s, receive chunk r - 1 - s,
/// both finished sums.
///
/// With W narrower than the arithmetic type (ring_narrows_v), every rank's input counts as
/// rounded to W (as if the gradient were sent whole, as DDP's bf16 and fp16 hooks send it), the
/// partial sums are rounded to W as they are sent and formed in ring_sum_t<W> (float for a
/// 16-bit W, double for float), and the finished average is rounded to W on the rank that
/// finished it, so that what it keeps is what the others receive. At P = 1: the input rounded
/// to W. A value beyond W's range anywhere makes its average Inf, hence counted.
template <class W, class ExecSpace, class In, class Out>
std::int64_t ring_average(const ExecSpace& exec, const Communicator& comm, const In& in,
                          const Out& out, RingBuffers<W, typename ExecSpace::memory_space>& buffers,
                          const std::vector<std::int64_t>& bounds, bool gather) {
  // A narrowing wire: the values sent live in buffers.wire.
  constexpr bool narrow = ring_narrows_v<W, typename Out::non_const_value_type>;
  const auto n = static_cast<std::int64_t>(out.extent(0));
  const int P = comm.size();
  const int me = comm.rank();
  const auto divisor = static_cast<float>(P);
  if (P == 1) {
    if constexpr (narrow) return round_counting_nonfinite<W>(exec, in, out);
    return divide_counting_nonfinite(exec, in, out, divisor);
  }

  std::int64_t longest = 0;
  for (int c = 0; c < P; ++c)
    longest = std::max(
        longest, bounds[static_cast<std::size_t>(c) + 1] - bounds[static_cast<std::size_t>(c)]);
  ensure_capacity(exec, buffers.received, longest);
  if constexpr (narrow) ensure_capacity(exec, buffers.wire, n);
  const auto& received = buffers.received;
  const auto& wire = buffers.wire;
  const int right = (me + 1) % P;
  const int left = (me + P - 1) % P;
  const auto chunk = [&](int c) {
    const int wrapped = ((c % P) + P) % P;
    return Kokkos::make_pair(bounds[static_cast<std::size_t>(wrapped)],
                             bounds[static_cast<std::size_t>(wrapped) + 1]);
  };
  constexpr int reduce_tag = 11;
  constexpr int gather_tag = 12;
  // A chunk travels in segments, each its own message, and each is added as it arrives, while
  // it is still in cache and while later segments travel.
  const auto segments = [](std::int64_t count) {
    return (count + ring_segment_values - 1) / ring_segment_values;
  };
  // The allgather moves finished averages: out's own for a wire of the arithmetic type, else
  // their rounded copies in `wire`, widened into out as they arrive.
  const auto gathered = [&] {
    if constexpr (narrow) {
      return wire;
    } else {
      return out;
    }
  }();
  // The allgather's first step moves the chunk this rank finishes in the last reduce step
  // (chunk me) and brings chunk me - 1: each segment is sent as soon as it is averaged, so that
  // it travels while the next is added (at P = 2 that is the whole allgather). Without the
  // allgather it is empty.
  const auto first_gathered =
      gather ? chunk(me - 1) : Kokkos::make_pair(std::int64_t{0}, std::int64_t{0});
  const std::int64_t first_gathered_count = first_gathered.second - first_gathered.first;
  auto first_gather_receive = mpi_receive_view(exec, Kokkos::subview(gathered, first_gathered));
  std::vector<Communicator::Requests> first_gather_arrivals(
      static_cast<std::size_t>(segments(first_gathered_count)));
  std::size_t first_gather_posted = 0;
  const auto post_first_gather_receives = [&](std::size_t up_to) {
    for (; first_gather_posted < std::min(up_to, first_gather_arrivals.size());
         ++first_gather_posted) {
      const std::int64_t at = static_cast<std::int64_t>(first_gather_posted) * ring_segment_values;
      comm.irecv(first_gather_receive.data() + at,
                 std::min(ring_segment_values, first_gathered_count - at), left, gather_tag,
                 first_gather_arrivals[first_gather_posted]);
    }
  };
  Communicator::Requests first_gather_departures;
  std::vector<MpiBuffer<const W>> first_gather_sends;
  first_gather_sends.reserve(first_gather_arrivals.size() + 1);

  std::int64_t nonfinite = 0;
  for (int s = 0; s < P - 1; ++s) {
    const bool last = s == P - 2;
    const auto sent = chunk(me - 1 - s);
    const auto got = chunk(me - 2 - s);
    const std::int64_t sent_count = sent.second - sent.first;
    const std::int64_t got_count = got.second - got.first;
    auto receive = mpi_receive_view(
        exec, Kokkos::subview(received, Kokkos::make_pair(std::int64_t{0}, got_count)));
    // Step 0 sends this rank's input; later steps the partial sums it made (for a narrow
    // wire, already rounded into `wire` by the step before).
    MpiBuffer<const W> send;
    if constexpr (narrow) {
      if (s == 0) ring_round(exec, in, wire, sent.first, sent_count);
      send = mpi_send_view(exec, Kokkos::subview(wire, sent));
    } else if (s == 0) {
      send = mpi_send_view(exec, Kokkos::subview(in, sent));
    } else {
      send = mpi_send_view(exec, Kokkos::subview(out, sent));
    }
    // Both neighbours know every chunk's length, so empty chunks (n < P) need no message, and
    // both cut it into the same segments, which MPI delivers in order.
    std::vector<Communicator::Requests> arrivals(static_cast<std::size_t>(segments(got_count)));
    for (std::size_t j = 0; j < arrivals.size(); ++j) {
      const std::int64_t at = static_cast<std::int64_t>(j) * ring_segment_values;
      comm.irecv(receive.data() + at, std::min(ring_segment_values, got_count - at), left,
                 reduce_tag, arrivals[j]);
    }
    // One request per segment: at P = 2 the allgather's first step receives into the chunk
    // this step sends (`wire`'s on a narrowing wire, and `out`'s when `in` is `out`), so
    // segment j may be received into only once its send is complete.
    std::vector<Communicator::Requests> departures(static_cast<std::size_t>(segments(sent_count)));
    for (std::size_t j = 0; j < departures.size(); ++j) {
      const std::int64_t at = static_cast<std::int64_t>(j) * ring_segment_values;
      comm.isend(send.data() + at, std::min(ring_segment_values, sent_count - at), right,
                 reduce_tag, departures[j]);
    }
    OKTOPK_FAULT_POINT(comm, "posted");
    for (std::size_t j = 0; j < arrivals.size(); ++j) {
      const std::int64_t at = static_cast<std::int64_t>(j) * ring_segment_values;
      const std::int64_t count = std::min(ring_segment_values, got_count - at);
      arrivals[j].wait_all();
      mpi_received(exec, receive, received, at, at + count);
      const auto part = Kokkos::subview(received, Kokkos::make_pair(at, at + count));
      const std::int64_t begin = got.first + at;
      if (!last) {
        if constexpr (narrow) {
          ring_add<W>(exec, in, wire, part, begin, count);
        } else {
          ring_add<W>(exec, in, out, part, begin, count);
        }
        continue;
      }
      if constexpr (narrow) {
        nonfinite += ring_add_average_rounded(exec, in, out, part, wire, begin, count, divisor);
      } else {
        nonfinite += ring_add_average(exec, in, out, part, begin, count, divisor);
      }
      if (!gather) continue;
      if (j < departures.size()) departures[j].wait_all();
      post_first_gather_receives(j + 1);
      first_gather_sends.push_back(
          mpi_send_view(exec, Kokkos::subview(gathered, Kokkos::make_pair(begin, begin + count))));
      comm.isend(first_gather_sends.back().data(), count, right, gather_tag,
                 first_gather_departures);
    }
    for (auto& departure : departures) departure.wait_all();
  }
  if (!gather) return nonfinite;
  // Chunk me - 1 may have more segments than the chunk this rank finished.
  post_first_gather_receives(first_gather_arrivals.size());
  for (auto& arrival : first_gather_arrivals) arrival.wait_all();
  first_gather_departures.wait_all();
  mpi_received(exec, first_gather_receive, Kokkos::subview(gathered, first_gathered), 0,
               first_gathered_count);
  if constexpr (narrow) ring_widen(exec, wire, out, first_gathered.first, first_gathered_count);

  for (int s = 1; s < P - 1; ++s) {
    const auto sent = chunk(me - s);
    const auto got = chunk(me - 1 - s);
    const auto send = mpi_send_view(exec, Kokkos::subview(gathered, sent));
    auto receive = mpi_receive_view(exec, Kokkos::subview(gathered, got));
    Communicator::Requests requests;
    if (got.second > got.first) {
      comm.irecv(receive.data(), got.second - got.first, left, gather_tag, requests);
    }
    if (sent.second > sent.first) {
      comm.isend(send.data(), sent.second - sent.first, right, gather_tag, requests);
    }
    requests.wait_all();
    mpi_received(exec, receive, Kokkos::subview(gathered, got), 0, got.second - got.first);
    if constexpr (narrow) ring_widen(exec, wire, out, got.first, got.second - got.first);
  }
  return nonfinite;
}

/// out = (sum over ranks of in) / P on every rank, bit-identical on all (ring_average with P
/// equal chunks).
template <class W, class ExecSpace, class In, class Out>
std::int64_t ring_allreduce_average(const ExecSpace& exec, const Communicator& comm, const In& in,
                                    const Out& out,
                                    RingBuffers<W, typename ExecSpace::memory_space>& buffers) {
  return ring_average(exec, comm, in, out, buffers,
                      equal_shard_offsets(static_cast<std::int64_t>(out.extent(0)), comm.size()),
                      true);
}

/// The ring's reduce-scatter: out[offsets[r], offsets[r + 1]) = rank r's shard of
/// (sum over ranks of in) / P on rank r (ring_average without the allgather; the rest of out is
/// scratch). With equal shards (equal_shard_offsets), the shard holds the same bits as
/// ring_allreduce_average's output there. Returns how many of the shard's averages are not
/// finite.
template <class W, class ExecSpace, class In, class Out>
std::int64_t ring_reduce_scatter_average(const ExecSpace& exec, const Communicator& comm,
                                         const In& in, const Out& out,
                                         RingBuffers<W, typename ExecSpace::memory_space>& buffers,
                                         const std::vector<std::int64_t>& offsets) {
  return ring_average(exec, comm, in, out, buffers, offsets, false);
}

}  // namespace oktopk::impl
