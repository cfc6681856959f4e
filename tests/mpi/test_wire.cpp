// SPDX-License-Identifier: BSD-3-Clause
// 16-bit values on the wire (Options::wire) for the dense allreduce: the ring simulated on the
// host, bit for bit; the bytes it moves; the oracle's slack for it; and overflow of float16
// (test_sparse_wire.cpp has the sparse methods').
#include "mpi/method_checks.hpp"

#include <oktopk/impl/base/half_types.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace oktopk::test;  // NOLINT(google-build-using-namespace)
using oktopk::Algorithm;
using oktopk::Options;
using oktopk::Wire;

/// Floats of every scale from 2^-30 to 2^10, both signs, some zeros: sums that round in any
/// 16-bit type, and (below 2^-14) float16's subnormals. Deterministic in (rank, call).
std::vector<float> scaled_gradient(int rank, std::int64_t call, std::int64_t n) {
  std::vector<float> g(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j) {
    const auto u = hash_key(77, 5, static_cast<std::uint64_t>(rank),
                            static_cast<std::uint64_t>(call), static_cast<std::uint64_t>(j));
    const double mantissa = 1.0 + static_cast<double>(u & 0xffffffu) * 0x1p-24;
    const int exponent = static_cast<int>((u >> 24) % 41) - 30;
    const double sign = (u >> 63) != 0 ? -1.0 : 1.0;
    g[static_cast<std::size_t>(j)] =
        (u >> 40) % 16 == 0 ? 0.0f : static_cast<float>(sign * std::ldexp(mantissa, exponent));
  }
  return g;
}

template <class W>
float through(float x) {
  return oktopk::to_float(oktopk::round_to<W>(x));
}

/// The ring with wire type W on the host, from every rank's input, each rounded to W: chunk c
/// starts at rank c + 1 and ends at rank c; each next rank adds its input in float and rounds the
/// partial sum to W as it sends it on; the last adds, divides by P, and rounds the average to W.
template <class W>
std::vector<float> simulate_ring(const std::vector<float>& all, std::size_t n) {
  const int P = world_size();
  std::vector<float> out(n);
  for (int c = 0; c < P; ++c) {
    const auto begin =
        static_cast<std::size_t>(static_cast<std::int64_t>(c) * static_cast<std::int64_t>(n) / P);
    const auto end = static_cast<std::size_t>(static_cast<std::int64_t>(c + 1) *
                                              static_cast<std::int64_t>(n) / P);
    for (std::size_t j = begin; j < end; ++j) {
      const auto input = [&](int r) {
        return through<W>(all[static_cast<std::size_t>(r % P) * n + j]);
      };
      if (P == 1) {
        out[j] = input(0);
        continue;
      }
      float partial = input(c + 1);
      for (int step = 1; step < P - 1; ++step) partial = through<W>(input(c + 1 + step) + partial);
      out[j] = through<W>((input(c + P) + partial) / static_cast<float>(P));
    }
  }
  return out;
}

struct WireCase {
  Wire wire;
  oktopk::DenseAlgorithm dense_allreduce;
};

std::string name_of(const WireCase& w) {
  std::ostringstream os;
  os << "wire=" << w.wire << " dense_allreduce=" << w.dense_allreduce;
  return os.str();
}

const WireCase kNarrowWires[] = {{Wire::BFloat16, oktopk::DenseAlgorithm::Mpi},
                                 {Wire::BFloat16, oktopk::DenseAlgorithm::Ring},
                                 {Wire::Float16, oktopk::DenseAlgorithm::Mpi},
                                 {Wire::Float16, oktopk::DenseAlgorithm::Ring}};

TEST(DenseWire, MatchesTheRingSimulatedOnTheHostBitForBit) {
  const int P = world_size();
  for (const WireCase& w : kNarrowWires) {
    SCOPED_TRACE(name_of(w));
    const Options options = Options{}.set_wire(w.wire).set_dense_allreduce(w.dense_allreduce);
    for (const std::int64_t n : std::vector<std::int64_t>{0, 1, std::max(1, P - 1), P + 1, 3001}) {
      SCOPED_TRACE("n = " + std::to_string(n));
      Runner runner(Algorithm::Dense, n, options);
      for (int call = 0; call < 3; ++call) {
        const auto grad = call == 0 ? scaled_gradient(world_rank(), call, n)
                                    : make_gradient(call == 1 ? Dist::Uniform : Dist::Heavy, 3,
                                                    world_rank(), call, n);
        const Call c = runner.reduce(grad);
        check_common(runner, c);
        const auto un = static_cast<std::size_t>(n);
        const std::vector<float> all = gather_all(grad);
        const std::vector<float> expected = w.wire == Wire::BFloat16
                                                ? simulate_ring<oktopk::bfloat16>(all, un)
                                                : simulate_ring<oktopk::float16>(all, un);
        Diff diff;
        for (std::size_t j = 0; j < un; ++j) {
          if (bits_of(expected[j]) != bits_of(c.out[j])) diff.note(j, expected[j], c.out[j]);
        }
        EXPECT_EQ(diff.count, 0) << "call " << call << ", out vs the host ring: " << diff;
        expect_ring_bytes(c, 2);
      }
    }
  }
}

TEST(DenseWire, Float32WireIsTheFloatPath) {
  // wire=fp32 on float gradients is native: the same bits as without it, by MPI or the ring.
  const std::int64_t n = 1001;
  for (const auto algorithm : {oktopk::DenseAlgorithm::Mpi, oktopk::DenseAlgorithm::Ring}) {
    Runner fp32(Algorithm::Dense, n,
                Options{}.set_wire(Wire::Float32).set_dense_allreduce(algorithm));
    Runner native(Algorithm::Dense, n, Options{}.set_dense_allreduce(algorithm));
    const auto grad = scaled_gradient(world_rank(), 0, n);
    const Call a = fp32.reduce(grad);
    const Call b = native.reduce(grad);
    std::int64_t differing = 0;
    for (std::size_t j = 0; j < a.out.size(); ++j)
      differing += bits_of(a.out[j]) != bits_of(b.out[j]);
    EXPECT_EQ(differing, 0);
    EXPECT_EQ(a.stats.total_traffic().bytes_sent, b.stats.total_traffic().bytes_sent);
  }
}

TEST(DenseWire, OracleSlackHoldsTheResultAndNoMore) {
  // expected_result's slack for a 16-bit wire admits the ring's result; an output moved by
  // twice that slack (plus the relative tolerance) is refused.
  const std::int64_t n = 2048;
  for (const WireCase& w : kNarrowWires) {
    SCOPED_TRACE(name_of(w));
    Runner runner(Algorithm::Dense, n,
                  Options{}.set_wire(w.wire).set_dense_allreduce(w.dense_allreduce));
    const auto grad = scaled_gradient(world_rank(), 4, n);
    const Call c = runner.reduce(grad);
    Exec exec;
    const Vector acc = to_device(c.acc);
    Vector expected("test::expected", static_cast<std::size_t>(n));
    Vector slack("test::slack", static_cast<std::size_t>(n));
    oktopk::expected_result(exec, runner.handle(), acc, expected, oktopk::default_oracle_tolerance,
                            slack);
    Vector out = to_device(c.out);
    EXPECT_EQ(oktopk::count_mismatches(exec, runner.handle(), expected, out,
                                       oktopk::default_oracle_tolerance, slack),
              0);
    const std::vector<float> host_slack = to_host(slack);
    const std::vector<float> host_expected = to_host(expected);
    if (world_size() > 1) {
      // The slack is the derived bound, not a blanket: at most 2(2P+2)·u_w of the magnitudes'
      // mean (first order, with room for the higher orders) plus 8P half-subnormals eta_w,
      // so a 16-bit error it admits is one that the roundings can make.
      const double u_wire = w.wire == Wire::BFloat16 ? 0x1p-8 : 0x1p-11;
      const double eta_wire = w.wire == Wire::BFloat16 ? 0x1p-134 : 0x1p-25;
      const std::vector<float> magnitudes = [&] {
        std::vector<float> m(c.acc.size());
        for (std::size_t j = 0; j < m.size(); ++j) m[j] = std::fabs(c.acc[j]);
        return sum_over_ranks(m);
      }();
      const int P = world_size();
      std::int64_t loose = 0;
      for (std::size_t j = 0; j < host_slack.size(); ++j) {
        const double limit =
            2.0 * (2.0 * P + 2.0) * u_wire * magnitudes[j] / P + 8.0 * P * eta_wire * 1.001;
        loose += host_slack[j] > limit ? 1 : 0;
      }
      EXPECT_EQ(loose, 0) << "slack beyond its first-order size";
    }
    std::vector<float> moved = c.out;
    for (std::size_t j = 0; j < moved.size(); j += 7) {
      const float allowed =
          std::max(host_slack[j], static_cast<float>(oktopk::default_oracle_tolerance) *
                                      std::fabs(host_expected[j]));
      moved[j] = host_expected[j] + 2.0f * allowed + 1e-6f;
    }
    const Vector moved_device = to_device(moved);
    EXPECT_EQ(oktopk::count_mismatches(exec, runner.handle(), expected, moved_device,
                                       oktopk::default_oracle_tolerance, slack),
              (n + 6) / 7);
  }
}

TEST(DenseWire, Float16OverflowThrowsOnEveryRankAndChangesNothing) {
  // Finite gradients whose values or sums pass float16's largest 65504 give the dense
  // overflow error on every rank, as float sums past float's range do; the handle goes on
  // as if the call had not been made.
  const int P = world_size();
  const std::int64_t n = 300;
  const Options options = Options{}.set_wire(Wire::Float16);
  Runner runner(Algorithm::Dense, n, options);
  Runner fresh(Algorithm::Dense, n, options);
  const auto g1 = make_gradient(Dist::Uniform, 8, world_rank(), 0, n);
  runner.reduce(g1);
  fresh.reduce(g1);
  Exec exec;
  Vector out("test::out", static_cast<std::size_t>(n));
  // 70000 on the last rank is out of float16's range itself; 40000 on every rank sums past it
  // in a partial sum (from P = 3 on: at P = 2 the only sum is divided before it is rounded).
  for (const float big : {70000.0f, 40000.0f}) {
    if (big < 65504.0f && P < 3) continue;
    SCOPED_TRACE("value " + std::to_string(big));
    auto bad = g1;
    if (big > 65504.0f ? world_rank() == P - 1 : true) bad[n / 3] = big;
    const Vector g = to_device(bad);
    const std::string message = expect_invalid_argument(
        [&] { runner.handle().reduce(exec, g, out); }, "oktopk::SparseAllreduce::reduce");
    EXPECT_NE(message.find("overflows"), std::string::npos) << message;
    EXPECT_NE(message.find("65504"), std::string::npos) << message;
    EXPECT_TRUE(same_text_on_all_ranks(message));
    EXPECT_EQ(runner.handle().stats().iteration, 1);
  }
  const auto g2 = make_gradient(Dist::Uniform, 8, world_rank(), 1, n);
  const Call c = runner.reduce(g2);
  const Call f = fresh.reduce(g2);
  EXPECT_EQ(c.stats.iteration, 2);
  std::int64_t differing = 0;
  for (std::size_t j = 0; j < c.out.size(); ++j)
    differing += bits_of(c.out[j]) != bits_of(f.out[j]);
  EXPECT_EQ(differing, 0) << "after rejected calls vs a fresh handle";
}

TEST(DenseWire, SparseResultHoldsTheSameEntries) {
  const std::int64_t n = 777;
  const Options options = Options{}.set_wire(Wire::BFloat16);
  Runner dense(Algorithm::Dense, n, options);
  Runner sparse(Algorithm::Dense, n, options, Output::Sparse);
  for (int call = 0; call < 2; ++call) {
    const auto grad = scaled_gradient(world_rank(), 10 + call, n);
    const Call d = dense.reduce(grad);
    const Call s = sparse.reduce(grad);
    std::int64_t differing = 0;
    for (std::size_t j = 0; j < d.out.size(); ++j)
      differing += bits_of(d.out[j]) != bits_of(s.out[j]);
    EXPECT_EQ(differing, 0) << "call " << call;
  }
}

}  // namespace
