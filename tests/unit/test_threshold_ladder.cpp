// SPDX-License-Identifier: BSD-3-Clause
// Ok-Topk's ladder guard on the host: which level it picks, and how it places the next levels
// for counts that follow a power law of the threshold, as the tail of a gradient does.
#include <oktopk/impl/kernels/threshold_ladder.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

namespace {

using oktopk::impl::CountLevels;
using oktopk::impl::max_count_levels;
using oktopk::impl::ThresholdLadder;

/// Entries above t when count(t) = k·(t_k / t)^elasticity.
std::int64_t power_law_count(double t, double t_k, double elasticity, std::int64_t k) {
  return static_cast<std::int64_t>(
      std::floor(static_cast<double>(k) * std::pow(t_k / t, elasticity)));
}

void count_levels(const CountLevels& levels, double t_k, double elasticity, std::int64_t k,
                  std::int64_t* counts) {
  for (int j = 0; j < levels.count; ++j) {
    counts[j] = power_law_count(levels.threshold[j], t_k, elasticity, k);
  }
}

CountLevels levels_of(std::initializer_list<float> thresholds) {
  CountLevels levels;
  for (const float t : thresholds) levels.threshold[levels.count++] = t;
  return levels;
}

TEST(ThresholdLadder, NoLevelsBeforeAThresholdIsKnown) {
  ThresholdLadder ladder;
  EXPECT_EQ(ladder.levels(1.03).count, 0);
  ladder.anchor(0.0f);
  EXPECT_EQ(ladder.levels(1.03).count, 0);
  ladder.anchor(std::nanf(""));
  EXPECT_EQ(ladder.levels(1.03).count, 0);
}

TEST(ThresholdLadder, LevelsRiseAroundTheAnchorWithTheInitialStep) {
  ThresholdLadder ladder;
  ladder.anchor(2.0f);
  const CountLevels levels = ladder.levels(1.03);
  ASSERT_EQ(levels.count, max_count_levels);
  for (int j = 1; j < levels.count; ++j) {
    EXPECT_NEAR(levels.threshold[j] / levels.threshold[j - 1], 1.03, 1e-5);
  }
  EXPECT_LT(levels.threshold[max_count_levels / 2 - 1], 2.0f);
  EXPECT_GT(levels.threshold[max_count_levels / 2], 2.0f);
}

TEST(ThresholdLadder, PicksTheCountNearestKInRange) {
  const CountLevels levels = levels_of({1.0f, 1.1f, 1.2f, 1.3f});
  const std::int64_t counts[] = {150, 104, 93, 60};
  const auto pick = ThresholdLadder::pick(levels, counts, 100, 0.9, 1.1);
  EXPECT_TRUE(pick.in_range);
  EXPECT_EQ(pick.level, 1);
  // 93 is nearer than 104 when 104 is out of range.
  const auto narrow = ThresholdLadder::pick(levels, counts, 100, 0.9, 1.03);
  EXPECT_TRUE(narrow.in_range);
  EXPECT_EQ(narrow.level, 2);
}

TEST(ThresholdLadder, OutOfRangeKeepsTheTrafficBound) {
  const CountLevels levels = levels_of({1.0f, 1.1f, 1.2f});
  // All too many: the highest level, fewest passing.
  const std::int64_t many[] = {400, 300, 200};
  const auto high = ThresholdLadder::pick(levels, many, 100, 0.9, 1.1);
  EXPECT_FALSE(high.in_range);
  EXPECT_EQ(high.level, 2);
  // All too few: the lowest, most passing.
  const std::int64_t few[] = {50, 40, 30};
  const auto low = ThresholdLadder::pick(levels, few, 100, 0.9, 1.1);
  EXPECT_FALSE(low.in_range);
  EXPECT_EQ(low.level, 0);
  // Straddling the range: never above guard_factor·k.
  const std::int64_t gap[] = {200, 80, 10};
  const auto straddle = ThresholdLadder::pick(levels, gap, 100, 0.9, 1.1);
  EXPECT_FALSE(straddle.in_range);
  EXPECT_EQ(straddle.level, 1);
}

// Counts that fall steeply (elasticity 11, as on accumulated correlated gradients) or gently
// (1.3, lognormal): after one call the ladder's neighbours differ by about 8 % in count, and
// a level lands within 5 % of k.
TEST(ThresholdLadder, SpacingFollowsTheElasticity) {
  for (const double elasticity : {11.0, 1.3}) {
    SCOPED_TRACE(elasticity);
    const std::int64_t k = 100000;
    const double t_k = 5.0;
    ThresholdLadder ladder;
    ladder.anchor(4.8f);
    std::int64_t counts[max_count_levels];
    CountLevels levels = ladder.levels(1.03);
    count_levels(levels, t_k, elasticity, k, counts);
    ladder.learn(levels, counts, k);
    levels = ladder.levels(1.03);
    ASSERT_EQ(levels.count, max_count_levels);
    const double ratio = std::pow(levels.threshold[1] / levels.threshold[0], elasticity);
    EXPECT_NEAR(ratio, 1.08, 0.005);
    count_levels(levels, t_k, elasticity, k, counts);
    const auto pick = ThresholdLadder::pick(levels, counts, k, 0.95, 1.05);
    EXPECT_TRUE(pick.in_range) << counts[pick.level];
  }
}

// A threshold for k that rises 2 % per call (a growing residual): the prediction follows it,
// and from the third call on the level picked is within 5 % of k.
TEST(ThresholdLadder, FollowsADriftingThreshold) {
  const std::int64_t k = 50000;
  const double elasticity = 8.0;
  ThresholdLadder ladder;
  double t_k = 3.0;
  ladder.anchor(static_cast<float>(t_k));
  for (int call = 1; call <= 12; ++call) {
    t_k *= 1.02;
    std::int64_t counts[max_count_levels];
    const CountLevels levels = ladder.levels(1.03);
    count_levels(levels, t_k, elasticity, k, counts);
    const auto pick = ThresholdLadder::pick(levels, counts, k, 0.95, 1.05);
    ladder.learn(levels, counts, k);
    if (call >= 3) {
      EXPECT_TRUE(pick.in_range) << "call " << call << ": " << counts[pick.level];
    }
  }
  EXPECT_NEAR(ladder.predicted() / (t_k * 1.02), 1.0, 0.005);
}

// Levels that all pass too many (or too few) move the ladder by half its span and widen it,
// so that a jump of the gradient's scale is found in a few calls.
TEST(ThresholdLadder, AJumpIsFoundInAFewCalls) {
  for (const double jump : {4.0, 0.25}) {
    SCOPED_TRACE(jump);
    const std::int64_t k = 20000;
    const double elasticity = 6.0;
    ThresholdLadder ladder;
    ladder.anchor(1.0f);
    std::int64_t counts[max_count_levels];
    CountLevels levels = ladder.levels(1.03);
    count_levels(levels, 1.0, elasticity, k, counts);
    ladder.learn(levels, counts, k);
    bool found = false;
    for (int call = 0; call < 6 && !found; ++call) {
      levels = ladder.levels(1.03);
      count_levels(levels, jump, elasticity, k, counts);
      found = ThresholdLadder::pick(levels, counts, k, 0.9, 1.1).in_range;
      ladder.learn(levels, counts, k);
    }
    EXPECT_TRUE(found);
  }
}

TEST(ThresholdLadder, RestoreGivesTheSameLevels) {
  ThresholdLadder ladder;
  ladder.anchor(2.5f);
  const CountLevels first = ladder.levels(1.03);
  std::int64_t counts[max_count_levels];
  count_levels(first, 2.6, 5.0, 1000, counts);
  ladder.learn(first, counts, 1000);
  ThresholdLadder copy;
  copy.restore(ladder.predicted(), ladder.step(), ladder.previous_target());
  const CountLevels a = ladder.levels(1.03);
  const CountLevels b = copy.levels(1.03);
  ASSERT_EQ(a.count, b.count);
  for (int j = 0; j < a.count; ++j) EXPECT_EQ(a.threshold[j], b.threshold[j]);
}

}  // namespace
