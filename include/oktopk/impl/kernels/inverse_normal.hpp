// SPDX-License-Identifier: BSD-3-Clause
// The inverse of the standard normal CDF, on the host, for the Gaussian-k threshold.
#pragma once

#include <cmath>
#include <limits>

namespace oktopk::impl {

/// Phi^-1(p) for p in (0, 1); -Inf at 0, +Inf at 1, NaN outside [0, 1].
/// P. J. Acklam's rational approximation (relative error below 1.2e-9), then one Halley step
/// on Phi(x) - p using erfc, which brings it to about double precision (for p >= 1e-300; below
/// that, where exp(x^2/2) overflows, the approximation's 1.2e-9 is what remains).
inline double inverse_normal_cdf(double p) {
  if (!(p >= 0.0 && p <= 1.0)) return std::numeric_limits<double>::quiet_NaN();
  if (p == 0.0) return -std::numeric_limits<double>::infinity();
  if (p == 1.0) return std::numeric_limits<double>::infinity();

  constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,  -2.759285104469687e+02,
                          1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                          6.680131188771972e+01, -1.328068155288572e+01};
  constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                          -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                          3.754408661907416e+00};
  constexpr double tail = 0.02425;

  double x;
  if (p < tail || p > 1.0 - tail) {
    // Tails: a rational function of sqrt(-2 log q), q the smaller tail probability.
    const double q = std::sqrt(-2.0 * std::log(p < tail ? p : 1.0 - p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1.0);
    if (p > tail) x = -x;
  } else {
    const double q = p - 0.5;
    const double r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1.0);
  }
  // Below p ~ 1e-300 the step's exp(x^2 / 2) overflows; the approximation stands alone there.
  if (0.5 * x * x > 700.0) return x;
  const double pi = 3.14159265358979323846;
  const double error = 0.5 * std::erfc(-x / std::sqrt(2.0)) - p;
  const double u = error * std::sqrt(2.0 * pi) * std::exp(0.5 * x * x);
  return x - u / (1.0 + 0.5 * x * u);
}

}  // namespace oktopk::impl
