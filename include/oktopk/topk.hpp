// SPDX-License-Identifier: BSD-3-Clause
// Top-k thresholds: the exact k-th largest |x| (radix select), and two cheap estimates of it,
// from a random sample and from a Gaussian fit (Gaussian-k).
#pragma once

#include <oktopk/error.hpp>
#include <oktopk/fwd.hpp>
#include <oktopk/impl/base/hash.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/kernels/inverse_normal.hpp>
#include <oktopk/impl/kernels/radix_select.hpp>
#include <oktopk/impl/kernels/read_rounds.hpp>
#include <oktopk/impl/kernels/vector_ops.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace oktopk {

/// \brief Reusable buffers for kth_largest_abs, so repeated calls allocate nothing.
///
/// On GPUs `candidates` holds, when the first radix digit's bin is small, the |x| of the entries
/// in it, and `gathered_count` counts them as they are written. Both are allocated by a call
/// whose bin does not fit in the candidates there are: n / 16 floats for that call's n (1/16 of
/// a float gradient's memory). With `gather_candidates` false they are never allocated and x is
/// read three times.
template <class ExecSpace>
struct KthLargestWorkspace {
  using Histogram = Kokkos::View<std::int64_t*, typename ExecSpace::memory_space>;

  explicit KthLargestWorkspace(const ExecSpace& exec = ExecSpace())
      : histogram(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing,
                                     "oktopk::kth_largest_abs::histogram"),
                  std::size_t{1} << impl::radix_max_bits),
        histogram_host(Kokkos::create_mirror_view(histogram)) {}

  Histogram histogram;
  typename Histogram::host_mirror_type histogram_host;
  Kokkos::View<float*, typename ExecSpace::memory_space> candidates;
  Kokkos::View<std::int64_t, typename ExecSpace::memory_space> gathered_count;
  bool gather_candidates = true;
};

/// \brief The k-th largest |x(i)| (k counted from 1), by radix select on the bit patterns.
///
/// Semantics: NaN entries are ignored (m = number of non-NaN entries); -0 counts as 0; +-Inf
/// as +Inf. If k == 0 or m == 0 the result is +Inf; if k > m, k is clamped to m (the smallest
/// |x|). Ties need no special care: the result is a value, the same for any order of x. With
/// strict selection (|x| > result) k-1 entries are selected when the k largest are distinct.
/// Three read passes over x (two for the 16-bit types; on GPUs also two when the first digit's
/// bin holds at most n / 16 entries and workspace.gather_candidates is set: the second pass
/// gathers them for the third); only as many small histograms cross to the host.
template <class ExecSpace, class XView>
float kth_largest_abs(const ExecSpace& exec, const XView& x, std::int64_t k,
                      KthLargestWorkspace<ExecSpace>& workspace) {
  OKTOPK_STATIC_CHECK_VALUES(ExecSpace, XView, "oktopk::kth_largest_abs: x");
  OKTOPK_REQUIRE(k >= 0, std::invalid_argument, "oktopk::kth_largest_abs",
                 "k must be non-negative, got " << k);
  impl::ScopedRegion region("oktopk::kth_largest_abs");
  if (k == 0 || x.extent(0) == 0) return std::numeric_limits<float>::infinity();
  return impl::radix_kth_largest_abs<impl::radix_shape_v<ExecSpace>>(exec, x, k, workspace);
}

/// \brief kth_largest_abs with its own workspace (allocates its buffers on every call).
template <class ExecSpace, class XView>
float kth_largest_abs(const ExecSpace& exec, const XView& x, std::int64_t k) {
  KthLargestWorkspace<ExecSpace> workspace(exec);
  return kth_largest_abs(exec, x, k, workspace);
}

/// \brief Reusable buffers for estimate_threshold_sampled on x of value type Value: the sample
/// (grown to the largest sample_size asked for, with headroom) and kth_largest_abs's workspace,
/// so repeated calls allocate nothing once the sample is large enough.
template <class ExecSpace, class Value = float>
struct SampledThresholdWorkspace {
  explicit SampledThresholdWorkspace(const ExecSpace& exec = ExecSpace()) : kth(exec) {}

  Kokkos::View<Value*, typename ExecSpace::memory_space> sample{
      "oktopk::estimate_threshold_sampled::sample", 0};
  KthLargestWorkspace<ExecSpace> kth;
};

namespace impl {

// The kernels are named functors, not lambdas: a user's program and the library instantiate
// them with the same types, and nvcc's host-side lambda wrappers do not survive that
// (scripts/check-lambda-odr.py).

/// sample(j) = x(a hash of seed and j, mod n): draw j of the sampled threshold.
template <class XView, class SampleView>
struct DrawSample {
  XView x;
  SampleView sample;
  std::uint64_t seed = 0;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t j) const {
    const auto n = static_cast<std::uint64_t>(x.extent(0));
    const std::uint64_t h = splitmix64(seed ^ splitmix64(static_cast<std::uint64_t>(j)));
    sample(j) = x(static_cast<std::int64_t>(h % n));
  }
};

/// Adds, per chunk of x, the sum of (x(i) - center)^power for power 1 or 2 (a loop per chunk,
/// which vectorizes on the host).
template <class XView, int Power>
struct ChunkMoment {
  XView x;
  std::int64_t chunk = 1;
  double center = 0.0;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t c, double& sum) const {
    const auto n = static_cast<std::int64_t>(x.extent(0));
    const std::int64_t end = (c + 1) * chunk < n ? (c + 1) * chunk : n;
    double local = 0.0;
    for (std::int64_t i = c * chunk; i < end; ++i) {
      const double d = static_cast<double>(to_arithmetic(x(i))) - center;
      local += Power == 1 ? d : d * d;
    }
    sum += local;
  }
};

/// ChunkMoment on GPUs: work item c of `items` (n / reads, rounded up) adds the entries
/// c + j items, j < reads, a round read before any is added (read_in_rounds).
template <class XView, int Power>
struct MomentStrided {
  static constexpr int reads = reads_in_flight(sizeof(typename XView::non_const_value_type));
  XView x;
  std::int64_t items = 1;
  double center = 0.0;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t c, double& sum) const {
    const auto n = static_cast<std::int64_t>(x.extent(0));
    double local = 0.0;
    read_in_rounds<reads>(
        0, n, c, items, [&](std::int64_t i) { return static_cast<double>(to_arithmetic(x(i))); },
        [&](std::int64_t, double v) {
          const double d = v - center;
          local += Power == 1 ? d : d * d;
        });
    sum += local;
  }
};

inline const char* moment_label(int power) {
  return power == 1 ? "oktopk::estimate_threshold_gaussian::mean"
                    : "oktopk::estimate_threshold_gaussian::variance";
}

/// The sum of (x(i) - center)^Power over x in its GPU shape (MomentStrided), on any space (the
/// tests run it on the host).
template <int Power, class ExecSpace, class XView>
double moment_strided(const ExecSpace& exec, const XView& x, double center) {
  using Kernel = MomentStrided<XView, Power>;
  const auto n = static_cast<std::int64_t>(x.extent(0));
  const std::int64_t items = (n + Kernel::reads - 1) / Kernel::reads;
  double sum = 0.0;
  Kokkos::parallel_reduce(moment_label(Power), RangeOf<ExecSpace>(exec, 0, items),
                          Kernel{x, items, center}, sum);
  return sum;
}

/// The sum of (x(i) - center)^Power over x, for Power 1 (the mean's) or 2 (the variance's):
/// chunks of consecutive entries on the host, moment_strided() on GPUs.
template <int Power, class ExecSpace, class XView>
double moment(const ExecSpace& exec, const XView& x, double center) {
  if constexpr (!runs_on_host_v<ExecSpace>) {
    return moment_strided<Power>(exec, x, center);
  } else {
    const auto n = static_cast<std::int64_t>(x.extent(0));
    double sum = 0.0;
    Kokkos::parallel_reduce(moment_label(Power),
                            RangeOf<ExecSpace>(exec, 0, chunk_count<ExecSpace>(n)),
                            ChunkMoment<XView, Power>{x, chunk_length_v<ExecSpace>, center}, sum);
    return sum;
  }
}

}  // namespace impl

/// \brief Estimates the k-th largest |x| from `sample_size` entries drawn uniformly with
/// replacement (a hash of `seed` and the draw number picks each, so the estimate is
/// deterministic): the ceil(k·s/n)-th largest |sample|. Exact when sample_size >= n.
/// k == 0 or n == 0 gives +Inf. sample_size must be positive.
template <class ExecSpace, class XView>
float estimate_threshold_sampled(
    const ExecSpace& exec, const XView& x, std::int64_t k, std::int64_t sample_size,
    std::uint64_t seed,
    SampledThresholdWorkspace<ExecSpace, typename XView::non_const_value_type>& workspace) {
  constexpr const char* where = "oktopk::estimate_threshold_sampled";
  OKTOPK_STATIC_CHECK_VALUES(ExecSpace, XView, "oktopk::estimate_threshold_sampled: x");
  OKTOPK_REQUIRE(k >= 0, std::invalid_argument, where, "k must be non-negative, got " << k);
  OKTOPK_REQUIRE(sample_size > 0, std::invalid_argument, where,
                 "sample_size must be positive, got " << sample_size);
  impl::ScopedRegion region("oktopk::estimate_threshold_sampled");
  const auto n = static_cast<std::int64_t>(x.extent(0));
  if (k == 0 || n == 0) return std::numeric_limits<float>::infinity();
  if (sample_size >= n) return kth_largest_abs(exec, x, k, workspace.kth);

  impl::ensure_capacity(exec, workspace.sample, sample_size);
  const auto sample =
      Kokkos::subview(workspace.sample, Kokkos::make_pair(std::int64_t{0}, sample_size));
  Kokkos::parallel_for(
      "oktopk::estimate_threshold_sampled::draw", impl::RangeOf<ExecSpace>(exec, 0, sample_size),
      impl::DrawSample<XView, std::remove_const_t<decltype(sample)>>{x, sample, seed});
  // ceil(k·s/n) without overflow for any k <= n, s < n < 2^63.
  const long double scaled = static_cast<long double>(k) * sample_size / n;
  auto sample_k = static_cast<std::int64_t>(std::ceil(scaled));
  if (sample_k < 1) sample_k = 1;
  return kth_largest_abs(exec, sample, sample_k, workspace.kth);
}

/// \brief estimate_threshold_sampled with its own workspace (allocates the sample and the
/// selection's buffers on every call).
template <class ExecSpace, class XView>
float estimate_threshold_sampled(const ExecSpace& exec, const XView& x, std::int64_t k,
                                 std::int64_t sample_size, std::uint64_t seed) {
  SampledThresholdWorkspace<ExecSpace, typename XView::non_const_value_type> workspace(exec);
  return estimate_threshold_sampled(exec, x, k, sample_size, seed, workspace);
}

/// \brief The Gaussian-k threshold: fits a normal distribution (mean mu, standard deviation
/// sigma over all n entries) and returns mu + |Phi^-1(k / 2n)|·sigma, the value that |x|
/// exceeds with probability k/n when x is N(0, sigma^2). k == 0 gives +Inf; k >= n gives -Inf
/// (every non-NaN entry is selected). A NaN entry makes the result NaN.
template <class ExecSpace, class XView>
float estimate_threshold_gaussian(const ExecSpace& exec, const XView& x, std::int64_t k) {
  constexpr const char* where = "oktopk::estimate_threshold_gaussian";
  OKTOPK_STATIC_CHECK_VALUES(ExecSpace, XView, "oktopk::estimate_threshold_gaussian: x");
  OKTOPK_REQUIRE(k >= 0, std::invalid_argument, where, "k must be non-negative, got " << k);
  impl::ScopedRegion region("oktopk::estimate_threshold_gaussian");
  const auto n = static_cast<std::int64_t>(x.extent(0));
  if (k == 0 || n == 0) return std::numeric_limits<float>::infinity();
  if (k >= n) return -std::numeric_limits<float>::infinity();

  const double mean = impl::moment<1>(exec, x, 0.0) / static_cast<double>(n);
  // Two passes (mean, then squared deviations) avoid the cancellation of sum(x^2) - n·mean^2.
  const double squares = impl::moment<2>(exec, x, mean);
  const double sigma = std::sqrt(squares / static_cast<double>(n));
  const double z =
      impl::inverse_normal_cdf(static_cast<double>(k) / (2.0 * static_cast<double>(n)));
  return static_cast<float>(mean + std::fabs(z) * sigma);
}

}  // namespace oktopk
