// SPDX-License-Identifier: BSD-3-Clause
// Gradients of type double through every method: each call against the library's oracle at a
// tolerance only double arithmetic meets (a value rounded to float anywhere on the way is off
// by about 1e-8 and fails it), the residual holding acc's doubles bit for bit, reduce_sparse
// against reduce, finite doubles beyond float's range, checkpoints that carry the gradient
// type, and the factory's checks of the type. Then double gradients on a float wire (wire=fp32):
// the dense ring bit for bit, the oracle with its slack, error feedback that keeps every
// rounding error, and the bytes saved.
#include "api_checks.hpp"
#include "mpi/oracle_host.hpp"

#include <oktopk/any_space.hpp>

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace oktopk::test;  // NOLINT(google-build-using-namespace)
using oktopk::Algorithm;
using oktopk::Options;
using Exec = Kokkos::DefaultExecutionSpace;
using DoubleHandle = oktopk::SparseAllreduce<Exec, double>;
using FloatHandle = oktopk::SparseAllreduce<Exec, float>;
using DoubleVector = DoubleHandle::vector_type;

constexpr std::int64_t kN = 3001;  // odd: uneven regions and ring chunks
/// Well above what double arithmetic errs by, far below what one rounding to float errs by.
constexpr double kTolerance = 1e-12;

/// Doubles of scales 2^-20 to 2^4 with full 53-bit mantissas (no float holds them), both signs,
/// some zeros, and a part shared by every rank so that sums do not cancel to noise.
/// Deterministic in (rank, call).
std::vector<double> gradient(int rank, std::int64_t call, std::int64_t n) {
  std::vector<double> g(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j) {
    const auto u = hash_key(91, 3, static_cast<std::uint64_t>(rank),
                            static_cast<std::uint64_t>(call), static_cast<std::uint64_t>(j));
    const auto shared =
        hash_key(91, 4, 0, static_cast<std::uint64_t>(call), static_cast<std::uint64_t>(j));
    const double mantissa = 1.0 + static_cast<double>(u >> 11) * 0x1p-53;
    const int exponent = static_cast<int>(shared % 25) - 20;
    const double sign = ((u ^ shared) & 1) != 0 ? -1.0 : 1.0;
    g[static_cast<std::size_t>(j)] =
        (u >> 5) % 16 == 0 ? 0.0 : sign * std::ldexp(mantissa, exponent);
  }
  return g;
}

DoubleVector to_device(const std::vector<double>& host, const char* label) {
  DoubleVector device(std::string(label), host.size());
  Kokkos::deep_copy(
      device,
      Kokkos::View<const double*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
          host.data(), host.size()));
  return device;
}

template <class V>
std::vector<double> to_host(const V& device) {
  std::vector<double> host(device.extent(0));
  Kokkos::deep_copy(
      Kokkos::View<double*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
          host.data(), host.size()),
      device);
  return host;
}

bool holds_float(double x) { return static_cast<double>(static_cast<float>(x)) == x; }

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

Options options_for(Algorithm a) {
  Options o;
  o.set_density(0.02).set_warmup_iterations(1);
  if (a == Algorithm::OkTopk) o.set_threshold_period(2).set_repartition_period(3);
  return o;
}

std::string algorithm_name(const ::testing::TestParamInfo<Algorithm>& info) {
  return oktopk::to_string(info.param);
}

std::unique_ptr<DoubleHandle> make_double(Algorithm a, std::int64_t n = kN) {
  return oktopk::make_sparse_allreduce<Exec, double>(Exec(), a, oktopk::Communicator(), n,
                                                     options_for(a));
}

class DoubleGradients : public ::testing::TestWithParam<Algorithm> {};

// Every call (the dense warm-up and the method's own) matches the oracle to 1e-12 on every
// rank, and the residual keeps acc's doubles exactly where it keeps anything.
TEST_P(DoubleGradients, EveryCallMatchesTheOracleInDouble) {
  const Algorithm a = GetParam();
  const auto h = make_double(a);
  Exec exec;
  const bool feedback = a != Algorithm::Dense && a != Algorithm::S2Reducer;
  std::int64_t kept_doubles = 0;  // residual entries that no float holds
  for (std::int64_t call = 1; call <= 5; ++call) {
    const std::vector<double> grad = gradient(world_rank(), call, kN);
    const std::vector<double> residual_before = to_host(h->residual());
    std::vector<double> acc(grad.size());
    for (std::size_t j = 0; j < grad.size(); ++j) acc[j] = residual_before[j] + grad[j];
    const DoubleVector g = to_device(grad, "test::grad");
    DoubleVector out("test::out", kN);
    h->reduce(exec, g, out);

    const DoubleVector acc_device = to_device(acc, "test::acc");
    DoubleVector expected("test::expected", kN);
    DoubleVector slack("test::slack", kN);
    oktopk::expected_result(exec, *h, acc_device, expected, kTolerance, slack);
    EXPECT_EQ(oktopk::count_mismatches(exec, *h, expected, out, kTolerance, slack), 0)
        << "call " << call;

    // The check must be able to fail: most non-zero outputs are decided by the oracle (not
    // NaN, "either answer"), and some of them no float holds.
    const std::vector<double> e = to_host(expected);
    const std::vector<double> o = to_host(out);
    std::int64_t nonzero = 0;
    std::int64_t checked = 0;
    std::int64_t beyond_float = 0;
    for (std::size_t j = 0; j < e.size(); ++j) {
      if (o[j] == 0.0) continue;
      ++nonzero;
      checked += std::isnan(e[j]) ? 0 : 1;
      beyond_float += holds_float(o[j]) ? 0 : 1;
    }
    EXPECT_GT(nonzero, 0) << "call " << call;
    EXPECT_GE(2 * checked, nonzero) << "call " << call << ": most outputs undecided";
    EXPECT_GT(beyond_float, 0) << "call " << call << ": every output is a float";

    const std::vector<double> residual_after = to_host(h->residual());
    std::int64_t other = 0;
    for (std::size_t j = 0; j < acc.size(); ++j) {
      const double r = residual_after[j];
      if (r == 0.0) continue;
      if (!same_bits(r, acc[j])) ++other;
      kept_doubles += holds_float(r) ? 0 : 1;
    }
    EXPECT_EQ(other, 0) << "call " << call << ": residual entries other than 0 or acc";
  }
  if (feedback) {
    EXPECT_GT(kept_doubles, 0) << "the residual never held a value beyond float";
  }
}

// reduce_sparse returns the non-zeros of what reduce writes, as doubles, bit for bit.
TEST_P(DoubleGradients, ReduceSparseMatchesReduce) {
  const Algorithm a = GetParam();
  const auto dense = make_double(a);
  const auto sparse = make_double(a);
  Exec exec;
  oktopk::SparseResult<DoubleHandle::memory_space, double> result;
  for (std::int64_t call = 1; call <= 3; ++call) {
    const DoubleVector g = to_device(gradient(world_rank(), call, kN), "test::grad");
    DoubleVector out("test::out", kN);
    dense->reduce(exec, g, out);
    sparse->reduce_sparse(exec, g, result);
    exec.fence();
    const std::vector<double> o = to_host(out);
    std::vector<double> scattered(o.size(), 0.0);
    const auto idx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), result.indices);
    const auto val = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), result.values);
    ASSERT_LE(result.size, static_cast<std::int64_t>(idx.extent(0)));
    for (std::int64_t e = 0; e < result.size; ++e) {
      ASSERT_TRUE(idx(e) >= 0 && idx(e) < kN && (e == 0 || idx(e) > idx(e - 1)));
      scattered[static_cast<std::size_t>(idx(e))] = val(e);
    }
    std::int64_t differ = 0;
    for (std::size_t j = 0; j < o.size(); ++j) differ += same_bits(o[j], scattered[j]) ? 0 : 1;
    EXPECT_EQ(differ, 0) << "call " << call;
  }
}

// A finite double beyond float's range is an input like any other (its magnitude ranks as
// float's Inf for selection); an infinite one is refused on every rank, the handle unchanged.
TEST_P(DoubleGradients, DoublesBeyondFloatRangeAreFiniteInfIsNot) {
  const Algorithm a = GetParam();
  const auto h = make_double(a);
  Exec exec;
  std::vector<double> grad = gradient(world_rank(), 1, kN);
  grad[static_cast<std::size_t>(17 + world_rank())] = 1e300;
  DoubleVector out("test::out", kN);
  EXPECT_NO_THROW(h->reduce(exec, to_device(grad, "test::grad"), out));
  const std::vector<double> o = to_host(out);
  const double P = world_size();
  // The warm-up call is dense: every rank's huge entry reaches the output.
  EXPECT_EQ(o[static_cast<std::size_t>(17 + world_rank())], 1e300 / P);

  grad[5] = world_rank() == world_size() - 1 ? std::numeric_limits<double>::infinity() : 1.0;
  expect_invalid_argument([&] { h->reduce(exec, to_device(grad, "test::grad"), out); },
                          "oktopk::SparseAllreduce::reduce: ");
  EXPECT_EQ(h->stats().iteration, 1);
}

// A checkpoint says what it was written for: a double handle's restores into a double handle,
// which then goes on exactly as the saved one; a float handle refuses it, and a double handle
// a float one's, on every rank and with the same message. A float handle still writes the
// format version older readers know.
TEST_P(DoubleGradients, CheckpointsCarryTheGradientType) {
  const Algorithm a = GetParam();
  Exec exec;
  const auto saved = make_double(a);
  for (std::int64_t call = 1; call <= 3; ++call) {
    DoubleVector out("test::out", kN);
    saved->reduce(exec, to_device(gradient(world_rank(), call, kN), "test::grad"), out);
  }
  std::ostringstream blob;
  saved->save_state(exec, blob);

  const auto restored = make_double(a);
  std::istringstream in(blob.str());
  restored->restore_state(exec, in);
  const DoubleVector g = to_device(gradient(world_rank(), 4, kN), "test::grad");
  DoubleVector expected_out("test::expected_out", kN);
  DoubleVector out("test::out", kN);
  saved->reduce(exec, g, expected_out);
  restored->reduce(exec, g, out);
  const std::vector<double> e = to_host(expected_out);
  const std::vector<double> o = to_host(out);
  std::int64_t differ = 0;
  for (std::size_t j = 0; j < o.size(); ++j) differ += same_bits(o[j], e[j]) ? 0 : 1;
  EXPECT_EQ(differ, 0);

  const auto as_float = oktopk::make_sparse_allreduce<Exec, float>(
      Exec(), a, oktopk::Communicator(), kN, options_for(a));
  const std::string message = expect_invalid_argument(
      [&] {
        std::istringstream is(blob.str());
        as_float->restore_state(exec, is);
      },
      "oktopk::SparseAllreduce::restore_state: rank 0: checkpoint was written by a handle for "
      "float64 gradients, this handle takes float32");

  std::ostringstream float_blob;
  as_float->save_state(exec, float_blob);
  std::uint32_t version = 0;
  std::memcpy(&version, float_blob.str().data() + 8, sizeof version);
  EXPECT_EQ(version, 1u) << "a float handle without a layout writes format version 1";
  expect_invalid_argument(
      [&] {
        std::istringstream is(float_blob.str());
        restored->restore_state(exec, is);
      },
      "oktopk::SparseAllreduce::restore_state: rank 0: checkpoint was written by a handle for "
      "float32 gradients, this handle takes float64");
}

INSTANTIATE_TEST_SUITE_P(AllMethods, DoubleGradients,
                         ::testing::ValuesIn(std::vector<Algorithm>(oktopk::all_algorithms.begin(),
                                                                    oktopk::all_algorithms.end())),
                         algorithm_name);

// TopkDSA allgathers its reduced regions sparse or dense, whichever moves fewer bytes: for
// doubles 12 bytes an entry against 8 a dense element. Both ways match the oracle in double.
TEST(ValueTypes, TopkDsaSwitchesByDoubleBytes) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks";
  Exec exec;
  bool seen_sparse = false;
  bool seen_dense = false;
  for (const double density : {0.05, 0.5, 0.9}) {
    const auto h = oktopk::make_sparse_allreduce<Exec, double>(
        exec, Algorithm::TopkDSA, oktopk::Communicator(), kN,
        Options{}.set_density(density).set_warmup_iterations(0));
    const std::vector<double> grad = gradient(world_rank(), 1, kN);
    DoubleVector out("test::out", kN);
    h->reduce(exec, to_device(grad, "test::grad"), out);
    const DoubleVector acc = to_device(grad, "test::acc");
    DoubleVector expected("test::expected", kN);
    DoubleVector slack("test::slack", kN);
    oktopk::expected_result(exec, *h, acc, expected, kTolerance, slack);
    EXPECT_EQ(oktopk::count_mismatches(exec, *h, expected, out, kTolerance, slack), 0)
        << "density " << density;
    const std::int64_t total = h->stats().global_selected;
    EXPECT_EQ(h->stats().dense_switch, !(12 * total < 8 * kN)) << "density " << density;
    seen_sparse = seen_sparse || !h->stats().dense_switch;
    seen_dense = seen_dense || h->stats().dense_switch;
  }
  EXPECT_TRUE(seen_sparse && seen_dense);
}

// Ranks that make handles for different gradient types all learn of it, instead of mixing
// floats and doubles on the wire.
TEST(ValueTypes, FactoryRefusesMixedTypesOnEveryRank) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks";
  const oktopk::Communicator comm;
  const std::string message = expect_invalid_argument(
      [&] {
        if (world_rank() == 0) {
          oktopk::make_sparse_allreduce<Exec, double>(Exec(), Algorithm::OkTopk, comm, 100);
        } else {
          oktopk::make_sparse_allreduce<Exec, float>(Exec(), Algorithm::OkTopk, comm, 100);
        }
      },
      "oktopk::make_sparse_allreduce: ");
  EXPECT_NE(message.find("gradient type"), std::string::npos) << message;
}

// ---- Double gradients on a float32 wire (wire=fp32): values sent as floats, sums in double.

const std::vector<Algorithm> kFloat32WireMethods(oktopk::all_algorithms.begin(),
                                                 oktopk::all_algorithms.end());

std::unique_ptr<DoubleHandle> make_fp32_wire(Algorithm a, std::int64_t warmup = 1,
                                             std::int64_t n = kN) {
  Options o = options_for(a);
  o.set_wire(oktopk::Wire::Float32).set_warmup_iterations(warmup);
  return oktopk::make_sparse_allreduce<Exec, double>(Exec(), a, oktopk::Communicator(), n, o);
}

/// Every rank's `mine`, rank after rank.
std::vector<double> gather_doubles(const std::vector<double>& mine) {
  std::vector<double> all(mine.size() * static_cast<std::size_t>(world_size()));
  EXPECT_EQ(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, all.data(),
                          static_cast<int>(mine.size()), MPI_DOUBLE, MPI_COMM_WORLD),
            MPI_SUCCESS);
  return all;
}

std::vector<double> sum_doubles(const std::vector<double>& mine) {
  std::vector<double> sum(mine.size());
  EXPECT_EQ(MPI_Allreduce(mine.data(), sum.data(), static_cast<int>(mine.size()), MPI_DOUBLE,
                          MPI_SUM, MPI_COMM_WORLD),
            MPI_SUCCESS);
  return sum;
}

double through_float(double x) { return static_cast<double>(static_cast<float>(x)); }

/// The ring on a float wire, on the host: chunk c starts at rank c + 1 (and ends at rank c) with
/// its input rounded to float; each next rank adds its own rounded input in double and rounds the
/// partial sum to float as it sends it on; the last adds, divides by P, and rounds the average to
/// float.
std::vector<double> simulate_float_ring(const std::vector<double>& all, std::size_t n) {
  const int P = world_size();
  std::vector<double> out(n);
  for (int c = 0; c < P; ++c) {
    const auto begin =
        static_cast<std::size_t>(static_cast<std::int64_t>(c) * static_cast<std::int64_t>(n) / P);
    const auto end = static_cast<std::size_t>(static_cast<std::int64_t>(c + 1) *
                                              static_cast<std::int64_t>(n) / P);
    for (std::size_t j = begin; j < end; ++j) {
      const auto input = [&](int r) {
        return through_float(all[static_cast<std::size_t>(r % P) * n + j]);
      };
      if (P == 1) {
        out[j] = input(0);
        continue;
      }
      double partial = input(c + 1);
      for (int step = 1; step < P - 1; ++step)
        partial = through_float(input(c + 1 + step) + partial);
      out[j] = through_float((input(c + P) + partial) / P);
    }
  }
  return out;
}

// The dense allreduce of double gradients on a float wire runs the ring (MPI's float sums
// would not be formed in double), whatever dense_allreduce says: bit for bit the host's
// simulation, with half the bytes of the double ring.
TEST(Float32Wire, DenseIsTheFloatRingSimulatedOnTheHost) {
  Exec exec;
  const int P = world_size();
  for (const auto ring : {oktopk::DenseAlgorithm::Mpi, oktopk::DenseAlgorithm::Ring}) {
    for (const std::int64_t n : std::vector<std::int64_t>{0, 1, std::max(1, P - 1), P + 1, kN}) {
      std::ostringstream name;
      name << "dense_allreduce=" << ring << " n = " << n;
      SCOPED_TRACE(name.str());
      const auto options = Options{}.set_dense_allreduce(ring);
      const auto narrow = oktopk::make_sparse_allreduce<Exec, double>(
          exec, Algorithm::Dense, oktopk::Communicator(), n,
          Options(options).set_wire(oktopk::Wire::Float32));
      const auto wide = oktopk::make_sparse_allreduce<Exec, double>(
          exec, Algorithm::Dense, oktopk::Communicator(), n,
          Options(options).set_dense_allreduce(oktopk::DenseAlgorithm::Ring));
      for (std::int64_t call = 1; call <= 2; ++call) {
        const std::vector<double> grad = gradient(world_rank(), call, n);
        DoubleVector out("test::out", static_cast<std::size_t>(n));
        DoubleVector wide_out("test::wide_out", static_cast<std::size_t>(n));
        narrow->reduce(exec, to_device(grad, "test::grad"), out);
        wide->reduce(exec, to_device(grad, "test::grad"), wide_out);
        const std::vector<double> expected =
            simulate_float_ring(gather_doubles(grad), static_cast<std::size_t>(n));
        const std::vector<double> o = to_host(out);
        std::int64_t differ = 0;
        for (std::size_t j = 0; j < o.size(); ++j) differ += same_bits(o[j], expected[j]) ? 0 : 1;
        EXPECT_EQ(differ, 0) << "call " << call;
        const auto bytes = [](const DoubleHandle& h) {
          return h.stats().phases.at("dense_allreduce").traffic.bytes_sent;
        };
        EXPECT_EQ(2 * bytes(*narrow), bytes(*wide)) << "call " << call;
      }
    }
  }
}

// Every call of every method on the float wire matches the oracle at 1e-12 on every rank: the
// slack it derives for the wire's roundings (2^-24 each) holds the result. The wire does round:
// the method's own first call (after the warm-up, which leaves no residual) gives outputs that
// differ from a double wire's.
TEST(Float32Wire, EveryCallMatchesTheOracle) {
  Exec exec;
  for (const Algorithm a : kFloat32WireMethods) {
    SCOPED_TRACE(oktopk::to_string(a));
    const auto h = make_fp32_wire(a);
    const auto wide = make_double(a);
    std::int64_t rounded = 0;
    for (std::int64_t call = 1; call <= 5; ++call) {
      const std::vector<double> grad = gradient(world_rank(), call, kN);
      const std::vector<double> residual_before = to_host(h->residual());
      std::vector<double> acc(grad.size());
      for (std::size_t j = 0; j < grad.size(); ++j) acc[j] = residual_before[j] + grad[j];
      DoubleVector out("test::out", kN);
      DoubleVector wide_out("test::wide_out", kN);
      h->reduce(exec, to_device(grad, "test::grad"), out);
      wide->reduce(exec, to_device(grad, "test::grad"), wide_out);
      const DoubleVector acc_device = to_device(acc, "test::acc");
      DoubleVector expected("test::expected", kN);
      DoubleVector slack("test::slack", kN);
      oktopk::expected_result(exec, *h, acc_device, expected, kTolerance, slack);
      EXPECT_EQ(oktopk::count_mismatches(exec, *h, expected, out, kTolerance, slack), 0)
          << "call " << call;
      if (call == 2) {
        // Same inputs and no residual: any difference is the wire's.
        const std::vector<double> o = to_host(out);
        const std::vector<double> w = to_host(wide_out);
        for (std::size_t j = 0; j < o.size(); ++j) rounded += o[j] != w[j] ? 1 : 0;
      }
    }
    EXPECT_GT(rounded, 0) << "the float wire changed no output";
  }
}

// Over calls, P·(sum of the outputs) + (sum over ranks of the final residual) = the sum of every
// rank's gradients, to double rounding: each value's rounding to float stays in its sender's
// residual. Without that feedback the sums would differ by about 2^-25 of the values. (Dense
// keeps no residual; gTopk's tree and S2's sketch do not account for every input on any wire.)
TEST(Float32Wire, ErrorFeedbackKeepsEveryRoundingError) {
  Exec exec;
  const int P = world_size();
  for (const Algorithm a : kFloat32WireMethods) {
    if (a == Algorithm::Dense || a == Algorithm::GTopk || a == Algorithm::S2Reducer) continue;
    SCOPED_TRACE(oktopk::to_string(a));
    const auto h = make_fp32_wire(a, 0);
    std::vector<double> inputs(kN, 0.0);
    std::vector<double> outputs(kN, 0.0);
    std::vector<double> magnitudes(kN, 0.0);
    for (std::int64_t call = 1; call <= 8; ++call) {
      const std::vector<double> grad = gradient(world_rank(), call, kN);
      DoubleVector out("test::out", kN);
      h->reduce(exec, to_device(grad, "test::grad"), out);
      const std::vector<double> o = to_host(out);
      const std::vector<double> all = sum_doubles(grad);
      const std::vector<double> all_magnitudes = [&] {
        std::vector<double> m(grad.size());
        for (std::size_t j = 0; j < grad.size(); ++j) m[j] = std::fabs(grad[j]);
        return sum_doubles(m);
      }();
      for (std::size_t j = 0; j < all.size(); ++j) {
        inputs[j] += all[j];
        outputs[j] += o[j] * P;
        magnitudes[j] += all_magnitudes[j] + std::fabs(o[j]) * P;
      }
    }
    const std::vector<double> residuals = sum_doubles(to_host(h->residual()));
    std::int64_t bad = 0;
    double worst = 0.0;
    for (std::size_t j = 0; j < inputs.size(); ++j) {
      const double bound = 64.0 * (P + 8) * 0x1p-53 * (magnitudes[j] + std::fabs(residuals[j]));
      const double error = std::fabs(outputs[j] + residuals[j] - inputs[j]);
      worst = std::max(worst, error);
      bad += error > bound ? 1 : 0;
    }
    EXPECT_EQ(bad, 0) << "largest difference " << worst;
  }
}

// Same gradient, same selection: a float value (an S2 sketch cell) on the wire takes 4 bytes
// against 8, so the sparse methods move at most 0.7 of a double wire's bytes over all ranks
// (indices stay 4 bytes; counts, thresholds and S2's bitmap are the same on both), at n large
// enough for the values to count.
TEST(Float32Wire, FloatValuesCutTheBytes) {
  if (world_size() < 2) GTEST_SKIP() << "nothing is sent at P = 1";
  Exec exec;
  constexpr std::int64_t n = 40000;
  for (const Algorithm a : kFloat32WireMethods) {
    if (a == Algorithm::Dense) continue;
    SCOPED_TRACE(oktopk::to_string(a));
    const auto narrow = make_fp32_wire(a, 0, n);
    const auto wide = oktopk::make_sparse_allreduce<Exec, double>(
        exec, a, oktopk::Communicator(), n, Options(options_for(a)).set_warmup_iterations(0));
    const DoubleVector g = to_device(gradient(world_rank(), 1, n), "test::grad");
    DoubleVector out("test::out", n);
    narrow->reduce(exec, g, out);
    wide->reduce(exec, g, out);
    ASSERT_EQ(narrow->stats().local_selected, wide->stats().local_selected);
    const std::vector<double> sent =
        sum_doubles({static_cast<double>(narrow->stats().total_traffic().bytes_sent),
                     static_cast<double>(wide->stats().total_traffic().bytes_sent)});
    EXPECT_GT(sent[0], 0.0);
    EXPECT_LE(sent[0], 0.7 * sent[1]) << sent[0] << " bytes against " << sent[1];
  }
}

// A value beyond float's range (3.4e38) cannot be sent as a float: the dense call refuses a sum
// that overflows, the sparse call a value that rounds to Inf (S2: the sketch cell that holds it,
// found by the rank that finishes that cell), on every rank and naming float's range, and the
// handle stays as it was (call count, residual).
TEST(Float32Wire, ValuesBeyondFloatRangeAreRefusedOnEveryRank) {
  Exec exec;
  const int P = world_size();
  for (const Algorithm a :
       {Algorithm::Dense, Algorithm::TopkA, Algorithm::GTopk, Algorithm::S2Reducer}) {
    SCOPED_TRACE(oktopk::to_string(a));
    // S2 with error feedback, so that it has a residual to keep.
    Options o = options_for(a);
    o.set_wire(oktopk::Wire::Float32).set_warmup_iterations(0).set_s2_error_feedback(true);
    const auto h =
        oktopk::make_sparse_allreduce<Exec, double>(exec, a, oktopk::Communicator(), kN, o);
    DoubleVector out("test::out", kN);
    h->reduce(exec, to_device(gradient(world_rank(), 1, kN), "test::grad"), out);
    const std::vector<double> residual_before = to_host(h->residual());
    std::vector<double> huge = gradient(world_rank(), 2, kN);
    if (world_rank() == P - 1) huge[kN / 2] = 1e300;  // the largest: TopkA selects it
    const std::string message =
        expect_invalid_argument([&] { h->reduce(exec, to_device(huge, "test::grad"), out); },
                                "oktopk::SparseAllreduce::reduce: ");
    const std::string expected =
        a == Algorithm::Dense ? "with float32 on the wire, every value and partial sum sent must "
                                "stay within float's 3.4e38"
        : a == Algorithm::S2Reducer
            ? "values sent as fp32 round to Inf beyond float's 3.4e38 on rank "
            : "values sent as fp32 round to Inf beyond float's 3.4e38 on rank " +
                  std::to_string(P - 1);
    EXPECT_NE(message.find(expected), std::string::npos) << message;
    EXPECT_EQ(h->stats().iteration, 1);
    const std::vector<double> residual_after = to_host(h->residual());
    std::int64_t moved = 0;
    for (std::size_t j = 0; j < residual_after.size(); ++j)
      moved += same_bits(residual_after[j], residual_before[j]) ? 0 : 1;
    EXPECT_EQ(moved, 0) << "residual entries changed by the refused call";
  }
}

TEST(ValueTypes, WiresADoubleDoesNotTakeAreRefused) {
  const oktopk::Communicator comm;
  expect_invalid_argument(
      [&] {
        oktopk::make_sparse_allreduce<Exec, double>(Exec(), Algorithm::Dense, comm, 100,
                                                    Options{}.set_wire(oktopk::Wire::BFloat16));
      },
      "oktopk::make_sparse_allreduce: wire=bf16 does not apply to float64 gradients, which take "
      "wire=native or wire=fp32");
  expect_invalid_argument(
      [&] {
        oktopk::make_sparse_allreduce<Exec, double>(Exec(), Algorithm::GTopk, comm, 100,
                                                    Options{}.set_wire(oktopk::Wire::Float16));
      },
      "oktopk::make_sparse_allreduce: wire=fp16 does not apply to float64 gradients, which take "
      "wire=native or wire=fp32");
}

}  // namespace
