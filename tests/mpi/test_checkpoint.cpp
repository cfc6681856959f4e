// SPDX-License-Identifier: BSD-3-Clause
// SparseAllreduce::save_state / restore_state: for every method, a handle restored from a
// checkpoint continues bit for bit as the saved handle does; a truncated, damaged or foreign
// checkpoint (other algorithm, n, P, rank, options or call count) throws the same exception on
// every rank and leaves the handle as it was.
#include <oktopk/any_space.hpp>

#include "mpi_test_utils.hpp"
#include "oracle_host.hpp"

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace oktopk::test;  // NOLINT(google-build-using-namespace)
using oktopk::Algorithm;
using oktopk::Options;

using Exec = Kokkos::DefaultExecutionSpace;
using Handle = oktopk::SparseAllreduce<Exec>;
using Vector = Handle::vector_type;

constexpr std::int64_t kN = 3001;
constexpr int kCalls = 14;

/// Options under which every method carries state between calls: warm-up calls, Ok-Topk's
/// threshold and region schedules short enough to fall on both sides of a checkpoint, and S2
/// with error feedback.
Options test_options() {
  return Options()
      .set_density(0.03)
      .set_warmup_iterations(2)
      .set_threshold_period(3)
      .set_repartition_period(4)
      .set_s2_error_feedback(true);
}

std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// Rank- and call-dependent gradients with a few large entries that move between calls.
Vector gradient(int call, std::int64_t n = kN) {
  std::vector<float> host(static_cast<std::size_t>(n));
  const std::uint64_t base = mix(static_cast<std::uint64_t>(world_rank()) * 7919u + call);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint64_t r = mix(base ^ static_cast<std::uint64_t>(i));
    float v = static_cast<float>(static_cast<double>(r >> 11) / 9007199254740992.0 - 0.5);
    if ((r & 63u) == 0) v *= 20.0f;
    host[static_cast<std::size_t>(i)] = v;
  }
  Vector device("test::gradient", static_cast<std::size_t>(n));
  Kokkos::deep_copy(
      device,
      Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
          host.data(), host.size()));
  return device;
}

std::vector<std::uint32_t> bits(const Handle::const_vector_type& v) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  std::vector<std::uint32_t> b(host.extent(0));
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = bits_of(host(i));
  return b;
}

/// The outputs (as bits) of calls first..last (1-based) on `h`.
std::vector<std::vector<std::uint32_t>> run_calls(Handle& h, int first, int last) {
  Exec exec;
  std::vector<std::vector<std::uint32_t>> outputs;
  Vector out("test::out", static_cast<std::size_t>(h.size()));
  for (int call = first; call <= last; ++call) {
    h.reduce(exec, gradient(call, h.size()), out);
    outputs.push_back(bits(out));
  }
  return outputs;
}

std::string saved(const Handle& h) {
  std::ostringstream os;
  h.save_state(Exec(), os);
  return os.str();
}

void restore(Handle& h, const std::string& blob) {
  std::istringstream is(blob);
  h.restore_state(Exec(), is);
}

std::unique_ptr<Handle> make(Algorithm a, const oktopk::Communicator& comm, std::int64_t n = kN,
                             const Options& options = test_options()) {
  return oktopk::make_sparse_allreduce<Exec>(a, comm, n, options);
}

std::string algorithm_name(const ::testing::TestParamInfo<Algorithm>& info) {
  return oktopk::to_string(info.param);
}

struct Caught {
  std::string type;  // "none", "invalid_argument" or "runtime_error"
  std::string message;
};

template <class F>
Caught caught(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return {"invalid_argument", e.what()};
  } catch (const std::runtime_error& e) {
    return {"runtime_error", e.what()};
  }
  return {"none", ""};
}

bool same_text_on_all_ranks(const std::string& text) {
  return same_on_all_ranks(oktopk::agreement_digest(std::string_view(text)) & 0x3fffffffffffffff);
}

/// Collective: restoring `blob` into `h` must throw `type` on every rank with the same message,
/// which starts with restore_state's name, names `rank` and contains `cause`; `h` must be
/// unchanged (the same saved bytes before and after).
void expect_rejected(Handle& h, const std::string& blob, const std::string& type, int rank,
                     const std::string& cause) {
  const std::string before = saved(h);
  const Caught c = caught([&] { restore(h, blob); });
  EXPECT_EQ(c.type, type) << c.message;
  const std::string prefix =
      "oktopk::SparseAllreduce::restore_state: rank " + std::to_string(rank) + ": ";
  EXPECT_EQ(c.message.compare(0, prefix.size(), prefix), 0) << c.message;
  EXPECT_NE(c.message.find(cause), std::string::npos) << c.message;
  EXPECT_TRUE(same_text_on_all_ranks(c.message)) << "messages differ between ranks: " << c.message;
  EXPECT_TRUE(saved(h) == before) << "the handle changed although restore_state threw";
}

// =============================================================================================
// Bit-identical restart, every method
// =============================================================================================

class Restart : public ::testing::TestWithParam<Algorithm> {};

INSTANTIATE_TEST_SUITE_P(All, Restart, ::testing::ValuesIn(oktopk::all_algorithms), algorithm_name);

// Saved during the warm-up, right after it, and mid-schedule: later calls, their outputs and
// the final residual equal the uninterrupted handle's bit for bit.
TEST_P(Restart, ContinuesBitIdentically) {
  const Algorithm a = GetParam();
  oktopk::Communicator comm;
  for (const int at : {1, 2, 7, 9}) {
    SCOPED_TRACE("saved after call " + std::to_string(at));
    auto uninterrupted = make(a, comm);
    run_calls(*uninterrupted, 1, at);
    const std::string blob = saved(*uninterrupted);
    const auto expected = run_calls(*uninterrupted, at + 1, kCalls);

    auto restarted = make(a, comm);
    restore(*restarted, blob);
    EXPECT_EQ(restarted->stats().iteration, at);
    const auto got = run_calls(*restarted, at + 1, kCalls);
    ASSERT_EQ(got.size(), expected.size());
    for (std::size_t c = 0; c < got.size(); ++c) {
      EXPECT_TRUE(got[c] == expected[c]) << "output of call " << at + 1 + c << " differs";
    }
    EXPECT_TRUE(bits(restarted->residual()) == bits(uninterrupted->residual()));
    EXPECT_EQ(saved(*restarted), saved(*uninterrupted));
  }
}

// The state matters: a fresh handle that skips the restore diverges (so the test above can
// fail). Dense carries nothing but the call counter.
TEST_P(Restart, FreshHandleDiverges) {
  const Algorithm a = GetParam();
  if (a == Algorithm::Dense) GTEST_SKIP() << "dense carries no state between calls";
  oktopk::Communicator comm;
  auto uninterrupted = make(a, comm);
  run_calls(*uninterrupted, 1, 7);
  const auto expected = run_calls(*uninterrupted, 8, kCalls);
  auto fresh = make(a, comm);
  const auto got = run_calls(*fresh, 8, kCalls);
  EXPECT_FALSE(got == expected);
}

// =============================================================================================
// Rejected checkpoints: the same exception everywhere, the handle unchanged
// =============================================================================================

TEST(RestoreErrors, TruncatedOnOneRank) {
  oktopk::Communicator comm;
  const int odd = world_size() - 1;
  auto h = make(Algorithm::OkTopk, comm);
  run_calls(*h, 1, 5);
  const std::string good = saved(*h);
  run_calls(*h, 6, 6);  // the handle now differs from `good`
  for (const std::size_t keep :
       {std::size_t{0}, std::size_t{5}, std::size_t{20}, good.size() / 2, good.size() - 1}) {
    SCOPED_TRACE("first " + std::to_string(keep) + " bytes");
    const std::string blob = world_rank() == odd ? good.substr(0, keep) : good;
    expect_rejected(*h, blob, "runtime_error", odd, "checkpoint is truncated");
  }
}

TEST(RestoreErrors, FlippedByteOnOneRank) {
  oktopk::Communicator comm;
  const int odd = world_size() / 2;
  auto h = make(Algorithm::TopkA, comm);
  run_calls(*h, 1, 4);
  const std::string good = saved(*h);
  run_calls(*h, 5, 5);
  struct Case {
    std::size_t at;
    const char* cause;
  };
  // Magic, version, header payload, residual payload, residual checksum.
  for (const Case& c : {Case{0, "wrong magic"}, Case{8, "format version"},
                        Case{30, "header section does not match its checksum"},
                        Case{good.size() / 2, "residual section does not match its checksum"},
                        Case{good.size() - 21, "residual section does not match its checksum"}}) {
    SCOPED_TRACE("byte " + std::to_string(c.at));
    std::string blob = good;
    if (world_rank() == odd) blob[c.at] = static_cast<char>(blob[c.at] ^ 0x10);
    expect_rejected(*h, blob, "runtime_error", odd, c.cause);
  }
}

TEST(RestoreErrors, OtherAlgorithm) {
  oktopk::Communicator comm;
  auto topka = make(Algorithm::TopkA, comm);
  run_calls(*topka, 1, 3);
  auto h = make(Algorithm::OkTopk, comm);
  run_calls(*h, 1, 3);
  expect_rejected(*h, saved(*topka), "invalid_argument", 0,
                  "checkpoint was written for algorithm topka, this handle runs oktopk");
}

TEST(RestoreErrors, OtherN) {
  oktopk::Communicator comm;
  auto other = make(Algorithm::GTopk, comm, kN + 1);
  auto h = make(Algorithm::GTopk, comm);
  run_calls(*h, 1, 3);
  expect_rejected(*h, saved(*other), "invalid_argument", 0,
                  "checkpoint was written for n = 3002, this handle has n = 3001");
}

TEST(RestoreErrors, OtherOptions) {
  oktopk::Communicator comm;
  auto other = make(Algorithm::OkTopk, comm, kN, test_options().set_density(0.04));
  auto h = make(Algorithm::OkTopk, comm);
  run_calls(*h, 1, 3);
  expect_rejected(*h, saved(*other), "invalid_argument", 0, "written with other options");
}

TEST(RestoreErrors, OtherNumberOfRanks) {
  if (world_size() == 1) GTEST_SKIP() << "needs a communicator of another size";
  oktopk::Communicator self(MPI_COMM_SELF);
  oktopk::Communicator comm;
  auto single = make(Algorithm::OkTopk, self);
  auto h = make(Algorithm::OkTopk, comm);
  run_calls(*h, 1, 3);
  expect_rejected(*h, saved(*single), "invalid_argument", 0,
                  "checkpoint was written on 1 ranks, this handle's communicator has " +
                      std::to_string(world_size()));
}

// Every rank handed its neighbour's checkpoint.
TEST(RestoreErrors, OtherRank) {
  if (world_size() == 1) GTEST_SKIP() << "needs two ranks";
  oktopk::Communicator comm;
  auto h = make(Algorithm::TopkDSA, comm);
  run_calls(*h, 1, 3);
  std::string mine = saved(*h);
  std::string theirs(mine.size(), '\0');
  const int P = world_size();
  const int me = world_rank();
  MPI_Sendrecv(mine.data(), static_cast<int>(mine.size()), MPI_CHAR, (me + 1) % P, 0, theirs.data(),
               static_cast<int>(theirs.size()), MPI_CHAR, (me + P - 1) % P, 0, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
  expect_rejected(*h, theirs, "invalid_argument", 0,
                  "checkpoint was written by rank " + std::to_string(P - 1));
}

// Checkpoints of one run but from different calls (a mixed set of files).
TEST(RestoreErrors, DifferentCallsOnDifferentRanks) {
  if (world_size() == 1) GTEST_SKIP() << "needs two ranks";
  oktopk::Communicator comm;
  auto h = make(Algorithm::S2Reducer, comm);
  run_calls(*h, 1, 3);
  const std::string third = saved(*h);
  run_calls(*h, 4, 4);
  const std::string fourth = saved(*h);
  run_calls(*h, 5, 5);
  const std::string before = saved(*h);
  const Caught c = caught([&] { restore(*h, world_rank() == 0 ? third : fourth); });
  EXPECT_EQ(c.type, "invalid_argument");
  EXPECT_EQ(c.message,
            "oktopk::SparseAllreduce::restore_state: the ranks' checkpoints were written after "
            "different numbers of calls (smallest 3, largest 4)");
  EXPECT_TRUE(saved(*h) == before);
}

// A handle whose restore failed goes on exactly as a twin that never saw the attempt.
TEST(RestoreErrors, HandleWorksAfterAFailedRestore) {
  oktopk::Communicator comm;
  auto h = make(Algorithm::OkTopk, comm);
  auto twin = make(Algorithm::OkTopk, comm);
  run_calls(*h, 1, 6);
  run_calls(*twin, 1, 6);
  std::string blob = saved(*h);
  if (world_rank() == 0) blob.resize(blob.size() - 3);
  EXPECT_THROW(restore(*h, blob), std::runtime_error);
  EXPECT_TRUE(run_calls(*h, 7, kCalls) == run_calls(*twin, 7, kCalls));
}

TEST(SaveState, FailingStreamThrows) {
  oktopk::Communicator comm;
  auto h = make(Algorithm::TopkA, comm);
  std::ostringstream os;
  os.setstate(std::ios::badbit);
  const Caught c = caught([&] { h->save_state(Exec(), os); });
  EXPECT_EQ(c.type, "runtime_error");
  EXPECT_EQ(
      c.message.rfind("oktopk::SparseAllreduce::save_state: writing the checkpoint failed", 0), 0u)
      << c.message;
}

}  // namespace
