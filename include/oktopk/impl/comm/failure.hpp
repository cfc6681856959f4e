// SPDX-License-Identifier: BSD-3-Clause
// The end of a job after a failure on some ranks only: once a collective call has begun, a rank
// that cannot go on must not leave the others waiting inside MPI, so it says why and aborts.
#pragma once

#include <oktopk/algorithm.hpp>
#include <oktopk/communicator.hpp>

#include <cstdint>
#include <string>

namespace oktopk::impl {

/// \brief Prints "oktopk: rank R: <cause> in phase <phase> of <method> call <call>" to stderr
/// and calls MPI_Abort on the communicator's duplicate with exit code 1, which ends every rank.
/// Never returns (should MPI_Abort return, the process exits).
[[noreturn]] void abort_after_local_failure(const Communicator& comm, const std::string& cause,
                                            const std::string& phase, Algorithm method,
                                            std::int64_t call) noexcept;

}  // namespace oktopk::impl
