// SPDX-License-Identifier: BSD-3-Clause
// oktopk-bench's measurement of one method: warm-up and timed calls on the same gradients, the
// oracle check, and the reduction over ranks of times, bytes and phases into one Result.
#pragma once

#include "command_line.hpp"
#include "gradients.hpp"
#include "report.hpp"
#include "trace.hpp"
#include "types.hpp"

#include <oktopk/oktopk.hpp>

namespace oktopk::bench {

/// Collective: times `algorithm` on the gradients of `source`, rounded into --dtype.
Result run_algorithm(const Exec& exec, const oktopk::Communicator& world, const Args& args,
                     oktopk::Algorithm algorithm, GradientSource& source, Progress& progress,
                     Trace& trace);

/// The floor for the dense method: MPI_Allreduce (through oktopk::Communicator, which counts
/// its bytes) of each call's gradient, copied to host memory untimed, into a second buffer;
/// --dtype float32 or float64 (parse() refuses the others).
Result run_mpi_baseline(const Exec& exec, const oktopk::Communicator& world, const Args& args,
                        GradientSource& source, Progress& progress, Trace& trace);

}  // namespace oktopk::bench
