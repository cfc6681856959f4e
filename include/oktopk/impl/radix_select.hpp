// SPDX-License-Identifier: BSD-3-Clause
// Radix select on float bit patterns: the k-th largest |x| without sorting.
//
// For non-negative floats the IEEE-754 bit pattern, read as an unsigned integer, orders like
// the value, and clearing the sign bit gives |x|. So the k-th largest |x| is the k-th largest
// 31-bit key, found digit by digit from the top: a histogram of the current digit among the
// keys that match the digits fixed so far tells which digit value holds the k-th largest.
// Three passes (11 + 11 + 9 bits) read x three times and never write it.
#pragma once

#include <oktopk/fwd.hpp>
#include <oktopk/impl/kokkos_compat.hpp>
#include <oktopk/impl/kokkos_ext.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>

namespace oktopk::impl {

/// Keys above this are NaN (exponent all ones, mantissa non-zero) once the sign is cleared.
inline constexpr std::uint32_t abs_key_infinity = 0x7f800000u;
inline constexpr int radix_max_bits = 11;
inline constexpr int radix_passes = 3;
inline constexpr int radix_shift[radix_passes] = {20, 9, 0};
inline constexpr int radix_bits[radix_passes] = {11, 11, 9};

KOKKOS_INLINE_FUNCTION std::uint32_t abs_key(float x) { return float_to_bits(x) & 0x7fffffffu; }

/// Histogram of one radix digit over the keys of x whose higher digits equal `prefix`.
/// Each team counts a contiguous chunk into scratch memory, then adds it to the global bins.
/// On the host a team is one thread, so its scratch histogram is private and needs no atomics.
template <class ExecSpace, class XView, class HistView>
void radix_histogram(const ExecSpace& exec, const XView& x, int pass, std::uint32_t prefix,
                     const HistView& histogram) {
  using Policy = Kokkos::TeamPolicy<ExecSpace>;
  using Member = typename Policy::member_type;
  using ScratchHist =
      Kokkos::View<int*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;

  const auto n = static_cast<std::int64_t>(x.extent(0));
  const int shift = radix_shift[pass];
  const int bins = 1 << radix_bits[pass];
  const int prefix_shift = shift + radix_bits[pass];
  const std::uint32_t digit_mask = static_cast<std::uint32_t>(bins - 1);

  Kokkos::deep_copy(exec, Kokkos::subview(histogram, Kokkos::make_pair(0, bins)), 0);

  const int team_size = runs_on_host_v<ExecSpace> ? 1 : 256;
  // Host: one chunk per thread. Device: enough teams to fill the GPU, each a long stretch.
  const std::int64_t per_team_min = runs_on_host_v<ExecSpace> ? 1 : 64 * team_size;
  std::int64_t league = runs_on_host_v<ExecSpace> ? exec.concurrency() : 4096;
  league = std::min(league, (n + per_team_min - 1) / per_team_min);
  if (league < 1) league = 1;

  Policy policy(exec, static_cast<int>(league), team_size);
  policy.set_scratch_size(0, Kokkos::PerTeam(ScratchHist::shmem_size(bins)));
  Kokkos::parallel_for(
      "OkTopk::kth_largest_abs::histogram", policy, KOKKOS_LAMBDA(const Member& team) {
        ScratchHist local(team.team_scratch(0), bins);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, bins), [&](int b) { local(b) = 0; });
        team.team_barrier();
        const std::int64_t begin = n * team.league_rank() / team.league_size();
        const std::int64_t end = n * (team.league_rank() + 1) / team.league_size();
        const bool private_bins = team.team_size() == 1;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, begin, end), [&](std::int64_t i) {
          const std::uint32_t key = abs_key(x(i));
          // Shifting a 32-bit value by 32 is undefined, and the top pass has no fixed prefix.
          const bool matches = prefix_shift >= 31 || (key >> prefix_shift) == prefix;
          if (key <= abs_key_infinity && matches) {
            const int digit = static_cast<int>((key >> shift) & digit_mask);
            if (private_bins) {
              ++local(digit);
            } else {
              Kokkos::atomic_increment(&local(digit));
            }
          }
        });
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, bins), [&](int b) {
          if (local(b) != 0) Kokkos::atomic_add(&histogram(b), static_cast<std::int64_t>(local(b)));
        });
      });
}

}  // namespace oktopk::impl
