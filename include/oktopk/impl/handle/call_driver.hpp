// SPDX-License-Identifier: BSD-3-Clause
// What every collective call of a handle does around a method's own steps: the agreement it
// starts with, timed phases, the end of the job when a step fails on this rank only, and the
// agreement on a failure that every rank must learn of. The flat methods (MethodBase) and the
// hierarchical mode run their steps inside it.
#pragma once

#include <oktopk/algorithm.hpp>
#include <oktopk/communicator.hpp>
#include <oktopk/stats.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/comm/failure.hpp>
#include <oktopk/impl/comm/fault_injection.hpp>
#include <oktopk/impl/handle/call_checks.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <cstdint>
#include <exception>
#include <string>
#include <utility>

namespace oktopk::impl {

/// \brief The protocol of one handle's collective calls.
///
/// A step that throws on some ranks only must not leave the others waiting inside MPI: steps
/// run in run_or_abort(), which ends the job, naming the phase the failure left. Problems every
/// rank can know of (bad lengths, another handle, non-finite input, a rejected sum) are agreed
/// first and thrown on every rank alike, by the caller, from what agree() and
/// agree_on_failure() return.
template <class ExecSpace>
class CallDriver {
 public:
  /// `comm`: the handle's communicator (the agreements run over it, phases charge their traffic
  /// to it unless they name another, a local failure ends the job through it); phase times
  /// are added to `stats`. Both must outlive the driver.
  CallDriver(const Communicator& comm, Algorithm algorithm, ReduceStats& stats)
      : comm_(comm), algorithm_(algorithm), stats_(stats) {}
  CallDriver(const CallDriver&) = delete;
  CallDriver& operator=(const CallDriver&) = delete;

  /// \brief RAII: while alive, the communication of `charged` is counted to phase `name`; on
  /// destruction the execution space is fenced and the elapsed time added to the phase in the
  /// driver's stats. A failure that leaves it names it, unless it left an inner phase first.
  class Phase {
   public:
    Phase(CallDriver& driver, const ExecSpace& exec, const Communicator& charged, const char* name)
        : driver_(driver), exec_(exec), name_(name), scope_(charged.phase(name)) {
      try {
        OKTOPK_FAULT_POINT(charged, "enter");
      } catch (...) {
        // No destructor runs for a constructor that throws: name the phase here.
        driver_.note_failed_phase(name_);
        throw;
      }
    }
    ~Phase() {
      if (std::uncaught_exceptions() > uncaught_at_start_) {
        driver_.note_failed_phase(name_);
        return;
      }
      fence(exec_, "oktopk::SparseAllreduce::phase");
      driver_.stats_.phases[name_].seconds += MPI_Wtime() - start_;
    }
    Phase(const Phase&) = delete;
    Phase& operator=(const Phase&) = delete;

   private:
    CallDriver& driver_;
    ExecSpace exec_;
    std::string name_;
    Communicator::PhaseScope scope_;
    double start_ = MPI_Wtime();  // MPI's clock, the simulated one under SMPI
    int uncaught_at_start_ = std::uncaught_exceptions();
  };

  /// A phase whose traffic is the handle's communicator's.
  Phase phase(const ExecSpace& exec, const char* name) { return Phase(*this, exec, comm_, name); }
  /// A phase whose traffic is `charged`'s (a communicator inside the handle's).
  Phase phase(const ExecSpace& exec, const Communicator& charged, const char* name) {
    return Phase(*this, exec, charged, name);
  }

  /// Runs `body`, a part of collective call `call` (1-based); if it throws on this rank, the
  /// job ends (abort_after_local_failure) with a line naming the innermost phase the failure
  /// left, or `outside` when it left none.
  template <class Body>
  void run_or_abort(std::int64_t call, Body&& body, const char* outside = "other") {
    OKTOPK_FAULT_CALL(call);
    failed_phase_.clear();
    try {
      std::forward<Body>(body)();
    } catch (const std::exception& e) {
      abort_after_local_failure(comm_, failure_cause(e), phase_left(outside), algorithm_, call);
    } catch (...) {
      abort_after_local_failure(comm_, "an exception of unknown type", phase_left(outside),
                                algorithm_, call);
    }
  }

  /// Collective, in phase `name`, inside run_or_abort(): `agreed` becomes the maximum over the
  /// ranks of every rank's values.
  void agree(const ExecSpace& exec, const char* name, CallAgreement& agreed) {
    auto timer = phase(exec, name);
    comm_.allreduce_in_place(agreed.values, CallAgreement::count, MPI_MAX);
  }

  /// Collective, in phase `name` of call `call`: whether some rank failed (`failed`, with its
  /// `cause`), the same on every rank (Communicator::agree_on_failure).
  AgreedFailure agree_on_failure(const ExecSpace& exec, std::int64_t call, const char* name,
                                 bool failed, const std::string& cause) {
    AgreedFailure agreed;
    run_or_abort(call, [&] {
      auto timer = phase(exec, name);
      agreed = comm_.agree_on_failure(failed, cause);
    });
    return agreed;
  }

 private:
  void note_failed_phase(const std::string& name) {
    if (failed_phase_.empty()) failed_phase_ = name;
  }
  const std::string& phase_left(const char* outside) {
    if (failed_phase_.empty()) failed_phase_ = outside;
    return failed_phase_;
  }

  const Communicator& comm_;
  Algorithm algorithm_;
  ReduceStats& stats_;
  std::string failed_phase_;  // the innermost phase a failure left, during run_or_abort()
};

/// Builds a handle with `build` on every rank of `comm`, collectively: where it throws on some
/// ranks only (buffers that do not fit on one device), every rank throws the same
/// std::runtime_error starting with `where` and naming the lowest failing rank and its cause;
/// where it throws on every rank (an option the method rejects), each rethrows its own.
template <class Build>
auto build_on_every_rank(const Communicator& comm, const char* where, Build&& build) {
  decltype(build()) handle;
  std::exception_ptr failure;
  std::string cause;
  try {
    handle = std::forward<Build>(build)();
  } catch (const std::exception& e) {
    failure = std::current_exception();
    cause = one_line(failure_cause(e));
  } catch (...) {
    failure = std::current_exception();
    cause = one_line("an exception of unknown type");
  }
  const AgreedFailure agreed = comm.agree_on_failure(failure != nullptr, cause);
  if (agreed.every_rank) std::rethrow_exception(failure);
  OKTOPK_REQUIRE(!agreed, std::runtime_error, where,
                 "rank " << agreed.rank << " could not build the handle: " << agreed.cause);
  return handle;
}

}  // namespace oktopk::impl
