// SPDX-License-Identifier: BSD-3-Clause
// make_sparse_allreduce: n and options out of range, and n, algorithm or options differing by rank.
#include "mpi/method_checks.hpp"

#include <oktopk/make_sparse_allreduce.hpp>

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

namespace {

using namespace oktopk::test;  // NOLINT(google-build-using-namespace)
using oktopk::Algorithm;
using oktopk::Options;

TEST(Factory, RejectsNOutOfRange) {
  oktopk::Communicator comm;
  for (const std::int64_t n : {std::int64_t{-1}, std::int64_t{-1000},
                               std::int64_t{std::numeric_limits<std::int32_t>::max()} + 1}) {
    SCOPED_TRACE(n);
    expect_invalid_argument([&] { oktopk::make_sparse_allreduce<Exec>(Algorithm::TopkA, comm, n); },
                            "oktopk::make_sparse_allreduce");
  }
}

TEST(Factory, RejectsInvalidOptions) {
  oktopk::Communicator comm;
  for (const Algorithm a : oktopk::all_algorithms) {
    expect_invalid_argument(
        [&] { oktopk::make_sparse_allreduce<Exec>(a, comm, 100, Options{}.set_density(1.5)); },
        "oktopk::Options::validate");
    expect_invalid_argument(
        [&] { oktopk::make_sparse_allreduce<Exec>(a, comm, 100, Options{}.set_throttle(0)); },
        "oktopk::Options::validate");
  }
}

/// Collective: every rank must throw the same invalid_argument, starting with the factory's
/// name and naming `what`; afterwards a matching call works.
template <class Make>
void expect_factory_mismatch(Make&& make, const std::string& what) {
  const std::string message = expect_invalid_argument(make, "oktopk::make_sparse_allreduce");
  EXPECT_NE(message.find(what + " differs"), std::string::npos) << message;
  EXPECT_TRUE(same_text_on_all_ranks(message))
      << "different messages on different ranks: " << message;
}

TEST(Factory, RejectsNDifferingOnOneRank) {
  if (world_size() == 1) GTEST_SKIP() << "needs two ranks to disagree";
  oktopk::Communicator comm;
  const bool odd_one = world_rank() == world_size() - 1;
  for (const Algorithm a : oktopk::all_algorithms) {
    SCOPED_TRACE(oktopk::to_string(a));
    expect_factory_mismatch(
        [&] { oktopk::make_sparse_allreduce<Exec>(a, comm, odd_one ? 101 : 100); }, "n");
  }
  EXPECT_NO_THROW(oktopk::make_sparse_allreduce<Exec>(Algorithm::Dense, comm, 100));
}

TEST(Factory, RejectsAlgorithmDifferingOnOneRank) {
  if (world_size() == 1) GTEST_SKIP() << "needs two ranks to disagree";
  oktopk::Communicator comm;
  for (std::size_t i = 0; i < oktopk::all_algorithms.size(); ++i) {
    const Algorithm mine =
        world_rank() == 0 ? oktopk::all_algorithms[i] : oktopk::all_algorithms[(i + 1) % 7];
    expect_factory_mismatch([&] { oktopk::make_sparse_allreduce<Exec>(mine, comm, 64); },
                            "algorithm");
  }
}

TEST(Factory, RejectsOptionsDifferingOnOneRank) {
  if (world_size() == 1) GTEST_SKIP() << "needs two ranks to disagree";
  oktopk::Communicator comm;
  const bool odd_one = world_rank() == world_size() / 2;
  for (const auto& [name, change] : field_changes()) {
    SCOPED_TRACE(name);
    Options o;
    if (odd_one) change(o);
    expect_factory_mismatch(
        [&] { oktopk::make_sparse_allreduce<Exec>(Algorithm::OkTopk, comm, 64, o); }, "options");
  }
  // A valid option differing on one rank is reported as a mismatch, not as invalid.
  Options o;
  if (odd_one) o.density = 0.5;
  expect_factory_mismatch(
      [&] { oktopk::make_sparse_allreduce<Exec>(Algorithm::TopkA, comm, 64, o); }, "options");
}

}  // namespace
