// SPDX-License-Identifier: BSD-3-Clause
// Communicator: the duplicate, every wrapped call's results, traffic accounting (exact counts and
// the documented formulas, checked against a message-level model of the algorithms), errors, and
// the agreement checks. Runs at several rank counts, 1 included.
#include "mpi/mpi_test_utils.hpp"
#include <oktopk/communicator.hpp>
#include <oktopk/impl/comm/mpi_check.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using oktopk::Communicator;
using oktopk::PhaseTraffic;

using oktopk::test::world_rank;
using oktopk::test::world_size;

std::int64_t sum_over_ranks(std::int64_t value) {
  std::int64_t sum = 0;
  MPI_Allreduce(&value, &sum, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return sum;
}

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<std::size_t>(length));
}

// The message-level picture of the traffic of all ranks: every transfer from -> to of some
// bytes. The expected PhaseTraffic of a rank is read off it, independently of the formulas the
// Communicator uses, and conservation (sent == received over all ranks) holds by construction.
// A message is between nodes when its ends are on different nodes of `node_of_rank` (empty:
// every rank a node of its own, as on a Communicator nobody placed).
class TrafficModel {
 public:
  TrafficModel() = default;
  explicit TrafficModel(std::vector<int> node_of_rank) : node_of_rank_(std::move(node_of_rank)) {}

  void message(int from, int to, std::int64_t bytes) { messages_.push_back({from, to, bytes}); }

  PhaseTraffic of(int rank) const {
    PhaseTraffic t;
    for (const Message& m : messages_) {
      const bool between = node_of(m.from) != node_of(m.to);
      if (m.from == rank) {
        t.bytes_sent += m.bytes;
        t.messages_sent += 1;
        if (between) t.bytes_sent_between_nodes += m.bytes;
      }
      if (m.to == rank) {
        t.bytes_received += m.bytes;
        t.messages_received += 1;
        if (between) t.bytes_received_between_nodes += m.bytes;
      }
    }
    return t;
  }

  // B bytes dealt out byte by byte to P blocks: the first B mod P get one more.
  static std::vector<std::int64_t> blocks(std::int64_t bytes, int parts) {
    std::vector<std::int64_t> block(static_cast<std::size_t>(parts), 0);
    for (std::int64_t j = 0; j < bytes; ++j) {
      block[static_cast<std::size_t>(j % parts)] += 1;
    }
    return block;
  }

  // Reduce-scatter (every rank sends block t to rank t), then allgather of the blocks.
  void allreduce(std::int64_t bytes, int size) {
    const auto block = blocks(bytes, size);
    for (int s = 0; s < size; ++s) {
      for (int t = 0; t < size; ++t) {
        if (s != t) {
          message(s, t, block[static_cast<std::size_t>(t)]);
        }
      }
    }
    allgather_blocks(block);
  }

  // Every rank's contribution reaches every other rank once.
  void allgather_blocks(const std::vector<std::int64_t>& block) {
    const int size = static_cast<int>(block.size());
    for (int s = 0; s < size; ++s) {
      for (int t = 0; t < size; ++t) {
        if (s != t) {
          message(s, t, block[static_cast<std::size_t>(s)]);
        }
      }
    }
  }

  // Scatter of the blocks from the root, then allgather of the blocks.
  void bcast(std::int64_t bytes, int size, int root) {
    const auto block = blocks(bytes, size);
    for (int t = 0; t < size; ++t) {
      if (t != root) {
        message(root, t, block[static_cast<std::size_t>(t)]);
      }
    }
    allgather_blocks(block);
  }

 private:
  struct Message {
    int from;
    int to;
    std::int64_t bytes;
  };
  int node_of(int rank) const {
    return node_of_rank_.empty() ? rank : node_of_rank_[static_cast<std::size_t>(rank)];
  }

  std::vector<Message> messages_;
  std::vector<int> node_of_rank_;
};

void expect_traffic_eq(const PhaseTraffic& actual, const PhaseTraffic& expected) {
  EXPECT_EQ(actual.bytes_sent, expected.bytes_sent);
  EXPECT_EQ(actual.bytes_received, expected.bytes_received);
  EXPECT_EQ(actual.messages_sent, expected.messages_sent);
  EXPECT_EQ(actual.messages_received, expected.messages_received);
  EXPECT_EQ(actual.bytes_sent_between_nodes, expected.bytes_sent_between_nodes);
  EXPECT_EQ(actual.bytes_received_between_nodes, expected.bytes_received_between_nodes);
}

// Traffic of a Communicator nobody placed: every rank is a node of its own, so every byte is
// between nodes.
PhaseTraffic unplaced(std::int64_t bytes_sent, std::int64_t bytes_received,
                      std::int64_t messages_sent, std::int64_t messages_received) {
  return PhaseTraffic{bytes_sent,        bytes_received, messages_sent,
                      messages_received, bytes_sent,     bytes_received};
}

// ---- the duplicate -----------------------------------------------------------------------------

TEST(Communicator, DuplicatesTheGivenCommunicator) {
  Communicator comm;
  EXPECT_NE(comm.mpi_comm(), MPI_COMM_WORLD);
  int result = MPI_UNEQUAL;
  MPI_Comm_compare(comm.mpi_comm(), MPI_COMM_WORLD, &result);
  EXPECT_EQ(result, MPI_CONGRUENT);
  EXPECT_EQ(comm.rank(), world_rank());
  EXPECT_EQ(comm.size(), world_size());
}

TEST(Communicator, SetsErrorsReturnOnTheDuplicateOnly) {
  Communicator comm;
  MPI_Errhandler on_duplicate = MPI_ERRHANDLER_NULL;
  MPI_Errhandler on_world = MPI_ERRHANDLER_NULL;
  MPI_Comm_get_errhandler(comm.mpi_comm(), &on_duplicate);
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &on_world);
  EXPECT_EQ(on_duplicate, MPI_ERRORS_RETURN);
  EXPECT_EQ(on_world, MPI_ERRORS_ARE_FATAL);
  MPI_Errhandler_free(&on_duplicate);
  MPI_Errhandler_free(&on_world);
}

TEST(Communicator, CopiesShareTheDuplicateAndCounters) {
  Communicator comm;
  const Communicator copy = comm;  // NOLINT(performance-unnecessary-copy-initialization)
  EXPECT_EQ(copy.mpi_comm(), comm.mpi_comm());
  {
    auto scope = copy.phase("via_copy");
    EXPECT_EQ(comm.current_phase(), "via_copy");
    float x = 1.0f;
    copy.allreduce_in_place(&x, 1, MPI_SUM);
  }
  EXPECT_EQ(comm.current_phase(), "other");
  TrafficModel model;
  model.allreduce(sizeof(float), comm.size());
  expect_traffic_eq(comm.traffic("via_copy"), model.of(comm.rank()));
  EXPECT_TRUE(comm.traffic() == copy.traffic());
  comm.reset_traffic();
  EXPECT_TRUE(copy.traffic().empty());
}

TEST(Communicator, DuplicateOutlivesTheOriginalInItsCopies) {
  std::vector<Communicator> copies;
  {
    Communicator comm;
    copies.push_back(comm);
  }
  int sum = 0;
  const int one = 1;
  copies.front().allreduce(&one, &sum, 1, MPI_SUM);
  EXPECT_EQ(sum, world_size());
}

TEST(Communicator, RejectsNullCommunicator) {
  try {
    Communicator comm(MPI_COMM_NULL);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(starts_with(e.what(), "oktopk::Communicator::Communicator: ")) << e.what();
  }
}

TEST(Communicator, MapsTypesToMpiDatatypes) {
  using oktopk::impl::mpi_datatype;
  EXPECT_EQ(mpi_datatype<float>(), MPI_FLOAT);
  EXPECT_EQ(mpi_datatype<double>(), MPI_DOUBLE);
  EXPECT_EQ(mpi_datatype<std::int32_t>(), MPI_INT32_T);
  EXPECT_EQ(mpi_datatype<std::int64_t>(), MPI_INT64_T);
  EXPECT_EQ(mpi_datatype<std::uint32_t>(), MPI_UINT32_T);
  EXPECT_EQ(mpi_datatype<std::uint64_t>(), MPI_UINT64_T);
  EXPECT_EQ(mpi_datatype<char>(), MPI_CHAR);
  EXPECT_EQ(mpi_datatype<unsigned char>(), MPI_UNSIGNED_CHAR);
}

// ---- results of the wrapped calls ----------------------------------------------------------

TEST(Communicator, AllreduceSumAndMax) {
  Communicator comm;
  const int p = comm.size();
  const int r = comm.rank();
  const std::vector<std::int32_t> ints = {r, 10 * r, -r};
  std::vector<std::int32_t> int_sum(3), int_max(3);
  comm.allreduce(ints.data(), int_sum.data(), 3, MPI_SUM);
  comm.allreduce(ints.data(), int_max.data(), 3, MPI_MAX);
  const int ranks_sum = p * (p - 1) / 2;
  EXPECT_EQ(int_sum, (std::vector<std::int32_t>{ranks_sum, 10 * ranks_sum, -ranks_sum}));
  EXPECT_EQ(int_max, (std::vector<std::int32_t>{p - 1, 10 * (p - 1), 0}));

  // Small integers and halves: exact in float whatever the reduction order.
  const std::vector<float> floats = {0.5f * static_cast<float>(r), 1.0f};
  std::vector<float> float_sum(2), float_max(2);
  comm.allreduce(floats.data(), float_sum.data(), 2, MPI_SUM);
  comm.allreduce(floats.data(), float_max.data(), 2, MPI_MAX);
  EXPECT_EQ(float_sum[0], 0.5f * static_cast<float>(ranks_sum));
  EXPECT_EQ(float_sum[1], static_cast<float>(p));
  EXPECT_EQ(float_max[0], 0.5f * static_cast<float>(p - 1));
  EXPECT_EQ(float_max[1], 1.0f);

  const std::int64_t big = std::int64_t{1} << 40;
  std::int64_t big_sum = 0;
  comm.allreduce(&big, &big_sum, 1, MPI_SUM);
  EXPECT_EQ(big_sum, big * p);
}

TEST(Communicator, AllreduceInPlace) {
  Communicator comm;
  const int p = comm.size();
  std::vector<double> x = {static_cast<double>(comm.rank()), 2.0};
  comm.allreduce_in_place(x.data(), 2, MPI_SUM);
  EXPECT_EQ(x[0], static_cast<double>(p * (p - 1) / 2));
  EXPECT_EQ(x[1], 2.0 * p);
  std::uint32_t m = static_cast<std::uint32_t>(comm.rank()) * 3u;
  comm.allreduce_in_place(&m, 1, MPI_MAX);
  EXPECT_EQ(m, static_cast<std::uint32_t>(p - 1) * 3u);
}

TEST(Communicator, Alltoall) {
  Communicator comm;
  const int p = comm.size();
  const int r = comm.rank();
  const int k = 3;
  std::vector<std::int32_t> send(static_cast<std::size_t>(p * k));
  for (int t = 0; t < p; ++t) {
    for (int j = 0; j < k; ++j) {
      send[static_cast<std::size_t>(t * k + j)] = 1000 * r + 10 * t + j;  // from r, for t
    }
  }
  std::vector<std::int32_t> receive(send.size(), -1);
  comm.alltoall(send.data(), receive.data(), k);
  for (int s = 0; s < p; ++s) {
    for (int j = 0; j < k; ++j) {
      EXPECT_EQ(receive[static_cast<std::size_t>(s * k + j)], 1000 * s + 10 * r + j);
    }
  }
}

TEST(Communicator, Allgather) {
  Communicator comm;
  const int p = comm.size();
  const std::vector<std::uint64_t> mine = {static_cast<std::uint64_t>(comm.rank()),
                                           static_cast<std::uint64_t>(comm.rank()) << 33};
  std::vector<std::uint64_t> all(static_cast<std::size_t>(2 * p), 7);
  comm.allgather(mine.data(), 2, all.data());
  for (int s = 0; s < p; ++s) {
    EXPECT_EQ(all[static_cast<std::size_t>(2 * s)], static_cast<std::uint64_t>(s));
    EXPECT_EQ(all[static_cast<std::size_t>(2 * s + 1)], static_cast<std::uint64_t>(s) << 33);
  }
}

// Rank s contributes s % 3 elements (so ranks 0, 3, 6 contribute none), each 100 * s + j.
std::vector<int> mixed_counts(int size) {
  std::vector<int> counts(static_cast<std::size_t>(size));
  for (int s = 0; s < size; ++s) {
    counts[static_cast<std::size_t>(s)] = s % 3;
  }
  return counts;
}

TEST(Communicator, AllgathervWithUnequalAndZeroCounts) {
  Communicator comm;
  const int p = comm.size();
  const int r = comm.rank();
  const std::vector<int> counts = mixed_counts(p);
  std::vector<int> displacements(static_cast<std::size_t>(p));
  std::exclusive_scan(counts.begin(), counts.end(), displacements.begin(), 0);
  const int total = std::accumulate(counts.begin(), counts.end(), 0);
  std::vector<float> mine(static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]));
  for (std::size_t j = 0; j < mine.size(); ++j) {
    mine[j] = static_cast<float>(100 * r) + static_cast<float>(j);
  }
  std::vector<float> all(static_cast<std::size_t>(total) + 1, -1.0f);  // +1: never data()==null
  comm.allgatherv(mine.data(), static_cast<oktopk::count_type>(mine.size()), all.data(),
                  counts.data(), displacements.data());
  std::vector<float> expected;
  for (int s = 0; s < p; ++s) {
    for (int j = 0; j < counts[static_cast<std::size_t>(s)]; ++j) {
      expected.push_back(static_cast<float>(100 * s) + static_cast<float>(j));
    }
  }
  expected.push_back(-1.0f);  // untouched
  EXPECT_EQ(all, expected);
}

TEST(Communicator, BcastFromEveryRoot) {
  Communicator comm;
  for (int root = 0; root < comm.size(); ++root) {
    std::vector<double> x(5, -1.0);
    if (comm.rank() == root) {
      for (std::size_t j = 0; j < x.size(); ++j) {
        x[j] = 10.0 * root + static_cast<double>(j);
      }
    }
    comm.bcast(x.data(), 5, root);
    for (std::size_t j = 0; j < x.size(); ++j) {
      EXPECT_EQ(x[j], 10.0 * root + static_cast<double>(j)) << "root " << root;
    }
  }
}

TEST(Communicator, BarrierCompletes) {
  Communicator comm;
  comm.barrier();
  EXPECT_TRUE(comm.traffic().empty());
}

// ---- point to point ----------------------------------------------------------------------------

TEST(Communicator, RingIsendIrecvDeliversAndIsChargedExactly) {
  Communicator comm;
  const int p = comm.size();
  const int r = comm.rank();
  const int next = (r + 1) % p;
  const int previous = (r + p - 1) % p;
  const std::vector<std::int64_t> send = {r, 2 * r, 3 * r, 4 * r, 5 * r};
  std::vector<std::int64_t> receive(send.size(), -1);
  Communicator::Requests requests;
  comm.irecv(receive.data(), 5, previous, 7, requests);
  comm.isend(send.data(), 5, next, 7, requests);
  EXPECT_EQ(requests.size(), 2u);
  requests.wait_all();
  EXPECT_EQ(requests.size(), 0u);
  EXPECT_EQ(receive, (std::vector<std::int64_t>{previous, 2 * previous, 3 * previous, 4 * previous,
                                                5 * previous}));
  if (p == 1) {
    // The ring is a self-message: delivered, not charged.
    EXPECT_TRUE(comm.traffic().empty());
  } else {
    expect_traffic_eq(comm.traffic("other"), unplaced(5 * 8, 5 * 8, 1, 1));
    expect_traffic_eq(comm.total_traffic(), unplaced(5 * 8, 5 * 8, 1, 1));
  }
}

TEST(Communicator, SelfMessagesAreDeliveredButNotCharged) {
  Communicator comm;
  const std::vector<unsigned char> send = {1, 2, 3};
  std::vector<unsigned char> receive(3, 0);
  Communicator::Requests requests;
  comm.isend(send.data(), 3, comm.rank(), 0, requests);
  comm.irecv(receive.data(), 3, comm.rank(), 0, requests);
  requests.wait_all();
  EXPECT_EQ(receive, send);
  EXPECT_TRUE(comm.traffic().empty());
}

TEST(Communicator, ReceiveIsChargedWithItsActualSizeToThePhaseItWasPostedIn) {
  Communicator comm;
  if (comm.size() == 1) {
    GTEST_SKIP() << "needs another rank";
  }
  const int p = comm.size();
  const int r = comm.rank();
  // Each rank receives up to 10 floats from its predecessor, which sends only 3 + its rank.
  std::vector<float> receive(10, 0.0f);
  const std::vector<float> send(static_cast<std::size_t>(3 + r), 1.5f);
  Communicator::Requests requests;
  {
    auto posting = comm.phase("posted");
    comm.irecv(receive.data(), 10, (r + p - 1) % p, 3, requests);
  }
  {
    auto sending = comm.phase("sent");
    comm.isend(send.data(), static_cast<oktopk::count_type>(send.size()), (r + 1) % p, 3, requests);
  }
  {
    auto waiting = comm.phase("waited");
    requests.wait_all();
  }
  const std::int64_t from_previous = 3 + (r + p - 1) % p;
  expect_traffic_eq(comm.traffic("posted"), unplaced(0, 4 * from_previous, 0, 1));
  expect_traffic_eq(comm.traffic("sent"), unplaced(4 * (3 + r), 0, 1, 0));
  EXPECT_EQ(comm.traffic().count("waited"), 0u);
  EXPECT_EQ(comm.traffic().size(), 2u);
}

TEST(Communicator, RequestsDestructorWaits) {
  Communicator comm;
  const int p = comm.size();
  const int r = comm.rank();
  std::int32_t received = -1;
  const std::int32_t sent = 40 + r;
  {
    Communicator::Requests requests;
    comm.irecv(&received, 1, (r + p - 1) % p, 1, requests);
    comm.isend(&sent, 1, (r + 1) % p, 1, requests);
  }
  EXPECT_EQ(received, 40 + (r + p - 1) % p);
  // Completed by the destructor, but still charged.
  if (p > 1) {
    expect_traffic_eq(comm.total_traffic(), unplaced(4, 4, 1, 1));
  }
}

TEST(Communicator, RequestsMoveAssignmentWaitsForItsOwnFirst) {
  Communicator comm;
  const int p = comm.size();
  const int r = comm.rank();
  std::int32_t first = -1;
  std::int32_t second = -1;
  const std::int32_t sent_first = 100 + r;
  const std::int32_t sent_second = 200 + r;
  Communicator::Requests target;
  comm.irecv(&first, 1, (r + p - 1) % p, 1, target);
  comm.isend(&sent_first, 1, (r + 1) % p, 1, target);
  Communicator::Requests source;
  comm.irecv(&second, 1, (r + 1) % p, 2, source);
  comm.isend(&sent_second, 1, (r + p - 1) % p, 2, source);
  target = std::move(source);
  EXPECT_EQ(first, 100 + (r + p - 1) % p);  // the old ones completed
  EXPECT_EQ(target.size(), 2u);
  EXPECT_EQ(source.size(), 0u);  // NOLINT(bugprone-use-after-move): moved-from is empty
  Communicator::Requests moved(std::move(target));
  EXPECT_EQ(moved.size(), 2u);
  moved.wait_all();
  EXPECT_EQ(second, 200 + (r + 1) % p);
  if (p > 1) {
    expect_traffic_eq(comm.total_traffic(), unplaced(8, 8, 2, 2));
  }
}

// ---- traffic accounting ------------------------------------------------------------------------

TEST(Communicator, AlltoallTrafficIsExactWithoutSelf) {
  Communicator comm;
  const int p = comm.size();
  std::vector<double> send(static_cast<std::size_t>(3 * p), 1.0);
  std::vector<double> receive(send.size());
  comm.alltoall(send.data(), receive.data(), 3);
  const std::int64_t others = p - 1;
  expect_traffic_eq(comm.total_traffic(), unplaced(others * 24, others * 24, others, others));
}

TEST(Communicator, AllreduceTrafficFollowsTheFormula) {
  Communicator comm;
  const int p = comm.size();
  // 5P + 1 bytes leaves one extra byte for block 0 whenever P > 1; 13 floats = 52 bytes is
  // indivisible by 3, 5 and 8; 1 byte leaves every block but one empty.
  for (const oktopk::count_type count : {oktopk::count_type{5} * p + 1, oktopk::count_type{1}}) {
    comm.reset_traffic();
    std::vector<char> send(static_cast<std::size_t>(count), 1);
    std::vector<char> receive(send.size());
    comm.allreduce(send.data(), receive.data(), count, MPI_MAX);
    TrafficModel model;
    model.allreduce(count, p);
    expect_traffic_eq(comm.total_traffic(), model.of(comm.rank()));
  }
  comm.reset_traffic();
  std::vector<float> x(13, 1.0f);
  comm.allreduce_in_place(x.data(), 13, MPI_SUM);
  TrafficModel model;
  model.allreduce(13 * 4, p);
  expect_traffic_eq(comm.total_traffic(), model.of(comm.rank()));
  // The same, written out as the formula of the header for one case.
  const std::int64_t bytes = 52;
  const std::int64_t own = bytes / p + (comm.rank() < bytes % p ? 1 : 0);
  EXPECT_EQ(comm.total_traffic().bytes_sent, (bytes - own) + (p - 1) * own);
}

TEST(Communicator, AllgathervTrafficFollowsTheFormula) {
  Communicator comm;
  const int p = comm.size();
  const std::vector<int> counts = mixed_counts(p);
  std::vector<int> displacements(static_cast<std::size_t>(p));
  std::exclusive_scan(counts.begin(), counts.end(), displacements.begin(), 0);
  const int total = std::accumulate(counts.begin(), counts.end(), 0);
  const int mine = counts[static_cast<std::size_t>(comm.rank())];
  std::vector<std::int32_t> send(static_cast<std::size_t>(mine) + 1, 5);
  std::vector<std::int32_t> receive(static_cast<std::size_t>(total) + 1);
  comm.allgatherv(send.data(), mine, receive.data(), counts.data(), displacements.data());
  TrafficModel model;
  std::vector<std::int64_t> bytes(counts.begin(), counts.end());
  for (auto& b : bytes) {
    b *= 4;
  }
  model.allgather_blocks(bytes);
  expect_traffic_eq(comm.total_traffic(), model.of(comm.rank()));
}

TEST(Communicator, AllgatherTrafficIsThatOfAllgathervWithEqualCounts) {
  Communicator comm;
  const int p = comm.size();
  std::vector<double> send(3, 1.0);
  std::vector<double> receive(static_cast<std::size_t>(3 * p));
  comm.allgather(send.data(), 3, receive.data());
  TrafficModel model;
  model.allgather_blocks(std::vector<std::int64_t>(static_cast<std::size_t>(p), 24));
  expect_traffic_eq(comm.total_traffic(), model.of(comm.rank()));
}

TEST(Communicator, BcastTrafficFollowsTheFormula) {
  Communicator comm;
  const int p = comm.size();
  const int root = p - 1;  // a non-zero root whenever P > 1
  const oktopk::count_type count = 7 * p + 2;
  std::vector<unsigned char> x(static_cast<std::size_t>(count), 9);
  comm.bcast(x.data(), count, root);
  TrafficModel model;
  model.bcast(count, p, root);
  const PhaseTraffic expected = model.of(comm.rank());
  expect_traffic_eq(comm.total_traffic(), expected);
  if (p > 1) {
    // The message counts the header spells out.
    EXPECT_EQ(expected.messages_sent, comm.rank() == root ? 2 * (p - 1) : p - 1);
    EXPECT_EQ(expected.messages_received, comm.rank() == root ? p - 1 : p);
    EXPECT_EQ(expected.bytes_received, comm.rank() == root ? count - (count / p) : count);
  }
}

TEST(Communicator, TrafficIsZeroOnOneRank) {
  Communicator comm;
  if (comm.size() != 1) {
    GTEST_SKIP() << "one rank only";
  }
  float x[4] = {1, 2, 3, 4};
  float y[4];
  int count = 4;
  int zero = 0;
  comm.allreduce(x, y, 4, MPI_SUM);
  comm.alltoall(x, y, 4);
  comm.allgather(x, 4, y);
  comm.allgatherv(x, 4, y, &count, &zero);
  comm.bcast(x, 4, 0);
  comm.check_agreement("test", {{"a", 1}});
  EXPECT_TRUE(comm.traffic().empty());
  EXPECT_TRUE(comm.total_traffic() == PhaseTraffic{});
}

// Every operation, with sizes that depend on the rank, in two phases; whatever the formulas,
// the totals over ranks must balance like real traffic does.
TEST(Communicator, MixedSequenceConservesTraffic) {
  Communicator comm;
  const int p = comm.size();
  const int r = comm.rank();
  {
    auto scope = comm.phase("mixed_p2p");
    // Rank r sends r + t + 1 doubles to every t; the receiver posts room for more than that.
    std::vector<std::vector<double>> send(static_cast<std::size_t>(p));
    std::vector<std::vector<double>> receive(static_cast<std::size_t>(p));
    Communicator::Requests requests;
    for (int t = 0; t < p; ++t) {
      receive[static_cast<std::size_t>(t)].resize(static_cast<std::size_t>(2 * p + 1));
      comm.irecv(receive[static_cast<std::size_t>(t)].data(), 2 * p + 1, t, 4, requests);
    }
    for (int t = 0; t < p; ++t) {
      send[static_cast<std::size_t>(t)].assign(static_cast<std::size_t>(r + t + 1), 1.0);
      comm.isend(send[static_cast<std::size_t>(t)].data(), r + t + 1, t, 4, requests);
    }
    requests.wait_all();
  }
  {
    auto scope = comm.phase("mixed_collectives");
    std::vector<float> a(static_cast<std::size_t>(3 * p + 5), 1.0f);
    comm.allreduce_in_place(a.data(), 3 * p + 5, MPI_SUM);
    std::vector<std::int32_t> all(static_cast<std::size_t>(2 * p));
    std::vector<std::int32_t> back(all.size());
    comm.alltoall(all.data(), back.data(), 2);
    const std::vector<int> counts = mixed_counts(p);
    std::vector<int> displacements(static_cast<std::size_t>(p));
    std::exclusive_scan(counts.begin(), counts.end(), displacements.begin(), 0);
    std::vector<double> mine(3, 2.0);
    std::vector<double> gathered(static_cast<std::size_t>(3 * p));
    comm.allgatherv(mine.data(), counts[static_cast<std::size_t>(r)], gathered.data(),
                    counts.data(), displacements.data());
    comm.allgather(mine.data(), 3, gathered.data());
    std::vector<char> text(static_cast<std::size_t>(4 * p + 3), 'x');
    comm.bcast(text.data(), 4 * p + 3, p / 2);
    comm.check_agreement("test", {{"n", 17}, {"m", 3}});
  }
  const auto traffic = comm.traffic();
  for (const char* phase : {"mixed_p2p", "mixed_collectives"}) {
    const PhaseTraffic t = comm.traffic(phase);
    EXPECT_EQ(sum_over_ranks(t.bytes_sent), sum_over_ranks(t.bytes_received)) << phase;
    EXPECT_EQ(sum_over_ranks(t.messages_sent), sum_over_ranks(t.messages_received)) << phase;
    EXPECT_EQ(traffic.count(phase), p > 1 ? 1u : 0u) << phase;
  }
  const PhaseTraffic total = comm.total_traffic();
  const std::int64_t sent = sum_over_ranks(total.bytes_sent);
  EXPECT_EQ(sent, sum_over_ranks(total.bytes_received));
  EXPECT_EQ(sum_over_ranks(total.messages_sent), sum_over_ranks(total.messages_received));
  EXPECT_EQ(sent > 0, p > 1);
  // The point-to-point part is exact: sum over r, t != r of 8 (r + t + 1) bytes.
  std::int64_t p2p = 0;
  for (int s = 0; s < p; ++s) {
    for (int t = 0; t < p; ++t) {
      p2p += s != t ? 8 * (s + t + 1) : 0;
    }
  }
  EXPECT_EQ(sum_over_ranks(comm.traffic("mixed_p2p").bytes_sent), p2p);
  EXPECT_EQ(sum_over_ranks(comm.traffic("mixed_p2p").messages_received), std::int64_t{p} * (p - 1));
}

TEST(Communicator, PhasesNestAndRestore) {
  Communicator comm;
  const int p = comm.size();
  EXPECT_EQ(comm.current_phase(), "other");
  float x[3] = {1, 2, 3};
  comm.allreduce_in_place(x, 1, MPI_SUM);  // 4 bytes to "other"
  {
    auto outer = comm.phase("outer");
    EXPECT_EQ(comm.current_phase(), "outer");
    comm.allreduce_in_place(x, 2, MPI_SUM);  // 8 bytes
    {
      auto inner = comm.phase("inner");
      EXPECT_EQ(comm.current_phase(), "inner");
      comm.allreduce_in_place(x, 3, MPI_SUM);  // 12 bytes
      auto moved = std::move(inner);           // the moved-from guard must not restore
    }
    EXPECT_EQ(comm.current_phase(), "outer");
    comm.allreduce_in_place(x, 2, MPI_SUM);  // 8 more bytes to "outer"
  }
  EXPECT_EQ(comm.current_phase(), "other");

  TrafficModel other, outer, inner;
  other.allreduce(4, p);
  outer.allreduce(8, p);
  outer.allreduce(8, p);
  inner.allreduce(12, p);
  const int r = comm.rank();
  expect_traffic_eq(comm.traffic("other"), other.of(r));
  expect_traffic_eq(comm.traffic("outer"), outer.of(r));
  expect_traffic_eq(comm.traffic("inner"), inner.of(r));
  expect_traffic_eq(comm.traffic("never"), PhaseTraffic{});
  PhaseTraffic sum = other.of(r);
  sum += outer.of(r);
  sum += inner.of(r);
  expect_traffic_eq(comm.total_traffic(), sum);
  EXPECT_EQ(comm.traffic().size(), p > 1 ? 3u : 0u);
}

TEST(Communicator, ResetTrafficZeroesEverything) {
  Communicator comm;
  {
    auto scope = comm.phase("before_reset");
    double x = 1.0;
    comm.allreduce_in_place(&x, 1, MPI_SUM);
    comm.bcast(&x, 1, 0);
  }
  comm.reset_traffic();
  EXPECT_TRUE(comm.traffic().empty());
  EXPECT_TRUE(comm.traffic("before_reset") == PhaseTraffic{});
  EXPECT_TRUE(comm.total_traffic() == PhaseTraffic{});
  EXPECT_EQ(comm.current_phase(), "other");
}

TEST(Communicator, MessageLogIsOffByDefaultAndEmptyWhileOff) {
  Communicator comm;
  EXPECT_FALSE(comm.message_log_enabled());
  double x = 1.0;
  comm.allreduce_in_place(&x, 1, MPI_SUM);
  EXPECT_TRUE(comm.message_log().empty());
}

TEST(Communicator, MessageLogListsEveryChargeAndSumsToTheTraffic) {
  Communicator comm;
  const Communicator copy = comm;  // shares the log
  comm.set_message_log(true);
  EXPECT_TRUE(copy.message_log_enabled());
  const int p = comm.size();
  const int r = comm.rank();
  std::vector<float> send(static_cast<std::size_t>(2 + r), 1.0f);
  std::vector<float> receive(2 + p, 0.0f);
  {
    auto ring = comm.phase("ring");
    Communicator::Requests requests;
    comm.irecv(receive.data(), 2 + p, (r + p - 1) % p, 5, requests);
    comm.isend(send.data(), static_cast<oktopk::count_type>(send.size()), (r + 1) % p, 5, requests);
    requests.wait_all();
  }
  {
    auto sums = comm.phase("sums");
    double x = 1.0;
    comm.allreduce_in_place(&x, 1, MPI_SUM);
    std::vector<std::int64_t> all(p);
    const std::int64_t mine = r;
    comm.allgather(&mine, 1, all.data());
  }
  const auto& log = copy.message_log();
  if (p == 1) {
    EXPECT_TRUE(log.empty());  // self-messages and one-rank collectives are not charged
    return;
  }
  ASSERT_EQ(log.size(), 4u);
  EXPECT_EQ(std::string(log[0].operation), "send");
  EXPECT_EQ(log[0].peer, (r + 1) % p);
  EXPECT_EQ(log[0].bytes_sent, 4 * (2 + r));
  EXPECT_EQ(std::string(log[1].operation), "recv");
  EXPECT_EQ(log[1].peer, (r + p - 1) % p);
  EXPECT_EQ(log[1].bytes_received, 4 * (2 + (r + p - 1) % p));  // the actual size
  EXPECT_EQ(std::string(log[2].operation), "allreduce");
  EXPECT_EQ(std::string(log[3].operation), "allgather");
  std::map<std::string, PhaseTraffic> sums;
  for (const auto& m : log) {
    EXPECT_EQ(m.peer == -1,
              std::string(m.operation) != "send" && std::string(m.operation) != "recv");
    sums[m.phase] += PhaseTraffic{
        m.bytes_sent,        m.bytes_received,           m.messages_sent,
        m.messages_received, m.bytes_sent_between_nodes, m.bytes_received_between_nodes};
  }
  EXPECT_EQ(sums, comm.traffic());
  comm.reset_traffic();
  EXPECT_TRUE(copy.message_log().empty());
  comm.set_message_log(false);
  EXPECT_FALSE(copy.message_log_enabled());
}

// ---- errors ------------------------------------------------------------------------------------

// Runs `f`, which must throw std::invalid_argument whose message starts with `prefix`.
template <class F>
void expect_invalid_argument(F&& f, const std::string& prefix) {
  try {
    f();
    ADD_FAILURE() << "no exception, expected one starting with " << prefix;
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(starts_with(e.what(), prefix)) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

TEST(Communicator, InvalidArgumentsThrowBeforeReachingMpi) {
  Communicator comm;
  const int p = comm.size();
  const oktopk::count_type too_many = oktopk::count_type{INT_MAX} + 1;
  float x[4] = {};
  Communicator::Requests requests;
  expect_invalid_argument([&] { comm.isend(x, 1, p, 0, requests); },
                          "oktopk::Communicator::isend: destination = " + std::to_string(p));
  expect_invalid_argument([&] { comm.isend(x, 1, -1, 0, requests); },
                          "oktopk::Communicator::isend: ");
  expect_invalid_argument([&] { comm.isend(x, -1, 0, 0, requests); },
                          "oktopk::Communicator::isend: count = -1");
  expect_invalid_argument([&] { comm.isend(x, too_many, 0, 0, requests); },
                          "oktopk::Communicator::isend: count = 2147483648");
  expect_invalid_argument([&] { comm.irecv(x, 1, p + 3, 0, requests); },
                          "oktopk::Communicator::irecv: source");
  expect_invalid_argument([&] { comm.irecv(x, -5, 0, 0, requests); },
                          "oktopk::Communicator::irecv: count");
  EXPECT_EQ(requests.size(), 0u);
  expect_invalid_argument([&] { comm.allreduce(x, x + 1, -1, MPI_SUM); },
                          "oktopk::Communicator::allreduce: count");
  expect_invalid_argument([&] { comm.allreduce_in_place(x, too_many, MPI_SUM); },
                          "oktopk::Communicator::allreduce: count");
  expect_invalid_argument([&] { comm.alltoall(x, x, too_many); },
                          "oktopk::Communicator::alltoall: count_per_rank");
  expect_invalid_argument([&] { comm.allgather(x, -2, x); },
                          "oktopk::Communicator::allgather: count");
  expect_invalid_argument([&] { comm.bcast(x, 1, p); }, "oktopk::Communicator::bcast: root");
  expect_invalid_argument([&] { comm.bcast(x, too_many, 0); },
                          "oktopk::Communicator::bcast: count");
  std::vector<int> counts(static_cast<std::size_t>(p), 1);
  std::vector<int> displacements(static_cast<std::size_t>(p), 0);
  expect_invalid_argument([&] { comm.allgatherv(x, 2, x, counts.data(), displacements.data()); },
                          "oktopk::Communicator::allgatherv: count = 2 differs from counts[");
  counts[0] = -1;
  expect_invalid_argument([&] { comm.allgatherv(x, 1, x, counts.data(), displacements.data()); },
                          "oktopk::Communicator::allgatherv: counts[0] = -1");
  EXPECT_TRUE(comm.traffic().empty());
  // Nothing reached MPI, so the communicator is still in step on every rank.
  int one = 1;
  comm.allreduce_in_place(&one, 1, MPI_SUM);
  EXPECT_EQ(one, p);
}

TEST(Communicator, MpiErrorBecomesRuntimeErrorWithMpiText) {
  Communicator comm;
  float x = 1.0f;
  float y = 0.0f;
  try {
    // Every rank rejects MPI_OP_NULL in its argument check, before any communication.
    comm.allreduce(&x, &y, 1, MPI_OP_NULL);
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    const std::string prefix = "oktopk::Communicator::allreduce: MPI_Allreduce failed: ";
    EXPECT_TRUE(starts_with(message, prefix)) << message;
    EXPECT_GT(message.size(), prefix.size()) << message;
#ifdef OPEN_MPI
    EXPECT_EQ(message, prefix + mpi_error_text(MPI_ERR_OP));
#endif
  }
  EXPECT_TRUE(comm.traffic().empty());
  comm.allreduce(&x, &y, 1, MPI_SUM);  // still usable
  EXPECT_EQ(y, static_cast<float>(comm.size()));
}

TEST(Communicator, WaitAllReportsTheFailingRequest) {
  Communicator comm;
  if (comm.size() == 1) {
    // Open MPI 4.1.4 silently truncates a self-message instead of reporting MPI_ERR_TRUNCATE.
    GTEST_SKIP() << "needs another rank";
  }
  // A ring message longer than the receive: MPI_ERR_TRUNCATE in the receive's status.
  const int p = comm.size();
  const std::int32_t send[4] = {1, 2, 3, 4};
  std::int32_t receive[2] = {0, 0};
  Communicator::Requests requests;
  comm.irecv(receive, 2, (comm.rank() + p - 1) % p, 9, requests);
  comm.isend(send, 4, (comm.rank() + 1) % p, 9, requests);
  try {
    requests.wait_all();
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    const std::string prefix = "oktopk::Communicator::Requests::wait_all: MPI_Waitall failed: ";
    // MPICH may append an error stack to the class's text.
    EXPECT_TRUE(starts_with(message, prefix + mpi_error_text(MPI_ERR_TRUNCATE))) << message;
#ifdef OPEN_MPI
    EXPECT_EQ(message, prefix + mpi_error_text(MPI_ERR_TRUNCATE));
#endif
  }
  // The send was charged when posted; the failed receive is not.
  expect_traffic_eq(comm.total_traffic(), unplaced(16, 0, 1, 0));
}

// Counts the calls of the handler below (per process).
int default_handler_calls = 0;

void count_default_handler_call(MPI_Comm*, int*, ...) { ++default_handler_calls; }

// MPICH raises MPI_Waitall's errors on MPI_COMM_WORLD's handler, not on the duplicate's (and
// MPI-4.0 raises errors tied to no communicator on MPI_COMM_SELF's): a user's handler there must
// neither see OkTopk's failure nor be replaced by it. Failed before wait_all() gave both
// MPI_ERRORS_RETURN for the call: under MPICH the handler ran once per rank.
TEST(Communicator, WaitAllFailureNeverReachesTheUsersDefaultHandlers) {
  Communicator comm;
  if (comm.size() == 1) {
    GTEST_SKIP() << "needs another rank";  // as in WaitAllReportsTheFailingRequest
  }
  MPI_Errhandler counting = MPI_ERRHANDLER_NULL;
  ASSERT_EQ(MPI_Comm_create_errhandler(count_default_handler_call, &counting), MPI_SUCCESS);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, counting);
  MPI_Comm_set_errhandler(MPI_COMM_SELF, counting);
  default_handler_calls = 0;

  const int p = comm.size();
  const std::int32_t send[4] = {1, 2, 3, 4};
  std::int32_t receive[2] = {0, 0};
  {
    Communicator::Requests requests;
    comm.irecv(receive, 2, (comm.rank() + p - 1) % p, 9, requests);
    comm.isend(send, 4, (comm.rank() + 1) % p, 9, requests);
    EXPECT_THROW(requests.wait_all(), std::runtime_error);
  }
  {
    // A successful wait in between: the handlers must come back after it too.
    std::int32_t one = comm.rank();
    std::int32_t got = -1;
    Communicator::Requests requests;
    comm.irecv(&got, 1, (comm.rank() + p - 1) % p, 10, requests);
    comm.isend(&one, 1, (comm.rank() + 1) % p, 10, requests);
    requests.wait_all();
    EXPECT_EQ(got, (comm.rank() + p - 1) % p);
  }
  EXPECT_EQ(default_handler_calls, 0);

  MPI_Errhandler on_world = MPI_ERRHANDLER_NULL;
  MPI_Errhandler on_self = MPI_ERRHANDLER_NULL;
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &on_world);
  MPI_Comm_get_errhandler(MPI_COMM_SELF, &on_self);
  EXPECT_EQ(on_world, counting);
  EXPECT_EQ(on_self, counting);
  MPI_Errhandler_free(&on_world);
  MPI_Errhandler_free(&on_self);

  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_ARE_FATAL);
  MPI_Errhandler_free(&counting);
}

TEST(MpiCheck, NamesTheFunctionAndQuotesMpi) {
  const auto failing_call = [](int code) { return code; };
  try {
    OKTOPK_MPI_CHECK("oktopk::test", failing_call(MPI_ERR_COUNT));
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()),
              "oktopk::test: failing_call failed: " + mpi_error_text(MPI_ERR_COUNT));
  }
  EXPECT_NO_THROW(OKTOPK_MPI_CHECK("oktopk::test", failing_call(MPI_SUCCESS)));
  int evaluations = 0;
  const auto counted = [&] {
    ++evaluations;
    return MPI_SUCCESS;
  };
  OKTOPK_MPI_CHECK("oktopk::test", counted());
  EXPECT_EQ(evaluations, 1);
}

// ---- agreement ---------------------------------------------------------------------------------

TEST(Communicator, CheckAgreementPassesOnEqualValues) {
  Communicator comm;
  EXPECT_NO_THROW(comm.check_agreement("test", {{"n", 1000},
                                                {"density", oktopk::agreement_digest(0.01)},
                                                {"algo", oktopk::agreement_digest("oktopk")},
                                                {"min", INT64_MIN},
                                                {"max", INT64_MAX}}));
  EXPECT_NO_THROW(comm.check_agreement("test", {}));
}

TEST(Communicator, CheckAgreementThrowsTheSameErrorOnEveryRank) {
  Communicator comm;
  if (comm.size() == 1) {
    GTEST_SKIP() << "needs two ranks to disagree";
  }
  const int r = comm.rank();
  // "beta" is the first field that differs (only rank 1 has 5); "gamma" differs too.
  std::string message;
  try {
    comm.check_agreement("oktopk::Test::setup",
                         {{"alpha", 42}, {"beta", r == 1 ? 5 : -3}, {"gamma", r}});
  } catch (const std::invalid_argument& e) {
    message = e.what();
  }
  EXPECT_EQ(message, "oktopk::Test::setup: beta differs across ranks (smallest -3, largest 5)");
  // The same text everywhere: compare digests across ranks.
  std::int64_t digest = oktopk::agreement_digest(message);
  std::int64_t smallest = 0;
  MPI_Allreduce(&digest, &smallest, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
  EXPECT_EQ(smallest, digest);
}

TEST(Communicator, CheckAgreementReportsExtremeValues) {
  Communicator comm;
  if (comm.size() == 1) {
    GTEST_SKIP() << "needs two ranks to disagree";
  }
  const std::int64_t value = comm.rank() == comm.size() - 1 ? INT64_MIN : INT64_MAX;
  try {
    comm.check_agreement("caller", {{"seed", value}});
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "caller: seed differs across ranks (smallest -9223372036854775808, largest "
              "9223372036854775807)");
  }
}

TEST(Communicator, CheckAgreementIsChargedAsAnAllreduce) {
  Communicator comm;
  auto scope = comm.phase("agreement");
  comm.check_agreement("test", {{"a", 1}, {"b", 2}, {"c", 3}});
  TrafficModel model;
  model.allreduce(3 * 2 * 8, comm.size());  // value and complement per field
  expect_traffic_eq(comm.traffic("agreement"), model.of(comm.rank()));
}

TEST(Communicator, AgreeOnFailureWithoutFailureCostsOneAllreduce) {
  Communicator comm;
  auto scope = comm.phase("agreement");
  const oktopk::AgreedFailure agreed = comm.agree_on_failure(false, "ignored", 7);
  EXPECT_FALSE(agreed);
  EXPECT_EQ(agreed.rank, -1);
  EXPECT_FALSE(agreed.every_rank);
  EXPECT_EQ(agreed.code, 0);
  EXPECT_EQ(agreed.cause, "");
  TrafficModel model;
  model.allreduce(2 * 8, comm.size());
  expect_traffic_eq(comm.traffic("agreement"), model.of(comm.rank()));
}

TEST(Communicator, AgreeOnFailureCarriesTheLowestFailingRanksCauseToEveryRank) {
  Communicator comm;
  const int P = comm.size();
  const int r = comm.rank();
  // The last rank fails; so does rank 1 when there are three ranks or more (the lowest, then).
  const int lowest = P >= 3 ? 1 : P - 1;
  const bool fails = r == P - 1 || (P >= 3 && r == 1);
  const std::string cause = fails ? "rank " + std::to_string(r) + " ran out\nof memory" : "";
  const oktopk::AgreedFailure agreed = comm.agree_on_failure(fails, cause, 100 + r);
  EXPECT_TRUE(agreed);
  EXPECT_EQ(agreed.rank, lowest);
  EXPECT_EQ(agreed.every_rank, P == 1);
  EXPECT_EQ(agreed.code, 100 + lowest);
  // Carried as it is, line breaks included.
  EXPECT_EQ(agreed.cause, "rank " + std::to_string(lowest) + " ran out\nof memory");
}

TEST(Communicator, AgreeOnFailureOfEveryRankSaysSo) {
  Communicator comm;
  const oktopk::AgreedFailure agreed = comm.agree_on_failure(true, "", -1);
  EXPECT_EQ(agreed.rank, 0);
  EXPECT_TRUE(agreed.every_rank);
  EXPECT_EQ(agreed.code, -1);
  EXPECT_EQ(agreed.cause, "");
}

TEST(Communicator, AgreeOnFailureCutsALongCause) {
  Communicator comm;
  const std::string cause(100000, 'x');
  const oktopk::AgreedFailure agreed = comm.agree_on_failure(comm.rank() == 0, cause);
  EXPECT_EQ(agreed.rank, 0);
  EXPECT_EQ(agreed.cause, std::string(65536, 'x'));
}

TEST(Communicator, SplitGroupsByColorAndRanksByKey) {
  const Communicator comm;
  const int P = comm.size();
  const int rank = comm.rank();
  // Two colors (one at P = 1); within a color, the key reverses the ranks' order.
  const Communicator part = comm.split(rank % 2, P - rank);
  const PhaseTraffic traffic_after_split = comm.total_traffic();
  int expected_size = 0;
  int expected_rank = 0;
  for (int r = 0; r < P; ++r) {
    if (r % 2 != rank % 2) continue;
    ++expected_size;
    if (r > rank) ++expected_rank;
  }
  EXPECT_EQ(part.size(), expected_size);
  EXPECT_EQ(part.rank(), expected_rank);
  // Its calls reach the ranks of its color only, and are charged to its own counters.
  std::int64_t sum = 0;
  const std::int64_t mine = rank;
  part.allreduce(&mine, &sum, 1, MPI_SUM);
  std::int64_t expected_sum = 0;
  for (int r = rank % 2; r < P; r += 2) expected_sum += r;
  EXPECT_EQ(sum, expected_sum);
  EXPECT_EQ(comm.total_traffic(), traffic_after_split);
  TrafficModel model;
  model.allreduce(8, part.size());
  expect_traffic_eq(part.total_traffic(), model.of(part.rank()));
}

TEST(Communicator, SplitWithANegativeColorThrowsOnEveryRank) {
  const Communicator comm;
  const int bad = comm.size() - 1;
  const std::string message =
      oktopk::test::invalid_argument_of([&] { comm.split(comm.rank() == bad ? -3 : 0, 0); });
  EXPECT_TRUE(starts_with(message, "oktopk::Communicator::split: ")) << message;
  EXPECT_NE(message.find("rank " + std::to_string(bad) + " passed -3"), std::string::npos)
      << message;
  // Nobody was left behind: the communicator still works on every rank.
  std::int64_t one = 1;
  std::int64_t ranks = 0;
  comm.allreduce(&one, &ranks, 1, MPI_SUM);
  EXPECT_EQ(ranks, comm.size());
}

TEST(Communicator, SplitSharedMemoryHoldsTheRanksOfThisNode) {
  const Communicator comm;
  const std::vector<int> same_node = oktopk::test::ranks_named_like_this_one();
  const Communicator node = comm.split_shared_memory();
  ASSERT_EQ(node.size(), static_cast<int>(same_node.size()));
  const auto position = std::find(same_node.begin(), same_node.end(), comm.rank());
  EXPECT_EQ(node.rank(), static_cast<int>(position - same_node.begin()));
  std::int64_t lowest = comm.rank();
  node.allreduce_in_place(&lowest, 1, MPI_MIN);
  EXPECT_EQ(lowest, same_node.front());
}

// ---- inside and between nodes ------------------------------------------------------------------

// Node maps a job can have, by name: consecutive pairs, ranks dealt round-robin over two nodes,
// one node, and a node of one rank beside a node of the rest.
std::map<std::string, std::vector<int>> node_maps(int P) {
  std::vector<int> pairs(P), dealt(P), one(P, 0), first_apart(P);
  for (int q = 0; q < P; ++q) {
    pairs[q] = q / 2;
    dealt[q] = q % 2;
    first_apart[q] = q == 0 ? 0 : 1;
  }
  return {{"pairs", pairs}, {"dealt", dealt}, {"one node", one}, {"first apart", first_apart}};
}

// Every operation, each in its own phase, on `comm`; `model` gets each one's messages as its
// algorithm (the header's) moves them.
void run_every_operation(const Communicator& comm, std::map<std::string, TrafficModel>& models) {
  const int P = comm.size();
  const int r = comm.rank();
  {
    auto scope = comm.phase("ring");
    const int next = (r + 1) % P;
    const int previous = (r + P - 1) % P;
    std::vector<float> send(static_cast<std::size_t>(3 + r), 1.0f);
    std::vector<float> receive(static_cast<std::size_t>(3 + P));
    Communicator::Requests requests;
    comm.irecv(receive.data(), 3 + P, previous, 4, requests);
    comm.isend(send.data(), 3 + r, next, 4, requests);
    requests.wait_all();
    for (int q = 0; q < P; ++q) {
      if (q != (q + 1) % P) models["ring"].message(q, (q + 1) % P, 4 * (3 + q));
    }
  }
  {
    auto scope = comm.phase("allreduce");
    std::vector<char> x(static_cast<std::size_t>(5 * P + 3), 1);
    comm.allreduce_in_place(x.data(), 5 * P + 3, MPI_MAX);
    models["allreduce"].allreduce(5 * P + 3, P);
  }
  {
    auto scope = comm.phase("alltoall");
    std::vector<std::int32_t> send(static_cast<std::size_t>(2 * P), r), receive(send.size());
    comm.alltoall(send.data(), receive.data(), 2);
    for (int s = 0; s < P; ++s) {
      for (int t = 0; t < P; ++t) {
        if (s != t) models["alltoall"].message(s, t, 8);
      }
    }
  }
  {
    auto scope = comm.phase("allgather");
    std::vector<double> send(3, 1.0), receive(static_cast<std::size_t>(3 * P));
    comm.allgather(send.data(), 3, receive.data());
    models["allgather"].allgather_blocks(std::vector<std::int64_t>(P, 24));
  }
  {
    auto scope = comm.phase("allgatherv");
    const std::vector<int> counts = mixed_counts(P);
    std::vector<int> displacements(static_cast<std::size_t>(P));
    std::exclusive_scan(counts.begin(), counts.end(), displacements.begin(), 0);
    const int total = std::accumulate(counts.begin(), counts.end(), 0);
    std::vector<std::int32_t> send(static_cast<std::size_t>(counts[r]) + 1, 5);
    std::vector<std::int32_t> receive(static_cast<std::size_t>(total) + 1);
    comm.allgatherv(send.data(), counts[r], receive.data(), counts.data(), displacements.data());
    std::vector<std::int64_t> bytes(counts.begin(), counts.end());
    for (auto& b : bytes) b *= 4;
    models["allgatherv"].allgather_blocks(bytes);
  }
  for (int root : {0, P - 1}) {
    const std::string name = "bcast" + std::to_string(root);
    auto scope = comm.phase(name);
    std::vector<unsigned char> x(static_cast<std::size_t>(7 * P + 2), 9);
    comm.bcast(x.data(), 7 * P + 2, root);
    models[name].bcast(7 * P + 2, P, root);
  }
}

TEST(Communicator, NodeMapSplitsEveryOperationByWhereItsPeerRuns) {
  const Communicator comm;
  const int P = comm.size();
  for (const auto& [map_name, map] : node_maps(P)) {
    Communicator placed = comm.with_nodes(map);
    EXPECT_EQ(placed.node_of(P - 1), map[P - 1]);
    placed.reset_traffic();
    std::map<std::string, TrafficModel> models;
    for (const char* name : {"ring", "allreduce", "alltoall", "allgather", "allgatherv", "bcast0"})
      models.emplace(name, TrafficModel(map));
    models.emplace("bcast" + std::to_string(P - 1), TrafficModel(map));
    run_every_operation(placed, models);
    for (const auto& [name, model] : models) {
      SCOPED_TRACE(name + " on the node map '" + map_name + "'");
      expect_traffic_eq(placed.traffic(name), model.of(comm.rank()));
      // Conservation between nodes, over all ranks, the model aside.
      const PhaseTraffic t = placed.traffic(name);
      EXPECT_EQ(sum_over_ranks(t.bytes_sent_between_nodes),
                sum_over_ranks(t.bytes_received_between_nodes));
    }
  }
}

TEST(Communicator, NodeMapIsTheCopysOwn) {
  Communicator comm;
  const int P = comm.size();
  const Communicator one_node = comm.with_nodes(std::vector<int>(P, 0));
  double x = 1.0;
  one_node.allreduce_in_place(&x, 1, MPI_SUM);
  // Charged by the copy with one node: nothing between nodes, in the counters both share.
  EXPECT_EQ(comm.total_traffic().bytes_sent_between_nodes, 0);
  comm.reset_traffic();
  comm.allreduce_in_place(&x, 1, MPI_SUM);
  // Charged by the original, unplaced: every byte between nodes.
  EXPECT_EQ(comm.total_traffic().bytes_sent_between_nodes, comm.total_traffic().bytes_sent);
  EXPECT_EQ(comm.node_of(comm.rank()), comm.rank());
}

TEST(Communicator, SplitKeepsTheNodeMap) {
  const Communicator comm;
  const int P = comm.size();
  const int r = comm.rank();
  std::vector<int> pairs(P);
  for (int q = 0; q < P; ++q) pairs[q] = q / 2;
  const Communicator placed = comm.with_nodes(pairs);
  // A node's ranks: all inside one node. One rank of each node: all on different nodes.
  const Communicator node = placed.split(r / 2, r);
  const Communicator across = placed.split(r % 2, r);
  for (int q = 0; q < node.size(); ++q) EXPECT_EQ(node.node_of(q), r / 2);
  for (int q = 0; q < across.size(); ++q) EXPECT_EQ(across.node_of(q), q);
  std::vector<float> x(9, 1.0f);
  node.allreduce_in_place(x.data(), 9, MPI_SUM);
  across.allreduce_in_place(x.data(), 9, MPI_SUM);
  EXPECT_EQ(node.total_traffic().bytes_sent_between_nodes, 0);
  EXPECT_EQ(node.total_traffic().bytes_received_between_nodes, 0);
  EXPECT_EQ(across.total_traffic().bytes_sent_between_nodes, across.total_traffic().bytes_sent);
  EXPECT_EQ(across.total_traffic().bytes_received_between_nodes,
            across.total_traffic().bytes_received);
  // The shared-memory split keeps it too.
  const Communicator shared = placed.split_shared_memory();
  const std::vector<int> same_node = oktopk::test::ranks_named_like_this_one();
  for (int q = 0; q < shared.size(); ++q) EXPECT_EQ(shared.node_of(q), same_node[q] / 2);
}

TEST(Communicator, WithNodesRefusesAMapOfTheWrongSizeOrANegativeNode) {
  const Communicator comm;
  const int P = comm.size();
  expect_invalid_argument(
      [&] { (void)comm.with_nodes(std::vector<int>(P + 1, 0)); },
      "oktopk::Communicator::with_nodes: node_of_rank has " + std::to_string(P + 1) + " entries");
  std::vector<int> negative(P, 0);
  negative[P - 1] = -1;
  expect_invalid_argument([&] { (void)comm.with_nodes(negative); },
                          "oktopk::Communicator::with_nodes: node_of_rank[" +
                              std::to_string(P - 1) + "] = -1 is negative");
  expect_invalid_argument([&] { (void)comm.node_of(P); }, "oktopk::Communicator::node_of: ");
}

TEST(AgreementDigest, IsFnv1aForTextAndTheBitPatternForDoubles) {
  // Published FNV-1a 64 test vectors.
  EXPECT_EQ(static_cast<std::uint64_t>(oktopk::agreement_digest(std::string_view(""))),
            0xcbf29ce484222325ULL);
  EXPECT_EQ(static_cast<std::uint64_t>(oktopk::agreement_digest(std::string_view("a"))),
            0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(static_cast<std::uint64_t>(oktopk::agreement_digest(std::string_view("foobar"))),
            0x85944171f73967e8ULL);
  EXPECT_NE(oktopk::agreement_digest(std::string_view("topka")),
            oktopk::agreement_digest(std::string_view("topkdsa")));
  EXPECT_EQ(static_cast<std::uint64_t>(oktopk::agreement_digest(1.0)), 0x3ff0000000000000ULL);
  EXPECT_EQ(static_cast<std::uint64_t>(oktopk::agreement_digest(-2.0)), 0xc000000000000000ULL);
  EXPECT_NE(oktopk::agreement_digest(0.0), oktopk::agreement_digest(-0.0));
}

}  // namespace
