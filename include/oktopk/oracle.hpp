// SPDX-License-Identifier: BSD-3-Clause
// The result oracle: what the last SparseAllreduce::reduce call should have written, rebuilt
// from dense data and the thresholds the method reported (spec §6), and a comparison that
// tolerates only what a correct method may do differently: sum in another order, and decide
// either way on entries that sit on a threshold.
#pragma once

#include <oktopk/algorithm.hpp>
#include <oktopk/communicator.hpp>
#include <oktopk/error.hpp>
#include <oktopk/fwd.hpp>
#include <oktopk/layout.hpp>
#include <oktopk/select.hpp>
#include <oktopk/sparse_allreduce.hpp>
#include <oktopk/impl/algorithms/s2.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/comm/mpi_mirror.hpp>
#include <oktopk/impl/kernels/vector_ops.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace oktopk {

/// \brief The relative tolerance the oracle uses unless told otherwise.
inline constexpr double default_oracle_tolerance = 1e-5;

/// \brief Collective. Writes into `expected` what the last reduce call of `handle` should have
/// written into its output.
///
/// `acc` is this rank's input to that call as the method saw it: handle.residual() copied
/// *before* the call, plus the gradient (acc(i) = residual(i) + grad(i)). The result is
/// rebuilt from dense data and the thresholds in handle.stats():
/// - a dense call (the Dense method, or a warm-up call; stats().dense): the SUM allreduce of
///   acc, divided by P;
/// - TopkA, TopkDSA, GaussianK, OkTopk: every rank masks its acc with
///   |acc| > stats().local_threshold (its own threshold); R = the SUM allreduce of the masked
///   vectors; expected = R where |R| > stats().global_threshold (the same on all ranks; -Inf for
///   methods without a global selection), else 0; then divided by P (a float division, as the
///   methods do);
/// - GTopk: every rank's selection (its entries with |acc| > local_threshold) is gathered to
///   every rank and the tree is simulated on the host: in rounds s = 1, 2, 4, ... while s < P,
///   rank r with r % 2s == 0 and r + s < P merges its set (a) with rank r+s's (b), adding
///   a + b at common indices, then keeps the pairs with |v| > t, t = the (k+1)-th largest |v|
///   of the merged set (all of them if k >= its size, none if k == 0); rank 0's final set / P;
/// - S2Reducer: impl::s2_oracle: the dense mean of acc, sketched once with the method's hashes
///   and decoded on the union of the ranks' non-zero rows (equal by linearity of the sketch).
///   With a layout: the Dense segments get the mean of acc over ranks; the SparseRows segments'
///   entries, keyed by their number counted over those segments in layout order, get the same
///   sketch-and-decode of the mean, on the union of the rows (each segment's own row_width)
///   where some rank's acc is non-zero, 0 on the other rows. Error feedback does not change
///   the output (the sketch is taken before it), only the next call's acc.
///
/// Two things a correct method may do differently are allowed for:
/// - Selection on a threshold. Entries whose selection could flip are set to NaN, meaning
///   "either answer is right" (count_mismatches() then only checks that the output is finite
///   and equal on all ranks): on some rank acc != 0 and | |acc| - local_threshold | <=
///   rel_tol·max(|acc|, |local_threshold|); or (masked-sum methods) | |R| - global_threshold | <=
///   max(rel_tol·max(|R|, |global_threshold|), e), e the summation-order bound below.
/// - Summation order. `slack`, when given (length n), receives per entry the absolute amount by
///   which a correct output may differ because it adds the same floats in another order (first
///   order bounds, doubled for safety, in units of the output, i.e. after / P):
///   masked-sum methods: 2(c-1)·u·sum|terms| / P for the c >= 3 non-zero terms of R (0 for c <= 2:
///   a + b == b + a exactly; u = 2^-24); S2: per sketch cell of load L (entries with a non-zero
///   on some rank) and mass M (sum over them and over ranks of |acc|), both ways of summing
///   are within (L + P)·u·M of the exact cell, and the median moves no more than its inputs, so
///   4·max over the entry's cells of (L + P)·u·M / P (rows outside the union: 0; with a layout,
///   Dense segments: as for the ring below, since the method sums them inside a larger
///   allreduce whose order MPI may choose otherwise); dense calls with dense_allreduce = ring
///   (which sums in ring order): 2(P-1)·u·sum over ranks of |acc| / P for P >= 3; other dense
///   calls and gTopk: 0 (the same MPI_Allreduce as the library's dense path; the same a + b
///   additions as the tree).
///   Without `slack`, entries whose slack exceeds rel_tol·|expected| / 2 are set to NaN instead
///   (they cannot be checked to rel_tol), which for S2 is most of them.
///
/// Throws std::invalid_argument (on every rank) if any rank passes Views whose length is not
/// handle.size() (an empty `slack` is "not given"), std::logic_error if the handle has not
/// reduced anything yet.
template <class ExecSpace>
void expected_result(const ExecSpace& exec, const SparseAllreduce<ExecSpace>& handle,
                     const Kokkos::View<const float*, typename ExecSpace::memory_space>& acc,
                     const Kokkos::View<float*, typename ExecSpace::memory_space>& expected,
                     double rel_tol = default_oracle_tolerance,
                     const Kokkos::View<float*, typename ExecSpace::memory_space>& slack = {});

/// \brief Collective. The number of output entries that are wrong: `out` (the last call's
/// output on this rank) is not finite, or differs from rank 0's output (every rank must get
/// the same result), or differs from `expected` (from expected_result) by more than
/// max(rel_tol·max(|out|, |expected|), slack) + 1e-30. Entries where `expected` is NaN
/// (borderline, see expected_result) are held to the first two rules only. `slack` is the
/// View expected_result filled, or empty for none.
///
/// Returns the largest count over the ranks, so every rank gets the same number.
template <class ExecSpace>
std::int64_t count_mismatches(
    const ExecSpace& exec, const SparseAllreduce<ExecSpace>& handle,
    const Kokkos::View<const float*, typename ExecSpace::memory_space>& expected,
    const Kokkos::View<const float*, typename ExecSpace::memory_space>& out,
    double rel_tol = default_oracle_tolerance,
    const Kokkos::View<const float*, typename ExecSpace::memory_space>& slack = {});

// ---- implementation ----------------------------------------------------------------------

namespace impl {

template <class ExecSpace>
using OracleVector = Kokkos::View<float*, typename ExecSpace::memory_space>;
template <class ExecSpace>
using OracleConstVector = Kokkos::View<const float*, typename ExecSpace::memory_space>;

/// 2^-24: the unit roundoff of float.
inline constexpr float float_roundoff = 5.9604645e-8f;

KOKKOS_INLINE_FUNCTION float quiet_nan() { return bits_to_float(0x7fc00000u); }

KOKKOS_INLINE_FUNCTION float max_of(float a, float b) { return a > b ? a : b; }

/// x (a magnitude) lies within tol of a finite threshold t.
KOKKOS_INLINE_FUNCTION bool near_threshold(float x, float t, float tol) {
  if (!is_finite(t)) return false;
  return abs(x - t) <= tol * max_of(x, abs(t));
}

/// Every rank learns whether any rank's Views have the wrong length, so all throw together.
inline void oracle_check_lengths(const char* where, const Communicator& comm, std::int64_t n,
                                 std::initializer_list<std::size_t> lengths) {
  bool ok = true;
  for (const std::size_t length : lengths) ok = ok && static_cast<std::int64_t>(length) == n;
  std::int64_t bad = ok ? 0 : comm.rank() + 1;
  comm.allreduce_in_place(&bad, 1, MPI_MAX);
  OKTOPK_REQUIRE(bad == 0, std::invalid_argument, where,
                 "the Views must have length " << n << " on every rank; rank " << bad - 1
                                               << " passed other lengths");
}

/// flags(i) = the number of ranks on which acc(i) != 0 lies within tol of their local threshold.
template <class ExecSpace>
void local_borderline_counts(const ExecSpace& exec, const Communicator& comm,
                             const OracleConstVector<ExecSpace>& acc, float threshold, float tol,
                             const OracleVector<ExecSpace>& flags) {
  Kokkos::parallel_for(
      "OkTopk::expected_result::local_borderline", RangeOf<ExecSpace>(exec, 0, acc.extent(0)),
      KOKKOS_LAMBDA(std::int64_t i) {
        const float a = acc(i);
        flags(i) = (a != 0.0f && near_threshold(abs(a), threshold, tol)) ? 1.0f : 0.0f;
      });
  mpi_allreduce_in_place(exec, comm, flags, MPI_SUM);
}

/// Masked-sum methods (TopkA, TopkDSA, GaussianK, OkTopk): spec §6.1.
template <class ExecSpace>
void expected_masked_sum(const ExecSpace& exec, const SparseAllreduce<ExecSpace>& handle,
                         const OracleConstVector<ExecSpace>& acc,
                         const OracleVector<ExecSpace>& expected,
                         const OracleVector<ExecSpace>& slack, float tol) {
  const Communicator& comm = handle.communicator();
  const ReduceStats& stats = handle.stats();
  const auto n = static_cast<std::size_t>(handle.size());
  // expected first holds R, the masked sum; beside it sum|terms| (in slack), the count of
  // non-zero terms, and the number of ranks on which the entry is locally borderline.
  const auto terms = make_uninitialized<float>(exec, "OkTopk::expected_result::terms", n);
  const auto borderline = make_uninitialized<float>(exec, "OkTopk::expected_result::borderline", n);
  const float local_threshold = stats.local_threshold;
  Kokkos::parallel_for(
      "OkTopk::expected_result::mask", RangeOf<ExecSpace>(exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i) {
        const float a = acc(i);
        const float m = abs(a);
        const bool selected = m > local_threshold;
        expected(i) = selected ? a : 0.0f;
        slack(i) = selected ? m : 0.0f;
        terms(i) = (selected && a != 0.0f) ? 1.0f : 0.0f;
        borderline(i) = (a != 0.0f && near_threshold(m, local_threshold, tol)) ? 1.0f : 0.0f;
      });
  mpi_allreduce_in_place(exec, comm, expected, MPI_SUM);
  mpi_allreduce_in_place(exec, comm, slack, MPI_SUM);
  mpi_allreduce_in_place(exec, comm, terms, MPI_SUM);
  mpi_allreduce_in_place(exec, comm, borderline, MPI_SUM);

  const float global_threshold = stats.global_threshold;
  const auto ranks = static_cast<float>(comm.size());
  Kokkos::parallel_for(
      "OkTopk::expected_result::select", RangeOf<ExecSpace>(exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i) {
        const float r = expected(i);
        const float m = abs(r);
        const float c = terms(i);
        const float order = c > 2.0f ? 2.0f * (c - 1.0f) * float_roundoff * slack(i) : 0.0f;
        const bool keep = m > global_threshold;
        bool undecided = borderline(i) > 0.0f;
        if (is_finite(global_threshold)) {
          const float g = global_threshold;
          if (abs(m - g) <= max_of(tol * max_of(m, abs(g)), order)) undecided = true;
        }
        expected(i) = undecided ? quiet_nan() : (keep ? r / ranks : 0.0f);
        slack(i) = keep ? order / ranks : 0.0f;
      });
}

/// gTopk: the tree simulated on the host from everyone's local selection.
template <class ExecSpace>
void expected_gtopk(const ExecSpace& exec, const SparseAllreduce<ExecSpace>& handle,
                    const OracleConstVector<ExecSpace>& acc,
                    const OracleVector<ExecSpace>& expected, float tol) {
  constexpr const char* where = "oktopk::expected_result";
  using Memory = typename ExecSpace::memory_space;
  const Communicator& comm = handle.communicator();
  const int P = comm.size();
  const float local_threshold = handle.stats().local_threshold;
  const std::int64_t k = handle.k();

  // This rank's leaf: its entries above its threshold, ascending (select_above keeps order).
  std::int64_t count = count_above(exec, acc, local_threshold);
  Kokkos::View<index_type*, Memory> idx(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "OkTopk::expected_result::leaf_indices"),
      static_cast<std::size_t>(count));
  OracleVector<ExecSpace> val(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "OkTopk::expected_result::leaf_values"),
      static_cast<std::size_t>(count));
  count = select_above(exec, acc, local_threshold, idx, val);
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
  std::vector<float> all_val(static_cast<std::size_t>(total));
  comm.allgatherv(host_idx.data(), count, all_idx.data(), int_counts.data(), displacements.data());
  comm.allgatherv(host_val.data(), count, all_val.data(), int_counts.data(), displacements.data());

  using Set = std::vector<std::pair<index_type, float>>;
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
        for (std::size_t m = 0; m < merged.size(); ++m) magnitudes[m] = std::abs(merged[m].second);
        std::nth_element(magnitudes.begin(), magnitudes.begin() + k, magnitudes.end(),
                         std::greater<float>());
        const float t = magnitudes[static_cast<std::size_t>(k)];
        merged.erase(std::remove_if(merged.begin(), merged.end(),
                                    [t](const auto& e) { return !(std::abs(e.second) > t); }),
                     merged.end());
      }
      sets[r] = std::move(merged);
      sets[r + s].clear();
    }
  }

  const Set& result = sets[0];
  const auto size = static_cast<std::size_t>(result.size());
  Kokkos::View<index_type*, Memory> result_idx(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "OkTopk::expected_result::tree_indices"),
      size);
  OracleVector<ExecSpace> result_val(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "OkTopk::expected_result::tree_values"),
      size);
  auto host_result_idx = Kokkos::create_mirror_view(Kokkos::HostSpace(), result_idx);
  auto host_result_val = Kokkos::create_mirror_view(Kokkos::HostSpace(), result_val);
  for (std::size_t j = 0; j < size; ++j) {
    host_result_idx(j) = result[j].first;
    host_result_val(j) = result[j].second;
  }
  Kokkos::deep_copy(exec, result_idx, host_result_idx);
  Kokkos::deep_copy(exec, result_val, host_result_val);

  const auto borderline = make_uninitialized<float>(exec, "OkTopk::expected_result::borderline",
                                                    static_cast<std::size_t>(handle.size()));
  local_borderline_counts(exec, comm, acc, local_threshold, tol, borderline);
  Kokkos::deep_copy(exec, expected, 0.0f);
  const auto ranks = static_cast<float>(P);
  Kokkos::parallel_for(
      "OkTopk::expected_result::tree_scatter", RangeOf<ExecSpace>(exec, 0, size),
      KOKKOS_LAMBDA(std::int64_t j) { expected(result_idx(j)) = result_val(j) / ranks; });
  Kokkos::parallel_for(
      "OkTopk::expected_result::tree_borderline", RangeOf<ExecSpace>(exec, 0, expected.extent(0)),
      KOKKOS_LAMBDA(std::int64_t i) {
        if (borderline(i) > 0.0f) expected(i) = quiet_nan();
      });
  // Host vectors above die with this scope: nothing may still read them.
  fence(exec, "OkTopk::expected_result::gtopk");
}

/// The median of e[0, count) (sorted in place): the middle value, or for even counts the mean
/// of the two middle ones. Written apart from S2Sketch::estimate, so the oracle does not check
/// the decode against itself.
KOKKOS_INLINE_FUNCTION float oracle_median(float (&e)[s2_max_sketch_rows], int count) {
  for (int a = 1; a < count; ++a) {
    const float v = e[a];
    int b = a;
    for (; b > 0 && e[b - 1] > v; --b) e[b] = e[b - 1];
    e[b] = v;
  }
  const int mid = count / 2;
  return count % 2 == 1 ? e[mid] : 0.5f * (e[mid - 1] + e[mid]);
}

/// S2 with a layout, from the Layout itself rather than the method's segment map: Dense
/// segments get the exact mean; the SparseRows segments' entries, numbered consecutively over
/// them in layout order (the sketch's keys), are sketched once as the mean over ranks with the
/// method's hashes, and each row of them is decoded (median over sketch rows) where some rank
/// has a non-zero in it, 0 elsewhere.
template <class ExecSpace>
void expected_s2_layout(const ExecSpace& exec, const SparseAllreduce<ExecSpace>& handle,
                        const OracleConstVector<ExecSpace>& acc,
                        const OracleVector<ExecSpace>& expected,
                        const OracleVector<ExecSpace>& slack) {
  const Communicator& comm = handle.communicator();
  const int P = comm.size();
  const Layout& layout = handle.layout();
  const auto n = static_cast<std::size_t>(handle.size());
  const S2Sketch s =
      S2Sketch::make("oktopk::expected_result", layout.sparse_entries(), handle.options());

  // expected first holds the mean over ranks, slack the sum over ranks of |acc|.
  Kokkos::deep_copy(exec, expected, acc);
  mpi_allreduce_in_place(exec, comm, expected, MPI_SUM);
  divide(exec, expected, expected, static_cast<float>(P));
  Kokkos::parallel_for(
      "OkTopk::expected_result::s2_layout_abs", RangeOf<ExecSpace>(exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i) { slack(i) = abs(acc(i)); });
  mpi_allreduce_in_place(exec, comm, slack, MPI_SUM);

  const auto cells = static_cast<std::size_t>(s.cells());
  const OracleVector<ExecSpace> table("OkTopk::expected_result::s2_layout_table", cells);
  const OracleVector<ExecSpace> mass("OkTopk::expected_result::s2_layout_mass", cells);
  const OracleVector<ExecSpace> load("OkTopk::expected_result::s2_layout_load", cells);
  std::int64_t first_key = 0;
  for (const Segment& segment : layout.segments()) {
    if (segment.kind != SegmentKind::SparseRows) continue;
    const std::int64_t offset = segment.offset;
    const std::int64_t key_base = first_key - offset;
    Kokkos::parallel_for(
        "OkTopk::expected_result::s2_layout_sketch",
        RangeOf<ExecSpace>(exec, offset, offset + segment.length), KOKKOS_LAMBDA(std::int64_t i) {
          const float v = expected(i);
          const float a = slack(i);
          if (a == 0.0f) return;  // zero on every rank
          const std::int64_t key = key_base + i;
          const std::uint64_t mixed = s.mix(key);
          for (int q = 0; q < s.sketch_rows; ++q) {
            float sign = 1.0f;
            const std::int64_t c = s.cell(q, key, mixed, sign);
            Kokkos::atomic_add(&table(c), sign * v);
            Kokkos::atomic_add(&mass(c), a);
            Kokkos::atomic_add(&load(c), 1.0f);
          }
        });
    first_key += segment.length;
  }

  const auto ranks = static_cast<float>(P);
  // The MPI sums of the method's fused buffer and of the oracle's whole one may add in
  // different orders once there are three terms or more.
  const float dense_order =
      P > 2 ? 2.0f * static_cast<float>(P - 1) * float_roundoff / ranks : 0.0f;
  first_key = 0;
  for (const Segment& segment : layout.segments()) {
    const std::int64_t offset = segment.offset;
    const std::int64_t end = offset + segment.length;
    if (segment.kind == SegmentKind::Dense) {
      Kokkos::parallel_for(
          "OkTopk::expected_result::s2_layout_dense", RangeOf<ExecSpace>(exec, offset, end),
          KOKKOS_LAMBDA(std::int64_t i) { slack(i) *= dense_order; });
      continue;
    }
    // One work item per row: it alone reads and rewrites its entries, so the row's union
    // test needs no second pass.
    const std::int64_t width = segment.row_width;
    const std::int64_t key_base = first_key - offset;
    Kokkos::parallel_for(
        "OkTopk::expected_result::s2_layout_decode", RangeOf<ExecSpace>(exec, 0, segment.rows()),
        KOKKOS_LAMBDA(std::int64_t row) {
          const std::int64_t begin = offset + row * width;
          const std::int64_t stop = begin + width < end ? begin + width : end;
          bool in_union = false;
          for (std::int64_t i = begin; i < stop; ++i) in_union = in_union || slack(i) != 0.0f;
          for (std::int64_t i = begin; i < stop; ++i) {
            if (!in_union) {
              expected(i) = 0.0f;
              slack(i) = 0.0f;
              continue;
            }
            const std::int64_t key = key_base + i;
            const std::uint64_t mixed = s.mix(key);
            float e[s2_max_sketch_rows] = {};
            float worst = 0.0f;
            for (int q = 0; q < s.sketch_rows; ++q) {
              float sign = 1.0f;
              const std::int64_t c = s.cell(q, key, mixed, sign);
              e[q] = sign * table(c);
              worst = max_of(worst, (load(c) + ranks) * mass(c));
            }
            expected(i) = oracle_median(e, s.sketch_rows);
            slack(i) = 4.0f * float_roundoff * worst / ranks;
          }
        });
    first_key += segment.length;
  }
}

/// S2: its own oracle for the values; the slack from every sketch cell's load and mass.
template <class ExecSpace>
void expected_s2(const ExecSpace& exec, const SparseAllreduce<ExecSpace>& handle,
                 const OracleConstVector<ExecSpace>& acc, const OracleVector<ExecSpace>& expected,
                 const OracleVector<ExecSpace>& slack) {
  if (!handle.layout().empty()) {
    expected_s2_layout(exec, handle, acc, expected, slack);
    return;
  }
  const Communicator& comm = handle.communicator();
  const std::int64_t n = handle.size();
  s2_oracle(exec, comm, n, handle.options(), acc, expected);

  const S2Sketch s = S2Sketch::make("oktopk::expected_result", n, handle.options());
  // slack first holds sum over ranks of |acc|.
  Kokkos::parallel_for(
      "OkTopk::expected_result::s2_abs", RangeOf<ExecSpace>(exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i) { slack(i) = abs(acc(i)); });
  mpi_allreduce_in_place(exec, comm, slack, MPI_SUM);
  const auto cells = static_cast<std::size_t>(s.cells());
  const OracleVector<ExecSpace> mass("OkTopk::expected_result::s2_mass", cells);
  const OracleVector<ExecSpace> load("OkTopk::expected_result::s2_load", cells);
  Kokkos::parallel_for(
      "OkTopk::expected_result::s2_cells", RangeOf<ExecSpace>(exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i) {
        const float a = slack(i);
        if (a == 0.0f) return;
        const std::uint64_t mixed = s.mix(i);
        for (int q = 0; q < s.sketch_rows; ++q) {
          float sign = 1.0f;
          const std::int64_t c = s.cell(q, i, mixed, sign);
          Kokkos::atomic_add(&mass(c), a);
          Kokkos::atomic_add(&load(c), 1.0f);
        }
      });
  const auto ranks = static_cast<float>(comm.size());
  Kokkos::parallel_for(
      "OkTopk::expected_result::s2_slack", RangeOf<ExecSpace>(exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i) {
        const std::uint64_t mixed = s.mix(i);
        float worst = 0.0f;
        for (int q = 0; q < s.sketch_rows; ++q) {
          float sign = 1.0f;
          const std::int64_t c = s.cell(q, i, mixed, sign);
          worst = max_of(worst, (load(c) + ranks) * mass(c));
        }
        slack(i) = 4.0f * float_roundoff * worst / ranks;
      });
}

}  // namespace impl

template <class ExecSpace>
void expected_result(const ExecSpace& exec, const SparseAllreduce<ExecSpace>& handle,
                     const Kokkos::View<const float*, typename ExecSpace::memory_space>& acc,
                     const Kokkos::View<float*, typename ExecSpace::memory_space>& expected,
                     double rel_tol,
                     const Kokkos::View<float*, typename ExecSpace::memory_space>& slack) {
  constexpr const char* where = "oktopk::expected_result";
  impl::ScopedRegion region("OkTopk::expected_result");
  const Communicator& comm = handle.communicator();
  // Traffic lands in its own phase; handle.stats() keeps the reduce call's own numbers.
  auto scope = comm.phase("oracle");
  const bool slack_given = slack.extent(0) != 0;
  impl::oracle_check_lengths(
      where, comm, handle.size(),
      {acc.extent(0), expected.extent(0), slack_given ? slack.extent(0) : acc.extent(0)});
  const ReduceStats& stats = handle.stats();
  OKTOPK_REQUIRE(stats.iteration > 0, std::logic_error, where,
                 "the handle has not reduced anything yet");
  const auto tol = static_cast<float>(rel_tol);
  const auto n = static_cast<std::size_t>(handle.size());
  const impl::OracleVector<ExecSpace> bound =
      slack_given ? slack
                  : impl::make_uninitialized<float>(exec, "OkTopk::expected_result::slack", n);

  if (stats.dense || handle.algorithm() == Algorithm::Dense) {
    // The library's MPI path: an out-of-place SUM allreduce, then a division by P.
    const int P = comm.size();
    {
      const auto send = impl::mpi_send_view(exec, acc);
      auto receive = impl::mpi_receive_view(exec, expected);
      comm.allreduce(send.data(), receive.data(), static_cast<count_type>(n), MPI_SUM);
      impl::mpi_received(exec, receive, expected, 0, static_cast<std::int64_t>(n));
    }
    impl::divide(exec, expected, expected, static_cast<float>(P));
    if (handle.options().dense_allreduce == DenseAlgorithm::Ring && P > 2) {
      // The ring adds the same P floats in another order: first-order bound, doubled.
      Kokkos::parallel_for(
          "OkTopk::expected_result::abs", impl::RangeOf<ExecSpace>(exec, 0, n),
          KOKKOS_LAMBDA(std::int64_t i) { bound(i) = impl::abs(acc(i)); });
      impl::mpi_allreduce_in_place(exec, comm, bound, MPI_SUM);
      const float scale =
          2.0f * static_cast<float>(P - 1) * impl::float_roundoff / static_cast<float>(P);
      Kokkos::parallel_for(
          "OkTopk::expected_result::ring_slack", impl::RangeOf<ExecSpace>(exec, 0, n),
          KOKKOS_LAMBDA(std::int64_t i) { bound(i) *= scale; });
    } else {
      Kokkos::deep_copy(exec, bound, 0.0f);
    }
  } else {
    switch (handle.algorithm()) {
      case Algorithm::TopkA:
      case Algorithm::TopkDSA:
      case Algorithm::GaussianK:
      case Algorithm::OkTopk:
        impl::expected_masked_sum(exec, handle, acc, expected, bound, tol);
        break;
      case Algorithm::GTopk:
        impl::expected_gtopk(exec, handle, acc, expected, tol);
        Kokkos::deep_copy(exec, bound, 0.0f);
        break;
      case Algorithm::S2Reducer:
        impl::expected_s2(exec, handle, acc, expected, bound);
        break;
      default:
        throw std::invalid_argument(std::string(where) + ": not an Algorithm value (" +
                                    std::to_string(static_cast<int>(handle.algorithm())) + ")");
    }
  }
  if (!slack_given) {
    // Nobody will allow for the summation order: skip the entries it can move beyond rel_tol.
    Kokkos::parallel_for(
        "OkTopk::expected_result::order_sensitive", impl::RangeOf<ExecSpace>(exec, 0, n),
        KOKKOS_LAMBDA(std::int64_t i) {
          if (bound(i) > 0.5f * tol * impl::abs(expected(i))) expected(i) = impl::quiet_nan();
        });
  }
  impl::fence(exec, "OkTopk::expected_result");
}

template <class ExecSpace>
std::int64_t count_mismatches(
    const ExecSpace& exec, const SparseAllreduce<ExecSpace>& handle,
    const Kokkos::View<const float*, typename ExecSpace::memory_space>& expected,
    const Kokkos::View<const float*, typename ExecSpace::memory_space>& out, double rel_tol,
    const Kokkos::View<const float*, typename ExecSpace::memory_space>& slack) {
  constexpr const char* where = "oktopk::count_mismatches";
  impl::ScopedRegion region("OkTopk::count_mismatches");
  const Communicator& comm = handle.communicator();
  auto scope = comm.phase("oracle");
  const bool slack_given = slack.extent(0) != 0;
  impl::oracle_check_lengths(
      where, comm, handle.size(),
      {expected.extent(0), out.extent(0), slack_given ? slack.extent(0) : out.extent(0)});
  const auto n = static_cast<std::size_t>(handle.size());

  // Rank 0's output, to hold every rank to the same answer.
  const auto reference =
      impl::make_uninitialized<float>(exec, "OkTopk::count_mismatches::rank0", n);
  Kokkos::deep_copy(exec, reference, out);
  {
    auto buffer = impl::mpi_send_view(exec, reference);
    comm.bcast(buffer.data(), static_cast<count_type>(n), 0);
    impl::mpi_received(exec, buffer, reference, 0, static_cast<std::int64_t>(n));
  }
  const auto tol = static_cast<float>(rel_tol);
  std::int64_t wrong = 0;
  Kokkos::parallel_reduce(
      "OkTopk::count_mismatches", impl::RangeOf<ExecSpace>(exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i, std::int64_t& bad) {
        const float o = out(i);
        const float e = expected(i);
        bool mismatch = !impl::is_finite(o) || o != reference(i);
        if (!mismatch && !impl::isnan(e)) {
          const float allowed = impl::max_of(tol * impl::max_of(impl::abs(o), impl::abs(e)),
                                             slack_given ? slack(i) : 0.0f);
          mismatch = !(impl::abs(o - e) <= allowed + 1e-30f);
        }
        if (mismatch) ++bad;
      },
      wrong);
  comm.allreduce_in_place(&wrong, 1, MPI_MAX);
  return wrong;
}

}  // namespace oktopk
