// SPDX-License-Identifier: BSD-3-Clause
// The C interface (include/oktopk/c_api.h) over the public C++ API: handles on Kokkos's
// default execution space, errors as return codes plus a thread-local message.
#include <oktopk/c_api.h>
#include <oktopk/config.hpp>
#include <oktopk/device.hpp>
#include <oktopk/gpu_aware_mpi.hpp>
#include <oktopk/make_sparse_allreduce.hpp>
#include <oktopk/progress.hpp>

#include "mpi_library.hpp"

#include <Kokkos_Core.hpp>

#include <atomic>
#include <cassert>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <new>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
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

// The C constant of each gradient type.
template <class Value>
struct DtypeOf;
template <>
struct DtypeOf<float> {
  static constexpr int value = OKTOPK_FLOAT32;
};
template <>
struct DtypeOf<double> {
  static constexpr int value = OKTOPK_FLOAT64;
};
template <>
struct DtypeOf<oktopk::bfloat16> {
  static constexpr int value = OKTOPK_BFLOAT16;
};
template <>
struct DtypeOf<oktopk::float16> {
  static constexpr int value = OKTOPK_FLOAT16;
};

std::string dtype_name(int dtype) {
  switch (dtype) {
    case OKTOPK_FLOAT32:
      return "OKTOPK_FLOAT32";
    case OKTOPK_FLOAT64:
      return "OKTOPK_FLOAT64";
    case OKTOPK_BFLOAT16:
      return "OKTOPK_BFLOAT16";
    case OKTOPK_FLOAT16:
      return "OKTOPK_FLOAT16";
    default:
      return "dtype " + std::to_string(dtype);
  }
}

// A NULL array stands for an empty one, so that a NULL on some ranks only becomes the length
// error that reduce() reports on every rank rather than a rank that never joins the call.
template <class View, class Pointer>
View wrap(Pointer data, std::int64_t n) {
  return View(data, data == nullptr ? 0 : static_cast<std::size_t>(n));
}

// Why kernels of the default execution space cannot use `pointer` as an array of n values;
// empty when they can. Builds for the host cannot tell host memory apart, and need no other.
std::string refuse_array(const char* name, const void* pointer, std::int64_t n) {
  if (n == 0) return {};
  if (pointer == nullptr) return std::string(name) + " is NULL, with n = " + std::to_string(n);
  if constexpr (oktopk::runs_on_streams_v<Exec>) {
    const oktopk::PointerLocation at = oktopk::locate_pointer(pointer);
    const int device = oktopk::default_device();
    const bool device_memory = at.kind == oktopk::MemoryKind::Device && at.device == device;
    if (device_memory || at.kind == oktopk::MemoryKind::Managed) return {};
    std::string kind = oktopk::to_string(at.kind);
    if (at.kind == oktopk::MemoryKind::Device) kind += " of GPU " + std::to_string(at.device);
    return std::string(name) + " is " + kind + ", not memory of GPU " + std::to_string(device) +
           ", the one this process's handles run on (host arrays go to oktopk_reduce_typed)";
  }
  return {};
}

// What the C interface does with a handle, whatever its gradient type: arrays cross as
// untyped pointers, which HandleOf<Value> reads as Value (or its residual's type).
class TypedHandle {
 public:
  TypedHandle() = default;
  TypedHandle(const TypedHandle&) = delete;
  TypedHandle& operator=(const TypedHandle&) = delete;
  virtual ~TypedHandle() = default;

  virtual int dtype() const = 0;
  virtual int residual_dtype() const = 0;
  virtual std::int64_t size() const = 0;
  virtual std::int64_t k() const = 0;
  virtual const oktopk::ReduceStats& stats() const = 0;
  virtual const oktopk::Layout& layout() const = 0;
  virtual const oktopk::Communicator& communicator() const = 0;
  // Allocates the copies of host arrays the execution space cannot read (none where it can).
  virtual void allocate_staging() = 0;
  virtual void reduce_device(const void* grad, void* out) = 0;
  virtual void reduce_host(const void* grad, void* out) = 0;
  // Why this rank cannot run on `stream` (empty if it can), having made the execution space
  // instance over `stream` that reduce_on_stream then uses.
  virtual std::string refuse_stream(void* stream) = 0;
  virtual void reduce_on_stream(void* stream, const void* grad, void* out) = 0;
  // reduce_sparse of a host gradient; the result's entries end up in host memory, which
  // *indices and *values point to.
  virtual void reduce_sparse_host(const void* grad, const std::int32_t** indices,
                                  const void** values, std::int64_t* count) = 0;
  // reduce_scatter of n gradient values into `shard_length` values of this rank's shard, host
  // arrays or the execution space's (`device`); `offsets`: `count` boundaries, none (or NULL)
  // for equal shards.
  virtual void reduce_scatter(const void* grad, void* shard, std::int64_t shard_length,
                              const std::int64_t* offsets, std::int64_t count, bool device) = 0;
  // Copies the residual into n host values of the residual's type.
  virtual void copy_residual(void* out) const = 0;
  virtual void save_state(std::ostream& os) const = 0;
  virtual void restore_state(std::istream& is) = 0;
};

template <class Value>
class HandleOf final : public TypedHandle {
 public:
  using Handle = oktopk::SparseAllreduce<Exec, Value>;
  using Residual = typename Handle::arithmetic_type;
  using DeviceVector = Kokkos::View<Value*, Exec::memory_space>;
  using ConstDeviceVector = Kokkos::View<const Value*, Exec::memory_space>;

  explicit HandleOf(std::unique_ptr<Handle> handle) : handle_(std::move(handle)) {}

  int dtype() const override { return DtypeOf<Value>::value; }
  int residual_dtype() const override { return DtypeOf<Residual>::value; }
  std::int64_t size() const override { return handle_->size(); }
  std::int64_t k() const override { return handle_->k(); }
  const oktopk::ReduceStats& stats() const override { return handle_->stats(); }
  const oktopk::Layout& layout() const override { return handle_->layout(); }
  const oktopk::Communicator& communicator() const override { return handle_->communicator(); }

  void allocate_staging() override {
    if constexpr (!host_reads_device_memory) {
      const Exec exec;
      const auto n = static_cast<std::size_t>(handle_->size());
      staged_grad_ = DeviceVector(
          Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::c_api::staged_grad"), n);
      staged_out_ = DeviceVector(
          Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::c_api::staged_out"), n);
      exec.fence();
    }
  }

  void reduce_device(const void* grad, void* out) override {
    const Exec exec;
    handle_->reduce(exec, device_input(grad),
                    wrap<Kokkos::View<Value*, Exec::memory_space, Unmanaged>>(
                        static_cast<Value*>(out), handle_->size()));
    exec.fence();
  }

  std::string refuse_stream(void* stream) override {
    // One instance per stream: Kokkos allocates scratch for each, so a caller that keeps one
    // stream pays for it once.
    if (!on_stream_.has_value() || stream_ != stream) {
      on_stream_.reset();
      try {
        on_stream_.emplace(oktopk::execution_space_on_stream<Exec>(stream));
      } catch (const std::invalid_argument& e) {
        return e.what();
      }
      stream_ = stream;
    }
    return {};
  }

  void reduce_on_stream(void* stream, const void* grad, void* out) override {
    assert(on_stream_.has_value() && stream_ == stream);
    (void)stream;
    const Exec& exec = *on_stream_;
    handle_->reduce(exec, device_input(grad),
                    wrap<Kokkos::View<Value*, Exec::memory_space, Unmanaged>>(
                        static_cast<Value*>(out), handle_->size()));
    // The caller's stream only: its later work, and the host, see the result.
    exec.fence();
  }

  void reduce_host(const void* grad, void* out) override {
    if constexpr (host_reads_device_memory) {
      reduce_device(grad, out);
    } else {
      const Exec exec;
      const auto host_out = wrap<Kokkos::View<Value*, Kokkos::HostSpace, Unmanaged>>(
          static_cast<Value*>(out), handle_->size());
      // Lengths that differ from n reach reduce() unchanged, which reports them on every rank.
      const auto device_out =
          host_out.extent(0) == staged_out_.extent(0) ? staged_out_ : DeviceVector();
      handle_->reduce(exec, staged_input(exec, grad), device_out);
      if (device_out.extent(0) != 0) Kokkos::deep_copy(exec, host_out, staged_out_);
      exec.fence();
    }
  }

  void reduce_sparse_host(const void* grad, const std::int32_t** indices, const void** values,
                          std::int64_t* count) override {
    const Exec exec;
    if constexpr (host_reads_device_memory) {
      handle_->reduce_sparse(exec, device_input(grad), sparse_);
      *indices = sparse_.indices.data();
      *values = sparse_.values.data();
    } else {
      handle_->reduce_sparse(exec, staged_input(exec, grad), sparse_);
      const auto size = static_cast<std::size_t>(sparse_.size);
      if (sparse_indices_host_.extent(0) < size) {
        Kokkos::resize(sparse_indices_host_, sparse_.indices.extent(0));
        Kokkos::resize(sparse_values_host_, sparse_.values.extent(0));
      }
      const auto entries = Kokkos::make_pair(std::size_t{0}, size);
      Kokkos::deep_copy(exec, Kokkos::subview(sparse_indices_host_, entries),
                        Kokkos::subview(sparse_.indices, entries));
      Kokkos::deep_copy(exec, Kokkos::subview(sparse_values_host_, entries),
                        Kokkos::subview(sparse_.values, entries));
      *indices = sparse_indices_host_.data();
      *values = sparse_values_host_.data();
    }
    exec.fence();
    *count = sparse_.size;
  }

  void reduce_scatter(const void* grad, void* shard, std::int64_t shard_length,
                      const std::int64_t* offsets, std::int64_t count, bool device) override {
    const Exec exec;
    std::vector<std::int64_t> given;
    if (offsets != nullptr && count > 0) given.assign(offsets, offsets + count);
    const auto length = shard_length < 0 ? 0 : shard_length;
    if (device || host_reads_device_memory) {
      handle_->reduce_scatter(exec, device_input(grad),
                              wrap<Kokkos::View<Value*, Exec::memory_space, Unmanaged>>(
                                  static_cast<Value*>(shard), length),
                              given);
    } else {
      const auto host_shard = wrap<Kokkos::View<Value*, Kokkos::HostSpace, Unmanaged>>(
          static_cast<Value*>(shard), length);
      if (staged_shard_.extent(0) != host_shard.extent(0)) {
        staged_shard_ = DeviceVector(
            Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::c_api::staged_shard"),
            host_shard.extent(0));
      }
      handle_->reduce_scatter(exec, staged_input(exec, grad), staged_shard_, given);
      Kokkos::deep_copy(exec, host_shard, staged_shard_);
    }
    exec.fence();
  }

  void copy_residual(void* out) const override {
    const Exec exec;
    const Kokkos::View<Residual*, Kokkos::HostSpace, Unmanaged> host(
        static_cast<Residual*>(out), static_cast<std::size_t>(handle_->size()));
    Kokkos::deep_copy(exec, host, handle_->residual());
    exec.fence();
  }

  void save_state(std::ostream& os) const override { handle_->save_state(Exec(), os); }
  void restore_state(std::istream& is) override { handle_->restore_state(Exec(), is); }

 private:
  // n gradient values at `grad`, in the execution space's memory.
  Kokkos::View<const Value*, Exec::memory_space, Unmanaged> device_input(const void* grad) const {
    return wrap<Kokkos::View<const Value*, Exec::memory_space, Unmanaged>>(
        static_cast<const Value*>(grad), handle_->size());
  }

  // The host gradient at `grad` copied into staged_grad_ (on `exec`); for a NULL one, an empty
  // View, whose length reduce() then reports on every rank.
  ConstDeviceVector staged_input(const Exec& exec, const void* grad) {
    const auto host_grad = wrap<Kokkos::View<const Value*, Kokkos::HostSpace, Unmanaged>>(
        static_cast<const Value*>(grad), handle_->size());
    if (host_grad.extent(0) != staged_grad_.extent(0)) return ConstDeviceVector();
    if (host_grad.extent(0) != 0) Kokkos::deep_copy(exec, staged_grad_, host_grad);
    return staged_grad_;
  }

  std::unique_ptr<Handle> handle_;
  // The instance over the caller's stream of the last oktopk_reduce_on_stream, and that stream.
  std::optional<Exec> on_stream_;
  void* stream_ = nullptr;
  // Copies of host arrays where the host cannot reach the execution space's memory.
  DeviceVector staged_grad_;
  DeviceVector staged_out_;
  DeviceVector staged_shard_;
  // The last reduce_sparse's result, and its host copy where the host cannot reach it.
  oktopk::SparseResult<Exec::memory_space, Value> sparse_;
  Kokkos::View<oktopk::index_type*, Kokkos::HostSpace> sparse_indices_host_;
  Kokkos::View<Value*, Kokkos::HostSpace> sparse_values_host_;
};

}  // namespace

struct oktopk_request {
  oktopk::ReduceRequest request;
};

struct oktopk_handle {
  std::unique_ptr<TypedHandle> typed;
  std::string algorithm;
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

template <class Value>
std::unique_ptr<TypedHandle> make_typed(oktopk::Algorithm method,
                                        const oktopk::Communicator& communicator, std::int64_t n,
                                        const oktopk::Options& settings,
                                        const oktopk::Layout& layout) {
  return std::make_unique<HandleOf<Value>>(oktopk::make_sparse_allreduce<Exec, Value>(
      Exec(), method, communicator, n, settings, layout));
}

oktopk_handle* create(const char* where, MPI_Comm comm, const char* algorithm, std::int64_t n,
                      int dtype, const char* options, const LayoutArrays& segments) {
  const oktopk::Communicator communicator = shared_communicator(where, comm);
  // A bad method name, type, option or segment on some ranks only must not leave the others
  // waiting in make_sparse_allreduce: the ranks agree on whether every one could read its
  // arguments.
  oktopk::Algorithm method{};
  oktopk::Options settings;
  oktopk::Layout layout;
  const int local_code = guarded([&] {
    if (!Kokkos::is_initialized())
      throw std::runtime_error("Kokkos is not initialised (call oktopk_initialize first)");
    if (algorithm == nullptr) throw std::invalid_argument("algorithm is NULL");
    method = oktopk::algorithm_from_string(algorithm);
    if (dtype < OKTOPK_FLOAT32 || dtype > OKTOPK_FLOAT16)
      throw std::invalid_argument(
          "dtype must be OKTOPK_FLOAT32 (0), OKTOPK_FLOAT64 (1), "
          "OKTOPK_BFLOAT16 (2) or OKTOPK_FLOAT16 (3), got " +
          std::to_string(dtype));
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
  // the link fails (data/kokkos-develop-gcc12/README.md).
  std::unique_ptr<oktopk_handle> handle(new oktopk_handle);
  // Ranks that pass different types make handles of different types; make_sparse_allreduce
  // checks the type with the other arguments, so that every rank throws alike.
  switch (dtype) {
    case OKTOPK_FLOAT64:
      handle->typed = make_typed<double>(method, communicator, n, settings, layout);
      break;
    case OKTOPK_BFLOAT16:
      handle->typed = make_typed<oktopk::bfloat16>(method, communicator, n, settings, layout);
      break;
    case OKTOPK_FLOAT16:
      handle->typed = make_typed<oktopk::float16>(method, communicator, n, settings, layout);
      break;
    default:
      handle->typed = make_typed<float>(method, communicator, n, settings, layout);
  }
  handle->algorithm = oktopk::to_string(method);
  // The copies of host arrays are made now, where the ranks agree on failures: allocated in
  // the first reduce, a failure on one rank would leave the others waiting in it.
  const int code = guarded([&] { handle->typed->allocate_staging(); });
  // Every rank throws with the (lowest) failing rank's cause.
  const oktopk::AgreedFailure staging = communicator.agree_on_failure(
      code != OKTOPK_SUCCESS, code == OKTOPK_SUCCESS ? std::string() : last_error);
  if (staging)
    throw std::runtime_error(std::string(where) + ": rank " + std::to_string(staging.rank) +
                             " could not allocate the copies of host arrays: " + staging.cause);
  return handle.release();
}

int create_call(const char* where, MPI_Comm comm, const char* algorithm, std::int64_t n, int dtype,
                const char* options, const LayoutArrays& segments, oktopk_handle** handle) {
  return guarded([&] {
    if (handle == nullptr) throw std::invalid_argument(std::string(where) + ": handle is NULL");
    *handle = nullptr;
    *handle = oktopk::run_on_progress_thread(
        [&] { return create(where, comm, algorithm, n, dtype, options, segments); });
    ++live_handles;
  });
}

// Why arrays of type `dtype` do not fit a handle of another type. `typed` names the function
// to use instead where the caller used a float32 one.
std::string dtype_mismatch(const TypedHandle& h, int dtype, const char* typed) {
  std::string reason =
      "the arrays are " + dtype_name(dtype) + ", the handle's gradients " + dtype_name(h.dtype());
  if (typed != nullptr) reason += std::string(" (use ") + typed + ")";
  return reason;
}

// Where a reduce call's arrays live: host memory, the memory of Kokkos's default execution
// space, or that memory with the work on the caller's stream.
enum class ArraysIn { Host, Device, Stream };

// After a reduce that failed alike on every rank (its argument errors are agreed, so every
// rank is here): the ranks agree on whose own arguments the C interface refused, and throw
// the lowest such rank's reason; with none refused, the reduce's own error stands.
[[noreturn]] void rethrow_agreed(const char* where, const TypedHandle& h,
                                 const std::string& refusal) {
  const oktopk::AgreedFailure refused =
      h.communicator().agree_on_failure(!refusal.empty(), refusal);
  if (refused)
    throw std::invalid_argument(std::string(where) + ": rank " + std::to_string(refused.rank) +
                                ": " + refused.cause);
  throw;
}

// A reduce this rank cannot make, for `reason`: it joins the peers' call with no arrays, so that
// they fail with the length error instead of waiting for it, and then every rank reports the
// lowest refusing rank's reason.
[[noreturn]] void refuse_reduce(const char* where, TypedHandle& h, const std::string& reason) {
  try {
    h.reduce_host(nullptr, nullptr);
  } catch (const std::invalid_argument&) {
    rethrow_agreed(where, h, reason);
  }
  // n = 0: the empty call was valid, and no other rank waits.
  throw std::invalid_argument(std::string(where) + ": " + reason);
}

// A reduce of arrays of type `dtype`. A rank whose arguments are wrong (another type than the
// handle's; for device arrays, memory its GPU cannot use; for a stream, one the build cannot
// run on) refuses the call (refuse_reduce), and every rank reports that rank's reason.
void reduce_as(const char* where, const char* typed, TypedHandle& h, int dtype, const void* grad,
               void* out, ArraysIn arrays, void* stream) {
  std::string refusal;
  if (dtype != h.dtype()) {
    refusal = dtype_mismatch(h, dtype, typed);
  } else if (arrays != ArraysIn::Host) {
    if (arrays == ArraysIn::Stream) refusal = h.refuse_stream(stream);
    if (refusal.empty()) refusal = refuse_array("grad", grad, h.size());
    if (refusal.empty()) refusal = refuse_array("out", out, h.size());
  }
  if (!refusal.empty()) refuse_reduce(where, h, refusal);
  try {
    if (arrays == ArraysIn::Host) {
      h.reduce_host(grad, out);
    } else if (arrays == ArraysIn::Stream) {
      h.reduce_on_stream(stream, grad, out);
    } else {
      h.reduce_device(grad, out);
    }
  } catch (const std::invalid_argument&) {
    rethrow_agreed(where, h, std::string());
  }
}

int reduce_call(const char* where, const char* typed, oktopk_handle* handle, int dtype,
                const void* grad, void* out, ArraysIn arrays, void* stream = nullptr) {
  return guarded([&] {
    require_handle(handle, where);
    oktopk::run_on_progress_thread(
        [&] { reduce_as(where, typed, *handle->typed, dtype, grad, out, arrays, stream); });
  });
}

// Launches `work` (a call on handle's progress-thread queue) and hands back its request: the
// frame of every asynchronous entry.
template <class Work>
int launch_call(const char* where, oktopk_handle* handle, oktopk_request** request, Work work) {
  return guarded([&] {
    if (request == nullptr) throw std::invalid_argument(std::string(where) + ": request is NULL");
    *request = nullptr;
    require_handle(handle, where);
    auto launched = std::make_unique<oktopk_request>();
    launched->request = oktopk::launch_in_order(std::move(work));
    *request = launched.release();
  });
}

int reduce_async_call(const char* where, const char* typed, oktopk_handle* handle, int dtype,
                      const void* grad, void* out, oktopk_request** request, ArraysIn arrays,
                      void* stream = nullptr) {
  return launch_call(where, handle, request,
                     [where, typed, handle, dtype, grad, out, arrays, stream] {
                       reduce_as(where, typed, *handle->typed, dtype, grad, out, arrays, stream);
                     });
}

// A reduce_scatter: a rank whose arrays are of another type than the handle's, or (device
// arrays) in memory its GPU cannot use, refuses the call as refuse_reduce does.
int reduce_scatter_call(const char* where, const char* typed, oktopk_handle* handle, int dtype,
                        const void* grad, void* shard, std::int64_t shard_length,
                        const std::int64_t* shard_offsets, std::int64_t num_offsets,
                        ArraysIn arrays) {
  return guarded([&] {
    require_handle(handle, where);
    TypedHandle& h = *handle->typed;
    std::string refusal;
    if (dtype != h.dtype()) {
      refusal = dtype_mismatch(h, dtype, typed);
    } else if (arrays != ArraysIn::Host) {
      refusal = refuse_array("grad", grad, h.size());
      if (refusal.empty()) refusal = refuse_array("shard", shard, shard_length);
    }
    oktopk::run_on_progress_thread([&] {
      if (!refusal.empty()) refuse_reduce(where, h, refusal);
      try {
        h.reduce_scatter(grad, shard, shard_length, shard_offsets, num_offsets,
                         arrays != ArraysIn::Host);
      } catch (const std::invalid_argument&) {
        rethrow_agreed(where, h, std::string());
      }
    });
  });
}

int reduce_sparse_call(const char* where, const char* typed, oktopk_handle* handle, int dtype,
                       const void* grad, const int32_t** indices, const void** values,
                       int64_t* count) {
  if (indices != nullptr) *indices = nullptr;
  if (values != nullptr) *values = nullptr;
  if (count != nullptr) *count = 0;
  return guarded([&] {
    require_handle(handle, where);
    const bool outputs_given = indices != nullptr && values != nullptr && count != nullptr;
    const bool matches = dtype == handle->typed->dtype();
    const std::string refusal = !outputs_given ? "indices, values and count must not be NULL"
                                : !matches     ? dtype_mismatch(*handle->typed, dtype, typed)
                                               : std::string();
    const std::int32_t* got_indices = nullptr;
    const void* got_values = nullptr;
    std::int64_t got_count = 0;
    // Without somewhere to put the result, or with arrays of another type, the call is
    // refused (refuse_reduce), and every rank reports this one's reason.
    oktopk::run_on_progress_thread([&] {
      if (!refusal.empty()) refuse_reduce(where, *handle->typed, refusal);
      try {
        handle->typed->reduce_sparse_host(grad, &got_indices, &got_values, &got_count);
      } catch (const std::invalid_argument&) {
        rethrow_agreed(where, *handle->typed, std::string());
      }
    });
    *indices = got_indices;
    *values = got_values;
    *count = got_count;
  });
}

std::string reason_text(const char* reason) {
  return reason != nullptr && reason[0] != '\0' ? std::string(reason) : "(no reason given)";
}

int get_residual_call(const char* where, const oktopk_handle* handle, int dtype, void* out,
                      int64_t n) {
  return guarded([&] {
    require_handle(handle, where);
    const TypedHandle& h = *handle->typed;
    if (dtype != h.residual_dtype()) {
      throw std::invalid_argument(
          std::string(where) + ": the array is " + dtype_name(dtype) + ", the handle's residual " +
          dtype_name(h.residual_dtype()) +
          (dtype == OKTOPK_FLOAT32 ? " (use oktopk_get_residual_typed)" : ""));
    }
    const std::int64_t size = h.size();
    if (n != size) {
      throw std::invalid_argument(std::string(where) + ": n is " + std::to_string(n) +
                                  ", the handle's n " + std::to_string(size));
    }
    if (out == nullptr && n > 0) throw std::invalid_argument(std::string(where) + ": out is NULL");
    // In launch order, after the calls launched before it have run.
    oktopk::run_on_progress_thread([&h, out] { h.copy_residual(out); });
  });
}

}  // namespace

extern "C" {

const char* oktopk_version(void) { return OKTOPK_VERSION_STRING; }

const char* oktopk_mpi_library(void) { return OKTOPK_MPI_NAME; }

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
  return create_call("oktopk_create", comm, algorithm, n, OKTOPK_FLOAT32, options, LayoutArrays{},
                     handle);
}

int oktopk_create_with_layout(MPI_Comm comm, const char* algorithm, int64_t n, const char* options,
                              int64_t num_segments, const int64_t* lengths, const int* kinds,
                              const int64_t* row_widths, const char* const* names,
                              oktopk_handle** handle) {
  return create_call("oktopk_create_with_layout", comm, algorithm, n, OKTOPK_FLOAT32, options,
                     LayoutArrays{num_segments, lengths, kinds, row_widths, names}, handle);
}

int oktopk_create_typed(MPI_Comm comm, const char* algorithm, int64_t n, int dtype,
                        const char* options, int64_t num_segments, const int64_t* lengths,
                        const int* kinds, const int64_t* row_widths, const char* const* names,
                        oktopk_handle** handle) {
  return create_call("oktopk_create_typed", comm, algorithm, n, dtype, options,
                     LayoutArrays{num_segments, lengths, kinds, row_widths, names}, handle);
}

int oktopk_create_typed_f(MPI_Fint comm, const char* algorithm, int64_t n, int dtype,
                          const char* options, int64_t num_segments, const int64_t* lengths,
                          const int* kinds, const int64_t* row_widths, const char* const* names,
                          oktopk_handle** handle) {
  return oktopk_create_typed(MPI_Comm_f2c(comm), algorithm, n, dtype, options, num_segments,
                             lengths, kinds, row_widths, names, handle);
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

int oktopk_get_dtype(const oktopk_handle* handle, int* dtype, int* residual_dtype) {
  return guarded([&] {
    require_handle(handle, "oktopk_get_dtype");
    if (dtype != nullptr) *dtype = handle->typed->dtype();
    if (residual_dtype != nullptr) *residual_dtype = handle->typed->residual_dtype();
  });
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
  return reduce_call("oktopk_reduce", "oktopk_reduce_typed", handle, OKTOPK_FLOAT32, grad, out,
                     ArraysIn::Host);
}

int oktopk_reduce_typed(oktopk_handle* handle, int dtype, const void* grad, void* out) {
  return reduce_call("oktopk_reduce_typed", nullptr, handle, dtype, grad, out, ArraysIn::Host);
}

int oktopk_reduce_scatter(oktopk_handle* handle, const float* grad, float* shard,
                          int64_t shard_length, const int64_t* shard_offsets, int64_t num_offsets) {
  return reduce_scatter_call("oktopk_reduce_scatter", "oktopk_reduce_scatter_typed", handle,
                             OKTOPK_FLOAT32, grad, shard, shard_length, shard_offsets, num_offsets,
                             ArraysIn::Host);
}

int oktopk_reduce_scatter_typed(oktopk_handle* handle, int dtype, const void* grad, void* shard,
                                int64_t shard_length, const int64_t* shard_offsets,
                                int64_t num_offsets) {
  return reduce_scatter_call("oktopk_reduce_scatter_typed", nullptr, handle, dtype, grad, shard,
                             shard_length, shard_offsets, num_offsets, ArraysIn::Host);
}

int oktopk_reduce_scatter_device_typed(oktopk_handle* handle, int dtype, const void* grad,
                                       void* shard, int64_t shard_length,
                                       const int64_t* shard_offsets, int64_t num_offsets) {
  return reduce_scatter_call("oktopk_reduce_scatter_device_typed", nullptr, handle, dtype, grad,
                             shard, shard_length, shard_offsets, num_offsets, ArraysIn::Device);
}

int oktopk_reduce_async(oktopk_handle* handle, const float* grad, float* out,
                        oktopk_request** request) {
  return reduce_async_call("oktopk_reduce_async", "oktopk_reduce_async_typed", handle,
                           OKTOPK_FLOAT32, grad, out, request, ArraysIn::Host);
}

int oktopk_reduce_async_typed(oktopk_handle* handle, int dtype, const void* grad, void* out,
                              oktopk_request** request) {
  return reduce_async_call("oktopk_reduce_async_typed", nullptr, handle, dtype, grad, out, request,
                           ArraysIn::Host);
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
  const void* untyped = nullptr;
  const int code = reduce_sparse_call("oktopk_reduce_sparse", "oktopk_reduce_sparse_typed", handle,
                                      OKTOPK_FLOAT32, grad, indices,
                                      values != nullptr ? &untyped : nullptr, count);
  if (values != nullptr) *values = static_cast<const float*>(untyped);
  return code;
}

int oktopk_reduce_sparse_typed(oktopk_handle* handle, int dtype, const void* grad,
                               const int32_t** indices, const void** values, int64_t* count) {
  return reduce_sparse_call("oktopk_reduce_sparse_typed", nullptr, handle, dtype, grad, indices,
                            values, count);
}

int oktopk_reduce_device(oktopk_handle* handle, const float* grad, float* out) {
  return reduce_call("oktopk_reduce_device", "oktopk_reduce_device_typed", handle, OKTOPK_FLOAT32,
                     grad, out, ArraysIn::Device);
}

int oktopk_reduce_device_typed(oktopk_handle* handle, int dtype, const void* grad, void* out) {
  return reduce_call("oktopk_reduce_device_typed", nullptr, handle, dtype, grad, out,
                     ArraysIn::Device);
}

int oktopk_reduce_on_stream(oktopk_handle* handle, int dtype, const void* grad, void* out,
                            void* stream) {
  return reduce_call("oktopk_reduce_on_stream", nullptr, handle, dtype, grad, out, ArraysIn::Stream,
                     stream);
}

int oktopk_reduce_on_stream_async(oktopk_handle* handle, int dtype, const void* grad, void* out,
                                  void* stream, oktopk_request** request) {
  return reduce_async_call("oktopk_reduce_on_stream_async", nullptr, handle, dtype, grad, out,
                           request, ArraysIn::Stream, stream);
}

int oktopk_reduce_refused(oktopk_handle* handle, const char* reason) {
  constexpr const char* where = "oktopk_reduce_refused";
  return guarded([&] {
    require_handle(handle, where);
    const std::string text = reason_text(reason);
    oktopk::run_on_progress_thread([&] { refuse_reduce(where, *handle->typed, text); });
  });
}

int oktopk_reduce_refused_async(oktopk_handle* handle, const char* reason,
                                oktopk_request** request) {
  constexpr const char* where = "oktopk_reduce_refused_async";
  return launch_call(where, handle, request, [handle, text = reason_text(reason)] {
    refuse_reduce(where, *handle->typed, text);
  });
}

int oktopk_get_backend(const char** name) {
  return guarded([&] {
    if (name == nullptr) throw std::invalid_argument("oktopk_get_backend: name is NULL");
    *name = Exec::name();
  });
}

int oktopk_get_gpu_aware_mpi(int* device_pointers, const char** reason) {
  return guarded([&] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized)
      throw std::runtime_error(
          "oktopk_get_gpu_aware_mpi: MPI is not initialised (call MPI_Init first)");
    const oktopk::GpuAwareMpi& choice = oktopk::gpu_aware_mpi();
    if (device_pointers != nullptr) *device_pointers = choice.device_pointers ? 1 : 0;
    if (reason != nullptr) *reason = choice.reason.c_str();
  });
}

int oktopk_get_device(int* device) {
  return guarded([&] {
    if (device == nullptr) throw std::invalid_argument("oktopk_get_device: device is NULL");
    if (!Kokkos::is_initialized())
      throw std::runtime_error(
          "oktopk_get_device: Kokkos is not initialised (call oktopk_initialize first)");
    *device = oktopk::default_device();
  });
}

int oktopk_describe(const oktopk_handle* handle, const char** algorithm, int64_t* n, int64_t* k) {
  return guarded([&] {
    require_handle(handle, "oktopk_describe");
    if (algorithm != nullptr) *algorithm = handle->algorithm.c_str();
    if (n != nullptr) *n = handle->typed->size();
    if (k != nullptr) *k = handle->typed->k();
  });
}

int oktopk_get_stats(const oktopk_handle* handle, oktopk_stats* stats) {
  return guarded([&] {
    require_handle(handle, "oktopk_get_stats");
    if (stats == nullptr) throw std::invalid_argument("oktopk_get_stats: stats is NULL");
    // In launch order: the stats of the last call launched before, once it has run.
    const oktopk::ReduceStats s =
        oktopk::run_on_progress_thread([handle] { return handle->typed->stats(); });
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
    stats->bytes_sent_between_nodes = traffic.bytes_sent_between_nodes;
    stats->bytes_received_between_nodes = traffic.bytes_received_between_nodes;
    stats->selected_nothing = s.selected_nothing ? 1 : 0;
    stats->reduce_scatter = s.reduce_scatter ? 1 : 0;
  });
}

int oktopk_get_num_phases(const oktopk_handle* handle, int64_t* num_phases) {
  return guarded([&] {
    constexpr const char* where = "oktopk_get_num_phases";
    require_handle(handle, where);
    if (num_phases == nullptr)
      throw std::invalid_argument(std::string(where) + ": num_phases is NULL");
    const oktopk::ReduceStats s =
        oktopk::run_on_progress_thread([handle] { return handle->typed->stats(); });
    *num_phases = static_cast<int64_t>(s.phases.size());
  });
}

int oktopk_get_phase_stats(const oktopk_handle* handle, int64_t index, oktopk_phase_stats* phase) {
  return guarded([&] {
    constexpr const char* where = "oktopk_get_phase_stats";
    require_handle(handle, where);
    if (phase == nullptr) throw std::invalid_argument(std::string(where) + ": phase is NULL");
    const oktopk::ReduceStats s =
        oktopk::run_on_progress_thread([handle] { return handle->typed->stats(); });
    const auto count = static_cast<std::int64_t>(s.phases.size());
    if (index < 0 || index >= count)
      throw std::invalid_argument(std::string(where) + ": index " + std::to_string(index) +
                                  " is outside [0, " + std::to_string(count) + ")");
    const auto& [name, stats] = *std::next(s.phases.begin(), static_cast<std::ptrdiff_t>(index));
    *phase = oktopk_phase_stats{};
    // The library's phase names are short; a longer one would be cut, never left unterminated.
    name.copy(phase->name, sizeof phase->name - 1);
    phase->seconds = stats.seconds;
    phase->bytes_sent = stats.traffic.bytes_sent;
    phase->bytes_received = stats.traffic.bytes_received;
    phase->messages_sent = stats.traffic.messages_sent;
    phase->messages_received = stats.traffic.messages_received;
    phase->bytes_sent_between_nodes = stats.traffic.bytes_sent_between_nodes;
    phase->bytes_received_between_nodes = stats.traffic.bytes_received_between_nodes;
  });
}

int oktopk_get_residual(const oktopk_handle* handle, float* out, int64_t n) {
  return get_residual_call("oktopk_get_residual", handle, OKTOPK_FLOAT32, out, n);
}

int oktopk_get_residual_typed(const oktopk_handle* handle, int dtype, void* out, int64_t n) {
  return get_residual_call("oktopk_get_residual_typed", handle, dtype, out, n);
}

int oktopk_get_num_segments(const oktopk_handle* handle, int64_t* num_segments) {
  return guarded([&] {
    constexpr const char* where = "oktopk_get_num_segments";
    require_handle(handle, where);
    if (num_segments == nullptr)
      throw std::invalid_argument(std::string(where) + ": num_segments is NULL");
    *num_segments = static_cast<int64_t>(handle->typed->layout().segments().size());
  });
}

int oktopk_get_segment_stats(const oktopk_handle* handle, int64_t index,
                             oktopk_segment_stats* stats) {
  return guarded([&] {
    constexpr const char* where = "oktopk_get_segment_stats";
    require_handle(handle, where);
    if (stats == nullptr) throw std::invalid_argument(std::string(where) + ": stats is NULL");
    // The layout never changes after create: only the counts need the calls before this one.
    const auto& segments = handle->typed->layout().segments();
    const auto count = static_cast<std::int64_t>(segments.size());
    if (index < 0 || index >= count)
      throw std::invalid_argument(std::string(where) + ": index " + std::to_string(index) +
                                  " is outside [0, " + std::to_string(count) + ")");
    const oktopk::ReduceStats s =
        oktopk::run_on_progress_thread([handle] { return handle->typed->stats(); });
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
        oktopk::run_on_progress_thread([&] { handle->typed->save_state(os); });
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
    oktopk::run_on_progress_thread([&] { handle->typed->restore_state(is); });
  });
}

int oktopk_save_state_to_buffer(const oktopk_handle* handle, void* buffer, size_t capacity,
                                size_t* size) {
  return guarded([&] {
    constexpr const char* where = "oktopk_save_state_to_buffer";
    require_handle(handle, where);
    if (size == nullptr) throw std::invalid_argument(std::string(where) + ": size is NULL");
    std::ostringstream os(std::ios::binary);
    oktopk::run_on_progress_thread([&] { handle->typed->save_state(os); });
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
    oktopk::run_on_progress_thread([&] { handle->typed->restore_state(is); });
  });
}

}  // extern "C"
