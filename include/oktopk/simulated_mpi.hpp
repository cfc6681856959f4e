// SPDX-License-Identifier: BSD-3-Clause
// What OkTopk does differently when it is built against SimGrid's SMPI (smpicxx,
// scripts/smpi.sh, docs/simulation.md), which runs every rank of a program as a thread of one
// process and simulates the network between them. Known from the mpi.h the build includes:
// SMPI's includes smpi/smpi.h, whose include guard is SMPI_H. The differences, all of them:
//   - abort_job() below: MPI_Abort would make smpirun exit 0;
//   - the request-completion calls leave the error handlers of MPI_COMM_WORLD and MPI_COMM_SELF
//     alone: under SMPI, MPI_Comm_get_errhandler returns MPI_ERRHANDLER_NULL for them on every
//     rank but the first, which MPI_Comm_set_errhandler then refuses (src/communicator.cpp);
//   - the progress thread is refused: SMPI gives MPI_THREAD_SINGLE, and a thread of its own
//     that calls MPI crashes it (src/progress.cpp).
// Times are MPI_Wtime's everywhere, which under SMPI is the simulated clock.
#pragma once

#include <mpi.h>

#include <cstdlib>

namespace oktopk {

/// True when this program is built against SimGrid's SMPI.
#if defined(SMPI_H)
inline constexpr bool simulated_mpi = true;
#else
inline constexpr bool simulated_mpi = false;
#endif

/// \brief Ends the whole job, from one rank, with exit status `code`, for a failure the other
/// ranks may not share (they may be waiting in MPI). MPI_Abort on `comm`; under SMPI, whose
/// MPI_Abort makes smpirun exit 0, std::_Exit(code), which ends every rank, as they are all
/// threads of this process.
[[noreturn]] inline void abort_job(MPI_Comm comm, int code) noexcept {
  if constexpr (!simulated_mpi) MPI_Abort(comm, code);
  (void)comm;
  std::_Exit(code);
}

}  // namespace oktopk
