// SPDX-License-Identifier: BSD-3-Clause
// reduce_sparse: for every method, the sparse result of a handle fed the same gradients as a
// twin handle that calls reduce() is that twin's dense output (same entries, same bits), with
// the same residual and statistics, on warm-up and reused-threshold calls alike; it passes the
// method's oracle; its Views are reused and grown; per-segment statistics count its entries;
// bad input is rejected on every rank with the handle unchanged.
#include "mpi/method_checks.hpp"

#include <oktopk/any_space.hpp>
#include <oktopk/layout.hpp>

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace oktopk::test;  // NOLINT(google-build-using-namespace)
using oktopk::Algorithm;
using oktopk::Options;
using Result = oktopk::SparseResult<Handle::memory_space>;

std::string algorithm_name(const ::testing::TestParamInfo<Algorithm>& info) {
  return oktopk::to_string(info.param);
}

/// Entries where the outputs differ: bits, but a zero of either sign equals a zero (a dense
/// output may hold -0.0 where the sparse result holds no entry).
std::int64_t differing_entries(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  std::int64_t differ = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const bool both_zero = a[i] == 0.0f && b[i] == 0.0f;
    if (!both_zero && bits_of(a[i]) != bits_of(b[i])) ++differ;
  }
  return differ;
}

std::int64_t differing_bits(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  std::int64_t differ = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (bits_of(a[i]) != bits_of(b[i])) ++differ;
  }
  return differ;
}

class SparseResultOf : public ::testing::TestWithParam<Algorithm> {};

INSTANTIATE_TEST_SUITE_P(All, SparseResultOf, ::testing::ValuesIn(oktopk::all_algorithms),
                         algorithm_name);

TEST_P(SparseResultOf, IsTheDenseOutputOfATwinHandle) {
  const Algorithm a = GetParam();
  const std::int64_t n = 3001;
  // One dense warm-up call, then the method's own; Ok-Topk reuses thresholds from its second.
  for (const Options& options :
       {Options{}.set_density(0.02).set_warmup_iterations(1),
        Options{}.set_density(0.02).set_dense_allreduce(oktopk::DenseAlgorithm::Ring)}) {
    std::ostringstream described;
    described << options;
    SCOPED_TRACE(described.str());
    Runner dense(a, n, options, Output::Dense);
    Runner sparse(a, n, options, Output::Sparse);
    for (const Dist d : {Dist::Uniform, Dist::Heavy, Dist::Correlated, Dist::Rows, Dist::Ties}) {
      for (int call = 0; call < 3; ++call) {
        SCOPED_TRACE(std::string(name_of(d)) + " call " + std::to_string(sparse.calls() + 1));
        const auto grad = make_gradient(d, 11, world_rank(), sparse.calls(), n);
        const Call cd = dense.reduce(grad);
        const Call cs = sparse.reduce(grad);
        check_call(sparse, cs);
        EXPECT_EQ(differing_entries(cs.out, cd.out), 0) << "sparse result differs from reduce()";
        EXPECT_EQ(differing_bits(cs.residual_after, cd.residual_after), 0)
            << "residual differs from reduce()'s";
        EXPECT_EQ(cs.stats.global_selected, cd.stats.global_selected);
        EXPECT_EQ(cs.stats.local_selected, cd.stats.local_selected);
        EXPECT_EQ(bits_of(cs.stats.global_threshold), bits_of(cd.stats.global_threshold));
        EXPECT_EQ(cs.stats.dense, cd.stats.dense);
        if (a == Algorithm::OkTopk && !cs.stats.dense) {
          // Written straight from the gather: one entry per gathered entry.
          EXPECT_EQ(sparse.sparse().size, cs.stats.global_selected);
        }
      }
    }
  }
}

TEST_P(SparseResultOf, CountsItsEntriesPerSegment) {
  const Algorithm a = GetParam();
  oktopk::Layout layout;
  layout.append_dense(700, "head").append_sparse_rows(1600, 64, "rows").append_dense(701, "tail");
  const std::int64_t n = 3001;
  const Options options = Options{}.set_density(0.05);
  auto dense = oktopk::make_sparse_allreduce<Exec>(a, oktopk::Communicator(), n, options, layout);
  auto sparse = oktopk::make_sparse_allreduce<Exec>(a, oktopk::Communicator(), n, options, layout);
  Exec exec;
  Vector out("test::out", n);
  Result result;
  for (int call = 0; call < 4; ++call) {
    SCOPED_TRACE("call " + std::to_string(call + 1));
    const Vector g = to_device(make_gradient(Dist::Rows, 5, world_rank(), call, n));
    dense->reduce(exec, g, out);
    sparse->reduce_sparse(exec, g, result);
    exec.fence();
    const auto& ds = dense->stats().segments;
    const auto& ss = sparse->stats().segments;
    ASSERT_EQ(ss.size(), 3u);
    ASSERT_EQ(ds.size(), 3u);
    std::int64_t total = 0;
    for (std::size_t s = 0; s < 3; ++s) {
      EXPECT_EQ(ss[s].name, ds[s].name);
      EXPECT_EQ(ss[s].nonzeros, ds[s].nonzeros) << ss[s].name;
      total += ss[s].nonzeros;
    }
    EXPECT_EQ(total, result.size);
  }
}

TEST(SparseResult, ReusesAndGrowsItsViews) {
  const std::int64_t n = 4000;
  auto h = oktopk::make_sparse_allreduce<Exec>(Algorithm::OkTopk, oktopk::Communicator(), n,
                                               Options{}.set_density(0.05));
  Exec exec;
  // Too short or empty: grown, keeping the caller's label or taking the library's.
  Result result;
  result.values = decltype(result.values)("test::values", 3);
  h->reduce_sparse(exec, to_device(make_gradient(Dist::Uniform, 3, world_rank(), 0, n)), result);
  exec.fence();
  ASSERT_GE(result.size, 4);
  EXPECT_GE(static_cast<std::int64_t>(result.values.extent(0)), result.size);
  EXPECT_EQ(result.values.label(), "test::values");
  EXPECT_EQ(result.indices.label(), "oktopk::SparseResult::indices");
  // Long enough: the same memory, the new result.
  Result roomy;
  roomy.indices = decltype(roomy.indices)("test::indices", n);
  roomy.values = decltype(roomy.values)("test::values", n);
  const auto* const indices_before = roomy.indices.data();
  const auto* const values_before = roomy.values.data();
  h->reduce_sparse(exec, to_device(make_gradient(Dist::Heavy, 3, world_rank(), 1, n)), roomy);
  exec.fence();
  EXPECT_EQ(roomy.indices.data(), indices_before);
  EXPECT_EQ(roomy.values.data(), values_before);
  // result() hands back the last call's result.
  const Result last = h->result(exec);
  EXPECT_EQ(last.size, roomy.size);
  EXPECT_EQ(last.indices.data(), roomy.indices.data());
}

TEST(SparseResult, AsynchronousCallsRunInLaunchOrder) {
  const std::int64_t n = 2500;
  const Options options = Options{}.set_density(0.03);
  Runner dense(Algorithm::OkTopk, n, options, Output::Dense);
  auto h =
      oktopk::make_sparse_allreduce<Exec>(Algorithm::OkTopk, oktopk::Communicator(), n, options);
  Exec exec;
  std::vector<Vector> grads;
  std::vector<Result> results(3);
  std::vector<oktopk::ReduceRequest> requests;
  for (int call = 0; call < 3; ++call) {
    grads.push_back(to_device(make_gradient(Dist::Correlated, 9, world_rank(), call, n)));
  }
  for (int call = 0; call < 3; ++call) {
    requests.push_back(h->reduce_sparse_async(exec, grads[call], results[call]));
  }
  for (auto& r : requests) r.wait();
  for (int call = 0; call < 3; ++call) {
    SCOPED_TRACE("call " + std::to_string(call + 1));
    const Call cd = dense.reduce(make_gradient(Dist::Correlated, 9, world_rank(), call, n));
    const auto size = static_cast<std::size_t>(results[call].size);
    const auto idx = to_host<oktopk::index_type>(results[call].indices, size);
    const auto val = to_host<float>(results[call].values, size);
    std::vector<float> out(static_cast<std::size_t>(n), 0.0f);
    for (std::size_t e = 0; e < size; ++e) out[static_cast<std::size_t>(idx[e])] = val[e];
    EXPECT_EQ(differing_entries(out, cd.out), 0);
  }
}

TEST_P(SparseResultOf, RejectsBadInputOnEveryRankAndStaysUsable) {
  const Algorithm a = GetParam();
  const std::int64_t n = 1200;
  const int P = world_size();
  const int me = world_rank();
  Runner twin(a, n, Options{}.set_density(0.05), Output::Dense);
  auto h = oktopk::make_sparse_allreduce<Exec>(a, oktopk::Communicator(), n,
                                               Options{}.set_density(0.05));
  Exec exec;
  Result result;
  const int culprit = P - 1;
  // A wrong length on one rank.
  const Vector wrong =
      to_device(std::vector<float>(static_cast<std::size_t>(me == culprit ? n - 1 : n), 0.5f));
  const std::string length_error =
      invalid_argument_of([&] { h->reduce_sparse(exec, wrong, result); });
  EXPECT_TRUE(starts_with(length_error, "oktopk::SparseAllreduce::reduce_sparse: "))
      << length_error;
  EXPECT_NE(length_error.find("grad must have length " + std::to_string(n)), std::string::npos)
      << length_error;
  EXPECT_NE(length_error.find("rank " + std::to_string(culprit)), std::string::npos)
      << length_error;
  // The same on every rank up to what the culprit passed, which only it knows.
  EXPECT_TRUE(same_text_on_all_ranks(length_error.substr(0, length_error.find(" passed "))));
  // A NaN on one rank.
  std::vector<float> bad = make_gradient(Dist::Uniform, 2, me, 0, n);
  if (me == culprit) bad[17] = std::numeric_limits<float>::quiet_NaN();
  const std::string nan_error =
      invalid_argument_of([&] { h->reduce_sparse(exec, to_device(bad), result); });
  EXPECT_TRUE(starts_with(nan_error, "oktopk::SparseAllreduce::reduce_sparse: ")) << nan_error;
  EXPECT_NE(nan_error.find("NaN or Inf on rank " + std::to_string(culprit)), std::string::npos)
      << nan_error;
  // reduce_sparse on one rank, reduce on the others: the calls end in different collectives.
  if (P > 1) {
    const Vector mixed_grad = to_device(make_gradient(Dist::Uniform, 3, me, 0, n));
    const std::string mixed_error = invalid_argument_of([&] {
      if (me == culprit) {
        h->reduce_sparse(exec, mixed_grad, result);
      } else {
        Vector mixed_out("test::out", n);
        h->reduce(exec, mixed_grad, mixed_out);
      }
    });
    const std::string what = "reduce on some ranks and reduce_sparse on others";
    EXPECT_NE(mixed_error.find(what), std::string::npos) << mixed_error;
    EXPECT_TRUE(same_text_on_all_ranks(mixed_error.substr(mixed_error.find(what))));
  }
  EXPECT_EQ(h->stats().iteration, 0);
  // Unchanged: the next call is the twin's first.
  const auto grad = make_gradient(Dist::Heavy, 2, me, 0, n);
  const Call cd = twin.reduce(grad);
  h->reduce_sparse(exec, to_device(grad), result);
  exec.fence();
  std::vector<float> out(static_cast<std::size_t>(n), 0.0f);
  const auto size = static_cast<std::size_t>(result.size);
  const auto idx = to_host<oktopk::index_type>(result.indices, size);
  const auto val = to_host<float>(result.values, size);
  for (std::size_t e = 0; e < size; ++e) out[static_cast<std::size_t>(idx[e])] = val[e];
  EXPECT_EQ(differing_entries(out, cd.out), 0);
  EXPECT_EQ(h->stats().iteration, 1);
}

}  // namespace
