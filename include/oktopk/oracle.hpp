// SPDX-License-Identifier: BSD-3-Clause
// The result oracle: what the last SparseAllreduce::reduce call should have written, rebuilt
// from dense data and the thresholds the method reported (spec §6), and a comparison that
// tolerates only what a correct method may do differently: sum in another order, and decide
// either way on entries that sit on a threshold.
#pragma once

#include <oktopk/sparse_allreduce.hpp>
#include <oktopk/impl/base/explicit_instantiation.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace oktopk {

namespace impl {
/// expected_result and count_mismatches for handles of one execution space and gradient type,
/// as one class template that liboktopk instantiates
/// (include/oktopk/impl/oracle/expected_result.hpp holds the bodies): a program that checks results
/// compiles none of the oracle's kernels.
template <class ExecSpace, class Value>
class Oracle {
 public:
  using Handle = SparseAllreduce<ExecSpace, Value>;

  static void expected_result(const ExecSpace& exec, const Handle& handle,
                              const typename Handle::const_residual_vector_type& acc,
                              const typename Handle::residual_vector_type& expected, double rel_tol,
                              const typename Handle::residual_vector_type& slack);

  static std::int64_t count_mismatches(const ExecSpace& exec, const Handle& handle,
                                       const typename Handle::const_residual_vector_type& expected,
                                       const typename Handle::const_vector_type& out,
                                       double rel_tol,
                                       const typename Handle::const_residual_vector_type& slack);
};
}  // namespace impl

/// \brief The relative tolerance the oracle uses unless told otherwise.
inline constexpr double default_oracle_tolerance = 1e-5;

/// \brief Collective. Writes into `expected` what the last reduce call of `handle` should have
/// written into its output.
///
/// `acc` is this rank's input to that call as the method saw it: handle.residual() copied
/// *before* the call, plus the gradient (acc(i) = residual(i) + grad(i)). `acc`, `expected` and
/// `slack` hold the handle's arithmetic type (double for double gradients, float otherwise);
/// thresholds compare magnitudes rounded to float, as the methods do. The result is
/// rebuilt from dense data and the thresholds in handle.stats():
/// - a dense call (the Dense method, or a warm-up call; stats().dense): the SUM allreduce of
///   acc, divided by P;
/// - TopkA, TopkDSA, GaussianK, OkTopk: every rank masks its acc with
///   |acc| > stats().local_threshold (its own threshold; entries equal to an exact local
///   threshold, of which the method takes the first in index order up to k, are borderline); R =
///   the SUM allreduce of the masked vectors; expected = R where |R| > stats().global_threshold
///   (the same on all ranks; -Inf for methods without a global selection), else 0; then divided by
///   P (a float division, as the methods do). OkTopk's exact global threshold is the (k+1)-th
///   largest |R|, and the entries equal to it that complete the k are selected too: those lie on
///   the threshold and are borderline (below);
/// - GTopk: every rank's leaf, its k largest (the entries with |acc| > local_threshold, then,
///   if fewer than k and local_threshold > 0, those equal to it in index order up to k), is
///   gathered to every rank and the tree is simulated on the host: in rounds s = 1, 2, 4, ...
///   while s < P, rank r with r % 2s == 0 and r + s < P merges its set (a) with rank r+s's (b),
///   adding a + b at common indices, then keeps the pairs with |v| > t, t = the (k+1)-th
///   largest |v| of the merged set, and, if t > 0, the first pairs in index order with |v| ==
///   t up to k in all (all of them if k >= its size, none if k == 0); rank 0's final set / P.
///   On a wire narrower than the arithmetic type, b is rounded to it before the merge and the
///   final set before the division, with the method's own rounding, as the method sends them;
/// - a handle in the hierarchical mode (Options::hierarchical): acc summed over each node's
///   ranks (in local rank order, as the call sums them), and on each shard the flat oracle
///   above of the method over those node sums (the method's own handle on the shard, its
///   thresholds), divided by the ranks per node L (docs/algorithms.md);
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
///   a + b == b + a exactly; u = the unit roundoff of the arithmetic type, 2^-24 for float
///   and 2^-53 for double), plus, with a wire narrower than the arithmetic type (Options::wire
///   bf16 or fp16 for float gradients, fp32 for double ones, and always for the 16-bit
///   gradient types, whose values travel as themselves), twice what rounding the terms and the
///   sum to it may change: 2((2u_w + u_w^2)·sum|terms| + (c + 1)(1 + u_w)·eta_w) / P (u_w = 2^-8
///   and eta_w = 2^-134 for bf16, 2^-11 and 2^-25 for fp16, 2^-24 and 2^-150 for fp32; the same
///   amount widens the band around the global threshold);
///   S2: per sketch cell of load L (entries with a non-zero on some rank) and mass M (sum
///   over them and over ranks of |acc|), both ways of summing are within (L + P)·u·M of the
///   exact cell, and the median moves no more than its inputs, so 4·max over the entry's cells
///   of (L + P)·u·M / P (rows outside the union: 0; with a layout, Dense segments: as for the
///   ring below, since the method sums them inside a larger allreduce whose order MPI may
///   choose otherwise); on a narrower wire, where the method averages its table on the ring,
///   plus the ring's bound below of the heaviest of the entry's cells (M as the sum of
///   magnitudes; for a Dense segment's entry its own sum over ranks of |acc|); dense calls with
///   dense_allreduce = ring (which sums in ring order): 2(P-1)·u·sum over ranks of |acc| / P for P
///   >= 3; other dense calls and gTopk: 0 (the same MPI_Allreduce as the library's dense path; the
///   same a + b additions as the tree). Without `slack`, entries whose slack exceeds
///   rel_tol·|expected| / 2 are set to NaN instead (they cannot be checked to rel_tol), which for
///   S2 is most of them.
///
/// Entries on a threshold may go either way, but not all of them at once: a top-k method's
/// rank must have contributed as many entries as its selection rule promises
/// (stats().local_selected; with e the non-zeros of its acc and m = min(k, e): m for an exact
/// local threshold, whose ties complete the k in index order; at least guard_low·m for
/// Ok-Topk's reused threshold, gaussian_low·m for Gaussian-k's estimate, and one entry when m >
/// 0). On a rank that contributed fewer, the first entries of `expected`, as many as it lacked,
/// are +Inf, so that count_mismatches counts the shortfall (not checked in the hierarchical
/// mode).
///
/// Throws std::invalid_argument (on every rank) if any rank passes Views whose length is not
/// handle.size() (an empty `slack` is "not given"), std::logic_error if the handle has not
/// reduced anything yet.
template <class ExecSpace, class Value>
void expected_result(
    const ExecSpace& exec, const SparseAllreduce<ExecSpace, Value>& handle,
    const typename SparseAllreduce<ExecSpace, Value>::const_residual_vector_type& acc,
    const typename SparseAllreduce<ExecSpace, Value>::residual_vector_type& expected,
    double rel_tol = default_oracle_tolerance,
    const typename SparseAllreduce<ExecSpace, Value>::residual_vector_type& slack = {}) {
  impl::Oracle<ExecSpace, Value>::expected_result(exec, handle, acc, expected, rel_tol, slack);
}

/// \brief Collective. The number of output entries that are wrong: `out` (the last call's
/// output on this rank) is not finite, or differs from rank 0's output (every rank must get
/// the same result), or differs from `expected` (from expected_result) by more than
/// max(rel_tol·max(|out|, |expected|), slack) + 1e-30. Entries where `expected` is NaN
/// (borderline, see expected_result) are held to the first two rules only; entries where it is
/// +Inf (a selection's shortfall) are wrong whatever `out` holds. `slack` is the
/// View expected_result filled, or empty for none.
///
/// Returns the largest count over the ranks, so every rank gets the same number.
template <class ExecSpace, class Value>
std::int64_t count_mismatches(
    const ExecSpace& exec, const SparseAllreduce<ExecSpace, Value>& handle,
    const typename SparseAllreduce<ExecSpace, Value>::const_residual_vector_type& expected,
    const typename SparseAllreduce<ExecSpace, Value>::const_vector_type& out,
    double rel_tol = default_oracle_tolerance,
    const typename SparseAllreduce<ExecSpace, Value>::const_residual_vector_type& slack = {}) {
  return impl::Oracle<ExecSpace, Value>::count_mismatches(exec, handle, expected, out, rel_tol,
                                                          slack);
}

}  // namespace oktopk

// Compiled once, in liboktopk (src/instantiate/); oktopk/any_space.hpp for other spaces.
OKTOPK_IMPL_DECLARE_INSTANTIATIONS(oktopk::impl::Oracle)
