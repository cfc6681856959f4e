// SPDX-License-Identifier: BSD-3-Clause
// 16-bit values on the wire (Options::wire) for the sparse methods: the oracle with its slack
// for the roundings, error feedback that keeps every rounding error (sum over calls of
// P·outputs plus the final residuals equals the sum of the inputs; gTopk: where its tree drops
// nothing), the bytes saved, and float16 overflow refused on every rank with the residual left
// alone.
#include "mpi/method_checks.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace oktopk::test;  // NOLINT(google-build-using-namespace)
using oktopk::Algorithm;
using oktopk::Options;
using oktopk::Wire;

const Algorithm kSparseMethods[] = {Algorithm::TopkA,     Algorithm::TopkDSA, Algorithm::GTopk,
                                    Algorithm::GaussianK, Algorithm::OkTopk,  Algorithm::S2Reducer};

/// The methods whose outputs and residuals account for every input over calls (gTopk's tree
/// may drop a contribution whose index survives elsewhere; S2's sketch is approximate).
const Algorithm kConservingMethods[] = {Algorithm::TopkA, Algorithm::TopkDSA, Algorithm::GaussianK,
                                        Algorithm::OkTopk};

std::string name_of(Algorithm a, Wire w, Output output) {
  std::ostringstream os;
  os << a << " wire=" << w << (output == Output::Sparse ? " reduce_sparse" : " reduce");
  return os.str();
}

/// The oracle's verdict on call c of `runner`, with its slack.
std::int64_t oracle_mismatches(Runner& runner, const Call& c) {
  Exec exec;
  const auto n = c.acc.size();
  const Vector acc = to_device(c.acc);
  Vector expected("test::expected", n);
  Vector slack("test::slack", n);
  oktopk::expected_result(exec, runner.handle(), acc, expected, oktopk::default_oracle_tolerance,
                          slack);
  const Vector out = to_device(c.out);
  return oktopk::count_mismatches(exec, runner.handle(), expected, out,
                                  oktopk::default_oracle_tolerance, slack);
}

Options wire_options(Wire wire) {
  // Ok-Topk recomputes its thresholds exactly every other call, and reuses them between.
  return Options{}.set_density(0.05).set_wire(wire).set_threshold_period(2);
}

TEST(SparseWire, EveryCallMatchesTheOracle) {
  const std::int64_t n = 3001;
  for (const Algorithm a : kSparseMethods) {
    for (const Wire wire : {Wire::BFloat16, Wire::Float16}) {
      for (const Output output : {Output::Dense, Output::Sparse}) {
        SCOPED_TRACE(name_of(a, wire, output));
        Runner runner(a, n, wire_options(wire), output);
        for (int call = 0; call < 5; ++call) {
          const auto dist = call % 2 == 0 ? Dist::Heavy : Dist::Correlated;
          const Call c = runner.reduce(make_gradient(dist, 31, world_rank(), call, n));
          check_common(runner, c);
          EXPECT_EQ(oracle_mismatches(runner, c), 0) << "call " << call;
        }
      }
    }
  }
}

TEST(SparseWire, OracleSlackIsTheRoundingsAndNoMore) {
  // Every rank sends the same gradient, so each output entry is its rounded value and the
  // slack about 4 of bfloat16's unit roundoffs 2^-8 of it: the output as it is passes, and
  // entries moved by 8 roundoffs are refused.
  const std::int64_t n = 1000;
  Runner runner(Algorithm::TopkA, n, wire_options(Wire::BFloat16));
  const Call c = runner.reduce(make_gradient(Dist::Uniform, 5, 0, 0, n));
  EXPECT_EQ(oracle_mismatches(runner, c), 0);
  Call moved = c;
  std::int64_t changed = 0;
  for (std::size_t j = 0; j < moved.out.size(); j += 3) {
    if (moved.out[j] != 0.0f) {
      moved.out[j] *= 1.0f + 8.0f * 0x1p-8f;
      ++changed;
    }
  }
  ASSERT_GT(changed, 0);
  EXPECT_EQ(oracle_mismatches(runner, moved), changed);
}

TEST(SparseWire, ErrorFeedbackKeepsEveryRoundingError) {
  // Over calls, P·(sum of the outputs) + (sum over ranks of the final residual) = the sum of
  // every rank's gradients: what a rounding took from a value sent stays in its sender's
  // residual. Without that feedback the sums differ by the wire's roundings, about 2^-9 of
  // the values for bfloat16, far beyond the float bound checked here.
  const std::int64_t n = 2000;
  const int P = world_size();
  for (const Algorithm a : kConservingMethods) {
    for (const Wire wire : {Wire::Native, Wire::BFloat16, Wire::Float16}) {
      for (const Output output : {Output::Dense, Output::Sparse}) {
        SCOPED_TRACE(name_of(a, wire, output));
        Runner runner(a, n, wire_options(wire), output);
        std::vector<double> inputs(static_cast<std::size_t>(n), 0.0);
        std::vector<double> outputs(static_cast<std::size_t>(n), 0.0);
        std::vector<double> magnitudes(static_cast<std::size_t>(n), 0.0);
        std::vector<float> residual;
        for (int call = 0; call < 8; ++call) {
          const auto grad = make_gradient(Dist::Correlated, 17, world_rank(), call, n);
          const Call c = runner.reduce(grad);
          const std::vector<float> all = sum_over_ranks(grad);
          for (std::size_t j = 0; j < all.size(); ++j) {
            inputs[j] += all[j];
            outputs[j] += static_cast<double>(c.out[j]) * P;
            magnitudes[j] += std::fabs(static_cast<double>(all[j])) +
                             std::fabs(static_cast<double>(c.out[j])) * P;
          }
          residual = c.residual_after;
        }
        const std::vector<float> residuals = sum_over_ranks(residual);
        std::int64_t bad = 0;
        double worst = 0.0;
        for (std::size_t j = 0; j < inputs.size(); ++j) {
          // Float sums of at most 8 calls' values, P ranks and the residual: well within
          // 64(P + 8) roundings of the magnitudes involved.
          const double bound = 64.0 * (P + 8) * 0x1p-24 * (magnitudes[j] + std::fabs(residuals[j]));
          const double error = std::fabs(outputs[j] + residuals[j] - inputs[j]);
          worst = std::max(worst, error);
          bad += error > bound ? 1 : 0;
        }
        EXPECT_EQ(bad, 0) << "largest difference " << worst;
      }
    }
  }
}

TEST(SparseWire, GTopkKeepsTheRoundingErrorsOfWhatTheResultCarries) {
  // Every rank holds a multiple of the same vector, so every rank selects the same k indices,
  // every merge keeps all k and the tree drops nothing: then P·output + the sum over ranks of
  // the residuals is the sum of the inputs, though every sum was rounded to 16 bits on its way
  // up the tree and in the broadcast. Without the senders' feedback of those roundings the
  // two would differ by about 2^-9 of the sums.
  const std::int64_t n = 1000;
  const int P = world_size();
  for (const Wire wire : {Wire::BFloat16, Wire::Float16}) {
    SCOPED_TRACE(wire);
    Runner runner(Algorithm::GTopk, n, Options{}.set_density(0.05).set_wire(wire));
    std::vector<float> grad(static_cast<std::size_t>(n));
    const float scale = 1.0f + 0.0625f * static_cast<float>(world_rank());
    for (std::int64_t j = 0; j < n; ++j) {
      // Distinct magnitudes 1e-3 .. 1, signs alternating, in a scrambled order.
      const auto rank_in_order = static_cast<float>((j * 7919) % n + 1);
      grad[static_cast<std::size_t>(j)] =
          scale * (j % 2 == 0 ? 1.0f : -1.0f) * rank_in_order / static_cast<float>(n);
    }
    const Call c = runner.reduce(grad);
    ASSERT_EQ(c.stats.global_selected, runner.handle().k());
    const std::vector<float> inputs = sum_over_ranks(grad);
    const std::vector<float> residuals = sum_over_ranks(c.residual_after);
    std::int64_t bad = 0;
    std::int64_t rounded = 0;  // outputs the wire moved away from the exact average
    double worst = 0.0;
    for (std::size_t j = 0; j < inputs.size(); ++j) {
      const double total = static_cast<double>(c.out[j]) * P + residuals[j];
      const double error = std::fabs(total - inputs[j]);
      const double bound = 8.0 * (P + 2) * 0x1p-24 * std::fabs(static_cast<double>(inputs[j]));
      worst = std::max(worst, error);
      bad += error > bound ? 1 : 0;
      rounded +=
          c.out[j] != 0.0f && std::fabs(static_cast<double>(c.out[j]) * P - inputs[j]) > bound ? 1
                                                                                               : 0;
    }
    EXPECT_EQ(bad, 0) << "largest difference " << worst;
    EXPECT_GT(rounded, 0) << "the wire rounded no output";
  }
}

TEST(SparseWire, GTopkKeepsOnlyTheErrorsOfValuesTheResultKept) {
  // Every rank holds its own entries (index mod P), so the merges drop entries the final set
  // does not hold. Where this rank's entry reached the result, its residual is exactly that
  // entry's bfloat16 rounding error (re-rounding a value already rounded changes nothing, so
  // the ranks that pass it on keep 0); where a merge dropped it, its residual is the entry
  // itself, though this rank sent it rounded.
  const std::int64_t n = 1000;
  const int P = world_size();
  Runner runner(Algorithm::GTopk, n, Options{}.set_density(0.05).set_wire(Wire::BFloat16));
  std::vector<float> grad(static_cast<std::size_t>(n), 0.0f);
  for (std::int64_t j = world_rank(); j < n; j += P) {
    const auto scrambled = static_cast<float>((j * 7919) % n);
    grad[static_cast<std::size_t>(j)] =
        (j % 3 == 0 ? -1.0137f : 1.0137f) * (0.5f + scrambled / static_cast<float>(n));
  }
  const Call c = runner.reduce(grad);
  std::int64_t wrong = 0;
  std::int64_t kept = 0;
  std::int64_t dropped = 0;
  for (std::size_t j = 0; j < grad.size(); ++j) {
    const float g = grad[j];
    const float sent = oktopk::to_float(oktopk::round_to<oktopk::bfloat16>(g));
    float expected = 0.0f;
    if (g != 0.0f && c.out[j] != 0.0f) {
      expected = g - sent;
      ++kept;
      wrong += c.out[j] == sent / static_cast<float>(P) ? 0 : 1;
    } else if (g != 0.0f) {
      expected = g;
      ++dropped;
    }
    wrong += bits_of(c.residual_after[j]) == bits_of(expected) ? 0 : 1;
  }
  EXPECT_EQ(wrong, 0);
  // Values that round alike may tie at a merge's threshold, so the final set may hold fewer
  // than k.
  EXPECT_EQ(sum_over_ranks(kept), c.stats.global_selected);
  EXPECT_GT(c.stats.global_selected, 0);
  if (P > 1) EXPECT_GT(sum_over_ranks(dropped), 0) << "no merge dropped anything";
}

TEST(SparseWire, S2FeedbackEstimatesFromTheTableAsSent) {
  // An exact sketch decodes every entry from its own cells: with error feedback on a bfloat16
  // wire, a rank's residual is then exactly what bfloat16 loses of its entries (its own
  // estimate, from its table as sent, is each entry rounded).
  const std::int64_t n = 600;
  Runner runner(Algorithm::S2Reducer, n,
                Options{}
                    .set_wire(Wire::BFloat16)
                    .set_s2_error_feedback(true)
                    .set_s2_sketch_columns(n)
                    .set_s2_row_width(4));
  const auto grad = make_gradient(Dist::Correlated, 23, world_rank(), 0, n);
  const Call c = runner.reduce(grad);
  std::int64_t wrong = 0;
  std::int64_t kept = 0;
  for (std::size_t j = 0; j < grad.size(); ++j) {
    const float expected = grad[j] - oktopk::to_float(oktopk::round_to<oktopk::bfloat16>(grad[j]));
    wrong += bits_of(c.residual_after[j]) == bits_of(expected) ? 0 : 1;
    kept += expected != 0.0f ? 1 : 0;
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(kept, 0);
}

TEST(SparseWire, SixteenBitValuesCutTheBytes) {
  // The first call sees the same input on both handles, so the same entries are selected:
  // a 16-bit wire moves 6 bytes an entry in the allgatherv and gTopk's tree against 8, 2 bytes
  // a value in the split of Ok-Topk and TopkDSA against 4 (their indices stay 4 bytes), and 2
  // bytes an S2 sketch cell against 4 (its bitmap stays 1 byte a row): at most 0.8 of the bytes
  // in all, counts and thresholds included.
  const std::int64_t n = 40000;
  for (const Algorithm a : kSparseMethods) {
    SCOPED_TRACE(oktopk::to_string(a));
    Runner native(a, n, wire_options(Wire::Native));
    Runner narrow(a, n, wire_options(Wire::BFloat16));
    const auto grad = make_gradient(Dist::Heavy, 3, world_rank(), 0, n);
    const Call c32 = native.reduce(grad);
    const Call c16 = narrow.reduce(grad);
    ASSERT_EQ(c32.stats.local_selected, c16.stats.local_selected);
    const auto sent32 = sum_over_ranks(c32.stats.total_traffic().bytes_sent);
    const auto sent16 = sum_over_ranks(c16.stats.total_traffic().bytes_sent);
    if (world_size() == 1) {
      EXPECT_EQ(sent16, 0);
      continue;
    }
    EXPECT_LE(static_cast<double>(sent16), 0.8 * static_cast<double>(sent32))
        << sent16 << " bytes against " << sent32;
    EXPECT_GT(sent16, 0);
  }
}

TEST(SparseWire, Float16OverflowThrowsOnEveryRankAndKeepsTheResidual) {
  // A value beyond float16's 65504 on one rank (selected: it is the largest) cannot be sent
  // as float16: every rank throws, and the handle's residual and call count stay as they were.
  // S2's ring finds the cell that holds it beyond range on the rank that finishes that cell.
  const std::int64_t n = 500;
  const int P = world_size();
  for (const Algorithm a : kSparseMethods) {
    SCOPED_TRACE(oktopk::to_string(a));
    // S2 with error feedback, so that it has a residual to keep.
    Runner runner(a, n, wire_options(Wire::Float16).set_s2_error_feedback(true));
    const Call first = runner.reduce(make_gradient(Dist::Uniform, 8, world_rank(), 0, n));
    auto bad = make_gradient(Dist::Uniform, 8, world_rank(), 1, n);
    if (world_rank() == P - 1) bad[n / 2] = 70000.0f;
    Exec exec;
    const Vector g = to_device(bad);
    Vector out("test::out", static_cast<std::size_t>(n));
    const std::string message = expect_invalid_argument(
        [&] { runner.handle().reduce(exec, g, out); }, "oktopk::SparseAllreduce::reduce");
    EXPECT_NE(message.find("65504"), std::string::npos) << message;
    if (a != Algorithm::S2Reducer) {
      EXPECT_NE(message.find("rank " + std::to_string(P - 1)), std::string::npos) << message;
    }
    EXPECT_TRUE(same_text_on_all_ranks(message));
    EXPECT_EQ(runner.handle().stats().iteration, 1);
    const std::vector<float> residual = to_host(runner.handle().residual());
    std::int64_t moved = 0;
    for (std::size_t j = 0; j < residual.size(); ++j)
      moved += bits_of(residual[j]) != bits_of(first.residual_after[j]);
    EXPECT_EQ(moved, 0) << "residual entries changed by the rejected call";
    // The handle goes on.
    const Call next = runner.reduce(make_gradient(Dist::Uniform, 8, world_rank(), 2, n));
    EXPECT_EQ(next.stats.iteration, 2);
    EXPECT_EQ(oracle_mismatches(runner, next), 0);
  }
}

}  // namespace
