// SPDX-License-Identifier: BSD-3-Clause
// The oracle's count of a top-k method's local selection: how many entries a rank must have
// contributed, whatever the values, so that a selection that takes nothing on tied magnitudes
// cannot pass as an answer "on the threshold".
#pragma once

#include <oktopk/algorithm.hpp>
#include <oktopk/options.hpp>
#include <oktopk/select.hpp>
#include <oktopk/sparse_allreduce.hpp>
#include <oktopk/impl/oracle/common.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace oktopk::impl {

/// How many entries this rank's local selection in the handle's last call fell short of what
/// its method promises, given the call's input `acc`; 0 when it did not. With e the non-zero
/// entries of acc and m = min(k, e): an exact local threshold (stats().local_threshold_exact:
/// TopkA, TopkDSA and gTopk always, Ok-Topk on its exact calls, Gaussian-k where its estimate
/// fell back) takes m; a reused Ok-Topk threshold at least guard_low·m (guard_exact; without
/// it, at least one entry when m > 0); a Gaussian-k estimate at least gaussian_low·m. Dense,
/// S2 and dense calls: 0.
template <class ExecSpace, class Value, class Real = arithmetic_t<Value>>
std::int64_t selection_shortfall(const ExecSpace& exec,
                                 const SparseAllreduce<ExecSpace, Value>& handle,
                                 const OracleConstVector<ExecSpace, Real>& acc) {
  const ReduceStats& stats = handle.stats();
  const Options& o = handle.options();
  const Algorithm a = handle.algorithm();
  const bool top_k = a == Algorithm::TopkA || a == Algorithm::TopkDSA ||
                     a == Algorithm::GaussianK || a == Algorithm::OkTopk || a == Algorithm::GTopk;
  if (!top_k || stats.dense) return 0;
  const std::int64_t eligible = count_above(exec, acc, 0.0f);
  const auto wanted = static_cast<double>(std::min(handle.k(), eligible));
  double fraction = 1.0;
  if (!stats.local_threshold_exact) {
    if (a == Algorithm::GaussianK) fraction = o.gaussian_low;
    if (a == Algorithm::OkTopk) fraction = o.guard_exact ? o.guard_low : 0.0;
  }
  const double needed = wanted > 0.0 ? std::max(fraction * wanted, 1.0) : 0.0;
  const auto have = static_cast<double>(stats.local_selected);
  return have < needed ? static_cast<std::int64_t>(std::ceil(needed - have)) : 0;
}

}  // namespace oktopk::impl
