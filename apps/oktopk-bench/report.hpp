// SPDX-License-Identifier: BSD-3-Clause
// oktopk-bench's report: the result of one method, the rows it prints (table, csv or json, and
// the --phases rows) on rank 0, and the progress lines on stderr.
#pragma once

#include "command_line.hpp"

#include <oktopk/node_topology.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace oktopk::bench {

constexpr const char* csv_header =
    "algo,P,n,k,density,iters,time_s_med,time_s_max,bytes_per_rank_avg,bytes_per_rank_max,"
    "words_per_rank_max_over_k,nnz_out,wrong,nnz_out_avg,words_per_call_max_over_k,"
    "between_nodes_bytes_per_rank_max";

struct PhaseRow {
  std::string name;
  double seconds = 0.0;  // median over iterations of the max over ranks
  double bytes = 0.0;    // mean over iterations of the max over ranks of max(sent, received)
  double between_nodes_bytes = 0.0;  // the same, of the bytes to and from other nodes
};

struct Result {
  std::string algo;
  std::int64_t k = 0;
  double time_med = 0.0;
  double time_max = 0.0;
  double bytes_avg = 0.0;
  double bytes_max = 0.0;
  std::int64_t nnz = 0;
  double nnz_avg = 0.0;         // mean over the timed calls of the output's non-zeros
  double bytes_call_max = 0.0;  // max over the timed calls and ranks of max(sent, received)
  // As bytes_max, of the bytes to and from ranks on other nodes.
  double between_nodes_bytes_max = 0.0;
  std::int64_t wrong = 0;
  bool unchecked = false;  // a row --check does not apply to (mpi_allreduce)
  std::vector<PhaseRow> phases;
};

/// Progress on stderr (rank 0): a line when a method starts and every 10 s.
class Progress {
 public:
  explicit Progress(int rank) : rank_(rank) {}
  void start(const std::string& algo, std::size_t index, std::size_t count);
  void tick(std::int64_t call, std::int64_t calls);

 private:
  int rank_;
  std::string algo_;
  Kokkos::Timer since_start_;
  Kokkos::Timer since_print_;
};

/// Prints on rank 0 only, each row as soon as its method is done.
class Printer {
 public:
  /// `nodes`: how the ranks group into nodes, for the text header.
  Printer(const Args& args, int ranks, int rank, const NodeTopology& nodes)
      : args_(args), P_(ranks), rank_(rank), nodes_(nodes) {}

  /// The header (csv, table) or the opening bracket (json).
  void begin(std::int64_t k);
  void row(const Result& r);
  /// The closing bracket (json), or the phases table (--phases).
  void end();

 private:
  static std::string format(const char* spec, double value);
  static double phase_seconds(const Result& r);

  const Args& args_;
  int P_;
  int rank_;
  NodeTopology nodes_;
  std::vector<Result> results_;
};

}  // namespace oktopk::bench
