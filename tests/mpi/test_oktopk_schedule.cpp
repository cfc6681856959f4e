// SPDX-License-Identifier: BSD-3-Clause
// Ok-Topk over many calls: schedule, threshold prediction and guard, oracle, balancing.
#include "mpi/method_checks.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace {

using namespace oktopk::test;  // NOLINT(google-build-using-namespace)
using oktopk::Algorithm;
using oktopk::Balancing;
using oktopk::Options;

/// Ok-Topk's guard as the spec states it, on the host: from t, raise by guard_step while more
/// than guard_factor·k of x pass; otherwise lower while fewer than guard_low·k pass, stepping
/// back once if a lowering lets more than guard_factor·k pass; at most guard_loops steps (a
/// last lowering is checked too). `steps` receives how many steps were taken.
float spec_guard(float t, const std::vector<float>& x, const Options& o, std::int64_t k,
                 int& steps) {
  auto passing = [&](float threshold) {
    std::int64_t count = 0;
    for (const float v : x) count += std::fabs(v) > threshold ? 1 : 0;
    return static_cast<double>(count);
  };
  const double high = o.guard_factor * static_cast<double>(k);
  const double low = o.guard_low * static_cast<double>(k);
  steps = 0;
  if (passing(t) > high) {
    while (steps < o.guard_loops && passing(t) > high) {
      t = static_cast<float>(t * o.guard_step);
      ++steps;
    }
    return t;
  }
  while (steps < o.guard_loops && passing(t) < low) {
    const float lowered = static_cast<float>(t / o.guard_step);
    if (passing(lowered) > high) break;
    t = lowered;
    ++steps;
  }
  return t;
}

/// The Ok-Topk schedule, threshold control, oracle and balancing over many calls.
struct OkTopkRun {
  std::int64_t warmup = 0;
  std::int64_t threshold_period = 8;
  std::int64_t repartition_period = 16;
  int calls = 72;
  /// The reference's one-sided guard (guard_low 0) instead of the two-sided default, whose band
  /// [0.9 k, 1.1 k] lies inside the nudges' band, so that the nudges seldom act on top of it.
  bool reference_guard = false;
  /// Exact recomputation where the guard's steps do not suffice.
  bool guard_exact = false;
  /// The ladder guard (the default) instead of the walk and the nudges.
  bool guard_ladder = false;
  /// The distribution of call t (t counted from 0), chosen so that thresholds carried over
  /// from a different shape must be guarded and nudged.
  std::function<Dist(int)> dist;
};

void run_oktopk(const OkTopkRun& run) {
  const std::int64_t n = 4096;
  const int P = world_size();
  const Options base = Options{}
                           .set_density(0.02)
                           .set_warmup_iterations(run.warmup)
                           .set_threshold_period(run.threshold_period)
                           .set_repartition_period(run.repartition_period)
                           .set_guard_exact(run.guard_exact)
                           .set_guard_ladder(run.guard_ladder)
                           .set("guard_low", run.reference_guard ? "0" : "0.9");
  // Same data, different balancing and throttling: identical results required.
  Runner off(Algorithm::OkTopk, n, Options(base).set_balancing(Balancing::Off).set_throttle(4));
  Runner on(Algorithm::OkTopk, n, Options(base).set_balancing(Balancing::On).set_throttle(1));
  Runner adaptive(
      Algorithm::OkTopk, n,
      Options(base).set_balancing(Balancing::Adaptive).set_balance_threshold(1.0).set_throttle(3));
  const std::int64_t k = off.handle().k();
  const Options& o = off.handle().options();
  ASSERT_EQ(k, 81);

  // What the previous call left for threshold prediction.
  bool have_previous = false;
  bool previous_nudge_known = false;
  float previous_lt = 0.0f, previous_gt = 0.0f;
  std::int64_t previous_local = 0, previous_global = 0;
  std::int64_t exact_calls = 0, repartitions = 0, guarded = 0, nudged = 0, predicted = 0;

  for (int call = 0; call < run.calls; ++call) {
    SCOPED_TRACE("call " + std::to_string(call + 1));
    const auto grad = make_gradient(run.dist(call), 23, world_rank(), call, n);
    const Call c = off.reduce(grad);
    const Call b = on.reduce(grad);
    const Call m = adaptive.reduce(grad);
    const Checked checked = check_call(off, c);
    const auto& s = c.stats;
    const std::int64_t t = call - run.warmup;  // calls since the warm-up

    if (t < 0) {
      EXPECT_TRUE(s.dense);
      EXPECT_TRUE(b.stats.dense);
      have_previous = false;
    } else {
      EXPECT_FALSE(s.dense);
      const bool exact = t % run.threshold_period == 0;
      // Exact on schedule; between, exact only where the guard could not bring the count into
      // [guard_low k, guard_factor k] (guard_exact), checked below.
      if (exact) {
        EXPECT_TRUE(s.local_threshold_exact);
        EXPECT_TRUE(s.global_threshold_exact);
      }
      EXPECT_EQ(s.repartitioned, t % run.repartition_period == 0);
      exact_calls += exact ? 1 : 0;
      repartitions += s.repartitioned ? 1 : 0;
      const Oracle& orc = checked.oracle;
      if (s.local_threshold_exact) {
        EXPECT_EQ(bits_of(s.local_threshold), bits_of(kth_abs(c.acc, k)))
            << "exact local threshold is not the (k+1)-th largest |acc|";
      }
      if (s.global_threshold_exact) {
        EXPECT_EQ(bits_of(s.global_threshold), bits_of(kth_abs(orc.R, k)))
            << "exact global threshold is not the (k+1)-th largest |R|";
      }
      if (exact) {
        EXPECT_EQ(bits_of(s.local_threshold), bits_of(kth_abs(c.acc, k)))
            << "exact local threshold is not the (k+1)-th largest |acc|";
        EXPECT_EQ(bits_of(s.global_threshold), bits_of(kth_abs(orc.R, k)))
            << "exact global threshold is not the (k+1)-th largest |R|";
        EXPECT_LE(orc.local_count, k);
        EXPECT_LE(count_nonzero(c.out), k);
      } else if (run.guard_ladder) {
        // Reuse: a level of the ladder, whose count lies in [guard_low k, guard_factor k]
        // with guard_exact, or else an exact threshold.
        auto passing = [](const std::vector<float>& x, float threshold) {
          std::int64_t count = 0;
          for (const float v : x) count += std::fabs(v) > threshold ? 1 : 0;
          return static_cast<double>(count);
        };
        const double low = o.guard_low * static_cast<double>(k);
        const double high = o.guard_factor * static_cast<double>(k);
        if (!s.local_threshold_exact) {
          ++guarded;
          const double local = passing(c.acc, s.local_threshold);
          EXPECT_EQ(local, static_cast<double>(orc.local_count));
          if (o.guard_exact) {
            EXPECT_TRUE(local >= low && local <= high)
                << local << " pass the local ladder's threshold, k = " << k;
          }
        }
        if (!s.global_threshold_exact) {
          const double global = passing(orc.R, s.global_threshold);
          if (o.guard_exact) {
            EXPECT_TRUE(global >= low && global <= high)
                << global << " pass the global ladder's threshold, k = " << k;
          }
          // The levels' counts travel with the allgather of counts: no message of its own.
          const auto found = s.phases.find("global_select");
          if (found != s.phases.end()) {
            EXPECT_EQ(found->second.traffic.bytes_sent + found->second.traffic.bytes_received, 0);
          }
        }
      } else if (have_previous) {
        // Reuse: the previous threshold, nudged by the previous count, then guarded.
        double stored = previous_lt;
        bool ambiguous = !previous_nudge_known;
        if (previous_local < o.local_low * static_cast<double>(k)) {
          stored = previous_lt / o.local_step;
        } else if (previous_local > o.local_high * static_cast<double>(k)) {
          stored = previous_lt * o.local_step;
        }
        int loops = 0;
        const float thr = spec_guard(static_cast<float>(stored), c.acc, o, k, loops);
        double global = previous_gt;
        if (previous_global < o.global_low * static_cast<double>(k)) {
          global = previous_gt / o.global_step;
        } else if (previous_global > o.global_high * static_cast<double>(k)) {
          global = previous_gt * o.global_step;
        }
        // The global guard counts the reduced sum over all regions, i.e. all of R.
        int global_loops = 0;
        global = spec_guard(static_cast<float>(global), orc.R, o, k, global_loops);
        guarded += loops > 0 ? 1 : 0;
        nudged += static_cast<float>(stored) != previous_lt ? 1 : 0;
        if (!ambiguous) {
          ++predicted;
          const double tolerance = 1e-5;
          // The guard's result, or an exact threshold where its count is out of range.
          auto in_range = [&](const std::vector<float>& x, double threshold) {
            std::int64_t passing = 0;
            for (const float v : x) passing += std::fabs(v) > threshold ? 1 : 0;
            return passing <= o.guard_factor * static_cast<double>(k) &&
                   passing >= o.guard_low * static_cast<double>(k);
          };
          const bool local_fallback = o.guard_exact && !in_range(c.acc, thr);
          EXPECT_EQ(s.local_threshold_exact, local_fallback);
          if (!local_fallback) {
            EXPECT_NEAR(s.local_threshold, thr, tolerance * std::fabs(thr))
                << "local threshold after nudge (previous " << previous_lt << ", " << previous_local
                << " selected of k = " << k << ") and " << loops << " guard steps";
          }
          const bool global_fallback = o.guard_exact && !in_range(orc.R, global);
          EXPECT_EQ(s.global_threshold_exact, global_fallback);
          if (!global_fallback) {
            EXPECT_NEAR(s.global_threshold, global, tolerance * std::fabs(global))
                << "global threshold after nudge (previous " << previous_gt << ", "
                << previous_global << " selected)";
          }
        }
      }
      // The nudge after an exact call is unambiguous only when its count is in range.
      previous_nudge_known = !(s.local_threshold_exact || s.global_threshold_exact) ||
                             (orc.local_count >= o.local_low * static_cast<double>(k) &&
                              orc.local_count <= o.local_high * static_cast<double>(k) &&
                              orc.global_count >= o.global_low * static_cast<double>(k) &&
                              orc.global_count <= o.global_high * static_cast<double>(k));
      have_previous = true;
      previous_lt = s.local_threshold;
      previous_gt = s.global_threshold;
      previous_local = orc.local_count;
      previous_global = orc.global_count;

      for (const char* phase : {"split_reduce", "allgatherv"}) {
        const auto found = s.phases.find(phase);
        EXPECT_TRUE(found != s.phases.end()) << "no phase " << phase;
        if (found != s.phases.end() && P > 1) {
          EXPECT_GT(found->second.traffic.bytes_sent + found->second.traffic.bytes_received, 0)
              << phase;
        }
      }
      EXPECT_FALSE(s.balanced) << "balancing off";
      if (P > 1 && orc.global_count > 0) {
        EXPECT_TRUE(b.stats.balanced) << "balancing on";
        EXPECT_GT(b.stats.phases.count("balance"), 0u);
      }
    }
    // Balancing and throttle change nothing in the results.
    for (const Call* other : {&b, &m}) {
      Diff out_diff, residual_diff;
      for (std::size_t j = 0; j < c.out.size(); ++j) {
        if (bits_of(c.out[j]) != bits_of(other->out[j])) out_diff.note(j, c.out[j], other->out[j]);
        if (bits_of(c.residual_after[j]) != bits_of(other->residual_after[j])) {
          residual_diff.note(j, c.residual_after[j], other->residual_after[j]);
        }
      }
      const char* which = other == &b ? "balancing on, throttle 1" : "adaptive, throttle 3";
      EXPECT_EQ(out_diff.count, 0) << which << " vs off: " << out_diff;
      EXPECT_EQ(residual_diff.count, 0) << which << " residual vs off: " << residual_diff;
      EXPECT_EQ(bits_of(other->stats.local_threshold), bits_of(s.local_threshold)) << which;
      EXPECT_EQ(bits_of(other->stats.global_threshold), bits_of(s.global_threshold)) << which;
      EXPECT_EQ(other->stats.local_selected, s.local_selected) << which;
      EXPECT_EQ(other->stats.global_selected, s.global_selected) << which;
      EXPECT_EQ(other->stats.repartitioned, s.repartitioned) << which;
    }
    EXPECT_EQ(on.calls(), off.calls());
    EXPECT_EQ(b.stats.iteration, s.iteration);
  }
  const std::int64_t sparse_calls = run.calls - run.warmup;
  EXPECT_EQ(exact_calls, (sparse_calls + run.threshold_period - 1) / run.threshold_period);
  EXPECT_EQ(repartitions, (sparse_calls + run.repartition_period - 1) / run.repartition_period);
  if (!run.guard_ladder) {
    EXPECT_GT(predicted, 0);
  }
  // The distributions change between exact calls, so the control loops must have acted.
  EXPECT_GT(guarded, 0) << "the guard never moved a threshold";
  if (run.reference_guard) {
    EXPECT_GT(nudged, 0) << "no threshold was ever nudged";
  }
}

/// run_oktopk with the ladder guard (the default) and the two-sided walk, each with and without
/// guard_exact, and with the reference's guard.
void run_guard_variants(OkTopkRun run) {
  for (const bool ladder : {true, false}) {
    for (const bool exact : {true, false}) {
      SCOPED_TRACE(std::string(ladder ? "ladder" : "walk") +
                   (exact ? ", guard_exact on" : ", guard_exact off"));
      run.guard_ladder = ladder;
      run.guard_exact = exact;
      run_oktopk(run);
    }
  }
  run.guard_ladder = false;
  SCOPED_TRACE("the reference's guard");
  run.guard_exact = false;
  run.reference_guard = true;
  run_oktopk(run);
}

TEST(OkTopk, ScheduleOracleThresholdControlAndBalancingOverManyCalls) {
  OkTopkRun run;
  run.dist = [](int t) {
    if (t < 20) return Dist::Uniform;
    if (t < 44) return Dist::Heavy;    // uniform threshold on heavy data: too few pass
    if (t < 58) return Dist::Uniform;  // heavy threshold on uniform data: far too many pass
    return Dist::Correlated;
  };
  run_guard_variants(run);
}

TEST(OkTopk, ScheduleCountsFromTheEndOfTheWarmup) {
  OkTopkRun run;
  run.warmup = 3;
  run.threshold_period = 4;
  run.repartition_period = 6;
  run.calls = 20;
  run.dist = [](int t) { return t < 9 ? Dist::Heavy : Dist::Uniform; };
  run_guard_variants(run);
}

// Every rank selects the same k entries, so the regions are the quantiles of that one
// selection and each holds ⌊k/P⌋ or ⌈k/P⌉ of it: what a rank receives in the split-and-reduce
// is that share from each other rank, plus one count each. A k of 59 leaves a remainder of 1 to
// 4 at P = 2 to 8, which a fixed stride of ⌊k/P⌋ would leave all to the last region.
TEST(OkTopk, RegionsSplitTheSelectionEvenly) {
  const std::int64_t n = 4096;
  const int P = world_size();
  Runner runner(Algorithm::OkTopk, n,
                Options{}.set_density(59.5 / static_cast<double>(n)).set_warmup_iterations(0));
  const std::int64_t k = runner.handle().k();
  ASSERT_EQ(k, 59);
  std::vector<float> grad(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j) {
    // Distinct magnitudes in a scrambled order, the same on every rank.
    const auto m = static_cast<float>((j * 1237) % n + 1) / static_cast<float>(n);
    grad[static_cast<std::size_t>(j)] = j % 2 == 0 ? m : -m;
  }
  const Call c = runner.reduce(grad);
  ASSERT_TRUE(c.stats.repartitioned);
  const std::int64_t selected = c.stats.local_selected;
  EXPECT_EQ(selected, k);
  const auto found = c.stats.phases.find("split_reduce");
  ASSERT_TRUE(found != c.stats.phases.end());
  const std::int64_t entry = sizeof(std::int32_t) + sizeof(float);
  const std::int64_t count = sizeof(std::int64_t);
  const std::int64_t fewest = (P - 1) * (entry * (selected / P) + count);
  const std::int64_t most = (P - 1) * (entry * ((selected + P - 1) / P) + count);
  EXPECT_GE(found->second.traffic.bytes_received, fewest) << "rank " << world_rank();
  EXPECT_LE(found->second.traffic.bytes_received, most) << "rank " << world_rank();
}

}  // namespace
