// SPDX-License-Identifier: BSD-3-Clause
// How a process chooses between device pointers and host copies for MPI
// (oktopk/gpu_aware_mpi.hpp), from every input the choice depends on; no MPI call.
#include <oktopk/impl/comm/gpu_aware_mpi_choice.hpp>

#include <gtest/gtest.h>

#include <string>

namespace {

using oktopk::impl::decide_gpu_aware_mpi;
using oktopk::impl::GpuAwareMpiInputs;
using oktopk::impl::GpuAwareness;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A GPU build on an MPI whose query answers `query`.
GpuAwareMpiInputs gpu_build(const char* setting, GpuAwareness query) {
  GpuAwareMpiInputs inputs;
  inputs.setting = setting;
  inputs.gpu_backend = true;
  inputs.query = query;
  inputs.query_how = query == GpuAwareness::Unknown
                         ? "this MPI offers no query for GPU support"
                         : std::string("MPIX_Query_cuda_support() returned ") +
                               (query == GpuAwareness::Yes ? "1" : "0");
  return inputs;
}

TEST(GpuAwareMpi, AutoFollowsTheQuery) {
  const auto yes = decide_gpu_aware_mpi(gpu_build("auto", GpuAwareness::Yes));
  EXPECT_TRUE(yes.device_pointers);
  EXPECT_EQ(yes.setting, "auto");
  EXPECT_TRUE(yes.error.empty());
  EXPECT_TRUE(contains(yes.reason, "MPIX_Query_cuda_support() returned 1")) << yes.reason;
  const auto no = decide_gpu_aware_mpi(gpu_build("auto", GpuAwareness::No));
  EXPECT_FALSE(no.device_pointers);
  EXPECT_TRUE(contains(no.reason, "returned 0: host copies")) << no.reason;
}

TEST(GpuAwareMpi, OnAndOffOverrideTheQuery) {
  // Some CUDA-aware Open MPI builds (UCX's CUDA support only) answer 0: `on` still hands
  // device pointers, and says what the query answered.
  const auto on = decide_gpu_aware_mpi(gpu_build("on", GpuAwareness::No));
  EXPECT_TRUE(on.device_pointers);
  EXPECT_TRUE(contains(on.reason, "OKTOPK_GPU_AWARE_MPI=on: device pointers")) << on.reason;
  EXPECT_TRUE(contains(on.reason, "returned 0")) << on.reason;
  const auto off = decide_gpu_aware_mpi(gpu_build("off", GpuAwareness::Yes));
  EXPECT_FALSE(off.device_pointers);
  EXPECT_TRUE(contains(off.reason, "OKTOPK_GPU_AWARE_MPI=off: host copies")) << off.reason;
}

TEST(GpuAwareMpi, WithoutAQueryTheMpisOwnVariableDecides) {
  auto inputs = gpu_build("auto", GpuAwareness::Unknown);
  inputs.support_variable = "MPICH_GPU_SUPPORT_ENABLED";
  inputs.support_value = "1";
  const auto enabled = decide_gpu_aware_mpi(inputs);
  EXPECT_TRUE(enabled.device_pointers);
  EXPECT_TRUE(contains(enabled.reason, "MPICH_GPU_SUPPORT_ENABLED=1: device pointers"))
      << enabled.reason;
  inputs.support_value = "0";
  EXPECT_FALSE(decide_gpu_aware_mpi(inputs).device_pointers);
  inputs.support_value = nullptr;
  const auto unset = decide_gpu_aware_mpi(inputs);
  EXPECT_FALSE(unset.device_pointers);
  EXPECT_TRUE(contains(unset.reason, "MPICH_GPU_SUPPORT_ENABLED is unset: host copies"))
      << unset.reason;
  EXPECT_TRUE(contains(unset.reason, "OKTOPK_GPU_AWARE_MPI=on if")) << unset.reason;
  // A query's answer wins over the variable.
  auto answered = gpu_build("auto", GpuAwareness::No);
  answered.support_variable = "MPICH_GPU_SUPPORT_ENABLED";
  answered.support_value = "1";
  EXPECT_FALSE(decide_gpu_aware_mpi(answered).device_pointers);
  // An MPI with neither: host copies, and the reason says how to turn them off.
  const auto neither = decide_gpu_aware_mpi(gpu_build("auto", GpuAwareness::Unknown));
  EXPECT_FALSE(neither.device_pointers);
  EXPECT_TRUE(contains(neither.reason, "no query for GPU support: host copies")) << neither.reason;
}

TEST(GpuAwareMpi, UnsetOrEmptyTakesTheBuildsDefault) {
  for (const char* setting : {static_cast<const char*>(nullptr), ""}) {
    auto inputs = gpu_build(setting, GpuAwareness::No);
    inputs.build_default = "on";
    const auto choice = decide_gpu_aware_mpi(inputs);
    EXPECT_TRUE(choice.device_pointers);
    EXPECT_EQ(choice.setting, "on");
    EXPECT_TRUE(contains(choice.reason, "unset, the build's default on")) << choice.reason;
  }
}

TEST(GpuAwareMpi, WordsAreCaseInsensitiveAndOthersAreErrors) {
  EXPECT_TRUE(decide_gpu_aware_mpi(gpu_build("ON", GpuAwareness::No)).device_pointers);
  EXPECT_EQ(decide_gpu_aware_mpi(gpu_build("Auto", GpuAwareness::Yes)).setting, "auto");
  for (const char* bad : {"1", "yes", "of", "auto "}) {
    const auto choice = decide_gpu_aware_mpi(gpu_build(bad, GpuAwareness::Yes));
    EXPECT_FALSE(choice.device_pointers) << bad;
    EXPECT_EQ(choice.error,
              std::string("OKTOPK_GPU_AWARE_MPI is '") + bad + "', not on, off or auto");
  }
  // Also in a build without a GPU, where the choice changes nothing: a typo is still reported.
  GpuAwareMpiInputs host;
  host.setting = "maybe";
  EXPECT_FALSE(decide_gpu_aware_mpi(host).error.empty());
}

TEST(GpuAwareMpi, WithoutAGpuBackendHostMemoryGoesAsItIs) {
  GpuAwareMpiInputs host;
  host.setting = "on";
  const auto choice = decide_gpu_aware_mpi(host);
  EXPECT_FALSE(choice.device_pointers);
  EXPECT_TRUE(choice.error.empty());
  EXPECT_TRUE(contains(choice.reason, "no GPU backend")) << choice.reason;
}

}  // namespace
