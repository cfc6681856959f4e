// SPDX-License-Identifier: BSD-3-Clause
// Host synchronisations per reduce() call must not grow with P: on a GPU each one stalls the
// host for tens of microseconds, which at P = 256 would add milliseconds to every call.
//
// Kokkos reports every fence to the tools interface (fences the library asks for, reductions
// and scans into host scalars, deep copies without an instance), so a begin-fence callback
// counts them. One run on 8 ranks measures each method on sub-communicators of 2, 4 and 8
// ranks. Every rank holds the same gradient, so every rank takes the same branches (threshold
// corrections, balancing) whatever P is, and the counts differ only if the code does.
#include "mpi/mpi_test_utils.hpp"
#include <oktopk/any_space.hpp>

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>
#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace {

using oktopk::Algorithm;
using Exec = Kokkos::DefaultExecutionSpace;

std::atomic<std::int64_t> fences{0};

void count_fence(const char*, std::uint32_t, std::uint64_t* handle) {
  ++fences;
  *handle = 0;
}

/// Installs the counting callback for the test's lifetime.
class FenceCounter {
 public:
  FenceCounter() { Kokkos::Tools::Experimental::set_begin_fence_callback(&count_fence); }
  ~FenceCounter() { Kokkos::Tools::Experimental::set_begin_fence_callback(nullptr); }
  FenceCounter(const FenceCounter&) = delete;
  FenceCounter& operator=(const FenceCounter&) = delete;

  /// Whether this Kokkos reports fences of an execution space instance (Kokkos 3.4 does not).
  static bool reports_instance_fences() {
    const std::int64_t before = fences.load();
    oktopk::impl::fence(Exec(), "oktopk::test::probe");
    return fences.load() > before;
  }
};

/// The same deterministic gradient on every rank: multiples of 2^-10 with distinct magnitudes
/// in every 4096-entry block, changing from call to call.
Kokkos::View<float*, Exec::memory_space> gradient(std::int64_t n, int call) {
  Kokkos::View<float*, Exec::memory_space> g("oktopk::test::gradient", n);
  auto host = Kokkos::create_mirror_view(g);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t m = (i * 2654435761LL + 977LL * call) % 4093 + 1;
    host(i) = static_cast<float>((i + call) % 2 == 0 ? m : -m) / 1024.0f;
  }
  Kokkos::deep_copy(g, host);
  return g;
}

/// Fences counted in the 4th call of a handle on the first P ranks of MPI_COMM_WORLD (the
/// first three grow every buffer), the largest over those ranks, returned on every rank.
std::int64_t fences_per_call(Algorithm algorithm, int P, const oktopk::Options& options) {
  const int rank = oktopk::test::world_rank();
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank < P ? 0 : MPI_UNDEFINED, rank, &sub);
  std::int64_t counted = -1;
  if (sub != MPI_COMM_NULL) {
    {
      const std::int64_t n = 1 << 15;
      oktopk::Communicator comm(sub);
      const Exec exec;
      auto handle = oktopk::make_sparse_allreduce(exec, algorithm, comm, n, options);
      Kokkos::View<float*, Exec::memory_space> out("oktopk::test::out", n);
      constexpr int calls = 4;
      for (int call = 0; call < calls; ++call) {
        const auto grad = gradient(n, call);
        exec.fence();
        const std::int64_t before = fences.load();
        handle->reduce(exec, grad, out);
        counted = fences.load() - before;
      }
      MPI_Allreduce(MPI_IN_PLACE, &counted, 1, MPI_INT64_T, MPI_MAX, sub);
    }
    MPI_Comm_free(&sub);
  }
  MPI_Bcast(&counted, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  return counted;
}

class HostSyncs : public ::testing::Test {
 protected:
  void SetUp() override {
    if (oktopk::test::world_size() < 8) GTEST_SKIP() << "needs 8 ranks";
    if (!FenceCounter::reports_instance_fences()) {
      GTEST_SKIP() << "this Kokkos (" << KOKKOS_VERSION
                   << ") does not report instance fences to the tools interface";
    }
  }
  FenceCounter counter_;
};

struct Case {
  std::string name;
  Algorithm algorithm;
  oktopk::Options options;
};

std::vector<Case> cases() {
  using oktopk::Balancing;
  const auto base = oktopk::Options{}.set_density(0.01);
  return {
      {"dense", Algorithm::Dense, base},
      {"topka", Algorithm::TopkA, base},
      {"topkdsa", Algorithm::TopkDSA, base},
      {"gaussiank", Algorithm::GaussianK, base},
      {"s2", Algorithm::S2Reducer, base},
      // Exact thresholds every call, then reused ones (guards and nudges), with and without the
      // balancing step; call 4 is no repartition call.
      {"oktopk exact", Algorithm::OkTopk,
       oktopk::Options(base).set_threshold_period(1).set_balancing(Balancing::Off)},
      {"oktopk reused", Algorithm::OkTopk,
       oktopk::Options(base).set_threshold_period(8).set_balancing(Balancing::Off)},
      {"oktopk balanced", Algorithm::OkTopk,
       oktopk::Options(base).set_threshold_period(1).set_balancing(Balancing::On)},
  };
}

TEST_F(HostSyncs, EveryMethodButGTopkSynchronisesAsOftenAtEightRanksAsAtTwo) {
  for (const auto& c : cases()) {
    const std::int64_t at2 = fences_per_call(c.algorithm, 2, c.options);
    const std::int64_t at8 = fences_per_call(c.algorithm, 8, c.options);
    EXPECT_GT(at2, 0) << c.name;
    EXPECT_EQ(at2, at8) << c.name << ": host synchronisations per call at P = 2 and at P = 8";
  }
}

// gTopk's tree has log2(P) rounds, and each sends what the previous one computed, so the host
// must wait for the device once per round at least: its count grows with the rounds, by the
// same amount for each.
TEST_F(HostSyncs, GTopkSynchronisesAConstantNumberOfTimesPerTreeRound) {
  const auto options = oktopk::Options{}.set_density(0.01);
  const std::int64_t at2 = fences_per_call(Algorithm::GTopk, 2, options);  // 1 round
  const std::int64_t at4 = fences_per_call(Algorithm::GTopk, 4, options);  // 2 rounds
  const std::int64_t at8 = fences_per_call(Algorithm::GTopk, 8, options);  // 3 rounds
  EXPECT_GT(at4, at2);
  EXPECT_EQ(at8 - at4, at4 - at2) << "per-round synchronisations differ: " << at2 << ", " << at4
                                  << ", " << at8 << " at P = 2, 4, 8";
}

}  // namespace
