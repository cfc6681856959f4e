// SPDX-License-Identifier: BSD-3-Clause
#include <oktopk/impl/comm/failure.hpp>

#include <mpi.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>

namespace oktopk::impl {

void abort_after_local_failure(const Communicator& comm, const std::string& cause,
                               const std::string& phase, Algorithm method,
                               std::int64_t call) noexcept {
  // Built in a stack buffer (the failure may be an exhausted heap) and written at once, so that
  // lines of several failing ranks do not interleave.
  std::string method_name;  // short enough for the string's own storage: no allocation
  try {
    method_name = to_string(method);
  } catch (...) {
    method_name = "?";
  }
  // One line: MPICH's error strings carry a multi-line error stack.
  char one_line[1024];
  std::size_t used = 0;
  for (const char c : cause) {
    if (used + 1 == sizeof one_line) break;
    one_line[used++] = c == '\n' ? ' ' : c;
  }
  one_line[used] = '\0';
  char line[2048];
  std::snprintf(line, sizeof line, "oktopk: rank %d: %s in phase %s of %s call %lld\n", comm.rank(),
                one_line, phase.c_str(), method_name.c_str(), static_cast<long long>(call));
  std::fflush(stdout);
  std::fputs(line, stderr);
  std::fflush(stderr);
  MPI_Abort(comm.mpi_comm(), 1);
  std::_Exit(1);
}

}  // namespace oktopk::impl
