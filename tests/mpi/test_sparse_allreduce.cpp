// SPDX-License-Identifier: BSD-3-Clause
// The SparseAllreduce interface, for every method: the collective factory, input errors that
// every rank must report together, and each call's output checked bit for bit against oracles
// rebuilt on the host from dense data with plain MPI (spec §6), using the thresholds the method
// reports. Gradients are multiples of 2^-8 small enough that every sum is exact, so "bit for bit"
// holds whatever order a method adds in. Runs at several rank counts.
#include <oktopk/make_sparse_allreduce.hpp>
#include <oktopk/oktopk.hpp>

#include "mpi/method_checks.hpp"

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <limits>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace oktopk::test;  // NOLINT(google-build-using-namespace)
using oktopk::Algorithm;
using oktopk::Balancing;
using oktopk::Options;

std::string algorithm_name(const ::testing::TestParamInfo<Algorithm>& info) {
  return oktopk::to_string(info.param);
}

// =============================================================================================
// The factory
// =============================================================================================

TEST(Factory, RejectsNOutOfRange) {
  oktopk::Communicator comm;
  for (const std::int64_t n : {std::int64_t{-1}, std::int64_t{-1000},
                               std::int64_t{std::numeric_limits<std::int32_t>::max()} + 1}) {
    SCOPED_TRACE(n);
    expect_invalid_argument(
        [&] { oktopk::make_sparse_allreduce<Exec>(Algorithm::TopkA, comm, n); },
        "oktopk::make_sparse_allreduce");
  }
}

TEST(Factory, RejectsInvalidOptions) {
  oktopk::Communicator comm;
  for (const Algorithm a : oktopk::all_algorithms) {
    expect_invalid_argument(
        [&] { oktopk::make_sparse_allreduce<Exec>(a, comm, 100, Options{}.set_density(1.5)); },
        "oktopk::Options::validate");
    expect_invalid_argument(
        [&] { oktopk::make_sparse_allreduce<Exec>(a, comm, 100, Options{}.set_throttle(0)); },
        "oktopk::Options::validate");
  }
}

/// Collective: every rank must throw the same invalid_argument, starting with the factory's
/// name and naming `what`; afterwards a matching call works.
template <class Make>
void expect_factory_mismatch(Make&& make, const std::string& what) {
  const std::string message = expect_invalid_argument(make, "oktopk::make_sparse_allreduce");
  EXPECT_NE(message.find(what + " differs"), std::string::npos) << message;
  EXPECT_TRUE(same_text_on_all_ranks(message)) << "different messages on different ranks: "
                                               << message;
}

TEST(Factory, RejectsNDifferingOnOneRank) {
  if (world_size() == 1) GTEST_SKIP() << "needs two ranks to disagree";
  oktopk::Communicator comm;
  const bool odd_one = world_rank() == world_size() - 1;
  for (const Algorithm a : oktopk::all_algorithms) {
    SCOPED_TRACE(oktopk::to_string(a));
    expect_factory_mismatch(
        [&] { oktopk::make_sparse_allreduce<Exec>(a, comm, odd_one ? 101 : 100); }, "n");
  }
  EXPECT_NO_THROW(oktopk::make_sparse_allreduce<Exec>(Algorithm::Dense, comm, 100));
}

TEST(Factory, RejectsAlgorithmDifferingOnOneRank) {
  if (world_size() == 1) GTEST_SKIP() << "needs two ranks to disagree";
  oktopk::Communicator comm;
  for (std::size_t i = 0; i < oktopk::all_algorithms.size(); ++i) {
    const Algorithm mine = world_rank() == 0 ? oktopk::all_algorithms[i]
                                             : oktopk::all_algorithms[(i + 1) % 7];
    expect_factory_mismatch([&] { oktopk::make_sparse_allreduce<Exec>(mine, comm, 64); },
                            "algorithm");
  }
}

TEST(Factory, RejectsOptionsDifferingOnOneRank) {
  if (world_size() == 1) GTEST_SKIP() << "needs two ranks to disagree";
  oktopk::Communicator comm;
  const bool odd_one = world_rank() == world_size() / 2;
  for (const auto& [name, change] : field_changes()) {
    SCOPED_TRACE(name);
    Options o;
    if (odd_one) change(o);
    expect_factory_mismatch([&] { oktopk::make_sparse_allreduce<Exec>(Algorithm::OkTopk, comm,
                                                                        64, o); },
                            "options");
  }
  // A valid option differing on one rank is reported as a mismatch, not as invalid.
  Options o;
  if (odd_one) o.density = 0.5;
  expect_factory_mismatch(
      [&] { oktopk::make_sparse_allreduce<Exec>(Algorithm::TopkA, comm, 64, o); }, "options");
}

// =============================================================================================
// Every method (value-parameterized over Algorithm)
// =============================================================================================

class Method : public ::testing::TestWithParam<Algorithm> {};

INSTANTIATE_TEST_SUITE_P(All, Method, ::testing::ValuesIn(oktopk::all_algorithms),
                         algorithm_name);

TEST_P(Method, ReportsItsConfiguration) {
  const Algorithm a = GetParam();
  oktopk::Communicator comm;
  for (const auto& [n, density] : std::vector<std::pair<std::int64_t, double>>{
           {1000, 0.1}, {1000, 0.0149}, {3, 1.0 / 3.0}, {7, 0.0}, {7, 1.0}, {0, 0.5}}) {
    SCOPED_TRACE(std::to_string(n) + " " + std::to_string(density));
    const auto h = oktopk::make_sparse_allreduce<Exec>(a, comm, n,
                                                       Options{}.set_density(density));
    EXPECT_EQ(h->algorithm(), a);
    EXPECT_EQ(h->size(), n);
    EXPECT_EQ(h->k(), static_cast<std::int64_t>(std::floor(density * static_cast<double>(n))));
    EXPECT_EQ(h->options().density, density);
    EXPECT_EQ(h->communicator().size(), world_size());
    EXPECT_EQ(h->stats().iteration, 0);
    const auto residual = to_host(h->residual());
    EXPECT_EQ(static_cast<std::int64_t>(residual.size()), n);
    EXPECT_EQ(count_nonzero(residual), 0);
  }
}

TEST_P(Method, MatchesItsOracleOnEveryDistribution) {
  const Algorithm a = GetParam();
  const std::int64_t n = 3001;  // not a multiple of P, nor of S2's row width
  Runner runner(a, n, Options{}.set_density(0.02));
  const int P = world_size();
  std::int64_t tree_verified = 0;
  for (const Dist d : {Dist::Uniform, Dist::Heavy, Dist::Correlated, Dist::Rows, Dist::Ties}) {
    for (int call = 0; call < 3; ++call) {
      SCOPED_TRACE(std::string(name_of(d)) + " call " + std::to_string(runner.calls() + 1));
      const Call c = runner.reduce(make_gradient(d, 7, world_rank(), runner.calls(), n));
      const Checked checked = check_call(runner, c);
      tree_verified += checked.tree_verified ? 1 : 0;
      // Traffic is charged to named phases (beyond the per-call agreement).
      std::int64_t moved = 0;
      for (const auto& [phase, stats] : c.stats.phases) {
        EXPECT_GE(stats.seconds, 0.0) << phase;
        if (phase != "check") moved += stats.traffic.bytes_sent + stats.traffic.bytes_received;
      }
      if (P > 1) {
        EXPECT_GT(max_over_ranks(moved), 0) << "no traffic outside 'check'";
      }
      if (P == 1) {
        EXPECT_EQ(c.stats.total_traffic().bytes_sent, 0);
      }
      if (P > 1) {
        EXPECT_GT(c.stats.phases.count("check"), 0u);
      }
    }
  }
  if (a == Algorithm::GTopk) {
    EXPECT_GT(tree_verified, 0) << "every call was ambiguous";
  }
}

TEST_P(Method, LengthMismatchOnOneRankThrowsOnEveryRank) {
  const Algorithm a = GetParam();
  const std::int64_t n = 500;
  const Options options = Options{}.set_density(0.05);
  Runner runner(a, n, options);
  Runner fresh(a, n, options);
  const int P = world_size();
  const int me = world_rank();
  const auto grad = make_gradient(Dist::Uniform, 3, me, 0, n);
  Exec exec;
  const Vector g = to_device(grad);
  const Vector longer("test::longer", static_cast<std::size_t>(n + 1));
  const Vector shorter("test::shorter", static_cast<std::size_t>(n - 1));
  Vector out("test::out", static_cast<std::size_t>(n));
  // A longer gradient on the last rank only.
  const std::string m1 = expect_invalid_argument(
      [&] { runner.handle().reduce(exec, me == P - 1 ? longer : g, out); },
      "oktopk::SparseAllreduce::reduce");
  EXPECT_NE(m1.find(std::to_string(P - 1)), std::string::npos) << "the rank is not named: " << m1;
  // A shorter output on rank 0 only.
  expect_invalid_argument([&] { runner.handle().reduce(exec, g, me == 0 ? shorter : out); },
                          "oktopk::SparseAllreduce::reduce");
  EXPECT_EQ(count_nonzero(to_host(runner.handle().residual())), 0);
  // Nothing happened: the next good call is a first call.
  const Call c = runner.reduce(grad);
  EXPECT_EQ(c.stats.iteration, 1);
  const Call f = fresh.reduce(grad);
  check_call(runner, c);
  EXPECT_EQ(bits_differing_from_rank0(c.out), 0);
  Diff d;
  for (std::size_t j = 0; j < c.out.size(); ++j) {
    if (!same_value_bits(f.out[j], c.out[j])) d.note(j, f.out[j], c.out[j]);
  }
  EXPECT_EQ(d.count, 0) << "after rejected calls vs a fresh handle: " << d;
}

TEST_P(Method, NonFiniteOnOneRankThrowsOnEveryRankAndChangesNothing) {
  const Algorithm a = GetParam();
  const std::int64_t n = 700;
  const Options options = Options{}.set_density(0.05).set_threshold_period(2);
  Runner runner(a, n, options);
  Runner fresh(a, n, options);
  const int P = world_size();
  const int me = world_rank();
  const auto g1 = make_gradient(Dist::Heavy, 5, me, 0, n);
  const auto g2 = make_gradient(Dist::Heavy, 5, me, 1, n);
  runner.reduce(g1);
  fresh.reduce(g1);
  const std::vector<float> residual_before = to_host(runner.handle().residual());

  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::vector<float>> bad_inputs;
  {
    auto bad = g2;  // NaN on the last rank
    if (me == P - 1) bad[17] = nan;
    bad_inputs.push_back(bad);
  }
  {
    auto bad = g2;  // +Inf on rank 0 and -Inf on the middle rank
    if (me == 0) bad[3] = kInf;
    if (me == P / 2) bad[n - 1] = -kInf;
    bad_inputs.push_back(bad);
  }
  for (const auto& bad : bad_inputs) {
    Exec exec;
    const Vector g = to_device(bad);
    Vector out("test::out", static_cast<std::size_t>(n));
    const std::string message = expect_invalid_argument(
        [&] { runner.handle().reduce(exec, g, out); }, "oktopk::SparseAllreduce::reduce");
    EXPECT_NE(message.find("NaN or Inf"), std::string::npos) << message;
    const std::vector<float> residual_now = to_host(runner.handle().residual());
    Diff d;
    for (std::size_t j = 0; j < residual_now.size(); ++j) {
      if (bits_of(residual_now[j]) != bits_of(residual_before[j])) {
        d.note(j, residual_before[j], residual_now[j]);
      }
    }
    EXPECT_EQ(d.count, 0) << "a rejected call changed the residual: " << d;
  }
  // The next good call continues as if the bad ones never happened.
  const Call c = runner.reduce(g2);
  const Call f = fresh.reduce(g2);
  EXPECT_EQ(c.stats.iteration, 2);
  check_call(runner, c);
  Diff out_diff, residual_diff;
  for (std::size_t j = 0; j < c.out.size(); ++j) {
    if (bits_of(f.out[j]) != bits_of(c.out[j])) out_diff.note(j, f.out[j], c.out[j]);
    if (bits_of(f.residual_after[j]) != bits_of(c.residual_after[j])) {
      residual_diff.note(j, f.residual_after[j], c.residual_after[j]);
    }
  }
  EXPECT_EQ(out_diff.count, 0) << "out after rejected calls vs a fresh history: " << out_diff;
  EXPECT_EQ(residual_diff.count, 0) << "residual vs a fresh history: " << residual_diff;
  EXPECT_EQ(bits_of(c.stats.local_threshold), bits_of(f.stats.local_threshold));
  EXPECT_EQ(bits_of(c.stats.global_threshold), bits_of(f.stats.global_threshold));
  EXPECT_EQ(c.stats.local_threshold_exact, f.stats.local_threshold_exact);
}

TEST_P(Method, OverflowOfResidualPlusGradientThrows) {
  const Algorithm a = GetParam();
  if (a == Algorithm::Dense || a == Algorithm::S2Reducer) {
    GTEST_SKIP() << "no error feedback: acc = grad";
  }
  const std::int64_t n = 256;
  Runner runner(a, n, Options{}.set_density(0.0));  // k = 0: everything stays in the residual
  const int me = world_rank();
  std::vector<float> grad(static_cast<std::size_t>(n), 0.0f);
  if (me == world_size() - 1) grad[5] = 0.75f * std::numeric_limits<float>::max();
  const Call c = runner.reduce(grad);
  check_call(runner, c);
  EXPECT_EQ(c.residual_after[5], grad[5]);
  // residual + grad overflows to +Inf on the last rank only.
  Exec exec;
  const Vector g = to_device(grad);
  Vector out("test::out", static_cast<std::size_t>(n));
  expect_invalid_argument([&] { runner.handle().reduce(exec, g, out); },
                          "oktopk::SparseAllreduce::reduce");
  EXPECT_EQ(to_host(runner.handle().residual())[5], grad[5]);
}

TEST_P(Method, DensityZeroSendsNothingAndKeepsEverything) {
  const Algorithm a = GetParam();
  if (a == Algorithm::S2Reducer) GTEST_SKIP() << "S2 does not select by density";
  const std::int64_t n = 1000;
  Runner runner(a, n, Options{}.set_density(0.0));
  EXPECT_EQ(runner.handle().k(), 0);
  for (int call = 0; call < 3; ++call) {
    SCOPED_TRACE(call);
    const Call c = runner.reduce(make_gradient(Dist::Uniform, 11, world_rank(), call, n));
    check_call(runner, c);
    if (a == Algorithm::Dense) continue;
    EXPECT_EQ(count_nonzero(c.out), 0) << "k = 0 must give an all-zero output";
    Diff d;
    for (std::size_t j = 0; j < c.acc.size(); ++j) {
      if (!same_value_bits(c.acc[j], c.residual_after[j])) d.note(j, c.acc[j], c.residual_after[j]);
    }
    EXPECT_EQ(d.count, 0) << "k = 0 must keep all of acc in the residual: " << d;
  }
}

TEST_P(Method, DensityOneEqualsDense) {
  const Algorithm a = GetParam();
  if (a == Algorithm::S2Reducer) GTEST_SKIP() << "S2 does not select by density";
  const std::int64_t n = 1000;
  Runner runner(a, n, Options{}.set_density(1.0).set_threshold_period(2));
  EXPECT_EQ(runner.handle().k(), n);
  for (int call = 0; call < 4; ++call) {
    SCOPED_TRACE(call);
    const Dist d = call % 2 == 0 ? Dist::Uniform : Dist::Rows;  // Rows: zeros are kept too
    const Call c = runner.reduce(make_gradient(d, 13, world_rank(), call, n));
    check_call(runner, c);
    expect_dense_average(c);  // and the residual is empty
  }
}

TEST_P(Method, TinyVectors) {
  const Algorithm a = GetParam();
  for (const std::int64_t n : {0, 1, 3}) {
    for (const double density : {0.5, 1.0}) {
      SCOPED_TRACE("n = " + std::to_string(n) + ", density = " + std::to_string(density));
      Runner runner(a, n, Options{}.set_density(density).set_threshold_period(2)
                              .set_repartition_period(3).set_s2_row_width(2));
      for (int call = 0; call < 4; ++call) {
        const Call c = runner.reduce(make_gradient(Dist::Uniform, 17, world_rank(), call, n));
        check_call(runner, c);
        if (density == 1.0 && a != Algorithm::S2Reducer) expect_dense_average(c);
      }
    }
  }
}

TEST_P(Method, AllZeroGradientGivesZeroOutput) {
  const Algorithm a = GetParam();
  const std::int64_t n = 1024;
  Runner runner(a, n, Options{}.set_density(0.1));
  const std::vector<float> zeros(static_cast<std::size_t>(n), 0.0f);
  for (int call = 0; call < 3; ++call) {
    SCOPED_TRACE(call);
    const Call c = runner.reduce(zeros);
    check_call(runner, c);
    EXPECT_EQ(count_nonzero(c.out), 0);
    EXPECT_EQ(count_nonzero(c.residual_after), 0);
  }
}

TEST_P(Method, WarmupCallsAreDense) {
  const Algorithm a = GetParam();
  const std::int64_t n = 2000;
  Runner runner(a, n, Options{}.set_density(0.02).set_warmup_iterations(3));
  for (int call = 0; call < 6; ++call) {
    SCOPED_TRACE(call);
    const Call c = runner.reduce(make_gradient(Dist::Heavy, 19, world_rank(), call, n));
    const Checked checked = check_call(runner, c);
    if (call < 3) {
      EXPECT_TRUE(c.stats.dense);
      EXPECT_EQ(count_nonzero(c.residual_after), 0);
    } else {
      EXPECT_EQ(c.stats.dense, a == Algorithm::Dense);
    }
    EXPECT_EQ(checked.dense, c.stats.dense);
  }
}

// =============================================================================================
// Method-specific behaviour
// =============================================================================================

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
                           .set("guard_low", run.reference_guard ? "0" : "0.9");
  // Same data, different balancing and throttling: identical results required.
  Runner off(Algorithm::OkTopk, n, Options(base).set_balancing(Balancing::Off).set_throttle(4));
  Runner on(Algorithm::OkTopk, n, Options(base).set_balancing(Balancing::On).set_throttle(1));
  Runner adaptive(Algorithm::OkTopk, n, Options(base)
                                            .set_balancing(Balancing::Adaptive)
                                            .set_balance_threshold(1.0)
                                            .set_throttle(3));
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
                << "local threshold after nudge (previous " << previous_lt << ", "
                << previous_local << " selected of k = " << k << ") and " << loops
                << " guard steps";
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
      previous_nudge_known =
          !(s.local_threshold_exact || s.global_threshold_exact) || (orc.local_count >= o.local_low * static_cast<double>(k) &&
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
  EXPECT_GT(predicted, 0);
  // The distributions change between exact calls, so the control loops must have acted.
  EXPECT_GT(guarded, 0) << "the guard never moved a threshold";
  if (run.reference_guard) EXPECT_GT(nudged, 0) << "no threshold was ever nudged";
}

/// run_oktopk with the two-sided guard, with and without guard_exact, and with the reference's
/// guard.
void run_guard_variants(OkTopkRun run) {
  for (const bool exact : {false, true}) {
    SCOPED_TRACE(exact ? "guard_exact on (the default)" : "guard_exact off");
    run.guard_exact = exact;
    run_oktopk(run);
  }
  SCOPED_TRACE("the reference's guard");
  run.guard_exact = false;
  run.reference_guard = true;
  run_oktopk(run);
}

TEST(OkTopk, ScheduleOracleThresholdControlAndBalancingOverManyCalls) {
  OkTopkRun run;
  run.dist = [](int t) {
    if (t < 20) return Dist::Uniform;
    if (t < 44) return Dist::Heavy;  // uniform threshold on heavy data: too few pass
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

// ---- dense allreduce algorithms -------------------------------------------------------------

Options ring_options() { return Options{}.set_dense_allreduce(oktopk::DenseAlgorithm::Ring); }

TEST(DenseRing, MatchesMpiAllreduceBitForBitAtEverySize) {
  const int P = world_size();
  // Empty, one entry, fewer entries than ranks, chunks of unequal length, many entries.
  for (const std::int64_t n : std::vector<std::int64_t>{0, 1, std::max(1, P - 1), P + 1, 3001}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    Runner ring(Algorithm::Dense, n, ring_options());
    Runner mpi(Algorithm::Dense, n, Options{});
    for (const Dist d : {Dist::Uniform, Dist::Heavy, Dist::Wide}) {
      SCOPED_TRACE(name_of(d));
      const auto grad = make_gradient(d, 11, world_rank(), ring.calls(), n);
      const Call r = ring.reduce(grad);
      const Call m = mpi.reduce(grad);
      check_call(ring, r);  // the dense oracle: (Σ grad) / P, bit for bit, the same on every rank
      Diff diff;
      for (std::size_t j = 0; j < r.out.size(); ++j) {
        if (bits_of(r.out[j]) != bits_of(m.out[j])) diff.note(j, m.out[j], r.out[j]);
      }
      EXPECT_EQ(diff.count, 0) << "ring vs MPI_Allreduce: " << diff;
      if (P > 1 && n >= P) {
        // The bandwidth optimum: 2(P-1) chunks of about n/P floats leave every rank.
        const auto sent = r.stats.phases.at("dense_allreduce").traffic.bytes_sent;
        const std::int64_t chunks = 2 * (P - 1);
        EXPECT_GE(sent, chunks * (n / P) * 4);
        EXPECT_LE(sent, chunks * (n / P + 1) * 4);
      }
    }
  }
}

TEST(DenseRing, SendsItsChunksToTheRightNeighbourOnly) {
  const int P = world_size();
  const std::int64_t n = 1000;
  Runner runner(Algorithm::Dense, n, ring_options());
  oktopk::Communicator log = runner.handle().communicator();  // shares the handle's counters
  log.set_message_log(true);
  runner.reduce(make_gradient(Dist::Uniform, 19, world_rank(), 0, n));
  std::int64_t sends = 0, to_right = 0, collectives = 0;
  for (const auto& m : log.message_log()) {
    if (m.phase != "dense_allreduce") continue;
    if (std::string(m.operation) == "send") {
      ++sends;
      if (m.peer == (world_rank() + 1) % P) ++to_right;
    } else if (m.peer < 0) {
      ++collectives;
    }
  }
  log.set_message_log(false);
  EXPECT_EQ(sends, 2 * (P - 1));
  EXPECT_EQ(to_right, sends);
  EXPECT_EQ(collectives, 0) << "the ring made a collective call";
}

TEST(DenseRing, SumsOrdinaryFloatsWithinTheOrderBoundOfMpi) {
  // Random floats whose sums round: the ring and MPI may differ, by no more than the order
  // bound, and each is the same on every rank.
  const int P = world_size();
  const std::int64_t n = 4099;
  Runner ring(Algorithm::Dense, n, ring_options());
  Runner mpi(Algorithm::Dense, n, Options{});
  std::vector<float> grad(static_cast<std::size_t>(n));
  std::uint32_t state = 2463534242u + static_cast<std::uint32_t>(world_rank()) * 7919u;
  for (auto& g : grad) {
    state ^= state << 13, state ^= state >> 17, state ^= state << 5;
    g = static_cast<float>(state) * 0x1p-32f - 0.5f;
  }
  const Call r = ring.reduce(grad);
  const Call m = mpi.reduce(grad);
  EXPECT_EQ(bits_differing_from_rank0(r.out), 0);
  std::vector<float> magnitude(grad.size());
  for (std::size_t j = 0; j < grad.size(); ++j) magnitude[j] = std::fabs(grad[j]);
  const std::vector<float> abs_sum = sum_over_ranks(magnitude);
  Diff diff;
  for (std::size_t j = 0; j < grad.size(); ++j) {
    const float bound = 2.0f * static_cast<float>(P) * 0x1p-24f * abs_sum[j] / static_cast<float>(P);
    if (!(std::fabs(r.out[j] - m.out[j]) <= bound)) diff.note(j, m.out[j], r.out[j]);
  }
  EXPECT_EQ(diff.count, 0) << "ring vs MPI beyond the order bound: " << diff;
}

TEST(DenseRing, WarmupCallsOfASparseMethodUseItToo) {
  Runner runner(Algorithm::OkTopk, 2000, ring_options().set_warmup_iterations(2).set_density(0.05));
  for (int call = 0; call < 3; ++call) {
    const Call c = runner.reduce(make_gradient(Dist::Heavy, 13, world_rank(), call, 2000));
    const Checked checked = check_call(runner, c);
    EXPECT_EQ(checked.dense, call < 2);
  }
}

/// A dense call checks the average rather than its input: NaN or Inf on one rank, and finite
/// gradients whose sum overflows, throw on every rank, and the handle goes on as if the call
/// had never been made.
void expect_dense_rejects_nonfinite(const Options& options) {
  const std::int64_t n = 500;
  const int P = world_size();
  const int me = world_rank();
  Runner runner(Algorithm::Dense, n, options);
  Runner fresh(Algorithm::Dense, n, options);
  const auto g1 = make_gradient(Dist::Uniform, 17, me, 0, n);
  runner.reduce(g1);
  fresh.reduce(g1);
  Exec exec;
  Vector out("test::out", static_cast<std::size_t>(n));
  const oktopk::ReduceStats stats_before = runner.handle().stats();
  {
    auto bad = g1;
    if (me == P - 1) bad[n / 2] = std::numeric_limits<float>::quiet_NaN();
    const Vector g = to_device(bad);
    const std::string message = expect_invalid_argument(
        [&] { runner.handle().reduce(exec, g, out); }, "oktopk::SparseAllreduce::reduce");
    EXPECT_NE(message.find("NaN or Inf on rank " + std::to_string(P - 1)), std::string::npos)
        << message;
    EXPECT_TRUE(same_text_on_all_ranks(message.substr(0, message.find(" ("))));
    EXPECT_EQ(runner.handle().stats().iteration, stats_before.iteration);
    EXPECT_EQ(runner.handle().stats().phases.size(), stats_before.phases.size());
  }
  {
    auto bad = g1;  // +Inf on rank 0, -Inf on the last: their sum is NaN
    if (me == 0) bad[0] = kInf;
    if (me == P - 1) bad[n - 1] = -kInf;
    const Vector g = to_device(bad);
    expect_invalid_argument([&] { runner.handle().reduce(exec, g, out); },
                            "oktopk::SparseAllreduce::reduce");
  }
  if (P > 1) {
    // Finite everywhere, but 0.75 of the largest float on every rank sums past it.
    auto big = g1;
    big[7] = 0.75f * std::numeric_limits<float>::max();
    const Vector g = to_device(big);
    const std::string message = expect_invalid_argument(
        [&] { runner.handle().reduce(exec, g, out); }, "oktopk::SparseAllreduce::reduce");
    EXPECT_NE(message.find("overflows"), std::string::npos) << message;
    EXPECT_TRUE(same_text_on_all_ranks(message));
  }
  const auto g2 = make_gradient(Dist::Uniform, 17, me, 1, n);
  const Call c = runner.reduce(g2);
  const Call f = fresh.reduce(g2);
  EXPECT_EQ(c.stats.iteration, 2);
  check_call(runner, c);
  Diff diff;
  for (std::size_t j = 0; j < c.out.size(); ++j) {
    if (bits_of(f.out[j]) != bits_of(c.out[j])) diff.note(j, f.out[j], c.out[j]);
  }
  EXPECT_EQ(diff.count, 0) << "after rejected calls vs a fresh handle: " << diff;
}

TEST(DenseRing, NonFiniteAverageThrowsOnEveryRankAndChangesNothing) {
  expect_dense_rejects_nonfinite(ring_options());
}

TEST(DenseMpi, NonFiniteAverageThrowsOnEveryRankAndChangesNothing) {
  expect_dense_rejects_nonfinite(Options{});
}

TEST(TopkDSA, SparseAndDenseSwitchBothMatchTheOracle) {
  const std::int64_t n = 3001;
  for (const double density : {0.01, 0.6}) {
    SCOPED_TRACE(density);
    Runner runner(Algorithm::TopkDSA, n, Options{}.set_density(density));
    for (int call = 0; call < 3; ++call) {
      const Call c = runner.reduce(make_gradient(Dist::Uniform, 29, world_rank(), call, n));
      const Checked checked = check_call(runner, c);
      EXPECT_TRUE(same_on_all_ranks(c.stats.dense_switch ? 1 : 0));
      std::int64_t nnz = 0;
      for (const float r : checked.oracle.R) nnz += r != 0.0f ? 1 : 0;
      // Sparse iff 2·nnz < n (8 bytes an entry against 4 a dense element).
      EXPECT_EQ(c.stats.dense_switch, !(2 * nnz < n)) << nnz << " non-zeros";
      EXPECT_EQ(c.stats.dense_switch, density > 0.5);
    }
  }
}

TEST(GTopk, MatchesTheSimulatedTreeWithDistinctMagnitudes) {
  const std::int64_t n = 2048;
  Runner runner(Algorithm::GTopk, n, Options{}.set_density(0.01));
  std::int64_t verified = 0;
  for (int call = 0; call < 4; ++call) {
    SCOPED_TRACE(call);
    const Call c = runner.reduce(make_gradient(Dist::Wide, 31, world_rank(), call, n));
    verified += check_call(runner, c).tree_verified ? 1 : 0;
    EXPECT_LE(count_nonzero(c.out), runner.handle().k());
    if (world_size() == 1) {  // gTopk = TopkA = the local top-k at P = 1
      EXPECT_EQ(count_nonzero(c.out), runner.handle().k());
    }
  }
  EXPECT_GE(verified, 3) << "too many cuts between equal magnitudes to check the tree";
}

TEST(S2Reducer, ExactSketchEqualsDense) {
  const std::int64_t n = 64 * 40 + 5;
  for (const std::int64_t columns : {n, 2 * n}) {
    SCOPED_TRACE(columns);
    Runner runner(Algorithm::S2Reducer, n,
                  Options{}.set_density(0.02).set_s2_sketch_columns(columns).set_s2_sketch_rows(3));
    for (int call = 0; call < 4; ++call) {
      const Dist d = call % 2 == 0 ? Dist::Rows : Dist::Uniform;
      const Call c = runner.reduce(make_gradient(d, 37, world_rank(), call, n));
      check_call(runner, c);
      expect_dense_average(c);
    }
  }
}

TEST(S2Reducer, RowsWithoutNonZerosDecodeToZero) {
  const std::int64_t n = 64 * 48;
  Runner runner(Algorithm::S2Reducer, n, Options{}.set_density(0.05));
  for (int call = 0; call < 4; ++call) {
    SCOPED_TRACE(call);
    const Call c = runner.reduce(make_gradient(Dist::Rows, 41, world_rank(), call, n));
    check_call(runner, c);  // includes the union-row check
    EXPECT_GT(max_over_ranks(count_nonzero(c.out)), 0) << "S2 decoded nothing";
  }
}

}  // namespace
