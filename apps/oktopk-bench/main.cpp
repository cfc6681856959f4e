// SPDX-License-Identifier: BSD-3-Clause
// oktopk-bench: the collective benchmark, in the spirit of OSU and nccl-tests. Times every
// sparse allreduce method on generated (or replayed) gradients, reports time and traffic per
// rank, and with --check holds every output element to the oracle of oktopk/oracle.hpp.
// This file is the driver; the command line, the gradients, the measurement of one method,
// the report and the trace each have a file of their own beside it.
#include "command_line.hpp"
#include "common/app_failure.hpp"
#include "gradients.hpp"
#include "measure.hpp"
#include "report.hpp"
#include "trace.hpp"
#include "types.hpp"

#include <oktopk/oktopk.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <type_traits>

namespace oktopk::bench {
namespace {

void run_benchmark(const Args& args, const oktopk::Communicator& world, GradientFileHeader file) {
  const Exec exec;
  GradientSource source(args, world, file);
  if (!args.dump_path.empty()) dump_gradients(exec, world, args, source);
  Printer printer(args, world.size(), world.rank(),
                  oktopk::NodeTopology::find(world, args.options.node_size));
  printer.begin(std::min<std::int64_t>(
      args.n, static_cast<std::int64_t>(std::floor(args.density * static_cast<double>(args.n)))));
  Progress progress(world.rank());
  Trace trace(world, args.trace_path);
  const std::size_t rows = args.algorithms.size() + (args.mpi_baseline ? 1 : 0);
  for (std::size_t a = 0; a < args.algorithms.size(); ++a) {
    progress.start(oktopk::to_string(args.algorithms[a]), a, rows);
    printer.row(run_algorithm(exec, world, args, args.algorithms[a], source, progress, trace));
  }
  if (args.mpi_baseline) {
    progress.start(args.reduce_scatter ? "mpi_reduce_scatter_block" : "mpi_allreduce", rows - 1,
                   rows);
    printer.row(run_mpi_baseline(exec, world, args, source, progress, trace));
  }
  printer.end();
}

/// Everything between MPI_Init and MPI_Finalize; returns the exit status.
int bench_main(int argc, char* argv[], const oktopk::Communicator& world) {
  const bool root = world.rank() == 0;
  Args args;
  GradientFileHeader file;
  try {
    args = parse(argc, argv);
    if (args.help) {
      if (root) std::cout << usage();
      return 0;
    }
    if (args.dist.kind == DistKind::File) {
      file = check_gradient_file(world, args.dist.path);
      if (args.n_given && args.n != file.n) {
        throw UsageError("--n " + std::to_string(args.n) + " does not match the n = " +
                         std::to_string(file.n) + " of '" + args.dist.path + "'");
      }
      args.n = file.n;
    }
    args.layout = parse_layout(args.layout_spec, args.n);
  } catch (const UsageError& e) {
    if (root) std::cerr << "oktopk-bench: " << e.what() << " (see --help)\n";
    return 2;
  }
  int status = 0;
  oktopk::apps::FailureSettlement failures("oktopk-bench");
  Kokkos::ScopeGuard kokkos(argc, argv);
  try {
    // On a GPU, how the buffers reach MPI decides much of the time.
    if (root && !std::is_same_v<Kokkos::DefaultExecutionSpace, Kokkos::DefaultHostExecutionSpace>) {
      std::cerr << "oktopk-bench: GPU-aware MPI: " << oktopk::gpu_aware_mpi().reason << "\n";
    }
    run_benchmark(args, world, file);
  } catch (const std::exception& e) {
    const std::string cause = oktopk::apps::failure_cause(e);
    // Errors every rank throws alike (the library's checks, bad gradient files) are reported
    // once, by rank 0. One that hit this rank alone ends the job here, with this rank's number.
    failures.settle(cause);
    std::fflush(stdout);
    if (root) std::cerr << "oktopk-bench: " << cause << "\n";
    status = 1;
  }
  return status;
}

}  // namespace
}  // namespace oktopk::bench

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    // Destroyed before MPI_Finalize.
    const oktopk::Communicator world(MPI_COMM_WORLD);
    status = oktopk::bench::bench_main(argc, argv, world);
  }
  MPI_Finalize();
  return status;
}
