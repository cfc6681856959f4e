// SPDX-License-Identifier: BSD-3-Clause
// Asynchronous reduces: requests, and the queue that works them in launch order, either on
// OkTopk's progress thread (the calls then overlap with whatever the caller does meanwhile) or,
// without one, on the caller's thread inside ReduceRequest::test() and wait().
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

namespace oktopk {

namespace impl {

/// One queued call and its outcome.
struct ProgressTask;

/// Queues `work` behind every call queued before it (in this process).
std::shared_ptr<ProgressTask> enqueue(std::function<void()> work);
/// Whether `task` has finished (without waiting; without a progress thread, works the queue
/// up to and including `task` on this thread first).
bool finished(ProgressTask& task);
/// Waits until `task` has finished (without a progress thread, works the queue up to it).
void wait(ProgressTask& task);
/// The exception `task` ended with (null if none); valid once it has finished.
std::exception_ptr failure(const ProgressTask& task);
/// Whether this thread is running a queued call right now.
bool in_progress_task();

}  // namespace impl

/// \brief An asynchronous reduce (SparseAllreduce::reduce_async). The call's Views, and its
/// handle, must stay alive and untouched until it has completed. Copies share the request;
/// destroying the last copy of an unfinished request does not cancel it: the call is
/// collective and still runs, on the progress thread, or without one when the queue is next
/// worked (by any later test(), wait() or blocking call), so wait for it before destroying
/// what it uses. A queued call may not wait for a call queued after it (std::logic_error).
class ReduceRequest {
 public:
  ReduceRequest() = default;
  explicit ReduceRequest(std::shared_ptr<impl::ProgressTask> task) : task_(std::move(task)) {}

  /// Whether the call has completed; then rethrows the exception it ended with, if any (the
  /// errors of SparseAllreduce::reduce, on every rank alike). Without a progress thread, first
  /// works the queued calls, in launch order, up to and including this one.
  bool test() const;
  /// Waits until the call has completed, then rethrows its exception, if any.
  void wait() const;
  /// False for a default-constructed request.
  bool valid() const { return task_ != nullptr; }

 private:
  std::shared_ptr<impl::ProgressTask> task_;
};

/// \brief Queues `work` behind every call launched before it in this process (reduce_async
/// launches through here) and returns its request: for code that wraps a reduce, copying its
/// arrays in and out, say, so that the whole runs in launch order.
ReduceRequest launch_in_order(std::function<void()> work);

/// \brief Starts OkTopk's progress thread and initialises Kokkos on it (Kokkos::initialize
/// with these arguments, which are copied). Afterwards queued calls run on that thread while
/// the caller goes on, and every OkTopk call that runs Kokkos work from another thread must go
/// through run_on_progress_thread (the C, Fortran and Python interfaces do; with Kokkos's
/// OpenMP backend before 4.0 only the thread that initialised Kokkos may launch its parallel
/// reductions). So must everything else that uses a handle or its Communicator (making,
/// saving, restoring), since two threads may not run collectives on one communicator at once.
/// Needs MPI initialised with MPI_THREAD_MULTIPLE, since the progress thread and the caller may
/// then both call MPI, Kokkos not initialised yet, and no call queued: std::runtime_error
/// otherwise. Not collective.
void initialize_kokkos_on_progress_thread(int argc, char** argv);

/// \brief Runs every queued call, finalises Kokkos on the progress thread and stops it. Does
/// nothing if no progress thread runs.
void finalize_kokkos_on_progress_thread();

/// Whether the progress thread runs.
bool progress_thread_running();

/// \brief Runs `f` after every call queued before it, on the progress thread when one runs
/// (and this is not it), else on this thread, and returns its result or rethrows its
/// exception.
template <class F>
std::invoke_result_t<F> run_on_progress_thread(F&& f) {
  using Result = std::invoke_result_t<F>;
  if (impl::in_progress_task()) return f();
  if constexpr (std::is_void_v<Result>) {
    auto task = impl::enqueue(std::function<void()>(std::forward<F>(f)));
    impl::wait(*task);
    if (auto e = impl::failure(*task)) std::rethrow_exception(e);
  } else {
    // The result lives here; the queued call only writes it.
    std::unique_ptr<Result> result;
    auto task = impl::enqueue([&result, &f] { result = std::make_unique<Result>(f()); });
    impl::wait(*task);
    if (auto e = impl::failure(*task)) std::rethrow_exception(e);
    return std::move(*result);
  }
}

}  // namespace oktopk
