// SPDX-License-Identifier: BSD-3-Clause
// A ring allreduce that averages (Options::dense_allreduce = ring): a reduce-scatter in P - 1
// steps, then an allgather in P - 1 steps, each step one message of about n/P floats to the
// right-hand neighbour, so every rank sends 2(P-1)/P n floats, the bandwidth optimum. The
// division by P and the count of non-finite results ride on the last reduce step: a call reads
// its input once and writes its output once, where MPI_Allreduce followed by a division pass
// writes and reads the output once more.
#pragma once

#include <oktopk/communicator.hpp>
#include <oktopk/fwd.hpp>
#include <oktopk/impl/comm/fault_injection.hpp>
#include <oktopk/impl/comm/mpi_mirror.hpp>
#include <oktopk/impl/kernels/vector_ops.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace oktopk::impl {

/// First entry of chunk c when n entries are cut into P chunks (chunk P ends at n).
inline std::int64_t ring_chunk_begin(std::int64_t n, int P, int c) {
  return static_cast<std::int64_t>(c) * n / P;
}

/// out[begin, begin + count) = in[...] + received[0, count).
template <class ExecSpace, class In, class Out, class Received>
void ring_add(const ExecSpace& exec, const In& in, const Out& out, const Received& received,
              std::int64_t begin, std::int64_t count) {
  Kokkos::parallel_for(
      "oktopk::ring_allreduce::add", RangeOf<ExecSpace>(exec, 0, count),
      KOKKOS_LAMBDA(std::int64_t i) { out(begin + i) = in(begin + i) + received(i); });
}

/// out[begin, begin + count) = (in[...] + received[0, count)) / divisor, returning how many of
/// those results are not finite.
template <class ExecSpace, class In, class Out, class Received>
std::int64_t ring_add_average(const ExecSpace& exec, const In& in, const Out& out,
                              const Received& received, std::int64_t begin, std::int64_t count,
                              float divisor) {
  std::int64_t bad = 0;
  Kokkos::parallel_reduce(
      "oktopk::ring_allreduce::add_average", RangeOf<ExecSpace>(exec, 0, count),
      KOKKOS_LAMBDA(const std::int64_t i, std::int64_t& nonfinite) {
        const float average = (in(begin + i) + received(i)) / divisor;
        out(begin + i) = average;
        if (!is_finite(average)) ++nonfinite;
      },
      bad);
  return bad;
}

/// \brief Collective. out = (sum over ranks of in) / P, bit-identical on every rank: each chunk
/// is summed by one rank, in ring order, and then copied to the others. `in` and `out` may be
/// the same View. `received` is scratch that grows to n/P + 1 entries. Returns how many entries
/// of the chunk this rank finished hold NaN or Inf (the other ranks count the other chunks).
///
/// Rank r sends to r + 1 and receives from r - 1. Reduce-scatter step s = 0..P-2: send chunk
/// r - s (this rank's own input at s = 0, its partial sum after), receive chunk r - s - 1 and
/// add this rank's input to it; after the last step chunk r + 1 holds the whole sum. Allgather
/// step s: send chunk r + 1 - s, receive chunk r - s, both finished sums.
template <class ExecSpace, class In, class Out>
std::int64_t ring_allreduce_average(
    const ExecSpace& exec, const Communicator& comm, const In& in, const Out& out,
    Kokkos::View<value_type*, typename ExecSpace::memory_space>& received) {
  const auto n = static_cast<std::int64_t>(out.extent(0));
  const int P = comm.size();
  const int me = comm.rank();
  const auto divisor = static_cast<float>(P);
  if (P == 1) return divide_counting_nonfinite(exec, in, out, divisor);

  ensure_capacity(exec, received, n / P + 1);
  const int right = (me + 1) % P;
  const int left = (me + P - 1) % P;
  const auto chunk = [&](int c) {
    const int wrapped = ((c % P) + P) % P;
    return Kokkos::make_pair(ring_chunk_begin(n, P, wrapped), ring_chunk_begin(n, P, wrapped + 1));
  };
  constexpr int reduce_tag = 11;
  constexpr int gather_tag = 12;
  std::int64_t nonfinite = 0;
  for (int s = 0; s < P - 1; ++s) {
    const auto sent = chunk(me - s);
    const auto got = chunk(me - s - 1);
    const std::int64_t got_count = got.second - got.first;
    auto receive = mpi_receive_view(
        exec, Kokkos::subview(received, Kokkos::make_pair(std::int64_t{0}, got_count)));
    // Step 0 sends this rank's input; later steps the partial sums it made.
    Kokkos::View<const value_type*, mpi_memory_space_t<ExecSpace>> send;
    if (s == 0) {
      send = mpi_send_view(exec, Kokkos::subview(in, sent));
    } else {
      send = mpi_send_view(exec, Kokkos::subview(out, sent));
    }
    Communicator::Requests requests;
    // Both neighbours know every chunk's length, so empty chunks (n < P) need no message.
    if (got_count > 0) comm.irecv(receive.data(), got_count, left, reduce_tag, requests);
    if (sent.second > sent.first) {
      comm.isend(send.data(), sent.second - sent.first, right, reduce_tag, requests);
    }
    OKTOPK_FAULT_POINT(comm, "posted");
    requests.wait_all();
    mpi_received(exec, receive, received, 0, got_count);
    if (s < P - 2) {
      ring_add(exec, in, out, received, got.first, got_count);
    } else {
      nonfinite = ring_add_average(exec, in, out, received, got.first, got_count, divisor);
    }
  }
  for (int s = 0; s < P - 1; ++s) {
    const auto sent = chunk(me + 1 - s);
    const auto got = chunk(me - s);
    const auto send = mpi_send_view(exec, Kokkos::subview(out, sent));
    auto receive = mpi_receive_view(exec, Kokkos::subview(out, got));
    Communicator::Requests requests;
    if (got.second > got.first) {
      comm.irecv(receive.data(), got.second - got.first, left, gather_tag, requests);
    }
    if (sent.second > sent.first) {
      comm.isend(send.data(), sent.second - sent.first, right, gather_tag, requests);
    }
    requests.wait_all();
    mpi_received(exec, receive, Kokkos::subview(out, got), 0, got.second - got.first);
  }
  return nonfinite;
}

}  // namespace oktopk::impl
