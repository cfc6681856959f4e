// SPDX-License-Identifier: BSD-3-Clause
// How the programs in apps/ end after an exception. An error every rank sees alike (a missing
// data file, a rejected gradient) is printed once by rank 0 and the program exits with status
// 1. An error on some ranks only must not leave the others waiting inside MPI: the failing rank
// prints it with its rank and ends the job (oktopk::abort_job, MPI_Abort).
#pragma once

#include <oktopk/simulated_mpi.hpp>

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <typeinfo>

namespace oktopk::apps {

/// The cause `e` gives, on one line (Kokkos's allocation failures span several): its what(),
/// except for a plain std::bad_alloc (a host std::vector), whose what() names only its type.
inline std::string failure_cause(const std::exception& e) {
  if (typeid(e) == typeid(std::bad_alloc)) return "out of memory (std::bad_alloc)";
  std::string cause = e.what();
  for (char& c : cause) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!cause.empty() && cause.back() == ' ') cause.pop_back();
  return cause;
}

class FailureSettlement {
 public:
  /// Collective over MPI_COMM_WORLD (call it early, on every rank): a communicator of its own,
  /// so that the barrier below never meets a collective the program or the library started.
  explicit FailureSettlement(const char* program) : program_(program) {
    if (MPI_Comm_dup(MPI_COMM_WORLD, &comm_) != MPI_SUCCESS) {
      throw std::runtime_error(std::string(program) + ": MPI_Comm_dup failed");
    }
    MPI_Comm_rank(comm_, &rank_);
  }
  FailureSettlement(const FailureSettlement&) = delete;
  FailureSettlement& operator=(const FailureSettlement&) = delete;
  ~FailureSettlement() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  /// After this rank caught `what`: if every rank arrives here within `wait_seconds` (they
  /// failed alike), returns, and the caller prints once and exits non-zero. Otherwise the
  /// others are busy or waiting in MPI: prints "<program>: rank R: <what>" and ends the job
  /// (oktopk::abort_job: MPI_Abort).
  void settle(const std::string& what, double wait_seconds = 5.0) {
    MPI_Request barrier = MPI_REQUEST_NULL;
    int done = 0;
    if (MPI_Ibarrier(comm_, &barrier) == MPI_SUCCESS) {
      const auto until =
          std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_seconds);
      while (!done && std::chrono::steady_clock::now() < until) {
        if (MPI_Test(&barrier, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
        if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    if (done) return;
    std::fflush(stdout);
    std::fprintf(stderr, "%s: rank %d: %s\n", program_, rank_, what.c_str());
    std::fflush(stderr);
    abort_job(MPI_COMM_WORLD, 1);
  }

 private:
  const char* program_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
};

}  // namespace oktopk::apps
