// SPDX-License-Identifier: BSD-3-Clause
// A GPU thread's walk over its share of a stretch with several reads in flight.
//
// A thread that uses each entry before it reads the next waits out every read in turn whenever
// the use writes memory the compiler cannot tell from the input (an atomic on a shared-memory
// histogram, a reduction's accumulator): an H200 then counted 2^26 bfloat16s in the same time
// as 2^26 floats, at a quarter of copy bandwidth (docs/benchmarks.md, "GPU selection kernels").
// Here a thread reads a round of entries with no branch or store between the reads, and only
// then uses them.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

/// `#pragma unroll` where the compiler takes it (nvcc, as Kokkos says; clang, hipcc's): a loop of
/// a fixed trip count unrolled whole, so that its reads form one block of straight-line code. nvcc
/// unrolled the compaction's 32 reads of float16 rows only by four without it.
#if defined(KOKKOS_ENABLE_PRAGMA_UNROLL) || defined(__clang__)
#define OKTOPK_IMPL_UNROLL _Pragma("unroll")
#else
#define OKTOPK_IMPL_UNROLL
#endif

namespace oktopk::impl {

/// Reads in flight per thread for values of `value_bytes` bytes: 8 (32 bytes of floats), 16 of
/// 2-byte values.
constexpr int reads_in_flight(std::size_t value_bytes) { return value_bytes <= 2 ? 16 : 8; }

/// Thread t of `threads` (0 <= t < threads) over the stretch [begin, end): use(i, read(i)) for
/// the entries i = begin + t + m threads below end, in increasing i, so that the threads' reads
/// at one time are adjacent. Entries are read Reads at a time while a whole round of them lies
/// below end, then one at a time.
template <int Reads, class Read, class Use>
KOKKOS_INLINE_FUNCTION void read_in_rounds(std::int64_t begin, std::int64_t end, std::int64_t t,
                                           std::int64_t threads, const Read& read, const Use& use) {
  std::int64_t first = begin + t;
  for (; first + (Reads - 1) * threads < end; first += Reads * threads) {
    std::remove_cv_t<std::remove_reference_t<decltype(read(first))>> got[Reads];
    OKTOPK_IMPL_UNROLL
    for (int j = 0; j < Reads; ++j) got[j] = read(first + j * threads);
    OKTOPK_IMPL_UNROLL
    for (int j = 0; j < Reads; ++j) use(first + j * threads, got[j]);
  }
  for (; first < end; first += threads) use(first, read(first));
}

}  // namespace oktopk::impl
