// SPDX-License-Identifier: BSD-3-Clause
// kth_largest_abs, the sampled and Gaussian threshold estimates and inverse_normal_cdf.
#include "exec_spaces.hpp"
#include "host_reference.hpp"
#include "test_data.hpp"

#include <oktopk/select.hpp>
#include <oktopk/topk.hpp>
#include <oktopk/impl/kernels/inverse_normal.hpp>
#include <oktopk/impl/kernels/radix_select.hpp>
#include <oktopk/impl/kernels/read_rounds.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace oktopk::test;

template <class ExecSpace>
class TopK : public ::testing::Test {};
TYPED_TEST_SUITE(TopK, EnabledSpaces);

/// The ranks where selection breaks first: 0, 1, 2, n/2, n-1, n, n+5 (negative ones dropped).
std::vector<std::int64_t> ranks_for(std::size_t n_size) {
  const auto n = static_cast<std::int64_t>(n_size);
  std::vector<std::int64_t> ks = {0, 1, 2, n / 2, n - 1, n, n + 5};
  ks.erase(std::remove_if(ks.begin(), ks.end(), [](std::int64_t k) { return k < 0; }), ks.end());
  std::sort(ks.begin(), ks.end());
  ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
  return ks;
}

std::string case_name(const char* kind, std::size_t n, std::int64_t k) {
  return std::string(kind) + ", n = " + std::to_string(n) + ", k = " + std::to_string(k);
}

/// Order-statistic definition, independent of sorting: t is the k-th largest |x| of the m
/// non-NaN entries iff fewer than k exceed it and at least k reach it (for 1 <= k <= m).
::testing::AssertionResult is_kth_largest(const std::vector<float>& x, std::int64_t k, float t) {
  std::int64_t above = 0;
  std::int64_t at_least = 0;
  bool present = false;
  for (const float v : x) {
    if (std::isnan(v)) continue;
    const float a = std::fabs(v);
    if (a > t) ++above;
    if (a >= t) ++at_least;
    if (same_bits(a, t)) present = true;
  }
  if (present && above < k && k <= at_least) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << describe(t) << " is no k-th largest |x|: " << above << " above, " << at_least
         << " at or above, present " << present;
}

// ---- kth_largest_abs ---------------------------------------------------------------------

/// kth_largest_abs against the reference, with and without a workspace, and its selection with
/// the GPUs' kernels (impl::radix_kth_largest_abs in the device shape) on every space; on
/// normally distributed data of 10^6 entries that selection must have gathered the first
/// digit's bin (its candidates exist).
TYPED_TEST(TopK, KthLargestMatchesReference) {
  const TypeParam exec;
  oktopk::KthLargestWorkspace<TypeParam> workspace(exec);
  oktopk::KthLargestWorkspace<TypeParam> device_shape_workspace(exec);
  for (const auto kind : all_data_kinds) {
    for (const auto n : test_sizes) {
      const auto& x = cached_data(kind, n);
      const auto x_view = to_view<TypeParam>(x, "x");
      const auto mags = ref::abs_descending(x);
      for (const auto k : ranks_for(n)) {
        SCOPED_TRACE(case_name(to_string(kind), n, k));
        const float expected = ref::kth_from_descending(mags, k);
        const float with_workspace = oktopk::kth_largest_abs(exec, x_view, k, workspace);
        const float without = oktopk::kth_largest_abs(exec, x_view, k);
        EXPECT_TRUE(same_bits(with_workspace, expected))
            << describe(with_workspace) << ", expected " << describe(expected);
        EXPECT_TRUE(same_bits(without, expected))
            << describe(without) << ", expected " << describe(expected);
        if (k == 0 || n == 0) continue;  // answered before the selection
        const float device_shape =
            oktopk::impl::radix_kth_largest_abs<oktopk::impl::RadixShape::device>(
                exec, x_view, k, device_shape_workspace);
        EXPECT_TRUE(same_bits(device_shape, expected))
            << describe(device_shape) << ", expected " << describe(expected) << " (device shape)";
      }
    }
  }
  const std::size_t largest = *std::max_element(std::begin(test_sizes), std::end(test_sizes));
  EXPECT_EQ(device_shape_workspace.candidates.extent(0),
            largest / oktopk::impl::radix_gather_share);
}

/// The GPUs' selection where it gathers: on doubles (whose keys are their floats'), and where
/// the largest |x| are a few infinities beside NaNs whose |x| patterns share the infinity's
/// first two digits, which the gathering pass must leave out as the others do; and with
/// gathering turned off, which then allocates nothing.
TYPED_TEST(TopK, KthLargestGatheringDoublesAndInfinities) {
  const TypeParam exec;
  oktopk::KthLargestWorkspace<TypeParam> workspace(exec);
  oktopk::KthLargestWorkspace<TypeParam> no_gather_workspace(exec);
  no_gather_workspace.gather_candidates = false;
  auto x = cached_data(DataKind::normal, 100003);
  std::size_t position = 17;
  for (const std::uint32_t special : {0x7f800000u, 0xff800000u, 0x7f800000u, 0x7f800001u,
                                      0x7f8001ffu, 0xff800200u, 0x7f8fffffu}) {
    x[position] = float_from_bits(special);
    position += 14009;
  }
  const auto mags = ref::abs_descending(x);
  const auto x_view = to_view<TypeParam>(x, "x");
  const auto x_double = to_view<TypeParam>(std::vector<double>(x.begin(), x.end()), "x double");
  for (const std::int64_t k : {1, 2, 3, 4, 5, 1000, 50000}) {
    SCOPED_TRACE(case_name("normal with infinities and NaNs", x.size(), k));
    const float expected = ref::kth_from_descending(mags, k);
    const float got = oktopk::impl::radix_kth_largest_abs<oktopk::impl::RadixShape::device>(
        exec, x_view, k, workspace);
    EXPECT_TRUE(same_bits(got, expected)) << describe(got) << ", expected " << describe(expected);
    const float got_double = oktopk::impl::radix_kth_largest_abs<oktopk::impl::RadixShape::device>(
        exec, x_double, k, workspace);
    EXPECT_TRUE(same_bits(got_double, expected))
        << describe(got_double) << ", expected " << describe(expected) << " (double)";
    const float three_passes =
        oktopk::impl::radix_kth_largest_abs<oktopk::impl::RadixShape::device>(exec, x_view, k,
                                                                              no_gather_workspace);
    EXPECT_TRUE(same_bits(three_passes, expected))
        << describe(three_passes) << ", expected " << describe(expected) << " (not gathering)";
  }
  EXPECT_EQ(workspace.candidates.extent(0), x.size() / oktopk::impl::radix_gather_share);
  EXPECT_EQ(no_gather_workspace.candidates.extent(0), std::size_t{0});
}

/// Each documented rule on hand-made inputs, with hand-written answers.
TYPED_TEST(TopK, KthLargestDocumentedSemantics) {
  const TypeParam exec;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float sub = std::numeric_limits<float>::denorm_min();
  const float big = std::numeric_limits<float>::max();
  struct Case {
    const char* what;
    std::vector<float> x;
    std::int64_t k;
    float expected;
  };
  const std::vector<Case> cases = {
      {"k == 0", {1.0f, 2.0f}, 0, inf},
      {"empty", {}, 1, inf},
      {"empty, k == 0", {}, 0, inf},
      {"all NaN", {nan, -nan, nan}, 1, inf},
      {"all NaN, k > n", {nan, nan}, 5, inf},
      {"NaN ignored", {nan, -3.0f, 2.0f, nan}, 1, 3.0f},
      {"k > non-NaN count gives the smallest |x|", {nan, -3.0f, 2.0f, nan}, 3, 2.0f},
      {"k far beyond n", {nan, -3.0f, 2.0f, nan}, 1000, 2.0f},
      {"-0 counts as +0", {-0.0f}, 1, 0.0f},
      {"-0 and +0 tie", {-0.0f, 1.0f, 0.0f}, 2, 0.0f},
      {"-0 below a subnormal", {-0.0f, -sub}, 2, 0.0f},
      {"subnormal", {-0.0f, -sub}, 1, sub},
      {"-Inf counts as +Inf", {-inf, 1.0f}, 1, inf},
      {"+-Inf tie", {-inf, 5.0f, inf}, 2, inf},
      {"below the infinities", {-inf, 5.0f, inf}, 3, 5.0f},
      {"largest finite", {big, -inf, -big}, 3, big},
      {"NaN whose |x| pattern follows +Inf's", {float_from_bits(0x7f800001u), 1.0f}, 1, 1.0f},
      {"negative NaN", {float_from_bits(0xffffffffu), -1.0f}, 1, 1.0f},
      // NaNs whose |x| patterns share +Inf's top digits (0x7f800001..0x7f8fffff): still ignored
      // when the walk descends into +Inf's prefix.
      {"+Inf beside a NaN sharing its top 22 bits",
       {inf, float_from_bits(0x7f800001u), 1.0f},
       1,
       inf},
      {"+Inf beside a NaN sharing its top 11 bits",
       {inf, float_from_bits(0xff800200u), 1.0f},
       1,
       inf},
      {"two +Inf beside such NaNs",
       {float_from_bits(0x7f8fffffu), inf, -inf, float_from_bits(0x7f800001u)},
       2,
       inf},
      {"ties", {-2.0f, 2.0f, 1.0f, -2.0f}, 3, 2.0f},
      {"ties, below them", {-2.0f, 2.0f, 1.0f, -2.0f}, 4, 1.0f},
  };
  oktopk::KthLargestWorkspace<TypeParam> workspace(exec);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const auto x_view = to_view<TypeParam>(c.x, "x");
    const float got = oktopk::kth_largest_abs(exec, x_view, c.k, workspace);
    EXPECT_TRUE(same_bits(got, c.expected))
        << describe(got) << ", expected " << describe(c.expected);
    EXPECT_TRUE(same_bits(oktopk::kth_largest_abs(exec, x_view, c.k), c.expected));
  }
}

/// When the k largest |x| are distinct, selecting |x| > (k-th largest) takes k - 1 entries.
TYPED_TEST(TopK, KthLargestStrictSelectionTakesKMinusOne) {
  const TypeParam exec;
  for (const std::size_t n : {std::size_t{7}, std::size_t{1000}, std::size_t{1000003}}) {
    // Distinct magnitudes over many binades, random signs and order, and a few NaNs.
    auto rng = make_rng(200, n);
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto key = static_cast<std::uint32_t>(0x00800000u + i * 997u);
      x[i] = float_from_bits(key | (static_cast<std::uint32_t>(rng() & 1u) << 31));
    }
    std::shuffle(x.begin(), x.end(), rng);
    x.push_back(std::numeric_limits<float>::quiet_NaN());
    const auto x_view = to_view<TypeParam>(x, "x");
    const auto m = static_cast<std::int64_t>(n);
    for (const std::int64_t k :
         {std::int64_t{1}, std::int64_t{2}, std::int64_t{3}, m / 2, m - 1, m}) {
      SCOPED_TRACE(case_name("distinct", n, k));
      const float t = oktopk::kth_largest_abs(exec, x_view, k);
      EXPECT_EQ(ref::count_above(x, t), k - 1);
      EXPECT_EQ(oktopk::count_above(exec, x_view, t), k - 1);
    }
  }
}

TYPED_TEST(TopK, KthLargestWorkspaceReuseAcrossSizes) {
  const TypeParam exec;
  oktopk::KthLargestWorkspace<TypeParam> workspace(exec);
  const std::size_t sizes[] = {1000003, 7, 0, 1, 1000, 2, 1000003, 1000, 0, 7};
  std::size_t call = 0;
  for (const auto n : sizes) {
    for (const auto kind : all_data_kinds) {
      const auto& x = cached_data(kind, n);
      const auto x_view = to_view<TypeParam>(x, "x");
      const auto k = static_cast<std::int64_t>((call * 7919) % (n + 2));
      ++call;
      SCOPED_TRACE(case_name(to_string(kind), n, k));
      const float expected = ref::kth_largest_abs(x, k);
      const float got = oktopk::kth_largest_abs(exec, x_view, k, workspace);
      EXPECT_TRUE(same_bits(got, expected)) << describe(got) << ", expected " << describe(expected);
    }
  }
}

TYPED_TEST(TopK, KthLargestRejectsNegativeK) {
  const TypeParam exec;
  oktopk::KthLargestWorkspace<TypeParam> workspace(exec);
  for (const std::size_t n : {std::size_t{0}, std::size_t{7}}) {
    const auto x_view = to_view<TypeParam>(cached_data(DataKind::normal, n), "x");
    for (const std::int64_t k : {std::int64_t{-1}, std::numeric_limits<std::int64_t>::min()}) {
      SCOPED_TRACE(case_name("normal", n, k));
      EXPECT_TRUE(throws_invalid_argument([&] { oktopk::kth_largest_abs(exec, x_view, k); },
                                          "oktopk::kth_largest_abs"));
      EXPECT_TRUE(throws_invalid_argument(
          [&] { oktopk::kth_largest_abs(exec, x_view, k, workspace); }, "oktopk::kth_largest_abs"));
    }
  }
}

/// Many small arrays drawn from 5 values (so |x| ties constantly), every k from 0 to n + 2.
TYPED_TEST(TopK, KthLargestRandomSmallArraysWithHeavyTies) {
  const TypeParam exec;
  oktopk::KthLargestWorkspace<TypeParam> workspace(exec);
  constexpr float set[] = {2.0f, -2.0f, 0.5f, -0.0f, 1.0f};
  auto rng = make_rng(201);
  std::uniform_int_distribution<std::size_t> length(1, 40);
  std::uniform_int_distribution<int> pick(0, 4);
  for (int array = 0; array < 200; ++array) {
    std::vector<float> x(length(rng));
    for (auto& v : x) v = set[pick(rng)];
    if (array % 10 == 3) x[x.size() / 2] = std::numeric_limits<float>::quiet_NaN();
    const auto x_view = to_view<TypeParam>(x, "x");
    const auto non_nan = static_cast<std::int64_t>(ref::abs_descending(x).size());
    for (std::int64_t k = 0; k <= static_cast<std::int64_t>(x.size()) + 2; ++k) {
      SCOPED_TRACE("array " + std::to_string(array) + ", n = " + std::to_string(x.size()) +
                   ", k = " + std::to_string(k));
      const float got = oktopk::kth_largest_abs(exec, x_view, k, workspace);
      const float expected = ref::kth_largest_abs(x, k);
      ASSERT_TRUE(same_bits(got, expected)) << describe(got) << ", expected " << describe(expected);
      if (k >= 1 && k <= non_nan) {
        EXPECT_TRUE(is_kth_largest(x, k, got));
      }
    }
  }
}

/// Inputs that leave the decision to one radix pass: keys sharing their top 11 bits (passes 1
/// and 2 decide), their top 22 bits (pass 2 decides), differing only in the middle digit, only
/// in the top digit (Inf and NaN keys included), plus keys at the digit boundaries.
TYPED_TEST(TopK, KthLargestRadixPassStress) {
  const TypeParam exec;
  oktopk::KthLargestWorkspace<TypeParam> workspace(exec);
  struct Stress {
    const char* what;
    std::vector<float> x;
  };
  std::vector<Stress> inputs;
  for (const std::size_t n : {std::size_t{1000}, std::size_t{1000003}}) {
    inputs.push_back({"top 11 bits shared", make_keys(n, 0x3f812345u, 0x000fffffu, 1)});
    inputs.push_back({"top 22 bits shared", make_keys(n, 0x3f812345u, 0x000001ffu, 2)});
    inputs.push_back({"only the middle digit varies", make_keys(n, 0x3f812345u, 0x000ffe00u, 3)});
    inputs.push_back({"only the top digit varies", make_keys(n, 0x00012345u, 0x7ff00000u, 4)});
    inputs.push_back({"zero and subnormals, low digit only", make_keys(n, 0u, 0x000001ffu, 5)});
    // Two clusters whose top digits differ by one, each with its own low bits.
    auto two = make_keys(n / 2, 0x3f8fffffu, 0x000fffffu, 6);
    const auto other = make_keys(n - n / 2, 0x3f900000u, 0x000fffffu, 7);
    two.insert(two.end(), other.begin(), other.end());
    inputs.push_back({"two neighbouring top digits", two});
  }
  {
    constexpr std::uint32_t keys[] = {
        0x3f8fffffu, 0x3f900000u, 0x3f9001ffu, 0x3f900200u, 0x3f8ffe00u, 0x3f8ffdffu,
        0x7f7fffffu, 0x7f800000u, 0x7f800001u, 0x7fffffffu, 0x00000001u, 0x00000000u,
        0x000001ffu, 0x00000200u, 0x001fffffu, 0x00200000u, 0x3f900000u, 0x000001ffu};
    std::vector<float> x;
    for (std::size_t i = 0; i < std::size(keys); ++i) {
      x.push_back(float_from_bits(keys[i] | (i % 3 == 0 ? 0x80000000u : 0u)));
    }
    inputs.push_back({"digit boundaries", x});
  }
  for (const auto& input : inputs) {
    const auto& x = input.x;
    const auto n = static_cast<std::int64_t>(x.size());
    const auto x_view = to_view<TypeParam>(x, "x");
    const auto mags = ref::abs_descending(x);
    std::vector<std::int64_t> ks;
    if (n <= 1000) {
      for (std::int64_t k = 0; k <= n + 1; ++k) ks.push_back(k);
    } else {
      ks = {1, 2, 3, 100, n / 3, n / 2, n - 1, n};
    }
    for (const auto k : ks) {
      SCOPED_TRACE(case_name(input.what, x.size(), k));
      const float got = oktopk::kth_largest_abs(exec, x_view, k, workspace);
      const float expected = ref::kth_from_descending(mags, k);
      ASSERT_TRUE(same_bits(got, expected)) << describe(got) << ", expected " << describe(expected);
    }
  }
}

/// What the walk test gives read_in_rounds: functors, not lambdas, since the walk is a
/// __host__ __device__ function and nvcc rejects a host lambda called from one.
struct ReadIndex {
  KOKKOS_INLINE_FUNCTION std::int64_t operator()(std::int64_t i) const { return i; }
};
struct RecordVisit {
  int* visits;
  std::int64_t begin, end, threads, t;
  std::int64_t* last;
  bool* ordered;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::int64_t read) const {
    *ordered = *ordered && i == read && i > *last && i < end && (i - begin) % threads == t;
    *last = i;
    ++visits[i];
  }
};

/// Teams of 1 to 256 threads over stretches around multiples of a round: each entry visited
/// once, by its own thread, in increasing order; nothing outside the stretch.
template <int Reads>
void check_read_in_rounds() {
  for (std::int64_t threads = 1; threads <= 256; ++threads) {
    for (const std::int64_t length :
         {std::int64_t{0}, std::int64_t{1}, threads - 1, threads, Reads * threads - 1,
          Reads * threads, Reads * threads + 1, (3 * Reads + 5) * threads + 5}) {
      if (length < 0) continue;
      const std::int64_t begin = 3;
      const std::int64_t end = begin + length;
      // Room past the end, so that a walk that overruns it is counted, not out of bounds.
      std::vector<int> visits(static_cast<std::size_t>(end + Reads * threads), 0);
      for (std::int64_t t = 0; t < threads; ++t) {
        std::int64_t last = -1;
        bool ordered = true;
        oktopk::impl::read_in_rounds<Reads>(
            begin, end, t, threads, ReadIndex{},
            RecordVisit{visits.data(), begin, end, threads, t, &last, &ordered});
        ASSERT_TRUE(ordered) << Reads << " reads, " << threads << " threads, length " << length
                             << ", thread " << t;
      }
      for (std::size_t i = 0; i < visits.size(); ++i) {
        const auto entry = static_cast<std::int64_t>(i);
        ASSERT_EQ(visits[i], entry >= begin && entry < end ? 1 : 0)
            << Reads << " reads, " << threads << " threads, length " << length << ", entry " << i;
      }
    }
  }
}

/// impl::read_in_rounds, the walk of the GPU kernels' threads, at the round lengths they use.
TEST(ReadInRounds, EveryEntryOnceAtEveryTeamSize) {
  check_read_in_rounds<8>();
  check_read_in_rounds<16>();
  check_read_in_rounds<32>();
}

/// The histogram of one digit, from its definition: the non-NaN keys whose higher digits are
/// the prefix, counted by their digit.
std::vector<std::int64_t> reference_histogram(const std::vector<float>& x,
                                              const oktopk::impl::RadixDigit& digit) {
  std::vector<std::int64_t> bins(static_cast<std::size_t>(digit.bins), 0);
  for (const float v : x) {
    const std::uint32_t key = bits_of(v) & 0x7fffffffu;
    if (key > 0x7f800000u) continue;
    if (!digit.first_pass && (key >> digit.prefix_shift) != digit.prefix) continue;
    ++bins[(key >> digit.shift) & static_cast<std::uint32_t>(digit.bins - 1)];
  }
  return bins;
}

/// The radix histogram's kernel of GPUs (impl::radix_histogram_device), run on every space with
/// the teams that space allows, and on host spaces the host's, against the definition: each
/// pass, with a prefix that keys of x have and one they lack, on sizes that leave rounds
/// partial, with NaN and Inf.
TYPED_TEST(TopK, RadixHistogramBothShapesMatchReference) {
  const TypeParam exec;
  using Histogram = Kokkos::View<std::int64_t*, typename TypeParam::memory_space>;
  Histogram histogram("histogram", std::size_t{1} << oktopk::impl::radix_max_bits);
  std::vector<std::vector<float>> inputs;
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4099},
                              std::size_t{100003}, std::size_t{1000003}}) {
    inputs.push_back(make_keys(n, 0x3f812345u, 0x00ffffffu, n));
  }
  auto specials = cached_data(DataKind::non_finite, 1000);
  inputs.push_back(specials);
  for (const auto& x : inputs) {
    const auto x_view = to_view<TypeParam>(x, "x");
    const std::uint32_t some_key = x.empty() ? 0u : bits_of(x[x.size() / 2]) & 0x7fffffffu;
    for (int pass = 0; pass < oktopk::impl::radix_passes; ++pass) {
      const int prefix_shift = oktopk::impl::radix_shift[pass] + oktopk::impl::radix_bits[pass];
      const std::uint32_t present = some_key >> prefix_shift;
      std::vector<std::uint32_t> prefixes = {present};
      // Key bit 30 flipped: no key of make_keys' (all below 2) has it set.
      if (pass > 0) prefixes.push_back(present ^ (1u << (30 - prefix_shift)));
      for (const std::uint32_t prefix : prefixes) {
        const auto digit = oktopk::impl::radix_digit(pass, prefix);
        SCOPED_TRACE("n = " + std::to_string(x.size()) + ", pass " + std::to_string(pass) +
                     ", prefix " + std::to_string(prefix));
        const auto expected = reference_histogram(x, digit);
        for (const bool device_shape : {false, true}) {
          // The host shape keeps 32 KiB of bins per thread: host spaces only, as the library.
          if (!device_shape && !oktopk::impl::runs_on_host_v<TypeParam>) continue;
          Kokkos::deep_copy(exec, histogram, std::int64_t{0});
          if (device_shape) {
            oktopk::impl::radix_histogram_device(exec, x_view, digit, histogram);
          } else {
            oktopk::impl::radix_histogram_host(exec, x_view, digit, histogram);
          }
          const auto got = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), histogram);
          std::int64_t differ = 0;
          for (int b = 0; b < digit.bins; ++b) {
            differ += got(b) == expected[static_cast<std::size_t>(b)] ? 0 : 1;
          }
          EXPECT_EQ(differ, 0) << (device_shape ? "device" : "host") << " shape";
        }
      }
    }
  }
}

/// The gathering histogram of the middle pass (impl::radix_histogram_gathering), run on every
/// space with the teams that space allows, against the definition: the histogram, the count,
/// and the gathered |x| as a multiset (they come in no order), for a prefix that keys of x have,
/// one they lack and the infinity's (beside NaNs that share it), on sizes that leave steps
/// partial; and with too little room, where it writes only what fits and still counts
/// everything.
TYPED_TEST(TopK, GatheringHistogramCountsAndGathersItsKeys) {
  const TypeParam exec;
  using Memory = typename TypeParam::memory_space;
  Kokkos::View<std::int64_t*, Memory> histogram("histogram",
                                                std::size_t{1} << oktopk::impl::radix_max_bits);
  Kokkos::View<std::int64_t, Memory> count("count");
  std::vector<std::vector<float>> inputs;
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4099},
                              std::size_t{100003}, std::size_t{1000003}}) {
    inputs.push_back(make_keys(n, 0x3f812345u, 0x001fffffu, n));
  }
  inputs.push_back(cached_data(DataKind::non_finite, 1000));
  inputs.push_back(cached_data(DataKind::normal, 1000003));
  // Infinities beside NaNs whose |x| patterns share the infinity's first two digits.
  inputs.push_back(cached_data(DataKind::normal, 10007));
  std::size_t position = 5;
  for (const std::uint32_t special :
       {0x7f800000u, 0xff800000u, 0x7f800001u, 0x7f8001ffu, 0xff800200u, 0x7f8fffffu}) {
    inputs.back()[position] = float_from_bits(special);
    position += 1601;
  }
  for (const auto& x : inputs) {
    const auto x_view = to_view<TypeParam>(x, "x");
    const std::uint32_t some_key = x.empty() ? 0u : bits_of(x[x.size() / 3]) & 0x7fffffffu;
    const int prefix_shift = oktopk::impl::radix_shift[1] + oktopk::impl::radix_bits[1];
    const std::uint32_t present = some_key >> prefix_shift;
    const std::uint32_t infinity_prefix = oktopk::impl::abs_key_infinity >> prefix_shift;
    for (const std::uint32_t prefix :
         {present, present ^ (1u << (30 - prefix_shift)), infinity_prefix}) {
      const auto digit = oktopk::impl::radix_digit(1, prefix);
      std::vector<float> expected_gathered;
      for (const float v : x) {
        const std::uint32_t key = bits_of(v) & 0x7fffffffu;
        if (key <= 0x7f800000u && (key >> prefix_shift) == prefix) {
          expected_gathered.push_back(float_from_bits(key));
        }
      }
      const auto expected_histogram = reference_histogram(x, digit);
      const auto matches = static_cast<std::int64_t>(expected_gathered.size());
      for (const std::int64_t room : {matches + 3, matches / 2}) {
        SCOPED_TRACE("n = " + std::to_string(x.size()) + ", prefix " + std::to_string(prefix) +
                     ", " + std::to_string(matches) + " matches, room " + std::to_string(room));
        Kokkos::View<float*, Memory> gathered("gathered", static_cast<std::size_t>(room));
        Kokkos::deep_copy(gathered, -1.0f);
        oktopk::impl::radix_histogram_gathering(exec, x_view, digit, histogram, gathered, count);
        const auto got_histogram =
            Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), histogram);
        std::int64_t differ = 0;
        for (int b = 0; b < digit.bins; ++b) {
          differ += got_histogram(b) == expected_histogram[static_cast<std::size_t>(b)] ? 0 : 1;
        }
        EXPECT_EQ(differ, 0);
        const auto got_count = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), count);
        EXPECT_EQ(got_count(), matches);
        const auto got_gathered =
            Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gathered);
        std::vector<float> written(got_gathered.data(), got_gathered.data() + room);
        std::sort(expected_gathered.begin(), expected_gathered.end());
        if (room >= matches) {
          // Nothing written past the matches.
          for (std::int64_t i = matches; i < room; ++i) {
            EXPECT_TRUE(same_bits(written[static_cast<std::size_t>(i)], -1.0f)) << "slot " << i;
          }
          written.resize(static_cast<std::size_t>(matches));
          std::sort(written.begin(), written.end());
          EXPECT_TRUE(written == expected_gathered) << "the gathered |x| differ";
        } else {
          // Each slot holds one of the matches (non-negative numbers, ordered by <).
          std::int64_t strangers = 0;
          for (const float v : written) {
            strangers +=
                std::binary_search(expected_gathered.begin(), expected_gathered.end(), v) ? 0 : 1;
          }
          EXPECT_EQ(strangers, 0);
        }
      }
    }
  }
}

// ---- estimate_threshold_sampled ----------------------------------------------------------

TYPED_TEST(TopK, EstimateSampledIsExactWhenTheSampleCoversX) {
  const TypeParam exec;
  for (const auto kind : all_data_kinds) {
    for (const auto n : test_sizes) {
      const auto& x = cached_data(kind, n);
      const auto x_view = to_view<TypeParam>(x, "x");
      const auto mags = ref::abs_descending(x);
      const auto s = static_cast<std::int64_t>(std::max<std::size_t>(n, 1));
      for (const auto k : ranks_for(n)) {
        for (const std::int64_t sample_size : {s, s + 1, 2 * s + 7}) {
          SCOPED_TRACE(case_name(to_string(kind), n, k) + ", s = " + std::to_string(sample_size));
          const float got = oktopk::estimate_threshold_sampled(exec, x_view, k, sample_size, 17);
          const float expected = ref::kth_from_descending(mags, k);
          EXPECT_TRUE(same_bits(got, expected))
              << describe(got) << ", expected " << describe(expected);
        }
      }
    }
  }
}

/// Same seed, same estimate; and the estimate is always some |x(i)|, a k'-th largest of a
/// sample of x.
TYPED_TEST(TopK, EstimateSampledIsDeterministicAndTakenFromX) {
  const TypeParam exec;
  for (const auto kind : all_data_kinds) {
    for (const std::size_t n : {std::size_t{1000}, std::size_t{1000003}}) {
      const auto& x = cached_data(kind, n);
      const auto x_view = to_view<TypeParam>(x, "x");
      auto mags = ref::abs_descending(x);
      std::sort(mags.begin(), mags.end());
      const auto m = static_cast<std::int64_t>(n);
      for (const std::int64_t k : {std::int64_t{1}, m / 100, m / 2}) {
        for (const std::int64_t s : {std::int64_t{1}, std::int64_t{10}, m / 10, m - 1}) {
          for (const std::uint64_t seed : {std::uint64_t{0}, std::uint64_t{12345}}) {
            SCOPED_TRACE(case_name(to_string(kind), n, k) + ", s = " + std::to_string(s) +
                         ", seed = " + std::to_string(seed));
            const float first = oktopk::estimate_threshold_sampled(exec, x_view, k, s, seed);
            const float second = oktopk::estimate_threshold_sampled(exec, x_view, k, s, seed);
            EXPECT_TRUE(same_bits(first, second))
                << describe(first) << " then " << describe(second);
            // +Inf only when the whole sample could be NaN.
            const bool found = std::binary_search(mags.begin(), mags.end(), first) ||
                               (same_bits(first, inf) && kind == DataKind::non_finite);
            EXPECT_TRUE(found) << describe(first) << " is no |x(i)|";
          }
        }
      }
    }
  }
}

/// One workspace for calls of growing and shrinking sample sizes: the same estimates as
/// calls with their own, and no new sample buffer once it is large enough.
TYPED_TEST(TopK, EstimateSampledWithAWorkspaceMatchesAndAllocatesOnce) {
  const TypeParam exec;
  oktopk::SampledThresholdWorkspace<TypeParam, float> workspace(exec);
  const float* sample_after_largest = nullptr;
  for (const auto kind : {DataKind::normal, DataKind::ties, DataKind::heavy_tailed}) {
    const auto& x = cached_data(kind, 1000003);
    const auto x_view = to_view<TypeParam>(x, "x");
    for (const std::int64_t s : {std::int64_t{10}, std::int64_t{100000}, std::int64_t{1000},
                                 std::int64_t{2000000}, std::int64_t{1}}) {
      for (const std::int64_t k : {std::int64_t{1}, std::int64_t{10000}}) {
        SCOPED_TRACE(std::string(to_string(kind)) + ", s = " + std::to_string(s) +
                     ", k = " + std::to_string(k));
        const float own = oktopk::estimate_threshold_sampled(exec, x_view, k, s, 3);
        const float reused = oktopk::estimate_threshold_sampled(exec, x_view, k, s, 3, workspace);
        EXPECT_TRUE(same_bits(own, reused)) << describe(own) << " vs " << describe(reused);
      }
      if (s == 100000) sample_after_largest = workspace.sample.data();
    }
  }
  // 100000 was the largest sample drawn (2000000 >= n is exact, with no sample).
  EXPECT_EQ(workspace.sample.data(), sample_after_largest);
  EXPECT_GE(workspace.sample.extent(0), std::size_t{100000});
}

TYPED_TEST(TopK, EstimateSampledCountIsNearK) {
  const TypeParam exec;
  const auto& x = cached_data(DataKind::normal, 1000000);
  const auto x_view = to_view<TypeParam>(x, "x");
  const std::int64_t k = 10000;  // density 0.01
  for (const std::uint64_t seed :
       {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{42}, std::uint64_t{0xdeadbeef}}) {
    SCOPED_TRACE("seed = " + std::to_string(seed));
    const float t = oktopk::estimate_threshold_sampled(exec, x_view, k, 100000, seed);
    const auto count = ref::count_above(x, t);
    EXPECT_GE(count, k * 85 / 100) << "threshold " << t;
    EXPECT_LE(count, k * 115 / 100) << "threshold " << t;
  }
}

TYPED_TEST(TopK, EstimateSampledEdgeCases) {
  const TypeParam exec;
  const auto x_view = to_view<TypeParam>(cached_data(DataKind::normal, 1000), "x");
  const auto empty = to_view<TypeParam>(std::vector<float>{}, "empty");
  const std::string where = "oktopk::estimate_threshold_sampled";
  EXPECT_TRUE(same_bits(oktopk::estimate_threshold_sampled(exec, x_view, 0, 100, 1), inf));
  EXPECT_TRUE(same_bits(oktopk::estimate_threshold_sampled(exec, x_view, 0, 5000, 1), inf));
  EXPECT_TRUE(same_bits(oktopk::estimate_threshold_sampled(exec, empty, 3, 100, 1), inf));
  for (const std::int64_t s : {std::int64_t{0}, std::int64_t{-1}}) {
    SCOPED_TRACE("sample_size = " + std::to_string(s));
    EXPECT_TRUE(throws_invalid_argument(
        [&] { oktopk::estimate_threshold_sampled(exec, x_view, 10, s, 1); }, where));
    EXPECT_TRUE(throws_invalid_argument(
        [&] { oktopk::estimate_threshold_sampled(exec, empty, 10, s, 1); }, where));
  }
  EXPECT_TRUE(throws_invalid_argument(
      [&] { oktopk::estimate_threshold_sampled(exec, x_view, -1, 100, 1); }, where));
}

// ---- inverse_normal_cdf ------------------------------------------------------------------

::testing::AssertionResult relatively_near(double actual, double expected, double tolerance) {
  if (std::fabs(actual - expected) <= tolerance * std::fabs(expected)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << std::setprecision(17) << actual << ", expected " << expected << " (relative error "
         << std::fabs(actual - expected) / std::fabs(expected) << ")";
}

TEST(InverseNormalCdf, KnownQuantiles) {
  using oktopk::impl::inverse_normal_cdf;
  EXPECT_LE(std::fabs(inverse_normal_cdf(0.5)), 1e-15);
  struct Known {
    double p;
    double z;
  };
  const Known known[] = {
      {0.975, 1.959963984540054},  {0.025, -1.959963984540054}, {0.005, -2.5758293035489004},
      {0.995, 2.5758293035489004}, {1e-10, -6.361340902404056}, {0.8413447460685429, 1.0},
      {0.15865525393145707, -1.0}, {0.9772498680518208, 2.0},
  };
  for (const auto& q : known) {
    SCOPED_TRACE("p = " + describe(q.p));
    EXPECT_TRUE(relatively_near(inverse_normal_cdf(q.p), q.z, 1e-12));
  }
  // Symmetry: 1 - p is exact for p in [0.5, 1].
  for (const double p : {0.5, 0.6, 0.75, 0.9, 0.975, 0.99, 0.999, 0.9999}) {
    SCOPED_TRACE("p = " + describe(p));
    EXPECT_TRUE(relatively_near(inverse_normal_cdf(1.0 - p), -inverse_normal_cdf(p), 1e-12) ||
                p == 0.5);
  }
}

/// Against bisection on erfc in long double, across the body, both tails and both sides of
/// the 0.02425 switch between the approximation's branches.
TEST(InverseNormalCdf, MatchesBisectionReference) {
  using oktopk::impl::inverse_normal_cdf;
  std::vector<double> ps = {1e-300, 1e-200, 1e-100,  1e-50,  1e-20,  1e-15,   1e-10,
                            1e-5,   1e-3,   0.01,    0.02,   0.0242, 0.02425, 0.0243,
                            0.05,   0.9757, 0.97575, 0.9758, 0.99,   0.999,   0.9999};
  for (int i = 1; i < 1000; ++i) ps.push_back(i / 1000.0);
  for (const double p : ps) {
    SCOPED_TRACE("p = " + describe(p));
    const double expected = ref::normal_quantile(p);
    const double got = inverse_normal_cdf(p);
    if (std::fabs(expected) < 1e-3) {
      EXPECT_NEAR(got, expected, 1e-15);
    } else {
      EXPECT_TRUE(relatively_near(got, expected, 1e-12));
    }
  }
}

/// Subnormal p is inside the documented domain (0, 1): the result must be a finite quantile
/// (about -38), not NaN. erfc loses relative precision there, hence the loose tolerance.
TEST(InverseNormalCdf, SubnormalProbabilities) {
  using oktopk::impl::inverse_normal_cdf;
  for (const double p : {2.2250738585072014e-308, 1e-310, 1e-315, 1e-320,
                         std::numeric_limits<double>::denorm_min()}) {
    SCOPED_TRACE("p = " + describe(p));
    const double got = inverse_normal_cdf(p);
    EXPECT_TRUE(std::isfinite(got) && relatively_near(got, ref::normal_quantile(p), 1e-6))
        << got << ", expected " << describe(ref::normal_quantile(p));
  }
}

TEST(InverseNormalCdf, EdgeCases) {
  using oktopk::impl::inverse_normal_cdf;
  const double dinf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(inverse_normal_cdf(0.0), -dinf);
  EXPECT_EQ(inverse_normal_cdf(-0.0), -dinf);
  EXPECT_EQ(inverse_normal_cdf(1.0), dinf);
  for (const double p : {-1e-300, -0.5, 1.0000000000000002, 2.0, dinf, -dinf,
                         std::numeric_limits<double>::quiet_NaN()}) {
    SCOPED_TRACE("p = " + describe(p));
    EXPECT_TRUE(std::isnan(inverse_normal_cdf(p)));
  }
}

// ---- estimate_threshold_gaussian ---------------------------------------------------------

TYPED_TEST(TopK, GaussianThresholdMatchesReference) {
  const TypeParam exec;
  for (const auto kind : all_data_kinds) {
    for (const auto n : test_sizes) {
      const auto& x = cached_data(kind, n);
      const auto x_view = to_view<TypeParam>(x, "x");
      auto ks = ranks_for(n);
      ks.push_back(std::max<std::int64_t>(1, static_cast<std::int64_t>(n) / 100));
      for (const auto k : ks) {
        SCOPED_TRACE(case_name(to_string(kind), n, k));
        const auto fit = ref::gaussian_fit(x, k);
        const float got = oktopk::estimate_threshold_gaussian(exec, x_view, k);
        if (std::isnan(fit.threshold)) {
          EXPECT_TRUE(std::isnan(got)) << got;
        } else if (std::isinf(fit.threshold)) {
          EXPECT_EQ(static_cast<double>(got), fit.threshold);
        } else {
          // Summation order and the final rounding to float; bounded by the terms' size.
          const double tolerance =
              1e-6 * (std::fabs(fit.mean) + std::fabs(fit.z) * fit.sigma) + 1e-44;
          EXPECT_NEAR(static_cast<double>(got), fit.threshold, tolerance)
              << "mean " << fit.mean << ", sigma " << fit.sigma << ", z " << fit.z;
        }
      }
    }
  }
}

/// The Gaussian fit's two sums in their GPU shape (impl::moment_strided: rounds of entries
/// spread over x), run on every space, against sequential sums in double: equal up to the
/// summation order, on sizes around multiples of a round.
TYPED_TEST(TopK, GaussianMomentsInTheGpuShape) {
  const TypeParam exec;
  for (const auto kind : {DataKind::normal, DataKind::ties, DataKind::heavy_tailed}) {
    for (const std::size_t n : {1, 2, 7, 8, 9, 15, 16, 17, 1000, 100003}) {
      SCOPED_TRACE(case_name(to_string(kind), n, 0));
      const auto& x = cached_data(kind, n);
      const auto x_view = to_view<TypeParam>(x, "x");
      double sum = 0.0;
      double magnitudes = 0.0;
      for (const float v : x) {
        sum += v;
        magnitudes += std::fabs(v);
      }
      const double mean = sum / static_cast<double>(n);
      double squares = 0.0;
      for (const float v : x) squares += (v - mean) * (v - mean);
      // Reordering n double additions moves a sum by at most about n·2^-53 of its terms' size.
      const double order = 1e-10;
      EXPECT_NEAR(oktopk::impl::moment_strided<1>(exec, x_view, 0.0), sum, order * magnitudes);
      EXPECT_NEAR(oktopk::impl::moment_strided<2>(exec, x_view, mean), squares, order * squares);
    }
  }
}

/// A NaN anywhere makes the fit, and so the threshold, NaN.
TYPED_TEST(TopK, GaussianThresholdWithNaNIsNaN) {
  const TypeParam exec;
  auto x = cached_data(DataKind::normal, 1000);
  x[617] = std::numeric_limits<float>::quiet_NaN();
  const auto x_view = to_view<TypeParam>(x, "x");
  EXPECT_TRUE(std::isnan(oktopk::estimate_threshold_gaussian(exec, x_view, 10)));
}

TYPED_TEST(TopK, GaussianThresholdOnNormalData) {
  const TypeParam exec;
  const auto& x = cached_data(DataKind::normal, 1000000);
  const auto x_view = to_view<TypeParam>(x, "x");
  const std::int64_t k = 10000;  // density 0.01
  const float t = oktopk::estimate_threshold_gaussian(exec, x_view, k);
  EXPECT_NEAR(t, 2.5758293035489004, 0.02);
  const auto count = ref::count_above(x, t);
  EXPECT_GE(count, k * 90 / 100) << "threshold " << t;
  EXPECT_LE(count, k * 110 / 100) << "threshold " << t;
}

TYPED_TEST(TopK, GaussianThresholdEdgeCases) {
  const TypeParam exec;
  const auto x_view = to_view<TypeParam>(cached_data(DataKind::normal, 1000), "x");
  const auto empty = to_view<TypeParam>(std::vector<float>{}, "empty");
  EXPECT_EQ(oktopk::estimate_threshold_gaussian(exec, x_view, 0), inf);
  EXPECT_EQ(oktopk::estimate_threshold_gaussian(exec, empty, 0), inf);
  EXPECT_EQ(oktopk::estimate_threshold_gaussian(exec, empty, 5), inf);
  EXPECT_EQ(oktopk::estimate_threshold_gaussian(exec, x_view, 1000), -inf);
  EXPECT_EQ(oktopk::estimate_threshold_gaussian(exec, x_view, 1005), -inf);
  EXPECT_TRUE(
      throws_invalid_argument([&] { oktopk::estimate_threshold_gaussian(exec, x_view, -1); },
                              "oktopk::estimate_threshold_gaussian"));
}

}  // namespace
