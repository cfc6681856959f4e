// SPDX-License-Identifier: BSD-3-Clause
// Command-line helpers shared by the programs in apps/ (header-only; public API users too).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace oktopk::apps {

/// A bad command line: the program prints "<program>: <what()> (see --help)" and exits 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The whole of `text` as a T (finite for floating point, in range for integers), or a
/// UsageError naming `flag`.
template <class T>
T parse_number(const std::string& flag, const std::string& text) {
  try {
    std::size_t used = 0;
    T value{};
    if constexpr (std::is_floating_point_v<T>) {
      value = static_cast<T>(std::stod(text, &used));
      if (!std::isfinite(value)) throw std::invalid_argument("not finite");
    } else if constexpr (std::is_unsigned_v<T>) {
      if (text.find('-') != std::string::npos) throw std::invalid_argument("negative");
      const unsigned long long v = std::stoull(text, &used);
      if (v > std::numeric_limits<T>::max()) throw std::out_of_range("too large");
      value = static_cast<T>(v);
    } else {
      const long long v = std::stoll(text, &used);
      if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) {
        throw std::out_of_range("out of range");
      }
      value = static_cast<T>(v);
    }
    if (used != text.size() || text.empty()) throw std::invalid_argument("trailing characters");
    return value;
  } catch (const std::out_of_range&) {
    throw UsageError(flag + " is out of range, got '" + text + "'");
  } catch (const std::exception&) {
    throw UsageError(flag + " expects a number, got '" + text + "'");
  }
}

/// The parts of `text` between `separator`s, empty ones included ("a,,b" gives "a", "", "b").
inline std::vector<std::string> split_at(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::size_t begin = 0;
  while (true) {
    const auto end = text.find(separator, begin);
    parts.push_back(text.substr(begin, end == std::string::npos ? end : end - begin));
    if (end == std::string::npos) return parts;
    begin = end + 1;
  }
}

}  // namespace oktopk::apps
