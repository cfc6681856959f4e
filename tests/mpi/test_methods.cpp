// SPDX-License-Identifier: BSD-3-Clause
// Every method against its oracle (the Method suite, ties at every threshold among its cases),
// then TopkDSA's, gTopk's and S2's own cases, and the ties that complete k at an exact
// threshold (gTopk, Ok-Topk).
#include "mpi/method_checks.hpp"

#include <oktopk/any_space.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace oktopk::test;  // NOLINT(google-build-using-namespace)
using oktopk::Algorithm;
using oktopk::Options;

std::string algorithm_name(const ::testing::TestParamInfo<Algorithm>& info) {
  return oktopk::to_string(info.param);
}

class Method : public ::testing::TestWithParam<Algorithm> {};

INSTANTIATE_TEST_SUITE_P(All, Method, ::testing::ValuesIn(oktopk::all_algorithms), algorithm_name);

TEST_P(Method, ReportsItsConfiguration) {
  const Algorithm a = GetParam();
  oktopk::Communicator comm;
  for (const auto& [n, density] : std::vector<std::pair<std::int64_t, double>>{
           {1000, 0.1}, {1000, 0.0149}, {3, 1.0 / 3.0}, {7, 0.0}, {7, 1.0}, {0, 0.5}}) {
    SCOPED_TRACE(std::to_string(n) + " " + std::to_string(density));
    const auto h = oktopk::make_sparse_allreduce<Exec>(a, comm, n, Options{}.set_density(density));
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
  for (const Dist d : {Dist::Uniform, Dist::Heavy, Dist::Correlated, Dist::Rows, Dist::Ties}) {
    for (int call = 0; call < 3; ++call) {
      SCOPED_TRACE(std::string(name_of(d)) + " call " + std::to_string(runner.calls() + 1));
      const Call c = runner.reduce(make_gradient(d, 7, world_rank(), runner.calls(), n));
      check_call(runner, c);
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
  const std::string m1 =
      expect_invalid_argument([&] { runner.handle().reduce(exec, me == P - 1 ? longer : g, out); },
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
      Runner runner(a, n,
                    Options{}
                        .set_density(density)
                        .set_threshold_period(2)
                        .set_repartition_period(3)
                        .set_s2_row_width(2));
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

/// Gradients whose magnitudes tie: every entry 1.0 on every rank (`levels` 1), or `levels`
/// magnitudes 1 .. levels (in units of 2^-4) with random signs, different on every rank.
std::vector<float> tied_gradient(int levels, std::int64_t call, std::int64_t n) {
  std::vector<float> g(static_cast<std::size_t>(n), 1.0f);
  if (levels == 1) return g;
  for (std::int64_t j = 0; j < n; ++j) {
    const auto u =
        hash_key(43, static_cast<std::uint64_t>(levels), static_cast<std::uint64_t>(world_rank()),
                 static_cast<std::uint64_t>(call), static_cast<std::uint64_t>(j));
    const auto m = static_cast<float>(1 + static_cast<int>(u % static_cast<std::uint64_t>(levels)));
    g[static_cast<std::size_t>(j)] = ((u >> 63) != 0 ? -m : m) * 0x1p-4f;
  }
  return g;
}

// Ties at every threshold a method meets, local and global, exact, reused and estimated, in
// the input and, from the second call on, in the residual (an all-equal input leaves the
// unsent entries tied at twice the value): every call keeps k entries. An identical all-equal
// input on every rank makes every rank's k the first k indices, so the output has exactly k
// non-zeros there.
TEST_P(Method, KeepsKWhenMagnitudesTie) {
  const Algorithm a = GetParam();
  if (a == Algorithm::Dense || a == Algorithm::S2Reducer) GTEST_SKIP() << "no top-k selection";
  for (const std::int64_t n : {1000, 10000}) {
    for (const double density : {0.1, 0.01}) {
      for (const int levels : {1, 2, 4, 16}) {
        Runner runner(a, n, Options{}.set_density(density));
        const std::int64_t k = runner.handle().k();
        for (int call = 0; call < 6; ++call) {
          SCOPED_TRACE("n " + std::to_string(n) + ", density " + std::to_string(density) +
                       ", levels " + std::to_string(levels) + ", call " + std::to_string(call + 1));
          const Call c = runner.reduce(tied_gradient(levels, call, n));
          check_call(runner, c);
          EXPECT_GT(count_nonzero(c.out), 0) << "nothing selected";
          if (levels == 1) {
            EXPECT_EQ(count_nonzero(c.out), k);
          }
        }
      }
    }
  }
}

// ---- method-specific behaviour --------------------------------------------------------------

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

TEST(GTopk, MatchesTheSimulatedTreeAndKeepsKOnTies) {
  const std::int64_t n = 2048;
  for (const Dist d : {Dist::Wide, Dist::Ties}) {
    // A handle of its own: a residual of wide values would leave the ties data none.
    Runner runner(Algorithm::GTopk, n, Options{}.set_density(0.01));
    for (int call = 0; call < 3; ++call) {
      SCOPED_TRACE(std::string(name_of(d)) + " call " + std::to_string(call));
      const Call c = runner.reduce(make_gradient(d, 31, world_rank(), call, n));
      check_call(runner, c);
      // Equal magnitudes at every cut of the ties data: the tie rule still keeps k.
      EXPECT_EQ(count_nonzero(c.out), runner.handle().k());
    }
  }
}

/// Rank r holds 1.0 at 2k entries from r·2k on (`all_equal`), or 1.0 at the first k of them
/// and 0.5 at the next k: either way every rank's k largest are 1.0s, the sums tie at 1.0
/// across ranks, and the k largest of the result, ties in index order, are rank 0's first k.
std::vector<float> tied_blocks(std::int64_t n, std::int64_t k, bool all_equal) {
  std::vector<float> g(static_cast<std::size_t>(n), 0.0f);
  const std::int64_t begin = 2 * k * world_rank();
  for (std::int64_t j = begin; j < begin + 2 * k; ++j) {
    g[static_cast<std::size_t>(j)] = all_equal || j < begin + k ? 1.0f : 0.5f;
  }
  return g;
}

TEST(TiesAtAnExactThreshold, CompleteTheKLargestInIndexOrder) {
  const std::int64_t n = 400;  // room for 8 ranks' blocks of 2k = 32
  const Options options = Options{}.set_density(0.04).set_threshold_period(1);
  for (const auto& [algorithm, all_equal] :
       {std::pair{Algorithm::OkTopk, false}, std::pair{Algorithm::OkTopk, true},
        std::pair{Algorithm::GTopk, false}, std::pair{Algorithm::GTopk, true}}) {
    SCOPED_TRACE(std::string(oktopk::to_string(algorithm)) + (all_equal ? ", all equal" : ""));
    Runner runner(algorithm, n, options);
    const std::int64_t k = runner.handle().k();
    ASSERT_EQ(k, 16);
    const Call c = runner.reduce(tied_blocks(n, k, all_equal));
    check_call(runner, c);
    Diff wrong;
    for (std::int64_t j = 0; j < n; ++j) {
      const float want = j < k ? 1.0f / static_cast<float>(world_size()) : 0.0f;
      if (!same_value_bits(want, c.out[static_cast<std::size_t>(j)])) {
        wrong.note(static_cast<std::size_t>(j), want, c.out[static_cast<std::size_t>(j)]);
      }
    }
    EXPECT_EQ(wrong.count, 0) << "out vs 1/P at the first k indices: " << wrong;
  }
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
