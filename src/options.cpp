// SPDX-License-Identifier: BSD-3-Clause
// Algorithm names, Options validation, printing and digest.
#include <oktopk/algorithm.hpp>
#include <oktopk/communicator.hpp>
#include <oktopk/error.hpp>
#include <oktopk/options.hpp>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace oktopk {

std::string to_string(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::Dense:
      return "dense";
    case Algorithm::TopkA:
      return "topka";
    case Algorithm::TopkDSA:
      return "topkdsa";
    case Algorithm::GTopk:
      return "gtopk";
    case Algorithm::GaussianK:
      return "gaussiank";
    case Algorithm::OkTopk:
      return "oktopk";
    case Algorithm::S2Reducer:
      return "s2";
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
    case Balancing::Off:
      return os << "off";
    case Balancing::On:
      return os << "on";
    case Balancing::Adaptive:
      return os << "adaptive";
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

std::ostream& operator<<(std::ostream& os, DenseAlgorithm algorithm) {
  switch (algorithm) {
    case DenseAlgorithm::Mpi:
      return os << "mpi";
    case DenseAlgorithm::Ring:
      return os << "ring";
    case DenseAlgorithm::Auto:
      return os << "auto";
  }
  return os << "invalid";
}

namespace {
/// An option's enum value as set() reads it.
template <class Enum>
std::string to_text(Enum value) {
  std::ostringstream os;
  os << value;
  return os.str();
}
}  // namespace

DenseAlgorithm dense_allreduce_from_string(const char* name) {
  const std::string text = name == nullptr ? "" : name;
  if (text == "mpi") return DenseAlgorithm::Mpi;
  if (text == "ring") return DenseAlgorithm::Ring;
  if (text == "auto") return DenseAlgorithm::Auto;
  throw std::invalid_argument("oktopk::dense_allreduce_from_string: unknown dense allreduce '" +
                              text + "' (valid: auto mpi ring)");
}

std::ostream& operator<<(std::ostream& os, Wire wire) {
  switch (wire) {
    case Wire::Native:
      return os << "native";
    case Wire::Float32:
      return os << "fp32";
    case Wire::BFloat16:
      return os << "bf16";
    case Wire::Float16:
      return os << "fp16";
  }
  return os << "invalid";
}

Wire wire_from_string(const char* name) {
  const std::string text = name == nullptr ? "" : name;
  if (text == "native") return Wire::Native;
  if (text == "fp32") return Wire::Float32;
  if (text == "bf16") return Wire::BFloat16;
  if (text == "fp16") return Wire::Float16;
  throw std::invalid_argument("oktopk::wire_from_string: unknown wire type '" + text +
                              "' (valid: native fp32 bf16 fp16)");
}

namespace {

constexpr const char* set_where = "oktopk::Options::set";

[[noreturn]] void bad_value(std::string_view key, std::string_view value, const char* expected) {
  throw std::invalid_argument(std::string(set_where) + ": " + std::string(key) + "='" +
                              std::string(value) + "' is not " + expected);
}

// std::from_chars: the same result whatever the program's locale, and no leading blanks or '+'.
double parse_double(std::string_view key, std::string_view value) {
  double v = 0.0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (value.empty() || error != std::errc() || end != value.data() + value.size() ||
      !std::isfinite(v))
    bad_value(key, value, "a finite number");
  return v;
}

template <class Int>
Int parse_integer(std::string_view key, std::string_view value) {
  Int v = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (value.empty() || error != std::errc() || end != value.data() + value.size()) {
    bad_value(key, value,
              std::is_unsigned_v<Int> ? "a non-negative integer that fits in 64 bits"
              : sizeof(Int) == 8      ? "an integer that fits in 64 bits"
                                      : "an integer that fits in 32 bits");
  }
  return v;
}

bool parse_bool(std::string_view key, std::string_view value) {
  if (value == "on" || value == "true" || value == "1") return true;
  if (value == "off" || value == "false" || value == "0") return false;
  bad_value(key, value, "on, off, true, false, 1 or 0");
}

using Setter = std::function<void(Options&, std::string_view key, std::string_view value)>;

template <class Field>
Setter setter(Field Options::*field) {
  return [field](Options& o, std::string_view key, std::string_view value) {
    if constexpr (std::is_same_v<Field, double>) {
      o.*field = parse_double(key, value);
    } else if constexpr (std::is_same_v<Field, bool>) {
      o.*field = parse_bool(key, value);
    } else if constexpr (std::is_same_v<Field, Balancing>) {
      try {
        o.*field = balancing_from_string(std::string(value).c_str());
      } catch (const std::invalid_argument&) {
        bad_value(key, value, "off, on or adaptive");
      }
    } else if constexpr (std::is_same_v<Field, DenseAlgorithm>) {
      try {
        o.*field = dense_allreduce_from_string(std::string(value).c_str());
      } catch (const std::invalid_argument&) {
        bad_value(key, value, "auto, mpi or ring");
      }
    } else if constexpr (std::is_same_v<Field, Wire>) {
      try {
        o.*field = wire_from_string(std::string(value).c_str());
      } catch (const std::invalid_argument&) {
        bad_value(key, value, "native, fp32, bf16 or fp16");
      }
    } else {
      o.*field = parse_integer<Field>(key, value);
    }
  };
}

// Every field, under its own name, in declaration order.
const std::vector<std::pair<std::string_view, Setter>>& option_setters() {
  static const std::vector<std::pair<std::string_view, Setter>> setters = {
      {"density", setter(&Options::density)},
      {"warmup_iterations", setter(&Options::warmup_iterations)},
      {"seed", setter(&Options::seed)},
      {"dense_allreduce", setter(&Options::dense_allreduce)},
      {"wire", setter(&Options::wire)},
      {"node_size", setter(&Options::node_size)},
      {"hierarchical", setter(&Options::hierarchical)},
      {"threshold_period", setter(&Options::threshold_period)},
      {"repartition_period", setter(&Options::repartition_period)},
      {"equal_regions", setter(&Options::equal_regions)},
      {"throttle", setter(&Options::throttle)},
      {"balancing", setter(&Options::balancing)},
      {"balance_threshold", setter(&Options::balance_threshold)},
      {"guard_low", setter(&Options::guard_low)},
      {"guard_factor", setter(&Options::guard_factor)},
      {"guard_step", setter(&Options::guard_step)},
      {"guard_loops", setter(&Options::guard_loops)},
      {"guard_exact", setter(&Options::guard_exact)},
      {"guard_ladder", setter(&Options::guard_ladder)},
      {"local_low", setter(&Options::local_low)},
      {"local_high", setter(&Options::local_high)},
      {"local_step", setter(&Options::local_step)},
      {"global_low", setter(&Options::global_low)},
      {"global_high", setter(&Options::global_high)},
      {"global_step", setter(&Options::global_step)},
      {"gaussian_low", setter(&Options::gaussian_low)},
      {"gaussian_high", setter(&Options::gaussian_high)},
      {"gaussian_step", setter(&Options::gaussian_step)},
      {"gaussian_loops", setter(&Options::gaussian_loops)},
      {"s2_row_width", setter(&Options::s2_row_width)},
      {"s2_sketch_rows", setter(&Options::s2_sketch_rows)},
      {"s2_sketch_columns", setter(&Options::s2_sketch_columns)},
      {"s2_error_feedback", setter(&Options::s2_error_feedback)},
  };
  return setters;
}

}  // namespace

Options& Options::set(std::string_view key, std::string_view value) {
  std::string valid;
  for (const auto& [name, apply] : option_setters()) {
    if (key == name) {
      apply(*this, key, value);
      return *this;
    }
    valid += (valid.empty() ? "" : " ") + std::string(name);
  }
  throw std::invalid_argument(std::string(set_where) + ": unknown option '" + std::string(key) +
                              "' (valid: " + valid + ")");
}

Options& Options::set_from_string(std::string_view settings) {
  constexpr std::string_view separators = " \t\n\r,";
  std::size_t pos = 0;
  while (true) {
    const std::size_t begin = settings.find_first_not_of(separators, pos);
    if (begin == std::string_view::npos) return *this;
    const std::size_t end = std::min(settings.find_first_of(separators, begin), settings.size());
    const std::string_view item = settings.substr(begin, end - begin);
    const std::size_t eq = item.find('=');
    OKTOPK_REQUIRE(eq != std::string_view::npos && eq > 0, std::invalid_argument,
                   "oktopk::Options::set_from_string",
                   "'" << item << "' is not of the form key=value");
    set(item.substr(0, eq), item.substr(eq + 1));
    pos = end;
  }
}

void Options::validate() const {
  constexpr const char* where = "oktopk::Options::validate";
  auto positive_finite = [](double v) { return std::isfinite(v) && v > 0.0; };
  OKTOPK_REQUIRE(density >= 0.0 && density <= 1.0, std::invalid_argument, where,
                 "density must be in [0, 1], got " << density);
  OKTOPK_REQUIRE(warmup_iterations >= 0, std::invalid_argument, where,
                 "warmup_iterations must be >= 0, got " << warmup_iterations);
  OKTOPK_REQUIRE(dense_allreduce == DenseAlgorithm::Mpi ||
                     dense_allreduce == DenseAlgorithm::Ring ||
                     dense_allreduce == DenseAlgorithm::Auto,
                 std::invalid_argument, where, "dense_allreduce is not a DenseAlgorithm value");
  OKTOPK_REQUIRE(wire == Wire::Native || wire == Wire::Float32 || wire == Wire::BFloat16 ||
                     wire == Wire::Float16,
                 std::invalid_argument, where, "wire is not a Wire value");
  OKTOPK_REQUIRE(node_size >= 0 && node_size <= INT_MAX, std::invalid_argument, where,
                 "node_size must be in [0, "
                     << INT_MAX << "] (0: the ranks that share memory), got " << node_size);
  OKTOPK_REQUIRE(threshold_period >= 1 && repartition_period >= 1, std::invalid_argument, where,
                 "threshold_period and repartition_period must be >= 1, got "
                     << threshold_period << " and " << repartition_period);
  OKTOPK_REQUIRE(throttle >= 1, std::invalid_argument, where,
                 "throttle must be >= 1, got " << throttle);
  OKTOPK_REQUIRE(
      balancing == Balancing::Off || balancing == Balancing::On || balancing == Balancing::Adaptive,
      std::invalid_argument, where, "balancing is not a Balancing value");
  OKTOPK_REQUIRE(std::isfinite(balance_threshold) && balance_threshold >= 1.0,
                 std::invalid_argument, where,
                 "balance_threshold must be >= 1, got " << balance_threshold);
  OKTOPK_REQUIRE(positive_finite(guard_factor) && guard_step > 1.0 && guard_loops >= 0,
                 std::invalid_argument, where,
                 "guard needs guard_factor > 0, guard_step > 1, guard_loops >= 0");
  OKTOPK_REQUIRE(std::isfinite(guard_low) && guard_low >= 0.0 && guard_low <= guard_factor,
                 std::invalid_argument, where,
                 "guard needs 0 <= guard_low <= guard_factor (0: raise only), got guard_low "
                     << guard_low << " and guard_factor " << guard_factor);
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
  OKTOPK_REQUIRE(
      s2_row_width >= 1 && s2_sketch_rows >= 1 && s2_sketch_rows <= 15 && s2_sketch_columns >= 0,
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
  return os << "density=" << o.density << " warmup_iterations=" << o.warmup_iterations << " seed="
            << o.seed
            // Only when it is not the default, so that the digest of options that leave it
            // alone, and so every checkpoint written before the field existed, stays the same.
            << (o.dense_allreduce == DenseAlgorithm::Auto ? "" : " dense_allreduce=")
            << (o.dense_allreduce == DenseAlgorithm::Auto ? std::string()
                                                          : to_text(o.dense_allreduce))
            << (o.wire == Wire::Native ? "" : " wire=")
            << (o.wire == Wire::Native ? std::string() : to_text(o.wire))
            << (o.node_size == 0 ? "" : " node_size=")
            << (o.node_size == 0 ? std::string() : std::to_string(o.node_size))
            << (o.hierarchical ? " hierarchical=on" : "")
            << " threshold_period=" << o.threshold_period
            << " repartition_period=" << o.repartition_period
            << (o.equal_regions ? " equal_regions=on" : "") << " throttle=" << o.throttle
            << " balancing=" << o.balancing << " balance_threshold=" << o.balance_threshold
            << " guard=" << o.guard_low << "/" << o.guard_factor << "/" << o.guard_step << "/"
            << o.guard_loops << (o.guard_exact ? "/exact" : "") << (o.guard_ladder ? "/ladder" : "")
            << " local_nudge=" << o.local_low << "/" << o.local_high << "/" << o.local_step
            << " global_nudge=" << o.global_low << "/" << o.global_high << "/" << o.global_step
            << " gaussian=" << o.gaussian_low << "/" << o.gaussian_high << "/" << o.gaussian_step
            << "/" << o.gaussian_loops << " s2_row_width=" << o.s2_row_width
            << " s2_sketch=" << o.s2_sketch_rows << "x" << o.s2_sketch_columns
            << " s2_error_feedback=" << (o.s2_error_feedback ? "on" : "off");
}

}  // namespace oktopk
