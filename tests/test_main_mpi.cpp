// SPDX-License-Identifier: BSD-3-Clause
// Main of every MPI test: MPI and Kokkos initialized once with scope guards, GoogleTest output on
// rank 0 only, and the exit status reduced over ranks so a failure on any rank fails the test.
#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

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

}  // namespace

int main(int argc, char* argv[]) {
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
