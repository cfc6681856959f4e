// SPDX-License-Identifier: BSD-3-Clause
// Ok-Topk's ladder guard (Options::guard_ladder): a reused threshold is chosen among levels
// that one pass counts together, instead of walked to by fixed steps. How the count passing a
// threshold answers a change of the threshold depends on the gradient: on lognormal
// gradients a 3 % step moves it by about 4 %, on accumulated correlated ones by about 30 %,
// so a fixed step either crawls or jumps over [guard_low·k, guard_factor·k]. The ladder
// measures that answer (the count's elasticity) between the levels around k, spaces the next
// call's levels so that neighbours differ by about ladder_count_ratio in count, and centres
// them where the threshold for k is heading.
#pragma once

#include <oktopk/impl/kernels/count_levels.hpp>

#include <cmath>
#include <cstdint>

namespace oktopk::impl {

/// Neighbouring levels aim at counts this far apart: the level nearest k is then within
/// about half of it (4 %), and the 16 levels span a factor 1.08^15 ≈ 3.2 in count.
inline constexpr double ladder_count_ratio = 1.08;

/// \brief The state of one ladder-guarded threshold between calls, and the choice of a level.
class ThresholdLadder {
 public:
  /// Which level to select at, and whether its count lies in [low·k, high·k].
  struct Pick {
    int level = -1;
    bool in_range = false;
  };

  /// The levels to count at the next call, rising, around the predicted threshold; none
  /// before any threshold is known. `initial_step` spaces them until an elasticity is measured.
  CountLevels levels(double initial_step) const {
    CountLevels out;
    if (!(std::isfinite(predicted_) && predicted_ > 0.0)) return out;
    const double step = step_ > 1.0 ? step_ : initial_step;
    out.count = max_count_levels;
    const double middle = 0.5 * (max_count_levels - 1);
    for (int j = 0; j < out.count; ++j) {
      out.threshold[j] = static_cast<float>(predicted_ * std::pow(step, j - middle));
    }
    return out;
  }

  /// The level whose count is nearest k (in ratio) among those in [low·k, high·k]; when none
  /// is, the one nearest k that lets at most high·k pass (the traffic bound first), else the
  /// highest. `counts` fall as the levels rise.
  static Pick pick(const CountLevels& levels, const std::int64_t* counts, std::int64_t k,
                   double low, double high) {
    Pick best;
    double best_distance = HUGE_VAL;
    const double kd = static_cast<double>(k);
    for (int j = 0; j < levels.count; ++j) {
      const auto c = static_cast<double>(counts[j]);
      if (c < low * kd || c > high * kd) continue;
      const double distance = std::fabs(std::log((c > 0.5 ? c : 0.5) / kd));
      if (distance < best_distance) {
        best_distance = distance;
        best.level = j;
      }
    }
    if (best.level >= 0) {
      best.in_range = true;
      return best;
    }
    for (int j = 0; j < levels.count && best.level < 0; ++j) {
      if (static_cast<double>(counts[j]) <= high * kd) best.level = j;
    }
    if (best.level < 0) best.level = levels.count - 1;
    return best;
  }

  /// Learns from this call's counts at `levels`: where the threshold for k lies (log-log
  /// interpolation between the levels around it), how fast it moves from call to call, and
  /// the elasticity that spaces the next levels. Levels that do not bracket k move the
  /// ladder by half its span towards it and widen it.
  void learn(const CountLevels& levels, const std::int64_t* counts, std::int64_t k) {
    if (levels.count < 2 || k <= 0) return;
    const double kd = static_cast<double>(k);
    int above = -1;  // the highest level passing at least k
    for (int j = 0; j < levels.count; ++j) {
      if (static_cast<double>(counts[j]) >= kd) above = j;
    }
    const double step = static_cast<double>(levels.threshold[1]) / levels.threshold[0];
    if (above < 0 || above == levels.count - 1) {
      predicted_ = above < 0 ? levels.threshold[0] : levels.threshold[levels.count - 1];
      step_ = clamp(step * step, min_step, max_step);
      previous_target_ = 0.0;
      return;
    }
    const double t_a = levels.threshold[above];
    const double t_b = levels.threshold[above + 1];
    const auto c_a = static_cast<double>(counts[above]);
    const auto c_b = static_cast<double>(counts[above + 1]);
    double target = t_a;
    if (c_b > 0.0 && c_a > c_b) {
      const double elasticity = std::log(c_a / c_b) / std::log(t_b / t_a);
      target = t_a * std::pow(c_a / kd, 1.0 / elasticity);
      step_ = clamp(std::pow(ladder_count_ratio, 1.0 / elasticity), min_step, max_step);
    }
    const double drift =
        previous_target_ > 0.0 ? clamp(target / previous_target_, 1.0 / max_drift, max_drift) : 1.0;
    previous_target_ = target;
    predicted_ = target * drift;
  }

  /// A threshold found another way (exactly): the next levels centre on it; the spacing
  /// learnt so far stays.
  void anchor(float threshold) {
    predicted_ = threshold;
    previous_target_ = threshold;
  }

  /// The state a checkpoint keeps.
  double predicted() const { return predicted_; }
  double step() const { return step_; }
  double previous_target() const { return previous_target_; }
  void restore(double predicted, double step, double previous_target) {
    predicted_ = predicted;
    step_ = step;
    previous_target_ = previous_target;
  }

 private:
  // Steps below 1.0005 would put neighbouring float levels within a few ulps at large
  // thresholds; above 1.5 the ladder is too coarse to be worth more than the walk.
  static constexpr double min_step = 1.0005;
  static constexpr double max_step = 1.5;
  // The threshold for k moves by at most this factor per call in the prediction.
  static constexpr double max_drift = 1.1;

  static double clamp(double v, double lo, double hi) { return v < lo ? lo : (v > hi ? hi : v); }

  double predicted_ = 0.0;        ///< centre of the next levels; 0: none
  double step_ = 0.0;             ///< ratio of neighbouring levels; 0: not measured yet
  double previous_target_ = 0.0;  ///< last call's threshold for k; 0: not known
};

}  // namespace oktopk::impl
