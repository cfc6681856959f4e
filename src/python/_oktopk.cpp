// SPDX-License-Identifier: BSD-3-Clause
// _oktopk: the compiled half of the Python package oktopk. A thin pybind11 layer over the C
// interface (include/oktopk/c_api.h) and nothing else, so that it needs neither OkTopk's C++
// headers nor Kokkos' nor torch's, and one build serves every torch version. The pure-Python
// half (oktopk/__init__.py) adds the names users call, the conversion of communicators, options
// and torch tensors, and the qualified function names in front of error messages: the messages
// raised here are bare.
//
// Lifetime: Kokkos is initialised (oktopk_initialize) by initialize(), or else when the first
// handle is made, and shutdown(), which the package registers with atexit after importing
// mpi4py.MPI (so that it runs before mpi4py's MPI_Finalize), completes every request in
// flight, destroys every handle still alive and then calls oktopk_finalize, which refuses to
// run under live handles.
#include <oktopk/c_api.h>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

// ---- errors

// Raises the Python exception for a C API return code, with this thread's message (read before
// anything else can call the C API on this thread).
[[noreturn]] void raise_code(int code, const std::string& message) {
  switch (code) {
    case OKTOPK_ERROR_INVALID_ARGUMENT:
      throw py::value_error(message);
    case OKTOPK_ERROR_OUT_OF_MEMORY:
      // pybind11 maps std::bad_alloc to a MemoryError without text; keep the C API's reason.
      PyErr_SetString(PyExc_MemoryError, message.c_str());
      throw py::error_already_set();
    default:
      throw std::runtime_error(message);  // RuntimeError
  }
}

void check(int code) {
  if (code != OKTOPK_SUCCESS) raise_code(code, oktopk_last_error());
}

// ---- library lifetime (every function here runs with the GIL held, which serialises them)

bool initialized_here = false;  // whether this module called oktopk_initialize
bool finalized = false;         // shutdown() ran: no new handles from now on

// oktopk_initialize with Kokkos arguments ("--kokkos-num-threads=2", ...), before any handle.
void initialize(const std::vector<std::string>& kokkos_args) {
  if (finalized) throw std::runtime_error("oktopk has been finalised (the interpreter is exiting)");
  if (initialized_here) {
    if (kokkos_args.empty()) return;
    throw std::runtime_error(
        "Kokkos is already initialised (the first handle does it): pass Kokkos arguments "
        "before making a handle");
  }
  int mpi_initialized = 0;
  MPI_Initialized(&mpi_initialized);
  if (!mpi_initialized)
    throw std::runtime_error("MPI is not initialised (import mpi4py.MPI first)");
  // Kokkos may reorder or drop the arguments it read: give it copies, with a program name.
  std::vector<std::string> storage{"python"};
  storage.insert(storage.end(), kokkos_args.begin(), kokkos_args.end());
  std::vector<char*> argv;
  for (auto& arg : storage) argv.push_back(arg.data());
  argv.push_back(nullptr);
  int argc = static_cast<int>(storage.size());
  char** argv_data = argv.data();
  check(oktopk_initialize(&argc, &argv_data));
  initialized_here = true;
}

// A C handle, shared by the Python Handle object and the requests launched on it: a request in
// flight keeps its handle alive, whatever happens to the Python object.
struct HandleCore {
  oktopk_handle* handle = nullptr;
  std::string algorithm;
  std::int64_t n = 0;
  std::int64_t k = 0;
  // The gradients' and the residual's types (OKTOPK_FLOAT32, ...).
  int dtype = OKTOPK_FLOAT32;
  int residual_dtype = OKTOPK_FLOAT32;

  HandleCore() = default;
  HandleCore(const HandleCore&) = delete;
  HandleCore& operator=(const HandleCore&) = delete;
  ~HandleCore() { destroy(); }

  void destroy() {
    if (handle != nullptr) oktopk_destroy(handle);  // never fails for a live handle
    handle = nullptr;
  }
};

// A C request and its outcome. Waiting happens without the GIL, so `mutex` orders the threads
// that may wait on, test or free it at once (a completion thread and shutdown(), say).
struct RequestCore {
  std::mutex mutex;
  oktopk_request* request = nullptr;
  std::shared_ptr<HandleCore> handle;
  // Written under `mutex`, read without it (Request.done, the destructors).
  std::atomic<bool> done{false};
  int code = OKTOPK_SUCCESS;
  std::string message;

  RequestCore() = default;
  RequestCore(const RequestCore&) = delete;
  RequestCore& operator=(const RequestCore&) = delete;
  ~RequestCore() { wait(); }

  // Records the outcome and frees the C request; `mutex` held.
  void finish_locked(int result) {
    if (done) return;
    code = result;
    if (code != OKTOPK_SUCCESS) message = oktopk_last_error();
    oktopk_request_free(request);
    request = nullptr;
    done = true;
  }

  // Waits for completion; call without the GIL.
  void wait() {
    std::lock_guard<std::mutex> lock(mutex);
    if (!done) finish_locked(oktopk_wait(request));
  }

  // Whether the request has completed, without waiting. A request another thread is waiting
  // on reads as not done yet.
  bool test() {
    std::unique_lock<std::mutex> lock(mutex, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    if (done) return true;
    int flag = 0;
    const int result = oktopk_test(request, &flag);
    if (flag != 0) finish_locked(result);
    return done;
  }
};

// What shutdown() must reach: every handle and request still alive. Weak, so that the registry
// never keeps anything alive itself; expired entries are swept when new ones are added.
std::vector<std::weak_ptr<HandleCore>> all_handles;
std::vector<std::weak_ptr<RequestCore>> all_requests;

template <class T>
void remember(std::vector<std::weak_ptr<T>>& registry, const std::shared_ptr<T>& item) {
  std::vector<std::weak_ptr<T>> alive;
  alive.reserve(registry.size() + 1);
  for (auto& entry : registry)
    if (!entry.expired()) alive.push_back(std::move(entry));
  alive.push_back(item);
  registry = std::move(alive);
}

void shutdown() {
  if (finalized) return;
  finalized = true;
  // Locked copies: nothing can expire under the loops.
  std::vector<std::shared_ptr<RequestCore>> requests;
  for (const auto& entry : all_requests)
    if (auto request = entry.lock()) requests.push_back(std::move(request));
  std::vector<std::shared_ptr<HandleCore>> handles;
  for (const auto& entry : all_handles)
    if (auto handle = entry.lock()) handles.push_back(std::move(handle));
  all_requests.clear();
  all_handles.clear();
  {
    py::gil_scoped_release release;
    // A request's call is collective and runs to its end; its peers launched it too.
    for (auto& request : requests) request->wait();
    for (auto& handle : handles) handle->destroy();
  }
  if (initialized_here) {
    initialized_here = false;
    check(oktopk_finalize());
  }
}

// ---- arrays

// The C interface's gradient types by their numpy names; bfloat16, which numpy lacks, travels
// as its bit patterns (uint16 or int16 arrays).
struct DtypeName {
  int dtype;
  const char* name;
};
constexpr DtypeName dtype_names[] = {{OKTOPK_FLOAT32, "float32"},
                                     {OKTOPK_FLOAT64, "float64"},
                                     {OKTOPK_BFLOAT16, "bfloat16"},
                                     {OKTOPK_FLOAT16, "float16"}};

std::string dtype_name(int dtype) {
  for (const auto& entry : dtype_names)
    if (entry.dtype == dtype) return entry.name;
  return "dtype " + std::to_string(dtype);
}

int dtype_from_name(const std::string& name) {
  for (const auto& entry : dtype_names)
    if (name == entry.name) return entry.dtype;
  throw py::value_error("dtype must be float32, float64, bfloat16 or float16, not '" + name + "'");
}

// The numpy dtype of arrays of a C type (uint16 for bfloat16's bit patterns).
py::dtype numpy_dtype(int dtype) {
  switch (dtype) {
    case OKTOPK_FLOAT64:
      return py::dtype::of<double>();
    case OKTOPK_BFLOAT16:
      return py::dtype::of<std::uint16_t>();
    case OKTOPK_FLOAT16:
      return py::dtype("float16");
    default:
      return py::dtype::of<float>();
  }
}

// Whether a numpy dtype holds values of the C type (equal() compares byte order too: a
// big-endian float32 array is not one).
bool holds(const py::dtype& dtype, int c_type) {
  if (dtype.equal(numpy_dtype(c_type))) return true;
  return c_type == OKTOPK_BFLOAT16 && dtype.equal(py::dtype::of<std::int16_t>());
}

std::size_t item_bytes(int dtype) {
  return dtype == OKTOPK_FLOAT64 ? 8 : dtype == OKTOPK_FLOAT32 ? 4 : 2;
}

struct Arrays {
  const void* grad = nullptr;
  void* out = nullptr;
};

// Why arrays cannot be reduced: TypeError for what they are, ValueError for their length,
// writability or overlap. Empty if they can.
struct Problem {
  bool type_error = false;
  std::string message;
  bool empty() const { return message.empty(); }
};

Problem array_problem(const py::handle& object, const char* name, const HandleCore& core,
                      bool writable, bool of_length_n = true) {
  const std::string wanted =
      core.dtype == OKTOPK_BFLOAT16 ? "bfloat16 (uint16 bit patterns)" : dtype_name(core.dtype);
  if (!py::isinstance<py::array>(object))
    return {true,
            std::string(name) + " must be a " + wanted +
                " numpy.ndarray, buffer or CPU torch.Tensor, not " +
                py::str(py::type::handle_of(object).attr("__qualname__")).cast<std::string>()};
  const auto array = py::reinterpret_borrow<py::array>(object);
  if (!holds(array.dtype(), core.dtype))
    return {true, std::string(name) + " must have dtype " + wanted +
                      " (native byte order), the handle's, not " +
                      py::str(array.dtype()).cast<std::string>()};
  if ((array.flags() & py::array::c_style) == 0)
    return {true, std::string(name) + " must be C-contiguous (numpy.ascontiguousarray)"};
  if (writable && !array.writeable()) return {false, std::string(name) + " is read-only"};
  if (of_length_n && static_cast<std::int64_t>(array.size()) != core.n)
    return {false, std::string(name) + " has " + std::to_string(array.size()) +
                       " elements, the handle's n is " + std::to_string(core.n)};
  return {};
}

// Checks grad and out and fills `arrays`, or returns the problem.
Problem take_arrays(const py::handle& grad, const py::handle& out, const HandleCore& core,
                    Arrays& arrays) {
  Problem problem = array_problem(grad, "grad", core, false);
  if (problem.empty()) problem = array_problem(out, "out", core, true);
  if (!problem.empty()) return problem;
  const auto g = py::reinterpret_borrow<py::array>(grad);
  auto o = py::reinterpret_borrow<py::array>(out);
  const auto* g_begin = static_cast<const char*>(g.data());
  const auto* o_begin = static_cast<const char*>(o.data());
  const auto bytes =
      static_cast<std::ptrdiff_t>(core.n) * static_cast<std::ptrdiff_t>(item_bytes(core.dtype));
  // In place (the same memory) is allowed; a partial overlap is not (c_api.h).
  if (g_begin != o_begin && g_begin < o_begin + bytes && o_begin < g_begin + bytes)
    return {false, "grad and out overlap without being the same array"};
  arrays.grad = g.data();
  arrays.out = o.mutable_data();
  return {};
}

// ---- Python classes

class Request;

// One segment of a fused buffer as the package passes it: (kind, length, row width, name),
// kind OKTOPK_SEGMENT_DENSE or OKTOPK_SEGMENT_ROWS; the C interface checks the values.
using SegmentTuple = std::tuple<int, std::int64_t, std::int64_t, std::string>;

class Handle {
 public:
  Handle(int comm, const std::string& algorithm, std::int64_t n, const std::string& options,
         const std::vector<SegmentTuple>& layout, const std::string& dtype) {
    const int c_type = dtype_from_name(dtype);
    initialize({});
    core_ = std::make_shared<HandleCore>();
    // The C interface's arrays, read while the GIL is released.
    const auto count = static_cast<std::int64_t>(layout.size());
    std::vector<std::int64_t> lengths, row_widths;
    std::vector<int> kinds;
    std::vector<const char*> names;
    for (const auto& [kind, length, row_width, name] : layout) {
      kinds.push_back(kind);
      lengths.push_back(length);
      row_widths.push_back(row_width);
      names.push_back(name.c_str());
    }
    oktopk_handle* handle = nullptr;
    int code = OKTOPK_SUCCESS;
    std::string message;
    {
      py::gil_scoped_release release;  // collective: other Python threads go on meanwhile
      const auto fortran_comm = static_cast<MPI_Fint>(comm);
      code = oktopk_create_typed_f(fortran_comm, algorithm.c_str(), n, c_type, options.c_str(),
                                   count, lengths.data(), kinds.data(), row_widths.data(),
                                   names.data(), &handle);
      if (code != OKTOPK_SUCCESS) message = oktopk_last_error();
    }
    if (code != OKTOPK_SUCCESS) raise_code(code, message);
    core_->handle = handle;
    const char* name = nullptr;
    check(oktopk_describe(handle, &name, &core_->n, &core_->k));
    core_->algorithm = name;
    check(oktopk_get_dtype(handle, &core_->dtype, &core_->residual_dtype));
    remember(all_handles, core_);
  }

  // The C handle, or ValueError once closed or finalised.
  oktopk_handle* get() const {
    if (!core_ || core_->handle == nullptr)
      throw py::value_error(finalized ? "the handle was destroyed when oktopk was finalised"
                                      : "the handle is closed");
    return core_->handle;
  }

  void reduce(const py::object& grad, const py::object& out) {
    oktopk_handle* handle = get();
    Arrays arrays;
    const Problem problem = take_arrays(grad, out, *core_, arrays);
    if (!problem.empty()) fail_reduce(problem);
    const int dtype = core_->dtype;
    int code = OKTOPK_SUCCESS;
    std::string message;
    {
      py::gil_scoped_release release;
      code = oktopk_reduce_typed(handle, dtype, arrays.grad, arrays.out);
      if (code != OKTOPK_SUCCESS) message = oktopk_last_error();
    }
    if (code != OKTOPK_SUCCESS) raise_code(code, message);
  }

  std::unique_ptr<Request> reduce_async(const py::object& grad, const py::object& out);

  // Collective. oktopk_reduce_on_stream on device memory the package found in tensors: n values
  // of the handle's type at `grad` and `out` (addresses), the work on `stream` (a
  // cudaStream_t or hipStream_t as an int; 0 for the legacy default stream). The C interface
  // checks where the memory lives and the stream, and agrees on refusals over the ranks.
  void reduce_on_stream(std::uintptr_t grad, std::uintptr_t out, std::uintptr_t stream) {
    oktopk_handle* handle = get();
    const int dtype = core_->dtype;
    int code = OKTOPK_SUCCESS;
    std::string message;
    {
      py::gil_scoped_release release;
      code = oktopk_reduce_on_stream(handle, dtype, address(grad), address(out), address(stream));
      if (code != OKTOPK_SUCCESS) message = oktopk_last_error();
    }
    if (code != OKTOPK_SUCCESS) raise_code(code, message);
  }

  // Collective. oktopk_reduce_on_stream_async; the request keeps `keep_grad` and `keep_out`
  // (the tensors that own the memory) until it completes.
  std::unique_ptr<Request> reduce_on_stream_async(std::uintptr_t grad, std::uintptr_t out,
                                                  std::uintptr_t stream,
                                                  const py::object& keep_grad,
                                                  const py::object& keep_out);

  // Collective. (indices int32, values of the handle's type): copies of the sparse result,
  // which the C interface keeps only until the handle's next call.
  py::tuple reduce_sparse(const py::object& grad) {
    oktopk_handle* handle = get();
    const Problem problem = array_problem(grad, "grad", *core_, false);
    if (!problem.empty()) fail_reduce(problem);
    const auto g = py::reinterpret_borrow<py::array>(grad);
    const void* data = g.data();
    const int dtype = core_->dtype;
    const std::int32_t* indices = nullptr;
    const void* values = nullptr;
    std::int64_t count = 0;
    int code = OKTOPK_SUCCESS;
    std::string message;
    {
      py::gil_scoped_release release;
      code = oktopk_reduce_sparse_typed(handle, dtype, data, &indices, &values, &count);
      if (code != OKTOPK_SUCCESS) message = oktopk_last_error();
    }
    if (code != OKTOPK_SUCCESS) raise_code(code, message);
    // Copied under the GIL: no other thread of this module calls the handle meanwhile.
    py::array_t<std::int32_t> index_array(static_cast<py::ssize_t>(count));
    py::array value_array(numpy_dtype(dtype), std::vector<py::ssize_t>{count});
    if (count > 0) {
      std::copy(indices, indices + count, index_array.mutable_data());
      std::memcpy(value_array.mutable_data(), values,
                  static_cast<std::size_t>(count) * item_bytes(dtype));
    }
    return py::make_tuple(index_array, value_array);
  }

  // Collective. oktopk_reduce_scatter_typed: `shard` (writable, of the handle's dtype) receives
  // this rank's shard; `offsets` empty for equal shards. The library checks the shard's length
  // against the offsets, and the offsets, on every rank.
  void reduce_scatter(const py::object& grad, const py::object& shard,
                      const std::vector<std::int64_t>& offsets) {
    oktopk_handle* handle = get();
    Problem problem = array_problem(grad, "grad", *core_, false);
    if (problem.empty()) problem = array_problem(shard, "shard", *core_, true, false);
    if (!problem.empty()) fail_reduce(problem);
    const auto g = py::reinterpret_borrow<py::array>(grad);
    auto out = py::reinterpret_borrow<py::array>(shard);
    const void* data = g.data();
    void* shard_data = out.mutable_data();
    const auto length = static_cast<std::int64_t>(out.size());
    const int dtype = core_->dtype;
    int code = OKTOPK_SUCCESS;
    std::string message;
    {
      py::gil_scoped_release release;
      code = oktopk_reduce_scatter_typed(handle, dtype, data, shard_data, length,
                                         offsets.empty() ? nullptr : offsets.data(),
                                         static_cast<std::int64_t>(offsets.size()));
      if (code != OKTOPK_SUCCESS) message = oktopk_last_error();
    }
    if (code != OKTOPK_SUCCESS) raise_code(code, message);
  }

  // Joins the reduce the peers are making without arrays (oktopk_reduce_refused), so that
  // they fail with this rank's reason instead of waiting for it, then raises `problem` here:
  // for arrays some ranks only got wrong. A request launched this way is waited for at once
  // (freeing it waits), which keeps this rank's calls in the launch order its peers see.
  [[noreturn]] void fail_reduce(const Problem& problem, bool async = false) {
    oktopk_handle* handle = get();
    {
      py::gil_scoped_release release;
      if (async) {
        oktopk_request* request = nullptr;
        if (oktopk_reduce_refused_async(handle, problem.message.c_str(), &request) ==
            OKTOPK_SUCCESS)
          oktopk_request_free(request);
      } else {
        oktopk_reduce_refused(handle, problem.message.c_str());
      }
    }
    if (problem.type_error) throw py::type_error(problem.message);
    throw py::value_error(problem.message);
  }

  py::array residual() const {
    oktopk_handle* handle = get();
    const int dtype = core_->residual_dtype;
    py::array out(numpy_dtype(dtype), std::vector<py::ssize_t>{core_->n});
    void* data = out.mutable_data();
    const std::int64_t n = core_->n;
    int code = OKTOPK_SUCCESS;
    std::string message;
    {
      py::gil_scoped_release release;  // waits for the calls launched before it
      code = oktopk_get_residual_typed(handle, dtype, data, n);
      if (code != OKTOPK_SUCCESS) message = oktopk_last_error();
    }
    if (code != OKTOPK_SUCCESS) raise_code(code, message);
    return out;
  }

  py::dict stats() const {
    oktopk_stats s{};
    check(oktopk_get_stats(get(), &s));
    py::dict d;
    d["iteration"] = s.iteration;
    d["k"] = s.k;
    d["local_selected"] = s.local_selected;
    d["global_selected"] = s.global_selected;
    d["bytes_sent"] = s.bytes_sent;
    d["bytes_received"] = s.bytes_received;
    d["messages_sent"] = s.messages_sent;
    d["messages_received"] = s.messages_received;
    d["seconds"] = s.seconds;
    d["local_threshold"] = s.local_threshold;
    d["global_threshold"] = s.global_threshold;
    d["dense"] = s.dense != 0;
    d["bytes_sent_between_nodes"] = s.bytes_sent_between_nodes;
    d["bytes_received_between_nodes"] = s.bytes_received_between_nodes;
    d["selected_nothing"] = s.selected_nothing != 0;
    d["reduce_scatter"] = s.reduce_scatter != 0;
    std::int64_t phase_count = 0;
    check(oktopk_get_num_phases(get(), &phase_count));
    py::dict phases;
    for (std::int64_t i = 0; i < phase_count; ++i) {
      oktopk_phase_stats phase{};
      check(oktopk_get_phase_stats(get(), i, &phase));
      py::dict entry;
      entry["seconds"] = phase.seconds;
      entry["bytes_sent"] = phase.bytes_sent;
      entry["bytes_received"] = phase.bytes_received;
      entry["messages_sent"] = phase.messages_sent;
      entry["messages_received"] = phase.messages_received;
      entry["bytes_sent_between_nodes"] = phase.bytes_sent_between_nodes;
      entry["bytes_received_between_nodes"] = phase.bytes_received_between_nodes;
      phases[py::str(phase.name)] = entry;
    }
    d["phases"] = phases;
    std::int64_t count = 0;
    check(oktopk_get_num_segments(get(), &count));
    py::list segments;
    for (std::int64_t i = 0; i < count; ++i) {
      oktopk_segment_stats segment{};
      check(oktopk_get_segment_stats(get(), i, &segment));
      py::dict entry;
      entry["name"] = segment.name;
      entry["kind"] = segment.kind == OKTOPK_SEGMENT_ROWS ? "rows" : "dense";
      entry["offset"] = segment.offset;
      entry["length"] = segment.length;
      entry["row_width"] = segment.row_width;
      entry["nonzeros"] = segment.nonzeros;
      segments.append(entry);
    }
    d["segments"] = segments;
    return d;
  }

  py::bytes save_state() const {
    oktopk_handle* handle = get();
    std::size_t size = 0;
    check(oktopk_save_state_to_buffer(handle, nullptr, 0, &size));
    std::string buffer(size, '\0');
    std::size_t written = 0;
    check(oktopk_save_state_to_buffer(handle, buffer.data(), buffer.size(), &written));
    buffer.resize(written);
    return py::bytes(buffer);
  }

  void restore_state(const py::bytes& state) {
    oktopk_handle* handle = get();
    const std::string bytes = state;  // a copy the released GIL cannot touch
    int code = OKTOPK_SUCCESS;
    std::string message;
    {
      py::gil_scoped_release release;
      code = oktopk_restore_state_from_buffer(handle, bytes.data(), bytes.size());
      if (code != OKTOPK_SUCCESS) message = oktopk_last_error();
    }
    if (code != OKTOPK_SUCCESS) raise_code(code, message);
  }

  // Destroys the C handle now, after its requests in flight (which hold it) complete.
  void close() {
    if (!core_) return;
    std::vector<std::shared_ptr<RequestCore>> mine;
    for (const auto& entry : all_requests)
      if (auto request = entry.lock())
        if (request->handle == core_) mine.push_back(std::move(request));
    {
      py::gil_scoped_release release;
      for (auto& request : mine) request->wait();
    }
    core_->destroy();
  }

  bool closed() const { return !core_ || core_->handle == nullptr; }
  const std::string& algorithm() const { return core_->algorithm; }
  std::int64_t n() const { return core_->n; }
  std::int64_t k() const { return core_->k; }
  std::string dtype() const { return dtype_name(core_->dtype); }
  std::string residual_dtype() const { return dtype_name(core_->residual_dtype); }

 private:
  static void* address(std::uintptr_t value) { return reinterpret_cast<void*>(value); }

  // Launches a C request made by `launch(&request)` and wraps it, keeping grad and out alive.
  template <class Launch>
  std::unique_ptr<Request> launched(Launch&& launch, const py::object& grad, const py::object& out);

  std::shared_ptr<HandleCore> core_;
};

// A reduce in flight. Holds its arrays (and so the memory the call reads and writes) and its
// handle until the call completes.
class Request {
 public:
  Request(std::shared_ptr<RequestCore> core, py::object grad, py::object out)
      : core_(std::move(core)), grad_(std::move(grad)), out_(std::move(out)) {}
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  ~Request() {
    // The last reference may be dropped while the call still runs: wait without the GIL (the
    // call may need a Python thread of this process to reach its peers' turn).
    if (core_ && !core_->done) {
      py::gil_scoped_release release;
      core_->wait();
    }
  }

  bool test() {
    if (!core_->test()) return false;
    settle();
    return true;
  }

  void wait() {
    {
      py::gil_scoped_release release;
      core_->wait();
    }
    settle();
  }

  bool done() const { return core_->done; }

 private:
  // Once complete: let go of the arrays and raise the call's error, if any (every time asked).
  void settle() {
    grad_ = py::none();
    out_ = py::none();
    if (core_->code != OKTOPK_SUCCESS) raise_code(core_->code, core_->message);
  }

  std::shared_ptr<RequestCore> core_;
  py::object grad_;
  py::object out_;
};

template <class Launch>
std::unique_ptr<Request> Handle::launched(Launch&& launch, const py::object& grad,
                                          const py::object& out) {
  auto core = std::make_shared<RequestCore>();
  core->handle = core_;
  // Launching may wait for the progress thread's queue lock; no need to hold the GIL there.
  int code = OKTOPK_SUCCESS;
  std::string message;
  {
    py::gil_scoped_release release;
    code = launch(&core->request);
    if (code != OKTOPK_SUCCESS) message = oktopk_last_error();
  }
  if (code != OKTOPK_SUCCESS) {
    core->done = true;  // nothing to free: *request is NULL on failure
    raise_code(code, message);
  }
  remember(all_requests, core);
  return std::make_unique<Request>(std::move(core), grad, out);
}

std::unique_ptr<Request> Handle::reduce_async(const py::object& grad, const py::object& out) {
  oktopk_handle* handle = get();
  Arrays arrays;
  const Problem problem = take_arrays(grad, out, *core_, arrays);
  if (!problem.empty()) fail_reduce(problem, true);
  const int dtype = core_->dtype;
  return launched(
      [&](oktopk_request** request) {
        return oktopk_reduce_async_typed(handle, dtype, arrays.grad, arrays.out, request);
      },
      grad, out);
}

std::unique_ptr<Request> Handle::reduce_on_stream_async(std::uintptr_t grad, std::uintptr_t out,
                                                        std::uintptr_t stream,
                                                        const py::object& keep_grad,
                                                        const py::object& keep_out) {
  oktopk_handle* handle = get();
  const int dtype = core_->dtype;
  return launched(
      [&](oktopk_request** request) {
        return oktopk_reduce_on_stream_async(handle, dtype, address(grad), address(out),
                                             address(stream), request);
      },
      keep_grad, keep_out);
}

}  // namespace

PYBIND11_MODULE(_oktopk, m) {
  m.doc() =
      "The compiled part of the oktopk package: handles over OkTopk's C interface. Use the "
      "package oktopk (oktopk.Handle), which wraps this module.";

  m.def("version", &oktopk_version, "The OkTopk library's version, \"MAJOR.MINOR.PATCH\".");
  m.def("mpi_library", &oktopk_mpi_library,
        "The MPI the library was compiled against, as its mpi.h names it (\"Open MPI 4.1.4\", "
        "\"MPICH 4.0.2\"; \"\" for another MPI).");
  // pybind11 reads numpy's array descriptors through its own copy of their layout, which
  // numpy 2 changed; releases before 2.12 know only numpy 1's.
  m.attr("pybind11_version") = py::make_tuple(PYBIND11_VERSION_MAJOR, PYBIND11_VERSION_MINOR);
  m.def("initialize", &initialize, py::arg("kokkos_args") = std::vector<std::string>(),
        "Initialises Kokkos (oktopk_initialize) with these arguments unless done already; the "
        "first handle does it without arguments otherwise. Not collective.");
  m.def("shutdown", &shutdown,
        "Completes every request in flight, destroys every handle and finalises Kokkos if "
        "this module initialised it. Runs at exit (registered by the package); afterwards no "
        "handle can be made. Call before MPI_Finalize.");
  m.def(
      "finalized", [] { return finalized; }, "Whether shutdown() has run.");
  m.def(
      "initialized", [] { return initialized_here; },
      "Whether initialize() has run (explicitly or for the first handle).");
  m.def(
      "backend",
      [] {
        const char* name = nullptr;
        check(oktopk_get_backend(&name));
        return std::string(name);
      },
      "The Kokkos execution space the handles run on: \"OpenMP\", \"Serial\", \"Cuda\", "
      "\"HIP\", ... (oktopk_get_backend); known before initialize().");
  m.def(
      "gpu_aware_mpi",
      [] {
        int device_pointers = 0;
        const char* reason = nullptr;
        check(oktopk_get_gpu_aware_mpi(&device_pointers, &reason));
        return py::make_tuple(device_pointers != 0, std::string(reason));
      },
      "(device_pointers, reason): whether MPI gets GPU buffers as they are rather than through "
      "host copies, and why (oktopk_get_gpu_aware_mpi). Needs MPI initialised.");
  m.def(
      "device",
      [] {
        initialize({});
        int device = -1;
        check(oktopk_get_device(&device));
        return device;
      },
      "The GPU the handles run on, or -1 in a build for CPUs (oktopk_get_device); initialises "
      "Kokkos first if needed.");
  m.attr("SEGMENT_DENSE") = OKTOPK_SEGMENT_DENSE;
  m.attr("SEGMENT_ROWS") = OKTOPK_SEGMENT_ROWS;

  py::class_<Request>(m, "Request", "An asynchronous reduce in flight (Handle.reduce_async).")
      .def("test", &Request::test,
           "True if the call has completed (raising its error if it failed), without waiting.")
      .def("wait", &Request::wait,
           "Waits (without the GIL) until the call completes; raises its error if it failed.")
      .def_property_readonly("done", &Request::done, "Whether the call has completed.");

  py::class_<Handle>(m, "Handle", "A sparse allreduce handle (oktopk_create_typed_f).")
      .def(py::init<int, const std::string&, std::int64_t, const std::string&,
                    const std::vector<SegmentTuple>&, const std::string&>(),
           py::arg("comm"), py::arg("algorithm"), py::arg("n"), py::arg("options") = "",
           py::arg("layout") = std::vector<SegmentTuple>(), py::arg("dtype") = "float32",
           "Collective. comm: a Fortran communicator handle (mpi4py: comm.py2f()); options: "
           "\"key=value ...\"; layout: (kind, length, row_width, name) per segment, kind "
           "SEGMENT_DENSE or SEGMENT_ROWS ([] for none); dtype: float32, float64, bfloat16 or "
           "float16 (oktopk_create_typed_f).")
      .def("reduce", &Handle::reduce, py::arg("grad"), py::arg("out"),
           "Collective. out = average over ranks of the sparsified grad (C-contiguous arrays of "
           "n elements of the handle's dtype, bfloat16 as uint16 or int16 bit patterns; grad "
           "is out is allowed). Releases the GIL.")
      .def("reduce_sparse", &Handle::reduce_sparse, py::arg("grad"),
           "Collective. The average over ranks of the sparsified grad in sparse form: (indices "
           "int32 ascending, values of the handle's dtype, bfloat16 as uint16), new arrays. "
           "Releases the GIL.")
      .def("reduce_scatter", &Handle::reduce_scatter, py::arg("grad"), py::arg("shard"),
           py::arg("offsets") = std::vector<std::int64_t>(),
           "Collective. shard = this rank's part [offsets[rank], offsets[rank + 1]) of what "
           "reduce would write (offsets: P + 1 boundaries, [] for equal shards); "
           "oktopk_reduce_scatter_typed. Releases the GIL.")
      .def("reduce_async", &Handle::reduce_async, py::arg("grad"), py::arg("out"),
           "Collective. Launches reduce(grad, out) and returns a Request; the arrays stay "
           "referenced until it completes.")
      .def("reduce_on_stream", &Handle::reduce_on_stream, py::arg("grad"), py::arg("out"),
           py::arg("stream"),
           "Collective. oktopk_reduce_on_stream: grad and out are addresses of n values of the "
           "handle's dtype in the GPU memory of device(), stream a cudaStream_t or hipStream_t "
           "as an int (0: the legacy default stream; in CPU builds host addresses and 0). "
           "Releases the GIL.")
      .def("reduce_on_stream_async", &Handle::reduce_on_stream_async, py::arg("grad"),
           py::arg("out"), py::arg("stream"), py::arg("keep_grad"), py::arg("keep_out"),
           "Collective. oktopk_reduce_on_stream_async; the Request keeps keep_grad and keep_out "
           "(the objects owning the memory) until it completes.")
      .def(
          "fail_reduce",
          [](Handle& self, const std::string& problem, bool async, bool type_error) {
            self.fail_reduce(Problem{type_error, problem}, async);
          },
          py::arg("problem"), py::arg("async_") = false, py::arg("type_error") = true,
          "Collective. Joins the peers' reduce (or reduce_async) without arrays "
          "(oktopk_reduce_refused), so that they fail with this problem instead of waiting, "
          "then raises TypeError(problem) here (ValueError with type_error=False).")
      .def("stats", &Handle::stats,
           "Statistics of the last reduce on this rank, as a dict; \"segments\": one dict per "
           "segment of the layout.")
      .def("residual", &Handle::residual,
           "A copy of this rank's residual (error feedback), n values of residual_dtype; waits "
           "for the calls launched before it. Not collective.")
      .def("save_state", &Handle::save_state, "This rank's state, as bytes. Not collective.")
      .def("restore_state", &Handle::restore_state, py::arg("state"),
           "Collective. Restores what save_state() returned on this rank.")
      .def("close", &Handle::close,
           "Destroys the handle, after its requests in flight complete. Not collective.")
      .def_property_readonly("closed", &Handle::closed)
      .def_property_readonly("algorithm", &Handle::algorithm)
      .def_property_readonly("n", &Handle::n)
      .def_property_readonly("k", &Handle::k)
      .def_property_readonly("dtype", &Handle::dtype)
      .def_property_readonly("residual_dtype", &Handle::residual_dtype);
}
