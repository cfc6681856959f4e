// SPDX-License-Identifier: BSD-3-Clause
// Deterministic kernel-test inputs (fixed-seed std::mt19937_64) and host <-> View transfers.
#pragma once

#include <oktopk/fwd.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace oktopk::test {

/// The sizes every kernel is tried on: empty, tiny, odd, and one large odd size that leaves a
/// remainder for any chunking into threads, teams or vector lanes.
inline constexpr std::size_t test_sizes[] = {0, 1, 2, 7, 1000, 1000003};

enum class DataKind { normal, ties, all_equal, signed_zero, non_finite, heavy_tailed };

inline constexpr DataKind all_data_kinds[] = {DataKind::normal,     DataKind::ties,
                                              DataKind::all_equal,  DataKind::signed_zero,
                                              DataKind::non_finite, DataKind::heavy_tailed};

inline const char* to_string(DataKind kind) {
  switch (kind) {
    case DataKind::normal:
      return "normal";
    case DataKind::ties:
      return "ties";
    case DataKind::all_equal:
      return "all_equal";
    case DataKind::signed_zero:
      return "signed_zero";
    case DataKind::non_finite:
      return "non_finite";
    case DataKind::heavy_tailed:
      return "heavy_tailed";
  }
  return "unknown";
}

inline float float_from_bits(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline std::uint32_t bits_of(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

inline constexpr float inf = std::numeric_limits<float>::infinity();

/// NaNs with different payloads and signs: the kernels must ignore all of them, including the
/// ones whose |x| bit pattern lies just above +Inf's.
inline float nan_variant(std::size_t which) {
  constexpr std::uint32_t patterns[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fffffffu};
  return float_from_bits(patterns[which % 4]);
}

/// One generator per (purpose, kind, n, stream): the same call always gives the same data.
inline std::mt19937_64 make_rng(std::uint64_t purpose, std::uint64_t a = 0, std::uint64_t b = 0,
                                std::uint64_t c = 0) {
  std::seed_seq seq{static_cast<std::uint32_t>(purpose), static_cast<std::uint32_t>(a),
                    static_cast<std::uint32_t>(a >> 32), static_cast<std::uint32_t>(b),
                    static_cast<std::uint32_t>(b >> 32), static_cast<std::uint32_t>(c)};
  return std::mt19937_64(seq);
}

/// n values of the given kind. `stream` picks an independent draw of the same kind.
///  normal        N(0, 1)
///  ties          values from a set of 9 (with +-pairs, so |x| ties even more)
///  all_equal     every entry -1.25
///  signed_zero   mostly +0 and -0, some subnormals, some N(0, 1)
///  non_finite    N(0, 1) with NaNs (four bit patterns), +Inf and -Inf at fixed positions
///                (positions 1, 3 and 6 among them, so n = 7 already holds each)
///  heavy_tailed  Cauchy(0, 1): magnitudes over many binades
inline std::vector<float> make_data(DataKind kind, std::size_t n, std::uint64_t stream = 0) {
  auto rng = make_rng(1, static_cast<std::uint64_t>(kind), n, stream);
  std::vector<float> x(n);
  std::normal_distribution<double> normal(0.0, 1.0);
  switch (kind) {
    case DataKind::normal:
      for (auto& v : x) v = static_cast<float>(normal(rng));
      break;
    case DataKind::ties: {
      constexpr float set[] = {-3.0f, -1.5f, -1.0f, -0.25f, 0.0f, 0.25f, 1.0f, 1.5f, 3.0f};
      std::uniform_int_distribution<int> pick(0, 8);
      for (auto& v : x) v = set[pick(rng)];
      break;
    }
    case DataKind::all_equal:
      std::fill(x.begin(), x.end(), -1.25f);
      break;
    case DataKind::signed_zero: {
      std::uniform_real_distribution<double> u(0.0, 1.0);
      std::uniform_int_distribution<std::uint32_t> small(1, 8);
      for (auto& v : x) {
        const double r = u(rng);
        if (r < 0.4) {
          v = 0.0f;
        } else if (r < 0.8) {
          v = -0.0f;
        } else if (r < 0.9) {
          const float sub = float_from_bits(small(rng));  // 1..8 times the smallest subnormal
          v = (rng() & 1u) ? sub : -sub;
        } else {
          v = static_cast<float>(normal(rng));
        }
      }
      break;
    }
    case DataKind::non_finite:
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t slot = i % 29;
        if (slot == 1 || slot == 17 || slot == 23) {
          x[i] = nan_variant(i / 29 + slot);
        } else if (slot == 3) {
          x[i] = inf;
        } else if (slot == 6) {
          x[i] = -inf;
        } else {
          x[i] = static_cast<float>(normal(rng));
        }
      }
      break;
    case DataKind::heavy_tailed: {
      std::cauchy_distribution<double> cauchy(0.0, 1.0);
      for (auto& v : x) v = static_cast<float>(cauchy(rng));
      break;
    }
  }
  return x;
}

/// make_data, generated once per process: the large inputs are reused by many tests.
inline const std::vector<float>& cached_data(DataKind kind, std::size_t n,
                                             std::uint64_t stream = 0) {
  static std::map<std::tuple<DataKind, std::size_t, std::uint64_t>, std::vector<float>> cache;
  const auto key = std::make_tuple(kind, n, stream);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make_data(kind, n, stream)).first;
  return it->second;
}

/// n floats whose |x| bit patterns equal `base_key` outside `varying_mask` and are random
/// inside it; signs random. Bits of the 31-bit key: pass 0 of the radix select reads 30..20,
/// pass 1 reads 19..9, pass 2 reads 8..0. Keys above 0x7f800000 are NaN.
inline std::vector<float> make_keys(std::size_t n, std::uint32_t base_key,
                                    std::uint32_t varying_mask, std::uint64_t seed) {
  auto rng = make_rng(2, base_key, varying_mask, seed);
  std::vector<float> x(n);
  for (auto& v : x) {
    const auto random = static_cast<std::uint32_t>(rng());
    const std::uint32_t key = ((base_key & ~varying_mask) | (random & varying_mask)) & 0x7fffffffu;
    const std::uint32_t sign = static_cast<std::uint32_t>(rng() >> 63) << 31;
    v = float_from_bits(key | sign);
  }
  return x;
}

/// `count` distinct positions in [0, n), shuffled (sorted when `sorted`).
inline std::vector<index_type> make_unique_indices(std::size_t count, std::size_t n,
                                                   std::uint64_t seed, bool sorted) {
  auto rng = make_rng(3, count, n, seed);
  std::vector<index_type> all(n);
  std::iota(all.begin(), all.end(), index_type{0});
  // Partial Fisher-Yates: the first `count` entries become a uniform sample.
  for (std::size_t i = 0; i < count && i + 1 < n; ++i) {
    std::uniform_int_distribution<std::size_t> pick(i, n - 1);
    std::swap(all[i], all[pick(rng)]);
  }
  all.resize(std::min(count, n));
  if (sorted) std::sort(all.begin(), all.end());
  return all;
}

/// `count` positions drawn with replacement from [0, range): many repeats when range is small.
inline std::vector<index_type> make_repeated_indices(std::size_t count, std::size_t range,
                                                     std::uint64_t seed) {
  auto rng = make_rng(4, count, range, seed);
  std::uniform_int_distribution<std::size_t> pick(0, range - 1);
  std::vector<index_type> idx(count);
  for (auto& i : idx) i = static_cast<index_type>(pick(rng));
  return idx;
}

/// `count` small integers in [-4, 4] as floats: any summation order of a few thousand of
/// them is exact in float, so atomics in any order must give the reference bit for bit.
inline std::vector<float> make_small_integers(std::size_t count, std::uint64_t seed) {
  auto rng = make_rng(5, count, seed);
  std::uniform_int_distribution<int> pick(-4, 4);
  std::vector<float> v(count);
  for (auto& x : v) x = static_cast<float>(pick(rng));
  return v;
}

/// Two strictly rising index lists with |a| = na, |b| = nb and exactly `common` indices in
/// both (common <= min(na, nb)); the others belong to one list only, interleaved at random.
/// Consecutive indices of the union differ by 1 to max_gap, starting at `first`.
struct IndexPair {
  std::vector<index_type> a;
  std::vector<index_type> b;
};

inline IndexPair make_index_pair(std::size_t na, std::size_t nb, std::size_t common,
                                 std::uint64_t seed, index_type first = 0, int max_gap = 3) {
  auto rng = make_rng(6, na * 1000003u + nb, common, seed);
  // 0: only in a, 1: only in b, 2: in both.
  std::vector<unsigned char> role;
  role.reserve(na + nb - common);
  role.insert(role.end(), na - common, 0);
  role.insert(role.end(), nb - common, 1);
  role.insert(role.end(), common, 2);
  std::shuffle(role.begin(), role.end(), rng);
  std::uniform_int_distribution<int> gap(1, max_gap);
  IndexPair pair;
  pair.a.reserve(na);
  pair.b.reserve(nb);
  std::int64_t index = first;
  for (std::size_t j = 0; j < role.size(); ++j) {
    if (j > 0) index += gap(rng);
    const auto i = static_cast<index_type>(index);
    if (role[j] != 1) pair.a.push_back(i);
    if (role[j] != 0) pair.b.push_back(i);
  }
  return pair;
}

enum class Overlap { disjoint, identical, partial, subset, a_empty, b_empty, both_empty };

inline constexpr Overlap all_overlaps[] = {Overlap::disjoint,  Overlap::identical, Overlap::partial,
                                           Overlap::subset,    Overlap::a_empty,   Overlap::b_empty,
                                           Overlap::both_empty};

inline const char* to_string(Overlap overlap) {
  switch (overlap) {
    case Overlap::disjoint:
      return "disjoint";
    case Overlap::identical:
      return "identical";
    case Overlap::partial:
      return "partial";
    case Overlap::subset:
      return "subset";
    case Overlap::a_empty:
      return "a_empty";
    case Overlap::b_empty:
      return "b_empty";
    case Overlap::both_empty:
      return "both_empty";
  }
  return "unknown";
}

/// An index pair of the given family built around size n.
inline IndexPair make_overlap(Overlap overlap, std::size_t n, std::uint64_t seed) {
  switch (overlap) {
    case Overlap::disjoint:
      return make_index_pair(n, n, 0, seed);
    case Overlap::identical:
      return make_index_pair(n, n, n, seed);
    case Overlap::partial: {
      const std::size_t nb = n / 2 + 1;
      return make_index_pair(n, nb, std::min(n, nb) / 2, seed);
    }
    case Overlap::subset:
      return make_index_pair(n, n / 2, n / 2, seed);
    case Overlap::a_empty:
      return make_index_pair(0, n, 0, seed);
    case Overlap::b_empty:
      return make_index_pair(n, 0, 0, seed);
    case Overlap::both_empty:
      return make_index_pair(0, 0, 0, seed);
  }
  return {};
}

// ---- Host <-> View transfers -------------------------------------------------------------

/// A View in ExecSpace's memory holding a copy of `host` (never an alias of it, even when that
/// memory is the host's, so a kernel writing the View leaves the reference input intact).
template <class ExecSpace, class T>
Kokkos::View<T*, typename ExecSpace::memory_space> to_view(const std::vector<T>& host,
                                                           const std::string& label = "input") {
  Kokkos::View<T*, Kokkos::HostSpace> staging(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "oktopk::test::" + label), host.size());
  std::copy(host.begin(), host.end(), staging.data());
  return Kokkos::create_mirror_view_and_copy(typename ExecSpace::memory_space(), staging);
}

/// A View in ExecSpace's memory of n copies of `fill`.
template <class ExecSpace, class T>
Kokkos::View<T*, typename ExecSpace::memory_space> filled_view(std::size_t n, T fill,
                                                               const std::string& label) {
  Kokkos::View<T*, typename ExecSpace::memory_space> view(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "oktopk::test::" + label), n);
  Kokkos::deep_copy(view, fill);
  return view;
}

/// The contents of a View, after the kernels queued on `exec` have finished.
template <class ExecSpace, class View>
std::vector<std::remove_const_t<typename View::value_type>> to_vector(const ExecSpace& exec,
                                                                      const View& view) {
  impl::fence(exec, "oktopk::test::to_vector");
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  return std::vector<std::remove_const_t<typename View::value_type>>(host.data(),
                                                                     host.data() + host.extent(0));
}

}  // namespace oktopk::test
