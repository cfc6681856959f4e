// SPDX-License-Identifier: BSD-3-Clause
#include <oktopk/simulated_mpi.hpp>
#include <oktopk/impl/comm/failure.hpp>

#include <mpi.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <typeinfo>

namespace oktopk::impl {
namespace {

// Copies `text` into `out` (capacity `size`, at least 1) as one NUL-terminated line, cut to
// fit; returns its length.
std::size_t flatten(const char* text, char* out, std::size_t size) noexcept {
  std::size_t used = 0;
  for (const char* c = text; c != nullptr && *c != '\0' && used + 1 < size; ++c) {
    out[used++] = *c == '\n' || *c == '\r' ? ' ' : *c;
  }
  while (used > 0 && out[used - 1] == ' ') --used;  // a trailing line break
  out[used] = '\0';
  return used;
}

}  // namespace

const char* failure_cause(const std::exception& e) noexcept {
  if (typeid(e) == typeid(std::bad_alloc)) return "out of memory (std::bad_alloc)";
  const char* what = e.what();
  return what != nullptr && *what != '\0' ? what : "an exception without a message";
}

std::string one_line(const char* text) noexcept {
  char buffer[1024];
  const std::size_t length = flatten(text, buffer, sizeof buffer);
  try {
    return std::string(buffer, length);
  } catch (...) {
    return std::string();
  }
}

void abort_after_local_failure(const Communicator& comm, const char* cause,
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
  char cause_line[1024];
  flatten(cause, cause_line, sizeof cause_line);
  char line[2048];
  std::snprintf(line, sizeof line, "oktopk: rank %d: %s in phase %s of %s call %lld\n", comm.rank(),
                cause_line, phase.c_str(), method_name.c_str(), static_cast<long long>(call));
  std::fflush(stdout);
  std::fputs(line, stderr);
  std::fflush(stderr);
  abort_job(comm.mpi_comm(), 1);
}

}  // namespace oktopk::impl
