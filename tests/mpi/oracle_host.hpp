// SPDX-License-Identifier: BSD-3-Clause
// Host-side helpers of the SparseAllreduce tests: deterministic exact-arithmetic gradients,
// bit-level comparison, and small MPI_COMM_WORLD reductions used to build the oracles from
// dense data, independently of the library's own communication.
#pragma once

#include "mpi/mpi_test_utils.hpp"

#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace oktopk::test {

/// Same bits, except that +0 and -0 count as equal (a sign of zero carries no information in an
/// averaged gradient; identity across ranks is checked strictly elsewhere).
inline bool same_value_bits(float a, float b) {
  return bits_of(a) == bits_of(b) || (a == 0.0f && b == 0.0f);
}

/// Element-wise sum over all ranks. Every test gradient is exact in float whatever the order
/// of summation, so this is the exact sum.
inline std::vector<float> sum_over_ranks(const std::vector<float>& x) {
  std::vector<float> sum(x.size() + 1, 0.0f);  // +1: data() is never null
  MPI_Allreduce(x.data(), sum.data(), static_cast<int>(x.size()), MPI_FLOAT, MPI_SUM,
                MPI_COMM_WORLD);
  sum.pop_back();
  return sum;
}

inline std::int64_t sum_over_ranks(std::int64_t x) {
  std::int64_t sum = 0;
  MPI_Allreduce(&x, &sum, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return sum;
}

inline std::int64_t max_over_ranks(std::int64_t x) {
  std::int64_t m = 0;
  MPI_Allreduce(&x, &m, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

/// Whether x has the same value on every rank.
inline bool same_on_all_ranks(std::int64_t x) {
  std::int64_t v[2] = {x, -x};
  std::int64_t m[2] = {0, 0};
  // -INT64_MIN overflows; the tests never pass it.
  MPI_Allreduce(v, m, 2, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  return m[0] == x && -m[1] == x;
}

inline bool same_bits_on_all_ranks(float x) {
  return same_on_all_ranks(static_cast<std::int64_t>(bits_of(x)));
}

/// The value rank 0 has.
inline std::int64_t from_rank0(std::int64_t x) {
  MPI_Bcast(&x, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  return x;
}

/// Entries whose bit pattern differs from rank 0's (strictly: -0 differs from +0).
inline std::int64_t bits_differing_from_rank0(const std::vector<float>& x) {
  std::vector<std::uint32_t> mine(x.size() + 1, 0u);
  for (std::size_t j = 0; j < x.size(); ++j) mine[j] = bits_of(x[j]);
  std::vector<std::uint32_t> root = mine;
  MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_UINT32_T, 0, MPI_COMM_WORLD);
  std::int64_t differing = 0;
  for (std::size_t j = 0; j < x.size(); ++j) differing += mine[j] != root[j] ? 1 : 0;
  return differing;
}

/// Every rank's vector (all of length n), rank after rank.
inline std::vector<float> gather_all(const std::vector<float>& x) {
  std::vector<float> all(x.size() * static_cast<std::size_t>(world_size()) + 1, 0.0f);
  MPI_Allgather(x.data(), static_cast<int>(x.size()), MPI_FLOAT, all.data(),
                static_cast<int>(x.size()), MPI_FLOAT, MPI_COMM_WORLD);
  all.pop_back();
  return all;
}

// ---- gradients ------------------------------------------------------------------------------

/// Gradient shapes. Values are m * 2^-8 with integer m, |m| < 2^14 (Wide: < 2^18), so sums over
/// ranks and over a test's calls stay below 2^24 units and every summation order is exact.
enum class Dist {
  Uniform,     ///< m uniform in (-2^14, 2^14)
  Heavy,       ///< mostly |m| <= 64, about 2% of entries large (|m| in [4096, 16383])
  Correlated,  ///< a component shared by all ranks plus small per-rank noise
  Rows,        ///< rows of 64 entries, ~80% of them zero; some active rows shared by all ranks
  Ties,        ///< m in [-3, 3]: many equal magnitudes around every threshold
  Wide         ///< m uniform in (-2^18, 2^18): hardly any equal magnitudes (few calls only)
};

inline const char* name_of(Dist d) {
  switch (d) {
    case Dist::Uniform:
      return "uniform";
    case Dist::Heavy:
      return "heavy";
    case Dist::Correlated:
      return "correlated";
    case Dist::Rows:
      return "rows";
    case Dist::Ties:
      return "ties";
    case Dist::Wide:
      return "wide";
  }
  return "?";
}

inline std::uint64_t mix64(std::uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline std::uint64_t hash_key(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d,
                              std::uint64_t e) {
  std::uint64_t h = mix64(a);
  h = mix64(h ^ b);
  h = mix64(h ^ c);
  h = mix64(h ^ d);
  return mix64(h ^ e);
}

inline float units(std::int64_t m) { return std::ldexp(static_cast<float>(m), -8); }

/// The gradient of `rank` at call `call`: deterministic in all arguments.
inline std::vector<float> make_gradient(Dist dist, std::uint64_t seed, int rank, std::int64_t call,
                                        std::int64_t n, std::int64_t row_width = 64) {
  std::vector<float> g(static_cast<std::size_t>(n), 0.0f);
  const auto d = static_cast<std::uint64_t>(dist);
  const auto r = static_cast<std::uint64_t>(rank);
  const auto t = static_cast<std::uint64_t>(call);
  for (std::int64_t j = 0; j < n; ++j) {
    const auto u = hash_key(seed, d, r, t, static_cast<std::uint64_t>(j));
    const std::int64_t sign = (u >> 63) != 0 ? -1 : 1;
    std::int64_t m = 0;
    switch (dist) {
      case Dist::Uniform:
        m = static_cast<std::int64_t>(u % 32767) - 16383;
        break;
      case Dist::Heavy:
        m = sign * ((u % 100) < 2 ? 4096 + static_cast<std::int64_t>((u >> 8) % 12288)
                                  : static_cast<std::int64_t>((u >> 8) % 65));
        break;
      case Dist::Correlated: {
        const auto shared = hash_key(seed, d, 0xC0FFEEULL, t, static_cast<std::uint64_t>(j));
        m = static_cast<std::int64_t>(shared % 24001) - 12000 +
            static_cast<std::int64_t>(u % 4001) - 2000;
        break;
      }
      case Dist::Rows: {
        const auto row = static_cast<std::uint64_t>(j / row_width);
        const bool shared_row = hash_key(seed, d, 0xABCULL, t / 2, row) % 10 == 0;
        const bool own_row = hash_key(seed, d, r + 1000, t, row) % 10 == 0;
        m = shared_row || own_row ? static_cast<std::int64_t>(u % 32767) - 16383 : 0;
        break;
      }
      case Dist::Ties:
        m = static_cast<std::int64_t>(u % 7) - 3;
        break;
      case Dist::Wide:
        m = static_cast<std::int64_t>(u % 524287) - 262143;
        break;
    }
    g[static_cast<std::size_t>(j)] = units(m);
  }
  return g;
}

}  // namespace oktopk::test
