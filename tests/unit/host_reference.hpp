// SPDX-License-Identifier: BSD-3-Clause
// Plain host reference implementations of the kernels, and the comparisons the tests use.
#pragma once

#include "test_data.hpp"

#include <oktopk/fwd.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <iterator>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace oktopk::test {

namespace ref {

// ---- Selection ---------------------------------------------------------------------------

inline std::int64_t count_above(const std::vector<float>& x, float threshold) {
  std::int64_t count = 0;
  for (float v : x) {
    if (std::fabs(v) > threshold) ++count;
  }
  return count;
}

struct Selection {
  std::vector<index_type> indices;
  std::vector<float> values;
  std::vector<count_type> counts;  // per region (select_above_by_region only)
};

inline Selection select_above(const std::vector<float>& x, float threshold) {
  Selection s;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::fabs(x[i]) > threshold) {
      s.indices.push_back(static_cast<index_type>(i));
      s.values.push_back(x[i]);
    }
  }
  return s;
}

inline Selection select_above_by_region(const std::vector<float>& x, float threshold,
                                        const std::vector<count_type>& offsets) {
  Selection s;
  for (std::size_t r = 0; r + 1 < offsets.size(); ++r) {
    count_type count = 0;
    for (count_type i = offsets[r]; i < offsets[r + 1]; ++i) {
      const float v = x[static_cast<std::size_t>(i)];
      if (std::fabs(v) > threshold) {
        s.indices.push_back(static_cast<index_type>(i - offsets[r]));
        s.values.push_back(v);
        ++count;
      }
    }
    s.counts.push_back(count);
  }
  return s;
}

// ---- Top-k -------------------------------------------------------------------------------

/// |x| of the non-NaN entries, largest first (std::fabs turns -0 into +0 and -Inf into +Inf).
inline std::vector<float> abs_descending(const std::vector<float>& x) {
  std::vector<float> mags;
  mags.reserve(x.size());
  for (float v : x) {
    if (!std::isnan(v)) mags.push_back(std::fabs(v));
  }
  std::sort(mags.begin(), mags.end(), std::greater<float>());
  return mags;
}

/// The k-th entry of abs_descending's list, with kth_largest_abs's documented edge cases.
inline float kth_from_descending(const std::vector<float>& mags, std::int64_t k) {
  if (k == 0 || mags.empty()) return inf;
  const auto m = static_cast<std::int64_t>(mags.size());
  return mags[static_cast<std::size_t>(std::min(k, m) - 1)];
}

inline float kth_largest_abs(const std::vector<float>& x, std::int64_t k) {
  return kth_from_descending(abs_descending(x), k);
}

/// Phi^-1(p) by bisection on Phi(x) = erfc(-x/sqrt 2)/2 in long double: slow and obviously
/// right. The upper half uses the symmetry, as 1 - p is exact there.
inline double normal_quantile(double p) {
  if (std::isnan(p) || p < 0.0 || p > 1.0) return std::numeric_limits<double>::quiet_NaN();
  if (p == 0.0) return -std::numeric_limits<double>::infinity();
  if (p == 1.0) return std::numeric_limits<double>::infinity();
  if (p > 0.5) return -normal_quantile(static_cast<double>(1.0L - static_cast<long double>(p)));
  const long double target = p;
  long double lo = -60.0L;
  long double hi = 0.0L;
  for (int iter = 0; iter < 200; ++iter) {
    const long double mid = 0.5L * (lo + hi);
    const long double phi = 0.5L * std::erfc(-mid / std::sqrt(2.0L));
    if (phi < target) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return static_cast<double>(0.5L * (lo + hi));
}

/// The Gaussian-k fit in double with sequential sums: threshold = mean + |z|·sigma, with
/// z = Phi^-1(k / 2n).
struct GaussianFit {
  double mean = 0.0;
  double sigma = 0.0;
  double z = 0.0;
  double threshold = 0.0;
};

inline GaussianFit gaussian_fit(const std::vector<float>& x, std::int64_t k) {
  GaussianFit fit;
  const auto n = static_cast<std::int64_t>(x.size());
  if (k == 0 || n == 0) {
    fit.threshold = std::numeric_limits<double>::infinity();
    return fit;
  }
  if (k >= n) {
    fit.threshold = -std::numeric_limits<double>::infinity();
    return fit;
  }
  double sum = 0.0;
  for (float v : x) sum += v;
  fit.mean = sum / static_cast<double>(n);
  double squares = 0.0;
  for (float v : x) squares += (v - fit.mean) * (v - fit.mean);
  fit.sigma = std::sqrt(squares / static_cast<double>(n));
  fit.z = normal_quantile(static_cast<double>(k) / (2.0 * static_cast<double>(n)));
  fit.threshold = fit.mean + std::fabs(fit.z) * fit.sigma;
  return fit;
}

// ---- Residual ----------------------------------------------------------------------------

/// residual + scale·grad with the product rounded on its own ...
inline float multiply_add_unfused(float residual, float scale, float grad) {
  volatile float product = scale * grad;  // volatile: the compiler may not fuse it into an FMA
  return residual + product;
}

/// ... and rounded once: a compiler may contract the kernel's expression into an FMA (nvcc does
/// by default), and either rounding is a correct result.
inline float multiply_add_fused(float residual, float scale, float grad) {
  return std::fma(scale, grad, residual);
}

/// v(indices(j) + offset) = +0 where that is inside v; returns how many were outside.
inline std::int64_t clear_at(std::vector<float>& v, const std::vector<index_type>& indices,
                             count_type offset) {
  std::int64_t outside = 0;
  for (index_type j : indices) {
    const count_type i = j + offset;
    if (i >= 0 && i < static_cast<count_type>(v.size())) {
      v[static_cast<std::size_t>(i)] = 0.0f;
    } else {
      ++outside;
    }
  }
  return outside;
}

// ---- Sparse vectors ----------------------------------------------------------------------

/// dense(indices(j) + offset) += values(j), in order of j; returns how many fell outside.
inline std::int64_t scatter_add(std::vector<float>& dense, const std::vector<index_type>& indices,
                                const std::vector<float>& values, count_type offset) {
  std::int64_t outside = 0;
  for (std::size_t j = 0; j < indices.size(); ++j) {
    const count_type i = indices[j] + offset;
    if (i >= 0 && i < static_cast<count_type>(dense.size())) {
      dense[static_cast<std::size_t>(i)] += values[j];
    } else {
      ++outside;
    }
  }
  return outside;
}

struct Sparse {
  std::vector<index_type> indices;
  std::vector<float> values;
};

/// Two-pointer merge of strictly rising lists; a common index gets a + b.
inline Sparse merge_sorted(const std::vector<index_type>& ai, const std::vector<float>& av,
                           const std::vector<index_type>& bi, const std::vector<float>& bv) {
  Sparse out;
  std::size_t i = 0;
  std::size_t j = 0;
  while (i < ai.size() || j < bi.size()) {
    if (j == bi.size() || (i < ai.size() && ai[i] < bi[j])) {
      out.indices.push_back(ai[i]);
      out.values.push_back(av[i]);
      ++i;
    } else if (i == ai.size() || bi[j] < ai[i]) {
      out.indices.push_back(bi[j]);
      out.values.push_back(bv[j]);
      ++j;
    } else {
      out.indices.push_back(ai[i]);
      out.values.push_back(av[i] + bv[j]);
      ++i;
      ++j;
    }
  }
  return out;
}

inline std::vector<index_type> intersect_sorted(const std::vector<index_type>& a,
                                                const std::vector<index_type>& b) {
  std::vector<index_type> out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

}  // namespace ref

// ---- Comparisons -------------------------------------------------------------------------

inline bool same_bits(float a, float b) { return bits_of(a) == bits_of(b); }

/// For computed values: bit-identical, except that any NaN matches any NaN (the payload of a
/// NaN produced by arithmetic differs between CPUs and GPUs).
inline bool same_value(float actual, float expected) {
  return std::isnan(expected) ? std::isnan(actual) : same_bits(actual, expected);
}

inline std::string describe(float v) {
  std::ostringstream os;
  os << std::setprecision(9) << v << " (0x" << std::hex << std::setw(8) << std::setfill('0')
     << bits_of(v) << ")";
  return os.str();
}

inline std::string describe(double v) {
  std::ostringstream os;
  os << std::setprecision(17) << v;
  return os.str();
}

template <class T>
std::string describe(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

/// Element-wise comparison that reports the first few differences and how many there are,
/// instead of one failure per element of a 10^6-entry vector.
template <class T, class Equal>
::testing::AssertionResult vectors_match(const std::vector<T>& actual,
                                         const std::vector<T>& expected, Equal equal) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "size " << actual.size() << ", expected " << expected.size();
  }
  std::size_t mismatches = 0;
  std::ostringstream os;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    if (!equal(actual[i], expected[i])) {
      if (mismatches < 5) {
        os << "\n  [" << i << "] " << describe(actual[i]) << ", expected " << describe(expected[i]);
      }
      ++mismatches;
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << mismatches << " of " << actual.size() << " entries differ:" << os.str();
}

/// Exact equality: integers compare with ==, floats bit for bit (so -0 differs from +0).
template <class T>
::testing::AssertionResult same_entries(const std::vector<T>& actual,
                                        const std::vector<T>& expected) {
  if constexpr (std::is_same_v<T, float>) {
    return vectors_match(actual, expected, same_bits);
  } else {
    return vectors_match(actual, expected, std::equal_to<T>());
  }
}

/// Bit-identical floats, any NaN matching any NaN: for values the kernel computes.
inline ::testing::AssertionResult same_values(const std::vector<float>& actual,
                                              const std::vector<float>& expected) {
  return vectors_match(actual, expected, same_value);
}

/// `call()` throws std::invalid_argument whose message starts with `prefix` (and contains
/// `fragment`, when one is given).
template <class Call>
::testing::AssertionResult throws_invalid_argument(Call&& call, const std::string& prefix,
                                                   const std::string& fragment = "") {
  try {
    call();
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    if (message.rfind(prefix, 0) != 0) {
      return ::testing::AssertionFailure()
             << "message \"" << message << "\" does not start with \"" << prefix << "\"";
    }
    if (message.find(fragment) == std::string::npos) {
      return ::testing::AssertionFailure()
             << "message \"" << message << "\" does not contain \"" << fragment << "\"";
    }
    return ::testing::AssertionSuccess() << message;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw another exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

}  // namespace oktopk::test
