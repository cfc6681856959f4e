// SPDX-License-Identifier: BSD-3-Clause
// How buffers reach MPI (impl/mpi_mirror.hpp) and the sparse allgatherv built on it. This program
// runs twice: as is, where host spaces hand their Views to MPI directly (a GPU build as the
// process chose, oktopk::gpu_aware_mpi()), and with --host-staging, where every buffer goes
// through a separate host copy as in CUDA and HIP builds without GPU-aware MPI.
// Buffers here have more capacity than they use, and the unused part holds a sentinel that must
// never reach another rank.
#include "mpi/mpi_test_utils.hpp"
#include <oktopk/communicator.hpp>
#include <oktopk/gpu_aware_mpi.hpp>
#include <oktopk/impl/collectives/sparse_allgatherv.hpp>
#include <oktopk/impl/comm/mpi_mirror.hpp>

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>

#include <cstdint>
#include <type_traits>
#include <vector>

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Memory = Exec::memory_space;
using oktopk::index_type;
using oktopk::value_type;
using oktopk::test::world_rank;
using oktopk::test::world_size;

// Whether MPI gets host copies: the test build's choice, or this process's for a GPU.
bool staged() { return !oktopk::impl::mpi_uses_view_memory<Exec>(); }

constexpr float sentinel = -7.0f;

template <class T>
Kokkos::View<T*, Memory> device_copy(const std::vector<T>& host, std::int64_t capacity, T fill) {
  Kokkos::View<T*, Memory> view("test::view", capacity);
  auto mirror = Kokkos::create_mirror_view(view);
  for (std::int64_t i = 0; i < capacity; ++i) {
    mirror(i) = i < static_cast<std::int64_t>(host.size()) ? host[i] : fill;
  }
  Kokkos::deep_copy(view, mirror);
  return view;
}

template <class View>
std::vector<typename View::non_const_value_type> host_copy(const View& view, std::int64_t count) {
  auto mirror = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  return std::vector<typename View::non_const_value_type>(mirror.data(), mirror.data() + count);
}

// What an MPI buffer holds, read on the host: its host copy, or the View's memory it points to.
template <class T>
std::vector<std::remove_const_t<T>> contents(const oktopk::impl::MpiBuffer<T>& buffer) {
  if (buffer.staged()) {
    const auto& host = buffer.staging();
    return std::vector<std::remove_const_t<T>>(host.data(), host.data() + host.extent(0));
  }
  using Entry = std::remove_const_t<T>;
  Kokkos::View<Entry*, Memory, Kokkos::MemoryTraits<Kokkos::Unmanaged>> in_place(
      const_cast<Entry*>(buffer.data()), buffer.size());
  return host_copy(in_place, static_cast<std::int64_t>(buffer.size()));
}

TEST(MpiStaging, ChoiceFollowsTheTestSwitchAndTheProcess) {
  if (oktopk::impl::stage_host_views_for_tests) {
    EXPECT_TRUE(staged()) << "--host-staging must route every buffer through a host copy";
  } else {
    EXPECT_EQ(staged(),
              !oktopk::impl::runs_on_host_v<Exec> && !oktopk::gpu_aware_mpi().device_pointers);
  }
}

TEST(MpiStaging, SendViewHoldsTheSentPartOnly) {
  Exec exec;
  const auto view = device_copy<float>({1.0f, 2.0f, 3.0f}, 10, sentinel);
  const auto sent =
      oktopk::impl::mpi_send_view(exec, Kokkos::subview(view, Kokkos::make_pair(0, 3)));
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_EQ(sent.staged(), staged());
  EXPECT_EQ(sent.data() != view.data(), staged());
  EXPECT_EQ(contents(sent), (std::vector<float>{1, 2, 3}));
  // A send of const entries, as the methods make from their inputs.
  const Kokkos::View<const float*, Memory> input = view;
  const oktopk::impl::MpiBuffer<const float> sent_const =
      oktopk::impl::mpi_send_view(exec, Kokkos::subview(input, Kokkos::make_pair(1, 3)));
  EXPECT_EQ(contents(sent_const), (std::vector<float>{2, 3}));
}

TEST(MpiStaging, ReceivedMovesOnlyTheGivenRange) {
  Exec exec;
  const auto view = device_copy<float>({}, 8, sentinel);
  auto buffer = oktopk::impl::mpi_receive_view(exec, view);
  ASSERT_EQ(buffer.size(), 8u);
  EXPECT_EQ(buffer.data() != view.data(), staged());
  // What MPI would write: into the host copy, or (GPU-aware MPI) into the View.
  if (buffer.staged()) {
    for (int i = 2; i < 5; ++i) buffer.staging()(i) = static_cast<float>(i);
  } else {
    auto written = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
    for (int i = 2; i < 5; ++i) written(i) = static_cast<float>(i);
    Kokkos::deep_copy(view, written);
  }
  oktopk::impl::mpi_received(exec, buffer, view, 2, 5);
  exec.fence();
  EXPECT_EQ(host_copy(view, 8),
            (std::vector<float>{sentinel, sentinel, 2, 3, 4, sentinel, sentinel, sentinel}));
}

TEST(MpiStaging, PoolReusesFreedBuffersAndNeverSharesLiveOnes) {
  // double: a type the library never stages, so this test sees the pool from its start.
  using Pool = oktopk::impl::HostStagingPool<double>;
  EXPECT_EQ(Pool::acquire(0).extent(0), 0u);
  auto a = Pool::acquire(10);
  auto b = Pool::acquire(10);
  ASSERT_EQ(a.extent(0), 10u);
  ASSERT_EQ(b.extent(0), 10u);
  EXPECT_NE(a.data(), b.data());
  const double* freed = a.data();
  a = Pool::Buffer();
  auto c = Pool::acquire(6);  // fits in the freed block
  EXPECT_EQ(c.data(), freed);
  EXPECT_EQ(c.extent(0), 6u);
  c = Pool::Buffer();
  auto d = Pool::acquire(1000);  // the freed block is too small: replaced by a larger one
  ASSERT_EQ(d.extent(0), 1000u);
  EXPECT_NE(d.data(), b.data());
  for (std::size_t i = 0; i < 1000; ++i) d(i) = static_cast<double>(i);  // all of it is ours
  for (std::size_t i = 0; i < 10; ++i) b(i) = -1.0;
  for (std::size_t i = 0; i < 1000; ++i) ASSERT_EQ(d(i), static_cast<double>(i)) << "entry " << i;
}

TEST(MpiStaging, SparseAllgathervIgnoresUnusedCapacity) {
  const int me = world_rank();
  const int P = world_size();
  Exec exec;
  oktopk::Communicator comm(MPI_COMM_WORLD);
  const auto no_timer = [](const char*) { return 0; };
  // Rank r sends 3r + 1 entries (rank 1 sends none, so counts are uneven and one is zero) from
  // buffers of capacity 64.
  const auto count_of = [](int r) { return r == 1 ? 0 : 3 * r + 1; };
  std::vector<index_type> my_indices;
  std::vector<value_type> my_values;
  for (int i = 0; i < count_of(me); ++i) {
    my_indices.push_back(1000 * me + i);
    my_values.push_back(static_cast<float>(me) + 0.125f * static_cast<float>(i));
  }
  std::vector<index_type> expected_indices;
  std::vector<value_type> expected_values;
  std::vector<std::int64_t> expected_counts;
  for (int r = 0; r < P; ++r) {
    expected_counts.push_back(count_of(r));
    for (int i = 0; i < count_of(r); ++i) {
      expected_indices.push_back(1000 * r + i);
      expected_values.push_back(static_cast<float>(r) + 0.125f * static_cast<float>(i));
    }
  }
  const std::int64_t total = static_cast<std::int64_t>(expected_indices.size());
  const auto indices = device_copy<index_type>(my_indices, 64, -1);
  const auto values = device_copy<value_type>(my_values, 64, sentinel);

  for (const auto balancing : {oktopk::Balancing::Off, oktopk::Balancing::On}) {
    SCOPED_TRACE(balancing == oktopk::Balancing::On ? "balanced" : "unbalanced");
    oktopk::impl::SparseGather<Exec, float> gather;
    oktopk::impl::sparse_allgatherv(exec, comm, indices, values, count_of(me), balancing, 1.0,
                                    gather, no_timer);
    EXPECT_EQ(gather.total, total);
    EXPECT_EQ(gather.counts, expected_counts);
    EXPECT_EQ(gather.balanced, balancing == oktopk::Balancing::On && P > 1);
    EXPECT_EQ(host_copy(gather.indices, total), expected_indices);
    EXPECT_EQ(host_copy(gather.values, total), expected_values);
  }
}

TEST(MpiStaging, SparseAllgathervOfNothing) {
  Exec exec;
  oktopk::Communicator comm(MPI_COMM_WORLD);
  const auto indices = device_copy<index_type>({}, 4, -1);
  const auto values = device_copy<value_type>({}, 4, sentinel);
  oktopk::impl::SparseGather<Exec, float> gather;
  oktopk::impl::sparse_allgatherv(exec, comm, indices, values, 0, oktopk::Balancing::On, 1.0,
                                  gather, [](const char*) { return 0; });
  EXPECT_EQ(gather.total, 0);
  EXPECT_FALSE(gather.balanced);
  EXPECT_EQ(gather.counts, std::vector<std::int64_t>(world_size(), 0));
}

}  // namespace
