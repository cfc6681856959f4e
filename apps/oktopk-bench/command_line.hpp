// SPDX-License-Identifier: BSD-3-Clause
// oktopk-bench's command line: the settings it parses, and the --help text that documents them.
#pragma once

#include "common/cli.hpp"

#include <oktopk/oktopk.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace oktopk::bench {

using oktopk::apps::parse_number;
using oktopk::apps::UsageError;

enum class DistKind { Normal, Laplace, Lognormal, Correlated, Rows, Levels, File };

struct Distribution {
  DistKind kind = DistKind::Normal;
  double parameter = 0.0;  // RHO, R or L
  std::string path;        // file:PATH
  std::string text = "normal";
};

struct Args {
  std::vector<oktopk::Algorithm> algorithms{oktopk::all_algorithms.begin(),
                                            oktopk::all_algorithms.end()};
  std::int64_t n = 1048576;
  bool n_given = false;
  double density = 0.01;
  std::int64_t iters = 20;
  std::int64_t warmup = 5;
  Distribution dist;
  std::uint64_t seed = 1;
  bool check = false;
  bool phases = false;
  bool mpi_baseline = false;
  bool shifted_draws = false;
  /// Calls reduce_sparse (the result as indices and values) instead of reduce.
  bool sparse_result = false;
  /// Calls reduce_scatter (each rank its equal shard of the result) instead of reduce.
  bool reduce_scatter = false;
  bool help = false;
  std::string format = "table";
  std::string dtype = "float32";  // the gradient's type, by the library's name for it
  std::string dump_path;
  std::string trace_path;
  oktopk::Options options;
  std::string layout_spec;  // --layout as given; `layout` once n is known
  oktopk::Layout layout;
};

/// The --help text.
std::string usage();

/// Parses identically on every rank (it reads nothing but argv), so all ranks agree on
/// whether to run. Throws UsageError.
Args parse(int argc, char* argv[]);

/// --layout SPEC for a buffer of n entries (the forms are --help's). Throws UsageError.
oktopk::Layout parse_layout(const std::string& spec, std::int64_t n);

}  // namespace oktopk::bench
