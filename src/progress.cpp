// SPDX-License-Identifier: BSD-3-Clause
// The queue of asynchronous calls and OkTopk's progress thread (include/oktopk/progress.hpp).
#include <oktopk/progress.hpp>
#include <oktopk/simulated_mpi.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace oktopk {

namespace impl {

struct ProgressTask {
  std::function<void()> work;
  std::mutex mutex;
  std::condition_variable finished_cv;
  bool done = false;
  std::exception_ptr error;
};

namespace {

thread_local bool running_a_task = false;

// Runs one task on this thread and publishes its outcome.
void run(ProgressTask& task) {
  std::exception_ptr error;
  running_a_task = true;
  try {
    task.work();
  } catch (...) {
    error = std::current_exception();
  }
  running_a_task = false;
  task.work = nullptr;  // drop what the call captured (Views) as soon as it is done
  {
    std::lock_guard<std::mutex> lock(task.mutex);
    task.error = error;
    task.done = true;
  }
  task.finished_cv.notify_all();
}

bool is_done(ProgressTask& task) {
  std::lock_guard<std::mutex> lock(task.mutex);
  return task.done;
}

class ProgressQueue {
 public:
  static ProgressQueue& instance() {
    static ProgressQueue queue;
    return queue;
  }

  // A program that ends without finalize_kokkos_on_progress_thread still exits cleanly (a
  // joinable std::thread would call std::terminate here).
  ~ProgressQueue() { stop_thread(); }

  std::shared_ptr<ProgressTask> enqueue(std::function<void()> work) {
    auto task = std::make_shared<ProgressTask>();
    task->work = std::move(work);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending_.push_back(task);
    }
    queued_cv_.notify_one();
    return task;
  }

  // Without a progress thread, the waiting thread works the queue in launch order until
  // `task` is done; one thread at a time, so that launch order is also execution order.
  void work_until(ProgressTask& task) {
    if (is_done(task) || threaded()) return;
    std::lock_guard<std::mutex> working(worker_mutex_);
    while (!is_done(task)) {
      std::shared_ptr<ProgressTask> next;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (pending_.empty()) break;  // `task` was taken by a thread that has let go since
        next = pending_.front();
        pending_.pop_front();
      }
      run(*next);
    }
  }

  // True from the start of the thread until it has drained the queue and ended, so that no
  // other thread works the queue meanwhile.
  bool threaded() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return running_;
  }

  void start_thread() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (thread_.joinable())
      throw std::runtime_error(
          "oktopk::initialize_kokkos_on_progress_thread: the progress "
          "thread already runs");
    // Calls queued before would run on the new thread before Kokkos is initialised there.
    if (!pending_.empty())
      throw std::runtime_error(
          "oktopk::initialize_kokkos_on_progress_thread: " + std::to_string(pending_.size()) +
          " asynchronous call(s) are still queued; wait for them first");
    stopping_ = false;
    running_ = true;
    thread_ = std::thread([this] { serve(); });
  }

  // Stops the thread once everything queued before has run.
  void stop_thread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!thread_.joinable()) return;
      stopping_ = true;
    }
    queued_cv_.notify_all();
    thread_.join();
    std::lock_guard<std::mutex> lock(mutex_);
    running_ = false;
  }

 private:
  void serve() {
    while (true) {
      std::shared_ptr<ProgressTask> next;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        queued_cv_.wait(lock, [this] { return stopping_ || !pending_.empty(); });
        if (pending_.empty()) return;  // stopping, and nothing is left
        next = pending_.front();
        pending_.pop_front();
      }
      run(*next);
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable queued_cv_;
  std::deque<std::shared_ptr<ProgressTask>> pending_;
  std::thread thread_;
  bool stopping_ = false;
  bool running_ = false;
  std::mutex worker_mutex_;
};

}  // namespace

std::shared_ptr<ProgressTask> enqueue(std::function<void()> work) {
  return ProgressQueue::instance().enqueue(std::move(work));
}

// A queued call that waits for another can only wait for one that has finished: the queue
// runs one call at a time, so any other would wait for it forever.
static void refuse_waiting_inside_a_task(ProgressTask& task, const char* where) {
  if (running_a_task && !is_done(task))
    throw std::logic_error(std::string(where) +
                           ": a queued call cannot wait for another one that has not run yet "
                           "(calls run one at a time, in launch order)");
}

bool finished(ProgressTask& task) {
  if (running_a_task) return is_done(task);
  if (!is_done(task)) ProgressQueue::instance().work_until(task);
  return is_done(task);
}

void wait(ProgressTask& task) {
  refuse_waiting_inside_a_task(task, "oktopk::ReduceRequest::wait");
  if (running_a_task) return;
  ProgressQueue::instance().work_until(task);
  std::unique_lock<std::mutex> lock(task.mutex);
  task.finished_cv.wait(lock, [&task] { return task.done; });
}

std::exception_ptr failure(const ProgressTask& task) {
  std::lock_guard<std::mutex> lock(const_cast<ProgressTask&>(task).mutex);
  return task.error;
}

bool in_progress_task() { return running_a_task; }

}  // namespace impl

bool ReduceRequest::test() const {
  if (!task_) throw std::invalid_argument("oktopk::ReduceRequest::test: an empty request");
  if (!impl::finished(*task_)) return false;
  if (auto e = impl::failure(*task_)) std::rethrow_exception(e);
  return true;
}

void ReduceRequest::wait() const {
  if (!task_) throw std::invalid_argument("oktopk::ReduceRequest::wait: an empty request");
  impl::wait(*task_);
  if (auto e = impl::failure(*task_)) std::rethrow_exception(e);
}

ReduceRequest launch_in_order(std::function<void()> work) {
  if (!work) throw std::invalid_argument("oktopk::launch_in_order: no work given");
  return ReduceRequest(impl::enqueue(std::move(work)));
}

void initialize_kokkos_on_progress_thread(int argc, char** argv) {
  constexpr const char* where = "oktopk::initialize_kokkos_on_progress_thread";
  if constexpr (simulated_mpi) {
    throw std::runtime_error(std::string(where) +
                             ": SimGrid's SMPI runs every rank as a thread of one process and "
                             "a thread of a rank's own that calls MPI crashes it: there is no "
                             "progress thread under SMPI (launch and wait work the queue on the "
                             "calling thread without it)");
  }
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (initialized) MPI_Query_thread(&provided);
  if (!initialized || provided != MPI_THREAD_MULTIPLE)
    throw std::runtime_error(std::string(where) +
                             ": needs MPI initialised with MPI_THREAD_MULTIPLE "
                             "(MPI_Init_thread), since the progress thread calls MPI while the "
                             "caller may too");
  if (Kokkos::is_initialized())
    throw std::runtime_error(std::string(where) + ": Kokkos is already initialised");
  // Kokkos keeps no pointer to its arguments, but they must outlive the queued call.
  std::vector<std::string> args(argv, argv + (argv == nullptr ? 0 : argc));
  impl::ProgressQueue::instance().start_thread();
  try {
    run_on_progress_thread([&args] {
      std::vector<char*> pointers;
      for (auto& a : args) pointers.push_back(a.data());
      pointers.push_back(nullptr);
      int count = static_cast<int>(args.size());
      if (count == 0) {
        Kokkos::initialize();
      } else {
        Kokkos::initialize(count, pointers.data());
      }
    });
  } catch (...) {
    impl::ProgressQueue::instance().stop_thread();
    throw;
  }
}

void finalize_kokkos_on_progress_thread() {
  if (!progress_thread_running()) return;
  try {
    run_on_progress_thread([] { Kokkos::finalize(); });
  } catch (...) {
    impl::ProgressQueue::instance().stop_thread();
    throw;
  }
  impl::ProgressQueue::instance().stop_thread();
}

bool progress_thread_running() { return impl::ProgressQueue::instance().threaded(); }

}  // namespace oktopk
