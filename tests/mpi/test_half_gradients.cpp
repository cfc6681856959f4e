// SPDX-License-Identifier: BSD-3-Clause
// Gradients of type bfloat16 and float16 through every method. Their arithmetic is float, so
// a 16-bit handle must compute exactly what a float handle computes from the same (widened)
// inputs and round only the output: every output bit for bit the float handle's rounded once,
// every residual bit for bit the float handle's. Also: every call against the oracle with the
// 16-bit output's own tolerance, reduce_sparse against reduce, NaN, Inf and float16's range
// refused on every rank, checkpoints that carry the type, and the factory's checks.
#include "api_checks.hpp"
#include "mpi/oracle_host.hpp"

#include <oktopk/any_space.hpp>

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace oktopk::test;  // NOLINT(google-build-using-namespace)
using oktopk::Algorithm;
using oktopk::bfloat16;
using oktopk::float16;
using oktopk::Options;
using Exec = Kokkos::DefaultExecutionSpace;
using FloatVector = oktopk::SparseAllreduce<Exec, float>::vector_type;

constexpr std::int64_t kN = 3001;  // odd: uneven regions and ring chunks

template <class V>
constexpr const char* type_name = std::is_same_v<V, bfloat16> ? "bfloat16" : "float16";

template <class V>
constexpr oktopk::Wire wire_of =
    std::is_same_v<V, bfloat16> ? oktopk::Wire::BFloat16 : oktopk::Wire::Float16;

/// 16-bit values of scales 2^-20 to 2^4 (float16 subnormals among them: below 2^-14), both
/// signs, some zeros, and a part shared by every rank. Deterministic in (rank, call).
template <class V>
std::vector<V> gradient(int rank, std::int64_t call, std::int64_t n) {
  std::vector<V> g(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j) {
    const auto u = hash_key(93, 3, static_cast<std::uint64_t>(rank),
                            static_cast<std::uint64_t>(call), static_cast<std::uint64_t>(j));
    const auto shared =
        hash_key(93, 4, 0, static_cast<std::uint64_t>(call), static_cast<std::uint64_t>(j));
    const float mantissa = 1.0f + static_cast<float>(u >> 40) * 0x1p-24f;
    const int exponent = static_cast<int>(shared % 25) - 20;
    const float sign = ((u ^ shared) & 1) != 0 ? -1.0f : 1.0f;
    const float x = (u >> 5) % 16 == 0 ? 0.0f : sign * std::ldexp(mantissa, exponent);
    g[static_cast<std::size_t>(j)] = oktopk::round_to<V>(x);
  }
  return g;
}

template <class T>
Kokkos::View<T*, Exec::memory_space> to_device(const std::vector<T>& host, const char* label) {
  Kokkos::View<T*, Exec::memory_space> device(std::string(label), host.size());
  Kokkos::deep_copy(
      device, Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                  host.data(), host.size()));
  return device;
}

template <class View>
std::vector<typename View::non_const_value_type> to_host(const View& device) {
  std::vector<typename View::non_const_value_type> host(device.extent(0));
  Kokkos::deep_copy(Kokkos::View<typename View::non_const_value_type*, Kokkos::HostSpace,
                                 Kokkos::MemoryTraits<Kokkos::Unmanaged>>(host.data(), host.size()),
                    device);
  return host;
}

template <class V>
std::vector<float> widened(const std::vector<V>& values) {
  std::vector<float> f(values.size());
  for (std::size_t j = 0; j < values.size(); ++j) f[j] = oktopk::to_float(values[j]);
  return f;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

Options options_for(Algorithm a, std::int64_t warmup) {
  Options o;
  o.set_density(0.02).set_warmup_iterations(warmup);
  if (a == Algorithm::OkTopk) o.set_threshold_period(2).set_repartition_period(3);
  return o;
}

template <class V>
std::unique_ptr<oktopk::SparseAllreduce<Exec, V>> make_half(Algorithm a, std::int64_t warmup = 1,
                                                            std::int64_t n = kN) {
  return oktopk::make_sparse_allreduce<Exec, V>(Exec(), a, oktopk::Communicator(), n,
                                                options_for(a, warmup));
}

std::string algorithm_name(const ::testing::TestParamInfo<Algorithm>& info) {
  return oktopk::to_string(info.param);
}

// A 16-bit handle and a float handle fed the same values (the float one their widening) make
// the same selections and sums: the 16-bit output is the float output rounded once, and the
// residuals are equal, bit for bit, call after call, the dense warm-up call among them. The
// float handle sends the 16-bit type (wire=bf16 or fp16), as the 16-bit handle does, and so
// they move the same bytes.
template <class V>
void check_rounded_float_handle(Algorithm a) {
  Exec exec;
  const bool dense = a == Algorithm::Dense;
  const std::int64_t warmup = 1;
  const auto half = make_half<V>(a, warmup);
  Options float_options = options_for(a, warmup);
  float_options.set_wire(wire_of<V>);
  const auto single = oktopk::make_sparse_allreduce<Exec, float>(exec, a, oktopk::Communicator(),
                                                                 kN, float_options);
  std::int64_t nonzero = 0;
  std::int64_t inexact = 0;  // float outputs the 16-bit type does not hold
  for (std::int64_t call = 1; call <= 4; ++call) {
    const std::vector<V> grad = gradient<V>(world_rank(), call, kN);
    Kokkos::View<V*, Exec::memory_space> out("test::out", kN);
    FloatVector float_out("test::float_out", kN);
    half->reduce(exec, to_device(grad, "test::grad"), out);
    single->reduce(exec, to_device(widened(grad), "test::float_grad"), float_out);
    const std::vector<V> o = to_host(out);
    const std::vector<float> f = to_host(float_out);
    std::int64_t differ = 0;
    for (std::size_t j = 0; j < o.size(); ++j) {
      differ += o[j].bits == oktopk::round_to<V>(f[j]).bits ? 0 : 1;
      nonzero += f[j] != 0.0f ? 1 : 0;
      inexact += oktopk::to_float(oktopk::round_to<V>(f[j])) != f[j] ? 1 : 0;
    }
    EXPECT_EQ(differ, 0) << type_name<V> << " call " << call;
    EXPECT_EQ(half->stats().global_selected, single->stats().global_selected) << "call " << call;
    EXPECT_EQ(half->stats().total_traffic().bytes_sent, single->stats().total_traffic().bytes_sent)
        << "call " << call;

    const std::vector<float> r = to_host(half->residual());
    const std::vector<float> s = to_host(single->residual());
    std::int64_t residual_differ = 0;
    for (std::size_t j = 0; j < r.size(); ++j) residual_differ += same_bits(r[j], s[j]) ? 0 : 1;
    EXPECT_EQ(residual_differ, 0) << type_name<V> << " call " << call;
  }
  EXPECT_GT(nonzero, 0);
  // Otherwise the comparison could not tell a rounded output from an unrounded one. On the
  // 16-bit wire, an output that is one value received (P = 1), a 16-bit sum divided by a power
  // of two (TopkDSA and Ok-Topk send their regions' sums rounded, gTopk its final set), or S2's
  // median of an odd number of its cells, which the ring averaged and rounded, is a 16-bit value.
  const bool sums_sent_rounded =
      a == Algorithm::TopkDSA || a == Algorithm::OkTopk || a == Algorithm::GTopk;
  const bool median_of_cells = a == Algorithm::S2Reducer && half->options().s2_sketch_rows % 2 == 1;
  const bool outputs_are_16_bit = world_size() == 1 || median_of_cells ||
                                  (sums_sent_rounded && (world_size() & (world_size() - 1)) == 0);
  if (!dense && !outputs_are_16_bit) {
    EXPECT_GT(inexact, 0) << "every float output was already a " << type_name<V>;
  }
}

/// Collective. One call of `h` on `grad` into `out`, and the entries of out that the oracle
/// finds wrong (count_mismatches, with the slack); `expected` receives the oracle's result.
template <class V>
std::int64_t reduce_against_oracle(
    oktopk::SparseAllreduce<Exec, V>& h, const std::vector<V>& grad,
    const typename oktopk::SparseAllreduce<Exec, V>::vector_type& out,
    const typename oktopk::SparseAllreduce<Exec, V>::residual_vector_type& expected) {
  Exec exec;
  const std::vector<float> residual_before = to_host(h.residual());
  std::vector<float> acc(grad.size());
  for (std::size_t j = 0; j < grad.size(); ++j) {
    acc[j] = residual_before[j] + oktopk::to_float(grad[j]);
  }
  h.reduce(exec, to_device(grad, "test::grad"), out);
  typename oktopk::SparseAllreduce<Exec, V>::residual_vector_type slack("test::slack", grad.size());
  oktopk::expected_result(exec, h, to_device(acc, "test::acc"), expected,
                          oktopk::default_oracle_tolerance, slack);
  return oktopk::count_mismatches(exec, h, expected, out, oktopk::default_oracle_tolerance, slack);
}

// Every call, the dense warm-up among them, matches the oracle on every rank, within what the
// 16-bit output's rounding adds (count_mismatches allows for it). The residual keeps the
// roundings' errors, which OutputIsTheFloatHandlesRoundedOnce checks against a float handle on
// the 16-bit wire, and test_sparse_wire.cpp against the inputs.
template <class V>
void check_oracle(Algorithm a) {
  const auto h = make_half<V>(a);
  using Handle = oktopk::SparseAllreduce<Exec, V>;
  for (std::int64_t call = 1; call <= 4; ++call) {
    typename Handle::vector_type out("test::out", kN);
    typename Handle::residual_vector_type expected("test::expected", kN);
    EXPECT_EQ(reduce_against_oracle(*h, gradient<V>(world_rank(), call, kN), out, expected), 0)
        << type_name<V> << " call " << call;

    // The check must be able to fail: most non-zero outputs are decided by the oracle.
    const std::vector<float> e = to_host(expected);
    const std::vector<V> o = to_host(out);
    std::int64_t nonzero = 0;
    std::int64_t checked = 0;
    for (std::size_t j = 0; j < e.size(); ++j) {
      if (oktopk::to_float(o[j]) == 0.0f) continue;
      ++nonzero;
      checked += std::isnan(e[j]) ? 0 : 1;
    }
    EXPECT_GT(nonzero, 0) << "call " << call;
    EXPECT_GE(2 * checked, nonzero) << "call " << call << ": most outputs undecided";
  }
}

// 16-bit gradients tie often: every entry 1 on every rank, or 2, 4 or 16 magnitudes with
// random signs, different on every rank. Every call of a top-k method keeps k entries (the
// oracle counts a shortfall as wrong entries), with no warm-up, so the first call is sparse.
template <class V>
void check_ties(Algorithm a) {
  if (a == Algorithm::Dense || a == Algorithm::S2Reducer) GTEST_SKIP() << "no top-k selection";
  using Handle = oktopk::SparseAllreduce<Exec, V>;
  for (const int levels : {1, 2, 4, 16}) {
    const auto h = make_half<V>(a, 0);
    for (std::int64_t call = 1; call <= 6; ++call) {
      SCOPED_TRACE(std::string(type_name<V>) + ", levels " + std::to_string(levels) + ", call " +
                   std::to_string(call));
      std::vector<V> grad(static_cast<std::size_t>(kN), oktopk::round_to<V>(1.0f));
      for (std::int64_t j = 0; levels > 1 && j < kN; ++j) {
        const auto u = hash_key(97, static_cast<std::uint64_t>(levels),
                                static_cast<std::uint64_t>(world_rank()),
                                static_cast<std::uint64_t>(call), static_cast<std::uint64_t>(j));
        const auto m = static_cast<float>(1 + u % static_cast<std::uint64_t>(levels));
        grad[static_cast<std::size_t>(j)] = oktopk::round_to<V>((u >> 63) != 0 ? -m : m);
      }
      typename Handle::vector_type out("test::out", kN);
      typename Handle::residual_vector_type expected("test::expected", kN);
      EXPECT_EQ(reduce_against_oracle(*h, grad, out, expected), 0);
      const oktopk::ReduceStats& stats = h->stats();
      EXPECT_FALSE(stats.selected_nothing);
      EXPECT_GT(stats.global_selected, 0);
      if (stats.local_threshold_exact) {
        EXPECT_EQ(stats.local_selected, h->k());
      }
    }
  }
}

// reduce_sparse returns the non-zeros of what reduce writes.
template <class V>
void check_reduce_sparse(Algorithm a) {
  Exec exec;
  const auto dense = make_half<V>(a);
  const auto sparse = make_half<V>(a);
  oktopk::SparseResult<Exec::memory_space, V> result;
  for (std::int64_t call = 1; call <= 3; ++call) {
    const auto g = to_device(gradient<V>(world_rank(), call, kN), "test::grad");
    Kokkos::View<V*, Exec::memory_space> out("test::out", kN);
    dense->reduce(exec, g, out);
    sparse->reduce_sparse(exec, g, result);
    exec.fence();
    const std::vector<V> o = to_host(out);
    std::vector<V> scattered(o.size(), V{0});
    const auto idx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), result.indices);
    const auto val = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), result.values);
    ASSERT_LE(result.size, static_cast<std::int64_t>(idx.extent(0)));
    for (std::int64_t e = 0; e < result.size; ++e) {
      ASSERT_TRUE(idx(e) >= 0 && idx(e) < kN && (e == 0 || idx(e) > idx(e - 1)));
      scattered[static_cast<std::size_t>(idx(e))] = val(e);
    }
    std::int64_t differ = 0;
    // Compared as numbers: an average that rounds to -0 in float16 is a zero of the dense
    // output, which the sparse form leaves out; every other value is equal bit for bit.
    for (std::size_t j = 0; j < o.size(); ++j) {
      differ += oktopk::to_float(o[j]) == oktopk::to_float(scattered[j]) ? 0 : 1;
    }
    EXPECT_EQ(differ, 0) << type_name<V> << " call " << call;
  }
}

// A checkpoint of a 16-bit handle restores into a handle of its type, which goes on exactly as
// the saved one; a float handle refuses it, on every rank, naming both types.
template <class V>
void check_checkpoint(Algorithm a) {
  Exec exec;
  const auto saved = make_half<V>(a);
  for (std::int64_t call = 1; call <= 3; ++call) {
    Kokkos::View<V*, Exec::memory_space> out("test::out", kN);
    saved->reduce(exec, to_device(gradient<V>(world_rank(), call, kN), "test::grad"), out);
  }
  std::ostringstream blob;
  saved->save_state(exec, blob);
  std::uint32_t version = 0;
  std::memcpy(&version, blob.str().data() + 8, sizeof version);
  EXPECT_EQ(version, 3u) << "a typed checkpoint";

  const auto restored = make_half<V>(a);
  std::istringstream in(blob.str());
  restored->restore_state(exec, in);
  const auto g = to_device(gradient<V>(world_rank(), 4, kN), "test::grad");
  Kokkos::View<V*, Exec::memory_space> expected_out("test::expected_out", kN);
  Kokkos::View<V*, Exec::memory_space> out("test::out", kN);
  saved->reduce(exec, g, expected_out);
  restored->reduce(exec, g, out);
  const std::vector<V> e = to_host(expected_out);
  const std::vector<V> o = to_host(out);
  std::int64_t differ = 0;
  for (std::size_t j = 0; j < o.size(); ++j) differ += o[j].bits == e[j].bits ? 0 : 1;
  EXPECT_EQ(differ, 0);

  const auto as_float = oktopk::make_sparse_allreduce<Exec, float>(
      Exec(), a, oktopk::Communicator(), kN, options_for(a, 1));
  expect_invalid_argument(
      [&] {
        std::istringstream is(blob.str());
        as_float->restore_state(exec, is);
      },
      std::string("oktopk::SparseAllreduce::restore_state: rank 0: checkpoint was written by a "
                  "handle for ") +
          type_name<V> + " gradients, this handle takes float32");
}

class BFloat16Gradients : public ::testing::TestWithParam<Algorithm> {};
class Float16Gradients : public ::testing::TestWithParam<Algorithm> {};

TEST_P(BFloat16Gradients, OutputIsTheFloatHandlesRoundedOnce) {
  check_rounded_float_handle<bfloat16>(GetParam());
}
TEST_P(BFloat16Gradients, EveryCallMatchesTheOracle) { check_oracle<bfloat16>(GetParam()); }
TEST_P(BFloat16Gradients, ReduceSparseMatchesReduce) { check_reduce_sparse<bfloat16>(GetParam()); }
TEST_P(BFloat16Gradients, KeepsKWhenMagnitudesTie) { check_ties<bfloat16>(GetParam()); }
TEST_P(BFloat16Gradients, CheckpointsCarryTheGradientType) {
  check_checkpoint<bfloat16>(GetParam());
}

TEST_P(Float16Gradients, OutputIsTheFloatHandlesRoundedOnce) {
  check_rounded_float_handle<float16>(GetParam());
}
TEST_P(Float16Gradients, EveryCallMatchesTheOracle) { check_oracle<float16>(GetParam()); }
TEST_P(Float16Gradients, ReduceSparseMatchesReduce) { check_reduce_sparse<float16>(GetParam()); }
TEST_P(Float16Gradients, KeepsKWhenMagnitudesTie) { check_ties<float16>(GetParam()); }
TEST_P(Float16Gradients, CheckpointsCarryTheGradientType) { check_checkpoint<float16>(GetParam()); }

const std::vector<Algorithm> every_method(oktopk::all_algorithms.begin(),
                                          oktopk::all_algorithms.end());
INSTANTIATE_TEST_SUITE_P(AllMethods, BFloat16Gradients, ::testing::ValuesIn(every_method),
                         algorithm_name);
INSTANTIATE_TEST_SUITE_P(AllMethods, Float16Gradients, ::testing::ValuesIn(every_method),
                         algorithm_name);

std::string reduce_error(Algorithm a, std::int64_t warmup, const std::vector<float16>& first,
                         const std::vector<float16>& second) {
  Exec exec;
  const auto h = make_half<float16>(a, warmup, static_cast<std::int64_t>(first.size()));
  Kokkos::View<float16*, Exec::memory_space> out("test::out", first.size());
  h->reduce(exec, to_device(first, "test::grad"), out);
  const std::int64_t calls = h->stats().iteration;
  const std::string message =
      expect_invalid_argument([&] { h->reduce(exec, to_device(second, "test::grad"), out); },
                              "oktopk::SparseAllreduce::reduce: ");
  EXPECT_EQ(h->stats().iteration, calls) << "a refused call leaves the handle as it was";
  return message;
}

// NaN on one rank, and a gradient plus residual beyond float16's range (its residual grows past
// 65504 on entries the call does not send), are refused on every rank with the same words.
TEST(HalfGradients, NaNAndFloat16RangeAreRefusedOnEveryRank) {
  constexpr std::int64_t n = 100;
  std::vector<float16> ordinary(n, oktopk::round_to<float16>(0.5f));
  std::vector<float16> nan = ordinary;
  if (world_rank() == world_size() - 1) nan[7] = float16{0x7e00};
  const std::string nan_message = reduce_error(Algorithm::OkTopk, 0, ordinary, nan);
  EXPECT_NE(nan_message.find("holds NaN or Inf, or values that round to Inf as float16 on rank " +
                             std::to_string(world_size() - 1)),
            std::string::npos)
      << nan_message;

  // All equal: a tie at the threshold, so TopkA sends the first k in index order and keeps the
  // other n - k, which the second call doubles past 65504 (on every rank; the message names
  // the highest).
  const std::vector<float16> largest(n, oktopk::round_to<float16>(65504.0f));
  const std::string range_message = reduce_error(Algorithm::TopkA, 0, largest, largest);
  const int last = world_size() - 1;
  const auto kept = n - static_cast<std::int64_t>(options_for(Algorithm::TopkA, 0).density * n);
  EXPECT_NE(range_message.find(
                "round to Inf as float16 on rank " + std::to_string(last) +
                (world_rank() == last ? " (" + std::to_string(kept) + " entries)" : std::string())),
            std::string::npos)
      << range_message;
}

// A ring partial sum beyond 65504 cannot be sent as float16: the Dense method and a warm-up
// call count it and every rank refuses the call (at P = 2 the only sum is the final average,
// which is formed in float, so nothing overflows).
TEST(HalfGradients, Float16RingSumsThatOverflowAreRefusedOnEveryRank) {
  if (world_size() < 3) GTEST_SKIP() << "needs a partial sum: three ranks";
  constexpr std::int64_t n = 100;
  const std::vector<float16> ordinary(n, oktopk::round_to<float16>(0.5f));
  std::vector<float16> large = ordinary;
  large[3] = oktopk::round_to<float16>(40000.0f);
  for (const Algorithm a : {Algorithm::Dense, Algorithm::OkTopk}) {
    const std::string message = reduce_error(a, 2, ordinary, large);
    EXPECT_NE(message.find("the sum over ranks overflows to Inf at 1 entries"), std::string::npos)
        << message;
    EXPECT_NE(message.find("with float16 on the wire"), std::string::npos) << message;
  }
}

// S2's sketch cells add up the entries that share them: with every entry near float16's limit
// and a sketch far smaller than n, cells exceed it, and cannot be sent as float16. Every rank
// throws std::invalid_argument, the handle unchanged, and goes on with ordinary values.
TEST(HalfGradients, Float16SketchCellsBeyondRangeAreRefusedOnEveryRank) {
  constexpr std::int64_t n = 4000;
  Exec exec;
  const auto h = oktopk::make_sparse_allreduce<Exec, float16>(
      exec, Algorithm::S2Reducer, oktopk::Communicator(), n,
      Options{}.set_density(0.01).set_warmup_iterations(0));
  const std::vector<float16> grad(n, oktopk::round_to<float16>(60000.0f));
  Kokkos::View<float16*, Exec::memory_space> out("test::out", n);
  const std::string message =
      expect_invalid_argument([&] { h->reduce(exec, to_device(grad, "test::grad"), out); },
                              "oktopk::SparseAllreduce::reduce: ");
  EXPECT_NE(message.find("values sent as fp16 round to Inf beyond float16's 65504"),
            std::string::npos)
      << message;
  EXPECT_EQ(h->stats().iteration, 0) << "the call was refused";
  h->reduce(exec, to_device(gradient<float16>(world_rank(), 1, n), "test::grad"), out);
  EXPECT_EQ(h->stats().iteration, 1);
  std::int64_t nonfinite = 0;
  for (const float16 x : to_host(out)) nonfinite += std::isfinite(oktopk::to_float(x)) ? 0 : 1;
  EXPECT_EQ(nonfinite, 0);
}

// The sparse methods send a 16-bit gradient's values as its own type: 2 bytes a value (S2: a
// table cell). Same gradient, same selection: the bfloat16 handle moves at most 0.8 of the
// bytes of a float handle on the float wire.
TEST(HalfGradients, SparseMethodsSendTheSixteenBitType) {
  if (world_size() < 2) GTEST_SKIP() << "nothing is sent at P = 1";
  Exec exec;
  constexpr std::int64_t n = 40000;
  for (const Algorithm a : {Algorithm::TopkA, Algorithm::TopkDSA, Algorithm::GTopk,
                            Algorithm::GaussianK, Algorithm::OkTopk, Algorithm::S2Reducer}) {
    SCOPED_TRACE(oktopk::to_string(a));
    const auto half = make_half<bfloat16>(a, 0, n);
    const auto single = oktopk::make_sparse_allreduce<Exec, float>(exec, a, oktopk::Communicator(),
                                                                   n, options_for(a, 0));
    const std::vector<bfloat16> grad = gradient<bfloat16>(world_rank(), 1, n);
    Kokkos::View<bfloat16*, Exec::memory_space> out("test::out", n);
    FloatVector float_out("test::float_out", n);
    half->reduce(exec, to_device(grad, "test::grad"), out);
    single->reduce(exec, to_device(widened(grad), "test::float_grad"), float_out);
    ASSERT_EQ(half->stats().local_selected, single->stats().local_selected);
    const auto sent16 = half->stats().total_traffic().bytes_sent;
    const auto sent32 = single->stats().total_traffic().bytes_sent;
    EXPECT_GT(sent16, 0);
    EXPECT_LE(static_cast<double>(sent16), 0.8 * static_cast<double>(sent32))
        << sent16 << " bytes against " << sent32;
  }
}

TEST(HalfGradients, FactoryRefusesMixedTypesAndOtherWires) {
  const oktopk::Communicator comm;
  if (world_size() >= 2) {
    const std::string message = expect_invalid_argument(
        [&] {
          if (world_rank() == 0) {
            oktopk::make_sparse_allreduce<Exec, bfloat16>(Exec(), Algorithm::OkTopk, comm, 100);
          } else {
            oktopk::make_sparse_allreduce<Exec, float16>(Exec(), Algorithm::OkTopk, comm, 100);
          }
        },
        "oktopk::make_sparse_allreduce: ");
    EXPECT_NE(message.find("gradient type"), std::string::npos) << message;
  }
  expect_invalid_argument(
      [&] {
        oktopk::make_sparse_allreduce<Exec, bfloat16>(Exec(), Algorithm::Dense, comm, 100,
                                                      Options{}.set_wire(oktopk::Wire::Float32));
      },
      "oktopk::make_sparse_allreduce: wire=fp32 does not apply to bfloat16 gradients, which take "
      "wire=native or wire=bf16");
  expect_invalid_argument(
      [&] {
        oktopk::make_sparse_allreduce<Exec, float16>(Exec(), Algorithm::TopkA, comm, 100,
                                                     Options{}.set_wire(oktopk::Wire::BFloat16));
      },
      "oktopk::make_sparse_allreduce: wire=bf16 does not apply to float16 gradients, which take "
      "wire=native or wire=fp16");
  // A 16-bit gradient's own type is its native wire, for every method.
  const Options own_type = Options{}.set_wire(oktopk::Wire::BFloat16);
  for (const Algorithm a : oktopk::all_algorithms) {
    EXPECT_NO_THROW((oktopk::make_sparse_allreduce<Exec, bfloat16>(Exec(), a, comm, 100, own_type)))
        << a;
  }
}

}  // namespace
