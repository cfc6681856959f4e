// SPDX-License-Identifier: BSD-3-Clause
// Test-only fault injection. Compiled in only with OKTOPK_FAULT_INJECTION defined (the fault
// tests' own build); otherwise the points below are empty and cost nothing.
//
// OKTOPK_FAULT=RANK:PHASE:CALL:KIND[:POINT] makes rank RANK fail when it reaches fault point
// POINT (enter, the default: a phase begins; posted: nonblocking operations are in flight) in
// phase PHASE of reduce() call CALL (1-based, as ReduceStats::iteration). KIND is
//   alloc      throw std::bad_alloc (an allocation failure, e.g. a device out of memory)
//   mpi        make a real erroneous MPI call on the handle's communicator (checked: it throws)
//   invariant  throw std::logic_error (an internal invariant found broken)
//   kill       raise SIGKILL (the process dies without a word, as under kill -9)
// OKTOPK_FAULT=list records instead every (phase, point) passed and the first call that passed
// it, for fault_injection::passed(). With OKTOPK_FAULT_STAMP=FILE, the failing rank first writes
// the time of the failure (nanoseconds since the epoch, system clock) to FILE, so a test can
// measure how long the job takes to end after it.
#pragma once

#ifdef OKTOPK_FAULT_INJECTION

#include <oktopk/communicator.hpp>
#include <oktopk/impl/comm/mpi_check.hpp>

#include <mpi.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace oktopk::impl::fault_injection {

struct Spec {
  bool list = false;
  int rank = -1;
  std::string phase;
  std::int64_t call = 0;
  std::string kind;
  std::string point = "enter";
};

inline Spec parse_spec() {
  Spec spec;
  const char* text = std::getenv("OKTOPK_FAULT");
  if (text == nullptr || *text == '\0') return spec;
  if (std::string(text) == "list") {
    spec.list = true;
    return spec;
  }
  std::istringstream in(text);
  std::string rank, call;
  if (!std::getline(in, rank, ':') || !std::getline(in, spec.phase, ':') ||
      !std::getline(in, call, ':') || !std::getline(in, spec.kind, ':')) {
    throw std::invalid_argument(
        std::string("OKTOPK_FAULT: expected RANK:PHASE:CALL:KIND[:POINT], got '") + text + "'");
  }
  std::getline(in, spec.point, ':');
  if (spec.point.empty()) spec.point = "enter";
  spec.rank = std::stoi(rank);
  spec.call = std::stoll(call);
  if (spec.kind != "alloc" && spec.kind != "mpi" && spec.kind != "invariant" &&
      spec.kind != "kill") {
    throw std::invalid_argument("OKTOPK_FAULT: unknown kind '" + spec.kind + "'");
  }
  return spec;
}

inline const Spec& spec() {
  static const Spec parsed = parse_spec();
  return parsed;
}

/// The reduce() call in progress (1-based), set by SparseAllreduce::reduce.
inline std::int64_t& current_call() {
  static std::int64_t call = 0;
  return call;
}

/// With OKTOPK_FAULT=list: (phase, point) -> the first call that passed it.
inline std::map<std::pair<std::string, std::string>, std::int64_t>& passed() {
  static std::map<std::pair<std::string, std::string>, std::int64_t> points;
  return points;
}

/// Writes the current time to $OKTOPK_FAULT_STAMP, if set (best effort: a test without the
/// stamp reports the fault as not reached).
inline void write_stamp() {
  const char* file = std::getenv("OKTOPK_FAULT_STAMP");
  if (file == nullptr || *file == '\0') return;
  const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::system_clock::now().time_since_epoch());
  if (std::FILE* f = std::fopen(file, "w")) {
    std::fprintf(f, "%lld\n", static_cast<long long>(now.count()));
    std::fclose(f);
  }
}

inline void point(const Communicator& comm, const char* point_name) {
  const Spec& s = spec();
  const std::string& phase = comm.current_phase();
  if (s.list) {
    passed().emplace(std::make_pair(phase, std::string(point_name)), current_call());
    return;
  }
  if (s.rank != comm.rank() || s.call != current_call() || s.phase != phase ||
      s.point != point_name) {
    return;
  }
  write_stamp();
  if (s.kind == "alloc") throw std::bad_alloc();
  if (s.kind == "invariant") {
    throw std::logic_error("oktopk: internal invariant broken (injected)");
  }
  if (s.kind == "kill") std::raise(SIGKILL);
  // A negative count: MPI returns MPI_ERR_COUNT through the duplicate's MPI_ERRORS_RETURN.
  int unused = 0;
  OKTOPK_MPI_CHECK("oktopk::impl::fault_injection::point",
                   MPI_Send(&unused, -1, MPI_INT, comm.rank(), 0, comm.mpi_comm()));
  throw std::logic_error("oktopk: MPI accepted the injected erroneous call");
}

}  // namespace oktopk::impl::fault_injection

#define OKTOPK_FAULT_POINT(comm, name) ::oktopk::impl::fault_injection::point((comm), (name))
#define OKTOPK_FAULT_CALL(call) (::oktopk::impl::fault_injection::current_call() = (call))

#else

#define OKTOPK_FAULT_POINT(comm, name) ((void)0)
#define OKTOPK_FAULT_CALL(call) ((void)0)

#endif
