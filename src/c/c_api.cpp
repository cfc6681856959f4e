// SPDX-License-Identifier: BSD-3-Clause
// The C interface (include/oktopk/c_api.h) over the public C++ API: handles on Kokkos's
// default execution space, errors as return codes plus a thread-local message.
#include <oktopk/c_api.h>
#include <oktopk/config.hpp>
#include <oktopk/make_sparse_allreduce.hpp>
#include <oktopk/progress.hpp>

#include <Kokkos_Core.hpp>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unistd.h>

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using DeviceVector = Kokkos::View<float*, Exec::memory_space>;
using ConstDeviceVector = Kokkos::View<const float*, Exec::memory_space>;
using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;

constexpr bool host_reads_device_memory =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, Exec::memory_space>::accessible;

thread_local std::string last_error;
// Handles alive: oktopk_finalize refuses to finalise Kokkos under them.
std::atomic<long> live_handles{0};
// Whether oktopk_initialize initialised Kokkos (and oktopk_finalize may finalise it).
std::atomic<bool> kokkos_ours{false};

// Runs `body`, turning every exception into a return code and this thread's message.
template <class Body>
int guarded(Body&& body) {
  try {
    body();
    return OKTOPK_SUCCESS;
  } catch (const std::invalid_argument& e) {
    last_error = e.what();
    return OKTOPK_ERROR_INVALID_ARGUMENT;
  } catch (const std::bad_alloc& e) {
    last_error = std::string("out of memory (") + e.what() + ")";
    return OKTOPK_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    last_error = e.what();
    return OKTOPK_ERROR_RUNTIME;
  } catch (...) {
    last_error = "an exception of unknown type";
    return OKTOPK_ERROR_RUNTIME;
  }
}

void require_handle(const void* handle, const char* where) {
  if (handle == nullptr) throw std::invalid_argument(std::string(where) + ": handle is NULL");
}

}  // namespace

struct oktopk_request {
  oktopk::ReduceRequest request;
};

struct oktopk_handle {
  std::unique_ptr<oktopk::SparseAllreduce<Exec>> sparse_allreduce;
  std::string algorithm;
  // Copies of host arrays where the host cannot reach the execution space's memory.
  DeviceVector staged_grad;
  DeviceVector staged_out;
  // The last oktopk_reduce_sparse's result, and its host copy where the host cannot reach it.
  oktopk::SparseResult<Exec::memory_space> sparse;
  Kokkos::View<oktopk::index_type*, Kokkos::HostSpace> sparse_indices_host;
  Kokkos::View<float*, Kokkos::HostSpace> sparse_values_host;
};

namespace {

void check_mpi(const char* where, int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw std::runtime_error(std::string(where) + ": " + call +
                           " failed: " + std::string(text, static_cast<std::size_t>(length)));
}

// The user's communicator is freed: drop its Communicator (handles keep their own copies).
int forget_communicator(MPI_Comm, int, void* value, void*) {
  delete static_cast<oktopk::Communicator*>(value);
  return MPI_SUCCESS;
}

// Every handle made on one user communicator shares one duplicate of it, cached as an
// attribute of that communicator: calls launched in different orders on different ranks then
// meet in the same collective, which detects it, where separate duplicates would deadlock.
oktopk::Communicator shared_communicator(const char* where, MPI_Comm comm) {
  static const int keyval = [where] {
    int k = MPI_KEYVAL_INVALID;
    check_mpi(where,
              MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, forget_communicator, &k, nullptr),
              "MPI_Comm_create_keyval");
    return k;
  }();
  if (comm == MPI_COMM_NULL)
    throw std::invalid_argument(std::string(where) + ": comm is MPI_COMM_NULL");
  void* value = nullptr;
  int found = 0;
  check_mpi(where, MPI_Comm_get_attr(comm, keyval, &value, &found), "MPI_Comm_get_attr");
  if (found) return *static_cast<oktopk::Communicator*>(value);
  // Duplicates comm: collective, like everything after it.
  auto cached = std::make_unique<oktopk::Communicator>(comm);
  check_mpi(where, MPI_Comm_set_attr(comm, keyval, cached.get()), "MPI_Comm_set_attr");
  return *cached.release();
}

// The segments oktopk_create_with_layout was given, as the caller's arrays.
struct LayoutArrays {
  std::int64_t count = 0;
  const std::int64_t* lengths = nullptr;
  const int* kinds = nullptr;
  const std::int64_t* row_widths = nullptr;
  const char* const* names = nullptr;
};

// The Layout the arrays describe, segments placed one after the other from 0. Throws
// std::invalid_argument with a bare reason (create() puts the function and rank in front)
// for what Layout::validate would otherwise report under its own name, or cannot see (a kind
// outside the enum, a NULL array).
oktopk::Layout read_layout(const LayoutArrays& arrays, std::int64_t n) {
  oktopk::Layout layout;
  if (arrays.count == 0) return layout;
  if (arrays.count < 0)
    throw std::invalid_argument("num_segments must be >= 0, got " + std::to_string(arrays.count));
  const auto null_array = [&](const char* name) {
    return std::invalid_argument(std::string(name) +
                                 " is NULL with num_segments = " + std::to_string(arrays.count));
  };
  if (arrays.lengths == nullptr) throw null_array("lengths");
  if (arrays.kinds == nullptr) throw null_array("kinds");
  if (arrays.row_widths == nullptr) throw null_array("row_widths");
  for (std::int64_t i = 0; i < arrays.count; ++i) {
    const std::string segment = "segment " + std::to_string(i) + ": ";
    const std::int64_t length = arrays.lengths[i];
    if (length < 0)
      throw std::invalid_argument(segment + "length must be >= 0, got " + std::to_string(length));
    // Compared before adding, so that no sum of lengths can overflow.
    if (length > n - layout.end())
      throw std::invalid_argument(segment + "it ends at " + std::to_string(layout.end()) + " + " +
                                  std::to_string(length) + ", past n = " + std::to_string(n));
    const char* name = arrays.names != nullptr && arrays.names[i] != nullptr ? arrays.names[i] : "";
    switch (arrays.kinds[i]) {
      case OKTOPK_SEGMENT_DENSE:
        layout.append_dense(length, name);
        break;
      case OKTOPK_SEGMENT_ROWS:
        if (arrays.row_widths[i] < 1)
          throw std::invalid_argument(segment + "row width must be >= 1, got " +
                                      std::to_string(arrays.row_widths[i]));
        layout.append_sparse_rows(length, arrays.row_widths[i], name);
        break;
      default:
        throw std::invalid_argument(
            segment + "kind must be OKTOPK_SEGMENT_DENSE (" + std::to_string(OKTOPK_SEGMENT_DENSE) +
            ") or OKTOPK_SEGMENT_ROWS (" + std::to_string(OKTOPK_SEGMENT_ROWS) + "), got " +
            std::to_string(arrays.kinds[i]));
    }
  }
  if (layout.end() != n)
    throw std::invalid_argument("the segments cover [0, " + std::to_string(layout.end()) +
                                "), not [0, n = " + std::to_string(n) + ")");
  return layout;
}

oktopk_handle* create(const char* where, MPI_Comm comm, const char* algorithm, std::int64_t n,
                      const char* options, const LayoutArrays& segments) {
  const oktopk::Communicator communicator = shared_communicator(where, comm);
  // A bad method name, option or segment on some ranks only must not leave the others waiting
  // in make_sparse_allreduce: the ranks agree on whether every one could read its arguments.
  oktopk::Algorithm method{};
  oktopk::Options settings;
  oktopk::Layout layout;
  const int local_code = guarded([&] {
    if (!Kokkos::is_initialized())
      throw std::runtime_error("Kokkos is not initialised (call oktopk_initialize first)");
    if (algorithm == nullptr) throw std::invalid_argument("algorithm is NULL");
    method = oktopk::algorithm_from_string(algorithm);
    if (options != nullptr) settings.set_from_string(options);
    layout = read_layout(segments, n);
  });
  // Every rank reports the (lowest) failing rank's own reason and code.
  const oktopk::AgreedFailure failure = communicator.agree_on_failure(
      local_code != OKTOPK_SUCCESS, local_code == OKTOPK_SUCCESS ? std::string() : last_error,
      local_code);
  if (failure) {
    const std::string message =
        std::string(where) + ": rank " + std::to_string(failure.rank) + ": " + failure.cause;
    if (failure.code == OKTOPK_ERROR_INVALID_ARGUMENT) throw std::invalid_argument(message);
    if (failure.code == OKTOPK_ERROR_OUT_OF_MEMORY) throw std::bad_alloc();
    throw std::runtime_error(message);
  }
  // Default-initialised (every member has a default constructor): GCC 12 value-initialising
  // this struct leaves out the definition of a Kokkos develop View member's constructor and
  // the link fails (docs/kokkos-develop-gcc12/README.md).
  std::unique_ptr<oktopk_handle> handle(new oktopk_handle);
  handle->sparse_allreduce =
      oktopk::make_sparse_allreduce(Exec(), method, communicator, n, settings, layout);
  handle->algorithm = oktopk::to_string(method);
  if constexpr (!host_reads_device_memory) {
    // The copies of host arrays are made now, where the ranks agree on failures: allocated in
    // the first reduce, a failure on one rank would leave the others waiting in it.
    const int code = guarded([&] {
      const Exec exec;
      handle->staged_grad = DeviceVector(
          Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::c_api::staged_grad"),
          static_cast<std::size_t>(n));
      handle->staged_out = DeviceVector(
          Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::c_api::staged_out"),
          static_cast<std::size_t>(n));
      exec.fence();
    });
    // Every rank throws with the (lowest) failing rank's cause.
    const oktopk::AgreedFailure failure = communicator.agree_on_failure(
        code != OKTOPK_SUCCESS, code == OKTOPK_SUCCESS ? std::string() : last_error);
    if (failure)
      throw std::runtime_error(std::string(where) + ": rank " + std::to_string(failure.rank) +
                               " could not allocate the copies of host arrays: " + failure.cause);
  }
  return handle.release();
}

// A NULL array stands for an empty one, so that a NULL on some ranks only becomes the length
// error that reduce() reports on every rank rather than a rank that never joins the call.
template <class View, class Pointer>
View wrap(Pointer data, std::int64_t n) {
  return View(data, data == nullptr ? 0 : static_cast<std::size_t>(n));
}

void reduce_device(oktopk_handle& h, const float* grad, float* out) {
  const Exec exec;
  const std::int64_t n = h.sparse_allreduce->size();
  h.sparse_allreduce->reduce(
      exec, wrap<Kokkos::View<const float*, Exec::memory_space, Unmanaged>>(grad, n),
      wrap<Kokkos::View<float*, Exec::memory_space, Unmanaged>>(out, n));
  exec.fence();
}

void reduce_host(oktopk_handle& h, const float* grad, float* out) {
  if constexpr (host_reads_device_memory) {
    reduce_device(h, grad, out);
  } else {
    const Exec exec;
    const std::int64_t n = h.sparse_allreduce->size();
    using HostConst = Kokkos::View<const float*, Kokkos::HostSpace, Unmanaged>;
    using Host = Kokkos::View<float*, Kokkos::HostSpace, Unmanaged>;
    const auto host_grad = wrap<HostConst>(grad, n);
    const auto host_out = wrap<Host>(out, n);
    // Lengths that differ from n reach reduce() unchanged, which reports them on every rank.
    const auto device_grad = host_grad.extent(0) == h.staged_grad.extent(0)
                                 ? ConstDeviceVector(h.staged_grad)
                                 : ConstDeviceVector();
    const auto device_out =
        host_out.extent(0) == h.staged_out.extent(0) ? h.staged_out : DeviceVector();
    if (device_grad.extent(0) != 0) Kokkos::deep_copy(exec, h.staged_grad, host_grad);
    h.sparse_allreduce->reduce(exec, device_grad, device_out);
    if (device_out.extent(0) != 0) Kokkos::deep_copy(exec, host_out, h.staged_out);
    exec.fence();
  }
}

// reduce_sparse of a host gradient; the result's entries end up in host memory, which
// *indices and *values point to. Staged as reduce_host stages.
void reduce_sparse_host(oktopk_handle& h, const float* grad, const std::int32_t** indices,
                        const float** values, std::int64_t* count) {
  const Exec exec;
  const std::int64_t n = h.sparse_allreduce->size();
  if constexpr (host_reads_device_memory) {
    h.sparse_allreduce->reduce_sparse(
        exec, wrap<Kokkos::View<const float*, Exec::memory_space, Unmanaged>>(grad, n), h.sparse);
    *indices = h.sparse.indices.data();
    *values = h.sparse.values.data();
  } else {
    const auto host_grad = wrap<Kokkos::View<const float*, Kokkos::HostSpace, Unmanaged>>(grad, n);
    // Lengths that differ from n reach reduce_sparse() unchanged, which reports them everywhere.
    const auto device_grad = host_grad.extent(0) == h.staged_grad.extent(0)
                                 ? ConstDeviceVector(h.staged_grad)
                                 : ConstDeviceVector();
    if (device_grad.extent(0) != 0) Kokkos::deep_copy(exec, h.staged_grad, host_grad);
    h.sparse_allreduce->reduce_sparse(exec, device_grad, h.sparse);
    const auto size = static_cast<std::size_t>(h.sparse.size);
    if (h.sparse_indices_host.extent(0) < size) {
      Kokkos::resize(h.sparse_indices_host, h.sparse.indices.extent(0));
      Kokkos::resize(h.sparse_values_host, h.sparse.values.extent(0));
    }
    const auto entries = Kokkos::make_pair(std::size_t{0}, size);
    Kokkos::deep_copy(exec, Kokkos::subview(h.sparse_indices_host, entries),
                      Kokkos::subview(h.sparse.indices, entries));
    Kokkos::deep_copy(exec, Kokkos::subview(h.sparse_values_host, entries),
                      Kokkos::subview(h.sparse.values, entries));
    *indices = h.sparse_indices_host.data();
    *values = h.sparse_values_host.data();
  }
  exec.fence();
  *count = h.sparse.size;
}

void write_state(const oktopk_handle& h, std::ostream& os) {
  h.sparse_allreduce->save_state(Exec(), os);
}

}  // namespace

extern "C" {

const char* oktopk_version(void) { return OKTOPK_VERSION_STRING; }

const char* oktopk_last_error(void) { return last_error.c_str(); }

int oktopk_initialize(int* argc, char*** argv) {
  return guarded([&] {
    if (Kokkos::is_initialized()) return;
    // With MPI_THREAD_MULTIPLE, Kokkos lives on the progress thread, where every call of this
    // interface then runs, so that asynchronous reduces overlap with the caller's work.
    // Otherwise everything runs on the caller's thread (asynchronous calls in test and wait).
    int mpi_initialized = 0, provided = MPI_THREAD_SINGLE;
    MPI_Initialized(&mpi_initialized);
    if (mpi_initialized) MPI_Query_thread(&provided);
    const bool have_args = argc != nullptr && argv != nullptr;
    if (provided == MPI_THREAD_MULTIPLE) {
      oktopk::initialize_kokkos_on_progress_thread(have_args ? *argc : 0,
                                                   have_args ? *argv : nullptr);
    } else if (have_args) {
      Kokkos::initialize(*argc, *argv);
    } else {
      Kokkos::initialize();
    }
    kokkos_ours = true;
  });
}

int oktopk_finalize(void) {
  return guarded([&] {
    if (!kokkos_ours) return;
    if (live_handles != 0)
      throw std::runtime_error("oktopk_finalize: " + std::to_string(live_handles.load()) +
                               " handle(s) not destroyed; Kokkos stays initialised");
    if (oktopk::progress_thread_running()) {
      oktopk::finalize_kokkos_on_progress_thread();
    } else {
      Kokkos::finalize();
    }
    kokkos_ours = false;
  });
}

int oktopk_create(MPI_Comm comm, const char* algorithm, int64_t n, const char* options,
                  oktopk_handle** handle) {
  return guarded([&] {
    if (handle == nullptr) throw std::invalid_argument("oktopk_create: handle is NULL");
    *handle = nullptr;
    *handle = oktopk::run_on_progress_thread(
        [&] { return create("oktopk_create", comm, algorithm, n, options, LayoutArrays{}); });
    ++live_handles;
  });
}

int oktopk_create_with_layout(MPI_Comm comm, const char* algorithm, int64_t n, const char* options,
                              int64_t num_segments, const int64_t* lengths, const int* kinds,
                              const int64_t* row_widths, const char* const* names,
                              oktopk_handle** handle) {
  return guarded([&] {
    constexpr const char* where = "oktopk_create_with_layout";
    if (handle == nullptr) throw std::invalid_argument(std::string(where) + ": handle is NULL");
    *handle = nullptr;
    const LayoutArrays segments{num_segments, lengths, kinds, row_widths, names};
    *handle = oktopk::run_on_progress_thread(
        [&] { return create(where, comm, algorithm, n, options, segments); });
    ++live_handles;
  });
}

int oktopk_create_with_layout_f(MPI_Fint comm, const char* algorithm, int64_t n,
                                const char* options, int64_t num_segments, const int64_t* lengths,
                                const int* kinds, const int64_t* row_widths,
                                const char* const* names, oktopk_handle** handle) {
  return oktopk_create_with_layout(MPI_Comm_f2c(comm), algorithm, n, options, num_segments, lengths,
                                   kinds, row_widths, names, handle);
}

int oktopk_create_f(MPI_Fint comm, const char* algorithm, int64_t n, const char* options,
                    oktopk_handle** handle) {
  return oktopk_create(MPI_Comm_f2c(comm), algorithm, n, options, handle);
}

int oktopk_destroy(oktopk_handle* handle) {
  return guarded([&] {
    if (handle == nullptr) return;
    // Queued behind the handle's own asynchronous calls, which therefore end first.
    oktopk::run_on_progress_thread([handle] { delete handle; });
    --live_handles;
  });
}

int oktopk_reduce(oktopk_handle* handle, const float* grad, float* out) {
  return guarded([&] {
    require_handle(handle, "oktopk_reduce");
    oktopk::run_on_progress_thread([&] { reduce_host(*handle, grad, out); });
  });
}

int oktopk_reduce_async(oktopk_handle* handle, const float* grad, float* out,
                        oktopk_request** request) {
  return guarded([&] {
    if (request == nullptr) throw std::invalid_argument("oktopk_reduce_async: request is NULL");
    *request = nullptr;
    require_handle(handle, "oktopk_reduce_async");
    auto launched = std::make_unique<oktopk_request>();
    launched->request =
        oktopk::launch_in_order([handle, grad, out] { reduce_host(*handle, grad, out); });
    *request = launched.release();
  });
}

int oktopk_test(oktopk_request* request, int* done) {
  if (done != nullptr) *done = 0;
  return guarded([&] {
    if (request == nullptr) throw std::invalid_argument("oktopk_test: request is NULL");
    if (done == nullptr) throw std::invalid_argument("oktopk_test: done is NULL");
    bool finished = false;
    try {
      finished = request->request.test();
    } catch (...) {
      *done = 1;  // finished, with the error the reduce reported
      throw;
    }
    *done = finished ? 1 : 0;
  });
}

int oktopk_wait(oktopk_request* request) {
  return guarded([&] {
    if (request == nullptr) throw std::invalid_argument("oktopk_wait: request is NULL");
    request->request.wait();
  });
}

int oktopk_request_free(oktopk_request* request) {
  return guarded([&] {
    if (request == nullptr) return;
    std::unique_ptr<oktopk_request> owned(request);
    // Its outcome was the caller's to collect; freeing only needs it to be over.
    try {
      owned->request.wait();
    } catch (const std::exception&) {
    }
  });
}

int oktopk_reduce_sparse(oktopk_handle* handle, const float* grad, const int32_t** indices,
                         const float** values, int64_t* count) {
  constexpr const char* where = "oktopk_reduce_sparse";
  if (indices != nullptr) *indices = nullptr;
  if (values != nullptr) *values = nullptr;
  if (count != nullptr) *count = 0;
  return guarded([&] {
    require_handle(handle, where);
    const bool outputs_given = indices != nullptr && values != nullptr && count != nullptr;
    const std::int32_t* got_indices = nullptr;
    const float* got_values = nullptr;
    std::int64_t got_count = 0;
    try {
      // Without somewhere to put the result, the call is joined with no gradient, so that the
      // other ranks fail with the length error instead of waiting for this one.
      oktopk::run_on_progress_thread([&] {
        reduce_sparse_host(*handle, outputs_given ? grad : nullptr, &got_indices, &got_values,
                           &got_count);
      });
    } catch (const std::invalid_argument&) {
      if (!outputs_given) {
        throw std::invalid_argument(std::string(where) +
                                    ": indices, values and count must not be NULL");
      }
      throw;
    }
    if (!outputs_given) {
      // n == 0: an empty gradient was a valid call.
      throw std::invalid_argument(std::string(where) +
                                  ": indices, values and count must not be NULL");
    }
    *indices = got_indices;
    *values = got_values;
    *count = got_count;
  });
}

int oktopk_reduce_device(oktopk_handle* handle, const float* grad, float* out) {
  return guarded([&] {
    require_handle(handle, "oktopk_reduce_device");
    oktopk::run_on_progress_thread([&] { reduce_device(*handle, grad, out); });
  });
}

int oktopk_describe(const oktopk_handle* handle, const char** algorithm, int64_t* n, int64_t* k) {
  return guarded([&] {
    require_handle(handle, "oktopk_describe");
    if (algorithm != nullptr) *algorithm = handle->algorithm.c_str();
    if (n != nullptr) *n = handle->sparse_allreduce->size();
    if (k != nullptr) *k = handle->sparse_allreduce->k();
  });
}

int oktopk_get_stats(const oktopk_handle* handle, oktopk_stats* stats) {
  return guarded([&] {
    require_handle(handle, "oktopk_get_stats");
    if (stats == nullptr) throw std::invalid_argument("oktopk_get_stats: stats is NULL");
    // In launch order: the stats of the last call launched before, once it has run.
    const oktopk::ReduceStats s =
        oktopk::run_on_progress_thread([handle] { return handle->sparse_allreduce->stats(); });
    const oktopk::PhaseTraffic traffic = s.total_traffic();
    *stats = oktopk_stats{};
    stats->iteration = s.iteration;
    stats->k = s.k;
    stats->local_selected = s.local_selected;
    stats->global_selected = s.global_selected;
    stats->bytes_sent = traffic.bytes_sent;
    stats->bytes_received = traffic.bytes_received;
    stats->messages_sent = traffic.messages_sent;
    stats->messages_received = traffic.messages_received;
    stats->seconds = s.total_seconds();
    stats->local_threshold = s.local_threshold;
    stats->global_threshold = s.global_threshold;
    stats->dense = s.dense ? 1 : 0;
  });
}

int oktopk_get_residual(const oktopk_handle* handle, float* out, int64_t n) {
  return guarded([&] {
    constexpr const char* where = "oktopk_get_residual";
    require_handle(handle, where);
    const std::int64_t size = handle->sparse_allreduce->size();
    if (n != size) {
      throw std::invalid_argument(std::string(where) + ": n is " + std::to_string(n) +
                                  ", the handle's n " + std::to_string(size));
    }
    if (out == nullptr && n > 0) throw std::invalid_argument(std::string(where) + ": out is NULL");
    const Kokkos::View<float*, Kokkos::HostSpace, Unmanaged> host(out, static_cast<std::size_t>(n));
    // In launch order, after the calls launched before it have run.
    oktopk::run_on_progress_thread([handle, host] {
      const Exec exec;
      Kokkos::deep_copy(exec, host, handle->sparse_allreduce->residual());
      exec.fence();
    });
  });
}

int oktopk_get_num_segments(const oktopk_handle* handle, int64_t* num_segments) {
  return guarded([&] {
    constexpr const char* where = "oktopk_get_num_segments";
    require_handle(handle, where);
    if (num_segments == nullptr)
      throw std::invalid_argument(std::string(where) + ": num_segments is NULL");
    *num_segments = static_cast<int64_t>(handle->sparse_allreduce->layout().segments().size());
  });
}

int oktopk_get_segment_stats(const oktopk_handle* handle, int64_t index,
                             oktopk_segment_stats* stats) {
  return guarded([&] {
    constexpr const char* where = "oktopk_get_segment_stats";
    require_handle(handle, where);
    if (stats == nullptr) throw std::invalid_argument(std::string(where) + ": stats is NULL");
    // The layout never changes after create: only the counts need the calls before this one.
    const auto& segments = handle->sparse_allreduce->layout().segments();
    const auto count = static_cast<std::int64_t>(segments.size());
    if (index < 0 || index >= count)
      throw std::invalid_argument(std::string(where) + ": index " + std::to_string(index) +
                                  " is outside [0, " + std::to_string(count) + ")");
    const oktopk::ReduceStats s =
        oktopk::run_on_progress_thread([handle] { return handle->sparse_allreduce->stats(); });
    const oktopk::Segment& segment = segments[static_cast<std::size_t>(index)];
    *stats = oktopk_segment_stats{};
    stats->offset = segment.offset;
    stats->length = segment.length;
    stats->row_width = segment.kind == oktopk::SegmentKind::SparseRows ? segment.row_width : 1;
    // Empty before the first call: nothing counted yet.
    stats->nonzeros = s.segments.empty() ? 0 : s.segments[static_cast<std::size_t>(index)].nonzeros;
    stats->kind = segment.kind == oktopk::SegmentKind::SparseRows ? OKTOPK_SEGMENT_ROWS
                                                                  : OKTOPK_SEGMENT_DENSE;
    stats->name = segment.name.c_str();
  });
}

int oktopk_save_state(const oktopk_handle* handle, const char* path) {
  return guarded([&] {
    constexpr const char* where = "oktopk_save_state";
    require_handle(handle, where);
    if (path == nullptr) throw std::invalid_argument(std::string(where) + ": path is NULL");
    const std::string target = path;
    const std::string temporary = target + ".tmp." + std::to_string(::getpid());
    {
      std::ofstream os(temporary, std::ios::binary | std::ios::trunc);
      if (!os) throw std::runtime_error(std::string(where) + ": cannot write " + temporary);
      try {
        oktopk::run_on_progress_thread([&] { write_state(*handle, os); });
      } catch (...) {
        os.close();
        std::remove(temporary.c_str());  // never leave a partial file behind
        throw;
      }
      os.close();
      if (!os) {
        std::remove(temporary.c_str());
        throw std::runtime_error(std::string(where) + ": writing " + temporary + " failed");
      }
    }
    if (std::rename(temporary.c_str(), target.c_str()) != 0) {
      const std::string cause = std::strerror(errno);
      std::remove(temporary.c_str());
      throw std::runtime_error(std::string(where) + ": cannot rename " + temporary + " to " +
                               target + ": " + cause);
    }
  });
}

int oktopk_restore_state(oktopk_handle* handle, const char* path) {
  return guarded([&] {
    require_handle(handle, "oktopk_restore_state");
    // A missing or unreadable file reads as an empty checkpoint, which restore_state rejects
    // on every rank alike (a rank that returned here alone would leave the others waiting).
    std::ifstream is;
    if (path != nullptr) is.open(path, std::ios::binary);
    oktopk::run_on_progress_thread([&] { handle->sparse_allreduce->restore_state(Exec(), is); });
  });
}

int oktopk_save_state_to_buffer(const oktopk_handle* handle, void* buffer, size_t capacity,
                                size_t* size) {
  return guarded([&] {
    constexpr const char* where = "oktopk_save_state_to_buffer";
    require_handle(handle, where);
    if (size == nullptr) throw std::invalid_argument(std::string(where) + ": size is NULL");
    std::ostringstream os(std::ios::binary);
    oktopk::run_on_progress_thread([&] { write_state(*handle, os); });
    const std::string bytes = os.str();
    if (buffer != nullptr) {
      if (capacity < bytes.size())
        throw std::invalid_argument(std::string(where) + ": the buffer holds " +
                                    std::to_string(capacity) + " bytes, the state needs " +
                                    std::to_string(bytes.size()));
      std::memcpy(buffer, bytes.data(), bytes.size());
    }
    *size = bytes.size();
  });
}

int oktopk_restore_state_from_buffer(oktopk_handle* handle, const void* buffer, size_t size) {
  return guarded([&] {
    require_handle(handle, "oktopk_restore_state_from_buffer");
    std::istringstream is(
        buffer == nullptr ? std::string() : std::string(static_cast<const char*>(buffer), size),
        std::ios::binary);
    oktopk::run_on_progress_thread([&] { handle->sparse_allreduce->restore_state(Exec(), is); });
  });
}

}  // extern "C"
