// SPDX-License-Identifier: BSD-3-Clause
// The oracle of gTopk: its reduction tree simulated on the host from every rank's local
// selection.
#pragma once

#include <oktopk/communicator.hpp>
#include <oktopk/error.hpp>
#include <oktopk/select.hpp>
#include <oktopk/sparse_allreduce.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/base/wire_rounding.hpp>
#include <oktopk/impl/comm/mpi_mirror.hpp>
#include <oktopk/impl/kernels/vector_ops.hpp>
#include <oktopk/impl/oracle/common.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <utility>
#include <vector>

namespace oktopk::impl {

/// gTopk: the tree simulated on the host from everyone's local selection. On a narrower wire
/// (value_wire()) every set is rounded where the method sends it (a child's before its
/// parent merges it, the root's before the broadcast), with the method's own rounding
/// function, so the simulation stays exact.
template <class ExecSpace, class Value, class Real = arithmetic_t<Value>>
void expected_gtopk(const ExecSpace& exec, const SparseAllreduce<ExecSpace, Value>& handle,
                    const OracleConstVector<ExecSpace, Real>& acc,
                    const OracleVector<ExecSpace, Real>& expected, float tol) {
  constexpr const char* where = "oktopk::expected_result";
  using Memory = typename ExecSpace::memory_space;
  const Communicator& comm = handle.communicator();
  const int P = comm.size();
  const float local_threshold = handle.stats().local_threshold;
  const std::int64_t k = handle.k();
  const Wire wire = value_wire<Value>(handle.options());
  const auto send = [wire](auto& set) {
    for (auto& entry : set) entry.second = wire_rounded(entry.second, wire);
  };

  // This rank's leaf: its k largest, ascending; the threshold is the (k+1)-th largest, so
  // where fewer than k lie above it, the first entries equal to it complete them (if it is
  // above 0).
  const std::int64_t above = count_above(exec, acc, local_threshold);
  const std::int64_t leaf_ties =
      std::isfinite(local_threshold) && local_threshold > 0.0f && above < k ? k - above : 0;
  Kokkos::View<index_type*, Memory> idx(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "oktopk::expected_result::leaf_indices"),
      static_cast<std::size_t>(above + leaf_ties));
  OracleVector<ExecSpace, Real> val(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "oktopk::expected_result::leaf_values"),
      static_cast<std::size_t>(above + leaf_ties));
  std::int64_t count = select_above_and_ties(exec, acc, local_threshold, leaf_ties, idx, val);
  auto host_idx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), idx);
  auto host_val = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), val);

  std::vector<std::int64_t> counts(P, 0);
  comm.allgather(&count, 1, counts.data());
  std::vector<int> int_counts(P, 0), displacements(P, 0);
  std::int64_t total = 0;
  for (int r = 0; r < P; ++r) {
    OKTOPK_REQUIRE(total + counts[r] <= INT_MAX, std::runtime_error, where,
                   "the gTopk leaves hold more entries than one MPI call can gather");
    displacements[r] = static_cast<int>(total);
    int_counts[r] = static_cast<int>(counts[r]);
    total += counts[r];
  }
  std::vector<index_type> all_idx(static_cast<std::size_t>(total));
  std::vector<Real> all_val(static_cast<std::size_t>(total));
  comm.allgatherv(host_idx.data(), count, all_idx.data(), int_counts.data(), displacements.data());
  comm.allgatherv(host_val.data(), count, all_val.data(), int_counts.data(), displacements.data());

  using Set = std::vector<std::pair<index_type, Real>>;
  std::vector<Set> sets(P);
  for (int r = 0; r < P; ++r) {
    for (std::int64_t j = displacements[r]; j < displacements[r] + counts[r]; ++j) {
      sets[r].emplace_back(all_idx[j], all_val[j]);
    }
  }
  std::vector<float> magnitudes;
  for (int s = 1; s < P; s *= 2) {
    for (int r = 0; r + s < P; r += 2 * s) {
      const Set& a = sets[r];
      send(sets[r + s]);
      const Set& b = sets[r + s];
      Set merged;
      merged.reserve(a.size() + b.size());
      std::size_t i = 0, j = 0;
      while (i < a.size() || j < b.size()) {
        if (j == b.size() || (i < a.size() && a[i].first < b[j].first)) {
          merged.push_back(a[i++]);
        } else if (i == a.size() || b[j].first < a[i].first) {
          merged.push_back(b[j++]);
        } else {
          merged.emplace_back(a[i].first, a[i].second + b[j].second);
          ++i, ++j;
        }
      }
      if (k == 0) {
        merged.clear();
      } else if (k < static_cast<std::int64_t>(merged.size())) {
        magnitudes.resize(merged.size());
        // Magnitudes as the method ranks them: rounded to float (magnitude()).
        for (std::size_t m = 0; m < merged.size(); ++m) magnitudes[m] = magnitude(merged[m].second);
        std::nth_element(magnitudes.begin(), magnitudes.begin() + k, magnitudes.end(),
                         std::greater<float>());
        const float t = magnitudes[static_cast<std::size_t>(k)];
        // Above t, and the first of those equal to t (merged ascends by index) up to k in all.
        std::int64_t ties = 0;
        if (t > 0.0f) {
          ties = k;
          for (const auto& e : merged) ties -= magnitude(e.second) > t ? 1 : 0;
        }
        Set kept;
        kept.reserve(static_cast<std::size_t>(k));
        for (const auto& e : merged) {
          const float m = magnitude(e.second);
          if (m > t) {
            kept.push_back(e);
          } else if (m == t && ties > 0) {
            kept.push_back(e);
            --ties;
          }
        }
        merged = std::move(kept);
      }
      sets[r] = std::move(merged);
      sets[r + s].clear();
    }
  }

  send(sets[0]);
  const Set& result = sets[0];
  const auto size = static_cast<std::size_t>(result.size());
  Kokkos::View<index_type*, Memory> result_idx(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "oktopk::expected_result::tree_indices"),
      size);
  OracleVector<ExecSpace, Real> result_val(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "oktopk::expected_result::tree_values"),
      size);
  auto host_result_idx = Kokkos::create_mirror_view(Kokkos::HostSpace(), result_idx);
  auto host_result_val = Kokkos::create_mirror_view(Kokkos::HostSpace(), result_val);
  for (std::size_t j = 0; j < size; ++j) {
    host_result_idx(j) = result[j].first;
    host_result_val(j) = result[j].second;
  }
  Kokkos::deep_copy(exec, result_idx, host_result_idx);
  Kokkos::deep_copy(exec, result_val, host_result_val);

  const auto borderline = make_uninitialized<Real>(exec, "oktopk::expected_result::borderline",
                                                   static_cast<std::size_t>(handle.size()));
  local_borderline_counts(exec, comm, acc, local_threshold, tol, borderline);
  Kokkos::deep_copy(exec, expected, 0.0f);
  const auto ranks = static_cast<float>(P);
  Kokkos::parallel_for(
      "oktopk::expected_result::tree_scatter", RangeOf<ExecSpace>(exec, 0, size),
      KOKKOS_LAMBDA(std::int64_t j) { expected(result_idx(j)) = result_val(j) / ranks; });
  Kokkos::parallel_for(
      "oktopk::expected_result::tree_borderline", RangeOf<ExecSpace>(exec, 0, expected.extent(0)),
      KOKKOS_LAMBDA(std::int64_t i) {
        if (borderline(i) > 0.0f) expected(i) = quiet_nan();
      });
  // Host vectors above die with this scope: nothing may still read them.
  fence(exec, "oktopk::expected_result::gtopk");
}

}  // namespace oktopk::impl
