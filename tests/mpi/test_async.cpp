// SPDX-License-Identifier: BSD-3-Clause
// SparseAllreduce::reduce_async without a progress thread: requests worked in launch order by
// test() and wait(), equal to blocking calls, and launch orders that differ between ranks
// reported on every rank. (The C interface's test runs the same with the progress thread.)
#include <oktopk/any_space.hpp>
#include <oktopk/progress.hpp>

#include "mpi/mpi_test_utils.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Vector = Kokkos::View<float*, Exec::memory_space>;
using oktopk::test::world_rank;

Vector gradient(std::int64_t n, int seed) {
  Vector g("grad", static_cast<std::size_t>(n));
  Kokkos::parallel_for(
      "fill", Kokkos::RangePolicy<Exec>(0, n), KOKKOS_LAMBDA(std::int64_t i) {
        const std::uint32_t h =
            static_cast<std::uint32_t>(i) * 2654435761u ^ static_cast<std::uint32_t>(seed) * 40503u;
        g(i) = static_cast<float>(h % 2001u) / 1000.0f - 1.0f;
      });
  Kokkos::fence();
  return g;
}

std::vector<float> to_host(const Vector& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<float>(h.data(), h.data() + h.extent(0));
}

struct Twins {
  std::unique_ptr<oktopk::SparseAllreduce<Exec>> async, blocking;
};

TEST(ReduceAsync, FourHandlesOutOfOrderEqualBlockingCalls) {
  const oktopk::Communicator comm(MPI_COMM_WORLD);
  const std::array<oktopk::Algorithm, 4> methods = {
      oktopk::Algorithm::OkTopk, oktopk::Algorithm::TopkA, oktopk::Algorithm::GTopk,
      oktopk::Algorithm::S2Reducer};
  const std::array<std::int64_t, 4> sizes = {5000, 3000, 2000, 4096};
  const auto options = oktopk::Options().set_density(0.02);
  std::vector<Twins> handles;
  for (std::size_t h = 0; h < methods.size(); ++h) {
    handles.push_back({oktopk::make_sparse_allreduce(methods[h], comm, sizes[h], options),
                       oktopk::make_sparse_allreduce(methods[h], comm, sizes[h], options)});
  }
  for (int round = 0; round < 3; ++round) {
    std::vector<Vector> grads, outs, expected;
    std::vector<oktopk::ReduceRequest> requests;
    for (std::size_t h = 0; h < handles.size(); ++h) {
      grads.push_back(gradient(sizes[h], world_rank() * 7 + static_cast<int>(h) + 10 * round));
      outs.emplace_back("out", static_cast<std::size_t>(sizes[h]));
      expected.emplace_back("expected", static_cast<std::size_t>(sizes[h]));
      requests.push_back(handles[h].async->reduce_async(Exec(), grads[h], outs[h]));
    }
    // The last request first: without a progress thread it works every call before it.
    EXPECT_TRUE(requests.back().test());
    for (auto& r : requests) EXPECT_TRUE(r.test());
    for (auto& r : requests) r.wait();
    for (std::size_t h = 0; h < handles.size(); ++h) {
      handles[h].blocking->reduce(Exec(), grads[h], expected[h]);
      EXPECT_EQ(to_host(outs[h]), to_host(expected[h])) << "handle " << h << " round " << round;
      EXPECT_EQ(handles[h].async->stats().iteration, round + 1);
    }
  }
}

TEST(ReduceAsync, DifferentLaunchOrdersFailOnEveryRank) {
  const oktopk::Communicator comm(MPI_COMM_WORLD);
  if (comm.size() == 1) GTEST_SKIP() << "needs two ranks";
  const auto options = oktopk::Options().set_density(0.05);
  auto a = oktopk::make_sparse_allreduce(oktopk::Algorithm::TopkA, comm, 1000, options);
  auto b = oktopk::make_sparse_allreduce(oktopk::Algorithm::OkTopk, comm, 3000, options);
  const Vector ga = gradient(1000, world_rank()), gb = gradient(3000, world_rank() + 1);
  Vector oa("oa", 1000), ob("ob", 3000);
  // Rank 0 launches a then b, the others b then a.
  std::vector<oktopk::ReduceRequest> requests;
  if (comm.rank() == 0) {
    requests.push_back(a->reduce_async(Exec(), ga, oa));
    requests.push_back(b->reduce_async(Exec(), gb, ob));
  } else {
    requests.push_back(b->reduce_async(Exec(), gb, ob));
    requests.push_back(a->reduce_async(Exec(), ga, oa));
  }
  for (auto& r : requests) {
    try {
      r.wait();
      ADD_FAILURE() << "a call launched out of order succeeded";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("launch calls in the same order"), std::string::npos)
          << e.what();
    }
  }
  // Unchanged handles: the same order everywhere works, and matches fresh handles' first call.
  EXPECT_EQ(a->stats().iteration, 0);
  EXPECT_EQ(b->stats().iteration, 0);
  auto fresh = oktopk::make_sparse_allreduce(oktopk::Algorithm::TopkA, comm, 1000, options);
  Vector expected("expected", 1000);
  a->reduce(Exec(), ga, oa);
  fresh->reduce(Exec(), ga, expected);
  EXPECT_EQ(to_host(oa), to_host(expected));
}

TEST(ReduceAsync, EmptyRequestThrows) {
  const oktopk::ReduceRequest empty;
  EXPECT_FALSE(empty.valid());
  EXPECT_THROW(empty.test(), std::invalid_argument);
  EXPECT_THROW(empty.wait(), std::invalid_argument);
}

}  // namespace
