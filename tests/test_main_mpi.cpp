// SPDX-License-Identifier: BSD-3-Clause
// Main of every MPI test: MPI and Kokkos initialized once with scope guards, GoogleTest output on
// rank 0 only, and the exit status reduced over ranks so a failure on any rank fails the test.
// The argument --host-staging stages every MPI buffer through a host copy
// (impl::stage_host_views_for_tests): the *_host_staging tests, the same programs. An argument
// rather than an environment variable, so that the ctest command line shows it and no other
// program a test starts inherits it.
#include <oktopk/impl/comm/mpi_mirror.hpp>

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstring>

namespace {

struct MpiScope {
  MpiScope(int* argc, char*** argv) { MPI_Init(argc, argv); }
  ~MpiScope() { MPI_Finalize(); }
};

// Prints failures of every rank (prefixed with the rank), since rank 0 cannot see them.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed()) {
      std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_,
                   result.file_name() ? result.file_name() : "?", result.line_number(),
                   result.summary());
    }
  }

 private:
  int rank_;
};

// Removes --host-staging from the arguments, before Kokkos and GoogleTest read them; whether it
// was there.
bool take_host_staging_argument(int& argc, char* argv[]) {
  bool found = false;
  int kept = 0;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::strcmp(argv[i], "--host-staging") == 0) {
      found = true;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argv[kept] = nullptr;
  argc = kept;
  return found;
}

}  // namespace

int main(int argc, char* argv[]) {
  oktopk::impl::stage_host_views_for_tests = take_host_staging_argument(argc, argv);
  MpiScope mpi(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    ::testing::InitGoogleTest(&argc, argv);
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    if (rank != 0) {
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new FailurePrinter(rank));
    }
    const int local = RUN_ALL_TESTS();
    MPI_Allreduce(&local, &status, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0 && status != local) {
      std::fprintf(stderr, "oktopk test main: a test failed on another rank\n");
    }
  }
  return status;
}
