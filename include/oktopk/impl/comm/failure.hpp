// SPDX-License-Identifier: BSD-3-Clause
// Failures on some ranks only: how a rank words its cause (for the factory, which carries it to
// every rank), and the end of a job: once a collective call has begun, a rank that cannot go on
// must not leave the others waiting inside MPI, so it says why and aborts.
#pragma once

#include <oktopk/algorithm.hpp>
#include <oktopk/communicator.hpp>

#include <cstdint>
#include <exception>
#include <string>

namespace oktopk::impl {

/// \brief The cause `e` gives, for a failure message: its what(), except for a plain
/// std::bad_alloc (operator new, a host std::vector), whose what() names only its type:
/// "out of memory (std::bad_alloc)". Kokkos's allocation failures are std::runtime_error or
/// std::bad_alloc subclasses that name the View's label and size, and keep their what().
/// Allocates nothing, so that it works on an exhausted heap.
const char* failure_cause(const std::exception& e) noexcept;

/// \brief `text` on one line (line breaks become spaces: Kokkos's and MPICH's messages span
/// several), at most 1023 characters; empty if even that cannot be allocated.
std::string one_line(const char* text) noexcept;

/// \brief Prints "oktopk: rank R: <cause> in phase <phase> of <method> call <call>" to stderr
/// and ends every rank with exit code 1 (abort_job on the communicator's duplicate: MPI_Abort).
/// Never returns.
/// `cause` is a C string so that nothing is allocated between the catch and the abort.
[[noreturn]] void abort_after_local_failure(const Communicator& comm, const char* cause,
                                            const std::string& phase, Algorithm method,
                                            std::int64_t call) noexcept;

}  // namespace oktopk::impl
