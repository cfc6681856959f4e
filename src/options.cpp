// SPDX-License-Identifier: BSD-3-Clause
// Algorithm names, Options validation, printing and digest.
#include <oktopk/algorithm.hpp>
#include <oktopk/communicator.hpp>
#include <oktopk/error.hpp>
#include <oktopk/options.hpp>

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>

namespace oktopk {

std::string to_string(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::Dense: return "dense";
    case Algorithm::TopkA: return "topka";
    case Algorithm::TopkDSA: return "topkdsa";
    case Algorithm::GTopk: return "gtopk";
    case Algorithm::GaussianK: return "gaussiank";
    case Algorithm::OkTopk: return "oktopk";
    case Algorithm::S2Reducer: return "s2";
  }
  throw std::invalid_argument("oktopk::to_string: not an Algorithm value (" +
                              std::to_string(static_cast<int>(algorithm)) + ")");
}

Algorithm algorithm_from_string(std::string_view name) {
  std::string valid;
  for (const Algorithm a : all_algorithms) {
    if (name == to_string(a)) return a;
    valid += (valid.empty() ? "" : " ") + to_string(a);
  }
  throw std::invalid_argument("oktopk::algorithm_from_string: unknown algorithm '" +
                              std::string(name) + "' (valid: " + valid + ")");
}

std::ostream& operator<<(std::ostream& os, Algorithm algorithm) {
  return os << to_string(algorithm);
}

std::ostream& operator<<(std::ostream& os, Balancing balancing) {
  switch (balancing) {
    case Balancing::Off: return os << "off";
    case Balancing::On: return os << "on";
    case Balancing::Adaptive: return os << "adaptive";
  }
  return os << "invalid";
}

Balancing balancing_from_string(const char* name) {
  const std::string text = name == nullptr ? "" : name;
  if (text == "off") return Balancing::Off;
  if (text == "on") return Balancing::On;
  if (text == "adaptive") return Balancing::Adaptive;
  throw std::invalid_argument("oktopk::balancing_from_string: unknown balancing '" + text +
                              "' (valid: off on adaptive)");
}

void Options::validate() const {
  constexpr const char* where = "oktopk::Options::validate";
  auto positive_finite = [](double v) { return std::isfinite(v) && v > 0.0; };
  OKTOPK_REQUIRE(density >= 0.0 && density <= 1.0, std::invalid_argument, where,
                 "density must be in [0, 1], got " << density);
  OKTOPK_REQUIRE(warmup_iterations >= 0, std::invalid_argument, where,
                 "warmup_iterations must be >= 0, got " << warmup_iterations);
  OKTOPK_REQUIRE(threshold_period >= 1 && repartition_period >= 1, std::invalid_argument, where,
                 "threshold_period and repartition_period must be >= 1, got "
                     << threshold_period << " and " << repartition_period);
  OKTOPK_REQUIRE(throttle >= 1, std::invalid_argument, where,
                 "throttle must be >= 1, got " << throttle);
  OKTOPK_REQUIRE(balancing == Balancing::Off || balancing == Balancing::On ||
                     balancing == Balancing::Adaptive,
                 std::invalid_argument, where, "balancing is not a Balancing value");
  OKTOPK_REQUIRE(std::isfinite(balance_threshold) && balance_threshold >= 1.0,
                 std::invalid_argument, where,
                 "balance_threshold must be >= 1, got " << balance_threshold);
  OKTOPK_REQUIRE(positive_finite(guard_factor) && guard_step > 1.0 && guard_loops >= 0,
                 std::invalid_argument, where,
                 "guard needs guard_factor > 0, guard_step > 1, guard_loops >= 0");
  OKTOPK_REQUIRE(positive_finite(local_low) && local_high >= local_low && local_step >= 1.0,
                 std::invalid_argument, where,
                 "local nudge needs 0 < local_low <= local_high and local_step >= 1");
  OKTOPK_REQUIRE(positive_finite(global_low) && global_high >= global_low && global_step >= 1.0,
                 std::invalid_argument, where,
                 "global nudge needs 0 < global_low <= global_high and global_step >= 1");
  OKTOPK_REQUIRE(positive_finite(gaussian_low) && gaussian_high >= gaussian_low &&
                     gaussian_step > 1.0 && gaussian_loops >= 0,
                 std::invalid_argument, where,
                 "Gaussian correction needs 0 < gaussian_low <= gaussian_high, "
                 "gaussian_step > 1, gaussian_loops >= 0");
  OKTOPK_REQUIRE(s2_row_width >= 1 && s2_sketch_rows >= 1 && s2_sketch_rows <= 15 &&
                     s2_sketch_columns >= 0,
                 std::invalid_argument, where,
                 "S2 needs s2_row_width >= 1, 1 <= s2_sketch_rows <= 15 (the median is taken in "
                 "registers), s2_sketch_columns >= 0; got "
                     << s2_row_width << ", " << s2_sketch_rows << ", " << s2_sketch_columns);
}

std::int64_t Options::digest() const {
  // The printed form holds every field at full precision, so equal text means equal options.
  std::ostringstream os;
  os.precision(17);
  os << *this;
  return agreement_digest(os.str());
}

std::ostream& operator<<(std::ostream& os, const Options& o) {
  return os << "density=" << o.density << " warmup_iterations=" << o.warmup_iterations
            << " seed=" << o.seed << " threshold_period=" << o.threshold_period
            << " repartition_period=" << o.repartition_period << " throttle=" << o.throttle
            << " balancing=" << o.balancing << " balance_threshold=" << o.balance_threshold
            << " guard=" << o.guard_factor << "/" << o.guard_step << "/" << o.guard_loops
            << " local_nudge=" << o.local_low << "/" << o.local_high << "/" << o.local_step
            << " global_nudge=" << o.global_low << "/" << o.global_high << "/" << o.global_step
            << " gaussian=" << o.gaussian_low << "/" << o.gaussian_high << "/"
            << o.gaussian_step << "/" << o.gaussian_loops << " s2_row_width=" << o.s2_row_width
            << " s2_sketch=" << o.s2_sketch_rows << "x" << o.s2_sketch_columns
            << " s2_error_feedback=" << (o.s2_error_feedback ? "on" : "off");
}

}  // namespace oktopk
