// SPDX-License-Identifier: BSD-3-Clause
// oktopk-bench --trace: every message of the timed calls, of every rank, in one CSV file.
#pragma once

#include <oktopk/oktopk.hpp>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

namespace oktopk::bench {

constexpr const char* trace_header =
    "algo,call,rank,phase,operation,peer,bytes_sent,bytes_received";

/// --trace: each rank keeps the CSV rows of its messages; after every method rank 0 collects
/// them (point to point, rank by rank, so the file is ordered by method, then rank, then call)
/// and appends them to the one file. Nothing is recorded without --trace.
class Trace {
 public:
  /// Collective: rank 0 creates the file and writes the header; every rank learns whether it
  /// could, so all throw together rather than some waiting later.
  Trace(const oktopk::Communicator& world, const std::string& path);

  bool enabled() const { return !path_.empty(); }

  /// Appends the records `comm` logged in one call (its log holds exactly that call: the
  /// handle resets the accounting at the start of every call).
  void add_call(const std::string& algo, std::int64_t call, const oktopk::Communicator& comm);

  /// Collective: moves every rank's rows to the file and clears them.
  void flush();

 private:
  oktopk::Communicator world_;
  std::string path_;
  std::ofstream out_;
  std::ostringstream rows_;
};

}  // namespace oktopk::bench
