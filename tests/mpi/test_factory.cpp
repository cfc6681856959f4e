// SPDX-License-Identifier: BSD-3-Clause
// make_sparse_allreduce: n and options out of range, and n, algorithm or options differing by
// rank; the GPU-aware MPI setting checked and agreed on.
#include "mpi/method_checks.hpp"

#include <oktopk/any_space.hpp>
#include <oktopk/gpu_aware_mpi.hpp>
#include <oktopk/impl/comm/gpu_aware_mpi_choice.hpp>

#include <gtest/gtest.h>

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <stdexcept>
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

// OKTOPK_GPU_AWARE_MPI as this process read it: valid (also unset), every handle is made;
// another word, every handle fails on every rank, naming the variable. ctest runs this test a
// second time with OKTOPK_GPU_AWARE_MPI=maybe (factory_gpu_aware_mpi_setting_np2).
TEST(Factory, ChecksTheGpuAwareMpiSetting) {
  oktopk::Communicator comm;
  const oktopk::GpuAwareMpi& choice = oktopk::gpu_aware_mpi();
  const char* variable = std::getenv("OKTOPK_GPU_AWARE_MPI");
  const std::string setting = variable != nullptr ? variable : "";
  std::string word = setting;  // the words are case-insensitive
  for (char& c : word) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const bool valid = word.empty() || word == "on" || word == "off" || word == "auto";
  EXPECT_EQ(choice.error.empty(), valid) << choice.error;
  for (const Algorithm a : oktopk::all_algorithms) {
    SCOPED_TRACE(oktopk::to_string(a));
    if (valid) {
      EXPECT_NO_THROW(oktopk::make_sparse_allreduce<Exec>(a, comm, 64));
    } else {
      const std::string message = expect_invalid_argument(
          [&] { oktopk::make_sparse_allreduce<Exec>(a, comm, 64); },
          "oktopk::make_sparse_allreduce: rank 0: OKTOPK_GPU_AWARE_MPI is '" + setting + "'");
      EXPECT_TRUE(same_text_on_all_ranks(message)) << message;
    }
  }
}

// Each rank's choice made up, so that ranks can differ in a build without a GPU too.
oktopk::GpuAwareMpi made_up_choice(bool device_pointers, const std::string& error = {}) {
  oktopk::GpuAwareMpi choice;
  choice.setting = device_pointers ? "on" : "off";
  choice.device_pointers = device_pointers;
  choice.reason = "rank " + std::to_string(world_rank()) + "'s reason";
  choice.error = error;
  return choice;
}

TEST(Factory, GpuAwareMpiSettingMustBeValidOnEveryRank) {
  oktopk::Communicator comm;
  const int last = world_size() - 1;
  const auto choice =
      made_up_choice(false, world_rank() == last ? "OKTOPK_GPU_AWARE_MPI is 'x', not on" : "");
  for (const bool device_buffers : {false, true}) {
    const std::string message = expect_invalid_argument(
        [&] { oktopk::impl::agree_on_gpu_aware_mpi(comm, "where", choice, device_buffers); },
        "where: rank " + std::to_string(last) + ": OKTOPK_GPU_AWARE_MPI is 'x', not on");
    EXPECT_TRUE(same_text_on_all_ranks(message)) << message;
  }
}

TEST(Factory, GpuHandlesNeedTheSameGpuAwareMpiChoiceOnEveryRank) {
  oktopk::Communicator comm;
  // Alike on every rank, either way: nothing to say.
  for (const bool device_pointers : {false, true}) {
    EXPECT_NO_THROW(
        oktopk::impl::agree_on_gpu_aware_mpi(comm, "where", made_up_choice(device_pointers), true));
  }
  if (world_size() == 1) GTEST_SKIP() << "needs two ranks to disagree";
  // The middle rank alone hands device pointers: every rank names it and rank 0.
  const int odd_one = world_size() / 2;
  const auto choice = made_up_choice(world_rank() == odd_one);
  try {
    oktopk::impl::agree_on_gpu_aware_mpi(comm, "where", choice, true);
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    const std::string expected = "where: the ranks differ on handing GPU memory to MPI: rank " +
                                 std::to_string(odd_one) + " gives it device pointers (rank " +
                                 std::to_string(odd_one) +
                                 "'s reason), rank 0 host copies (rank 0's reason); set "
                                 "OKTOPK_GPU_AWARE_MPI alike on every rank";
    EXPECT_EQ(e.what(), expected);
  }
  // A handle on the host does not care how GPU memory would go.
  EXPECT_NO_THROW(oktopk::impl::agree_on_gpu_aware_mpi(comm, "where", choice, false));
}

}  // namespace
