/* SPDX-License-Identifier: BSD-3-Clause */
/* The C interface to OkTopk: an opaque sparse allreduce handle for C, Fortran (through the
 * oktopk Fortran module) and Python (through the oktopk package).
 *
 * Every function returns OKTOPK_SUCCESS (0) or one of the error codes below; no C++ exception
 * crosses this interface. After an error, oktopk_last_error() returns the message, in the
 * calling thread, until the next failing call of that thread. Functions marked collective
 * must be called by every rank of the handle's communicator, in the same order; they return
 * the same code on every rank where the C++ API agrees on errors (bad arguments, NaN or Inf in
 * a gradient, mismatched n or options; the message may add details on the rank at fault), and
 * a failure on some ranks only ends the job with MPI_Abort instead of leaving the others
 * waiting (docs/reference.md, "Failures"). A NULL array counts as an array of length 0: a NULL on
 * some ranks only is the length error, on every rank. A NULL handle or request, or
 * MPI_COMM_NULL, is reported on that rank alone: it has no communicator to tell the others.
 * Without the progress thread (see oktopk_reduce_async), every call that waits for the calls
 * launched before it (oktopk_test, oktopk_wait, oktopk_get_stats, the state functions,
 * oktopk_destroy) runs them first, collectively: make those calls on every rank. */
#ifndef OKTOPK_C_API_H
#define OKTOPK_C_API_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Return codes. */
#define OKTOPK_SUCCESS 0
/* A bad argument: a null pointer, an unknown method or option, a value out of range, NaN or
 * Inf in a gradient, arguments that differ between ranks, a checkpoint of another handle. */
#define OKTOPK_ERROR_INVALID_ARGUMENT 1
/* Anything else that failed: MPI, I/O, a damaged checkpoint, Kokkos not initialised. */
#define OKTOPK_ERROR_RUNTIME 2
/* An allocation failed. */
#define OKTOPK_ERROR_OUT_OF_MEMORY 3

typedef struct oktopk_handle oktopk_handle;

/* Gradient types (dtype arguments): a handle's gradients and outputs are of one of them,
 * chosen at oktopk_create_typed; the functions without a dtype argument take float32. The
 * 16-bit types are passed as their bit patterns, one uint16_t per value (bfloat16: the upper
 * half of a float's bits). A handle sums and keeps its residual in float64 for float64
 * gradients and in float32 for the others (oktopk_get_dtype). */
#define OKTOPK_FLOAT32 0  /* float */
#define OKTOPK_FLOAT64 1  /* double */
#define OKTOPK_BFLOAT16 2 /* bfloat16, as uint16_t */
#define OKTOPK_FLOAT16 3  /* IEEE 754 binary16, as uint16_t */

/* Statistics of a handle's last reduce call, on this rank. */
typedef struct oktopk_stats {
  int64_t iteration;       /* calls made so far, the last included */
  int64_t k;               /* the k the handle aims at: floor(density * n) */
  int64_t local_selected;  /* entries this rank contributed */
  int64_t global_selected; /* entries of the global result (see the C++ ReduceStats) */
  int64_t bytes_sent;      /* by this rank, over every phase of the call */
  int64_t bytes_received;
  int64_t messages_sent;
  int64_t messages_received;
  double seconds;        /* the call's time on this rank */
  float local_threshold; /* -Inf: every entry */
  float global_threshold;
  int32_t dense; /* 1 if the call was a dense allreduce (warm-up or method dense) */
  /* Of bytes_sent and bytes_received, those to and from ranks on other nodes (the handle's
   * nodes, option node_size; the rest stayed inside this rank's node). */
  int64_t bytes_sent_between_nodes;
  int64_t bytes_received_between_nodes;
  /* 1 if a top-k method selected nothing on any rank although some rank's input had a
   * non-zero entry (the C++ ReduceStats::selected_nothing) */
  int32_t selected_nothing;
  /* 1 if the call was a reduce-scatter (oktopk_reduce_scatter and its kin) */
  int32_t reduce_scatter;
} oktopk_stats;

/* One phase of a handle's last reduce call on this rank: its time and traffic, the traffic
 * split as in oktopk_stats. */
typedef struct oktopk_phase_stats {
  char name[32]; /* "selection", "split_reduce", "node_reduce_scatter", ... (NUL-terminated) */
  double seconds;
  int64_t bytes_sent;
  int64_t bytes_received;
  int64_t messages_sent;
  int64_t messages_received;
  int64_t bytes_sent_between_nodes;
  int64_t bytes_received_between_nodes;
} oktopk_phase_stats;

/* The library's version, "MAJOR.MINOR.PATCH". Never fails. */
const char* oktopk_version(void);

/* The MPI library this copy of OkTopk was compiled against, as its mpi.h names it
 * ("Open MPI 4.1.4", "MPICH 4.0.2"; "" for another MPI). A program that loads a second MPI
 * (mpi4py, another library) must load one of the same family. Never fails. */
const char* oktopk_mpi_library(void);

/* The message of this thread's last failed call ("" if none). Never fails. The text stays
 * valid until this thread's next failing call. */
const char* oktopk_last_error(void);

/* Initialises Kokkos unless it already is (then it does nothing and oktopk_finalize leaves it
 * alone). argc and argv may be NULL; Kokkos takes its --kokkos-* arguments from them. Call it
 * after MPI_Init or MPI_Init_thread and before the first oktopk_create. With
 * MPI_THREAD_MULTIPLE, Kokkos is initialised on OkTopk's progress thread (see
 * oktopk_reduce_async), and argc and argv are left as they are. */
int oktopk_initialize(int* argc, char*** argv);

/* Finalises Kokkos if oktopk_initialize initialised it; otherwise does nothing. Every handle
 * must have been destroyed (OKTOPK_ERROR_RUNTIME otherwise, and nothing is finalised). Call it
 * before MPI_Finalize. */
int oktopk_finalize(void);

/* Collective. Makes a handle for gradients of n floats (oktopk_create_typed for the other
 * types), running `algorithm` (dense, topka, topkdsa, gtopk, gaussiank, oktopk or s2) over a
 * duplicate of `comm`. `options` holds key=value settings separated by spaces or commas
 * ("density=0.01 threshold_period=32"; NULL or "" for the defaults); the keys are the fields
 * of oktopk::Options (docs/reference.md, "Options"). Every rank must pass the same algorithm,
 * n and options. On success *handle is the new handle; on failure it is set to NULL. */
int oktopk_create(MPI_Comm comm, const char* algorithm, int64_t n, const char* options,
                  oktopk_handle** handle);

/* oktopk_create for a communicator given as a Fortran integer handle (MPI_Comm_c2f). */
int oktopk_create_f(MPI_Fint comm, const char* algorithm, int64_t n, const char* options,
                    oktopk_handle** handle);

/* What a segment of a fused buffer holds (oktopk_create_with_layout). */
#define OKTOPK_SEGMENT_DENSE 0 /* parameters whose gradient is mostly non-zero */
#define OKTOPK_SEGMENT_ROWS 1  /* rows of row_width floats (an embedding), most of them zero */

/* Collective. oktopk_create for a fused buffer (a DDP bucket, say) of num_segments consecutive
 * segments (docs/reference.md, "Fused buffers: layouts"): segment i holds the lengths[i] floats
 * after segment i - 1 (segment 0 starts at 0), of kind kinds[i]; an OKTOPK_SEGMENT_ROWS segment
 * holds rows of row_widths[i] >= 1 floats (the last row is shorter when lengths[i] is not a
 * multiple); row_widths[i] is ignored for dense segments. names may be NULL, and names[i] may be
 * NULL (both mean ""): labels for oktopk_get_segment_stats. The lengths must be >= 0 and sum to n.
 * lengths, kinds and row_widths may be NULL only when num_segments is 0, which is oktopk_create. S2
 * then sketches only the rows segments and averages the dense ones exactly; the other methods
 * compute what they compute without a layout. Every rank must pass the same layout, names included.
 * A bad segment on any rank returns OKTOPK_ERROR_INVALID_ARGUMENT on every rank, with the message
 * "oktopk_create_with_layout: rank R: segment I: ...". */
int oktopk_create_with_layout(MPI_Comm comm, const char* algorithm, int64_t n, const char* options,
                              int64_t num_segments, const int64_t* lengths, const int* kinds,
                              const int64_t* row_widths, const char* const* names,
                              oktopk_handle** handle);

/* oktopk_create_with_layout for a communicator given as a Fortran integer handle. */
int oktopk_create_with_layout_f(MPI_Fint comm, const char* algorithm, int64_t n,
                                const char* options, int64_t num_segments, const int64_t* lengths,
                                const int* kinds, const int64_t* row_widths,
                                const char* const* names, oktopk_handle** handle);

/* Collective. oktopk_create_with_layout for gradients of type `dtype` (OKTOPK_FLOAT32,
 * OKTOPK_FLOAT64, OKTOPK_BFLOAT16 or OKTOPK_FLOAT16); num_segments = 0 with NULL arrays for a
 * buffer without a layout. The handle's arrays are then passed to the *_typed functions, with
 * the same dtype. Every rank must pass the same dtype (a mismatch is reported on every rank,
 * naming "gradient type"); an unknown dtype on any rank returns OKTOPK_ERROR_INVALID_ARGUMENT
 * on every rank. Options the type does not take (wire=bf16 with float64, say) are refused
 * likewise. */
int oktopk_create_typed(MPI_Comm comm, const char* algorithm, int64_t n, int dtype,
                        const char* options, int64_t num_segments, const int64_t* lengths,
                        const int* kinds, const int64_t* row_widths, const char* const* names,
                        oktopk_handle** handle);

/* oktopk_create_typed for a communicator given as a Fortran integer handle. */
int oktopk_create_typed_f(MPI_Fint comm, const char* algorithm, int64_t n, int dtype,
                          const char* options, int64_t num_segments, const int64_t* lengths,
                          const int* kinds, const int64_t* row_widths, const char* const* names,
                          oktopk_handle** handle);

/* The handle's gradient type and the type of its residual, sums and averages (OKTOPK_FLOAT64
 * for float64 gradients, OKTOPK_FLOAT32 for the others); either may be NULL. */
int oktopk_get_dtype(const oktopk_handle* handle, int* dtype, int* residual_dtype);

/* Frees the handle (NULL is allowed and does nothing), after the calls launched before it.
 * Not collective: handles made on one communicator share a duplicate of it, which is freed
 * (collectively) when that communicator is freed. */
int oktopk_destroy(oktopk_handle* handle);

/* Collective. Reduces host arrays of n floats: `out` receives the average over ranks of the
 * sparsified gradients (mostly zeros), the same bits on every rank. `grad` is only read.
 * grad == out (in place) is allowed and gives the same result as separate arrays; otherwise
 * the two must not overlap. In CUDA and HIP builds the arrays are copied to the device and
 * back; use oktopk_reduce_device to avoid the copies. */
int oktopk_reduce(oktopk_handle* handle, const float* grad, float* out);

/* Collective. As oktopk_reduce, for arrays in the memory of Kokkos's default execution space:
 * device pointers in CUDA and HIP builds (the call is ordered on that space's default
 * instance, and complete on return), host pointers in CPU builds. Where the arrays live is
 * checked, as oktopk_reduce_on_stream checks it; to order the call with work on a stream of
 * the caller's, use that function. */
int oktopk_reduce_device(oktopk_handle* handle, const float* grad, float* out);

/* Collective. As oktopk_reduce, with the result returned in sparse form instead of written as
 * n floats: *count entries, *indices ascending (0-based) and *values the averages at them, the
 * same on every rank; oktopk_reduce's output would be zero at every other index. Method
 * "oktopk" writes them without a pass over n. The arrays are host memory owned by the handle,
 * valid until its next reduce call (of any kind) or its destruction. A NULL indices, values
 * or count still joins the call, so the other ranks fail too (OKTOPK_ERROR_INVALID_ARGUMENT,
 * the handle unchanged; for n > 0); on failure *count is 0 and the pointers are NULL where
 * given. */
int oktopk_reduce_sparse(oktopk_handle* handle, const float* grad, const int32_t** indices,
                         const float** values, int64_t* count);

/* Collective. oktopk_reduce, oktopk_reduce_device and oktopk_reduce_sparse for a handle of
 * any gradient type: grad, out and *values hold n (or *count) values of type `dtype`, which
 * must be the handle's (oktopk_get_dtype). A dtype other than the handle's is an error
 * (OKTOPK_ERROR_INVALID_ARGUMENT): that rank joins the call with empty arrays, so that every
 * other rank fails too ("rank R: the arrays are ...") instead of waiting; the handle is unchanged.
 * The float32 functions are these with dtype = OKTOPK_FLOAT32, and refuse other handles so. */
int oktopk_reduce_typed(oktopk_handle* handle, int dtype, const void* grad, void* out);
int oktopk_reduce_device_typed(oktopk_handle* handle, int dtype, const void* grad, void* out);
int oktopk_reduce_sparse_typed(oktopk_handle* handle, int dtype, const void* grad,
                               const int32_t** indices, const void** values, int64_t* count);

/* Collective. For sharded data parallelism (ZeRO, FSDP): `shard` receives this rank's shard of
 * what oktopk_reduce would write into out on the same gradients, entries [shard_offsets[rank],
 * shard_offsets[rank + 1]), with the same error feedback; no rank receives the others' shards.
 * shard_offsets: num_offsets = P + 1 boundaries from 0 to n, never decreasing, the same on
 * every rank, or NULL (num_offsets 0) on every rank for equal shards ([r*n/P, (r+1)*n/P));
 * shard_length must be this rank's shard's length. Methods "oktopk", "topka", "topkdsa" and
 * "gaussiank" (bit for bit oktopk_reduce's slice) and "dense" (one MPI_Reduce_scatter, float and
 * double gradients); "gtopk", "s2", hierarchical handles, bad offsets or lengths on any rank fail
 * on every rank with
 * OKTOPK_ERROR_INVALID_ARGUMENT, the handle unchanged. The _typed forms take arrays of the handle's
 * dtype, host memory or (_device) the memory of Kokkos's default execution space, as
 * oktopk_reduce_typed and oktopk_reduce_device_typed do. */
int oktopk_reduce_scatter(oktopk_handle* handle, const float* grad, float* shard,
                          int64_t shard_length, const int64_t* shard_offsets, int64_t num_offsets);
int oktopk_reduce_scatter_typed(oktopk_handle* handle, int dtype, const void* grad, void* shard,
                                int64_t shard_length, const int64_t* shard_offsets,
                                int64_t num_offsets);
int oktopk_reduce_scatter_device_typed(oktopk_handle* handle, int dtype, const void* grad,
                                       void* shard, int64_t shard_length,
                                       const int64_t* shard_offsets, int64_t num_offsets);

/* An asynchronous reduce in flight (oktopk_reduce_async). */
typedef struct oktopk_request oktopk_request;

/* Collective. Starts oktopk_reduce(handle, grad, out) and returns at once with *request; the
 * call runs on OkTopk's progress thread, in launch order after every call launched before it
 * in this process, while the caller goes on (with backprop, say). grad and out must stay
 * valid and untouched until the request completes. Every rank must launch its calls in the
 * same order: a rank whose next call belongs to another handle than its peers' gets
 * OKTOPK_ERROR_INVALID_ARGUMENT from that request on every rank, never a hang or a mixed
 * result, provided the handles were made on the same communicator. The handle must outlive
 * the request (oktopk_destroy waits for the handle's calls in flight). The calls overlap with
 * the caller's work when oktopk_initialize found MPI initialised with MPI_THREAD_MULTIPLE
 * (MPI_Init_thread) and Kokkos not yet initialised: it then starts OkTopk's progress thread,
 * where every call of this interface runs. Otherwise the queued calls run on the caller's
 * thread inside oktopk_test and oktopk_wait. *request is NULL on failure. */
int oktopk_reduce_async(oktopk_handle* handle, const float* grad, float* out,
                        oktopk_request** request);

/* Collective. oktopk_reduce_async for a handle of any gradient type, as oktopk_reduce_typed;
 * a dtype other than the handle's fails the request on every rank. */
int oktopk_reduce_async_typed(oktopk_handle* handle, int dtype, const void* grad, void* out,
                              oktopk_request** request);

/* Collective. As oktopk_reduce_device_typed, on the caller's stream: `stream` is a
 * cudaStream_t (CUDA builds) or hipStream_t (HIP builds) as void*, NULL for the runtime's
 * legacy default stream. Every kernel and copy of the call runs on that stream, after the work
 * queued on it before the call (the kernels that wrote `grad`, say), so no device-wide
 * synchronisation is needed before or after; on return the stream has finished the call and
 * `out` holds the result. grad and out must be n values of type `dtype` in device or managed
 * memory of the handle's GPU (oktopk_get_device). Each rank checks its arguments (the dtype,
 * the stream handle, where grad and out live): a bad argument on any rank fails the call on
 * every rank with OKTOPK_ERROR_INVALID_ARGUMENT, the message naming the lowest such rank and
 * its cause ("... rank 2: grad is pageable host memory ..."), and leaves the handle unchanged.
 * cudaStreamPerThread is refused (the call may run on OkTopk's progress thread, where it names
 * another stream), and so is a stream of another GPU than the handle's. In CPU builds `stream`
 * must be NULL and the arrays are host memory. The handle keeps a Kokkos instance over the last
 * stream it ran on: calls on one stream make it once, and each change of stream makes a new one
 * (a small allocation). */
int oktopk_reduce_on_stream(oktopk_handle* handle, int dtype, const void* grad, void* out,
                            void* stream);

/* Collective. oktopk_reduce_on_stream launched as oktopk_reduce_async launches oktopk_reduce:
 * the call is queued behind the calls launched before it and its work goes to `stream` when it
 * runs, after whatever the caller queued there by then; grad and out stay untouched until the
 * request completes (oktopk_test or oktopk_wait), which means the stream has finished the
 * call. Argument errors fail the request on every rank, as oktopk_reduce_on_stream's do. */
int oktopk_reduce_on_stream_async(oktopk_handle* handle, int dtype, const void* grad, void* out,
                                  void* stream, oktopk_request** request);

/* The GPU the handles of this process run on (Kokkos's default execution space's device, chosen
 * when Kokkos was initialised: see docs/reference.md, "GPU users"), or -1 in a build for CPUs
 * only. Needs oktopk_initialize (or Kokkos initialised) first. */
int oktopk_get_device(int* device);

/* Collective, for a rank that cannot make the reduce its peers are making now (any of the
 * reduce functions above; its own check of an array failed, say): joins that call without
 * arrays, so that every rank's call fails with OKTOPK_ERROR_INVALID_ARGUMENT instead of waiting,
 * the message naming the lowest such rank and its `reason` ("oktopk_reduce_typed: rank 1:
 * <reason>"), and the handle is unchanged. Returns that error here too (for n = 0 the peers'
 * call is valid and succeeds: only this rank fails). A NULL or empty reason reads "(no reason
 * given)". The bindings refuse arrays they cannot hand to the C interface with it. */
int oktopk_reduce_refused(oktopk_handle* handle, const char* reason);

/* Collective. oktopk_reduce_refused in launch order, for peers making an asynchronous reduce
 * (oktopk_reduce_async and its forms): *request fails as their requests do. */
int oktopk_reduce_refused_async(oktopk_handle* handle, const char* reason,
                                oktopk_request** request);

/* The name of the Kokkos execution space this build's handles run on ("Serial", "OpenMP",
 * "Cuda", "HIP", ...), in static storage; needs no oktopk_initialize. */
int oktopk_get_backend(const char** name);

/* How this process hands GPU buffers to MPI (docs/operations.md, "GPU-aware MPI"):
 * *device_pointers is 1 when MPI gets device pointers, 0 for page-locked host copies (and always
 * in a build without a GPU); *reason, in static storage, says why (OKTOPK_GPU_AWARE_MPI, or what
 * the MPI said of itself). Either may be NULL. Needs MPI_Init, not oktopk_initialize. */
int oktopk_get_gpu_aware_mpi(int* device_pointers, const char** reason);

/* Sets *done to 1 if the request has completed (0 otherwise) without waiting; once done,
 * returns the reduce's own result code (and its message in oktopk_last_error), again on every
 * later call. */
int oktopk_test(oktopk_request* request, int* done);

/* Waits until the request completes and returns the reduce's result code. */
int oktopk_wait(oktopk_request* request);

/* Frees the request, waiting for it first if it is still in flight (NULL is allowed). */
int oktopk_request_free(oktopk_request* request);

/* The handle's method name, n and k (any may be NULL). */
int oktopk_describe(const oktopk_handle* handle, const char** algorithm, int64_t* n, int64_t* k);

/* Statistics of the handle's last reduce call on this rank (all zero before the first); waits
 * for the calls launched before it. */
int oktopk_get_stats(const oktopk_handle* handle, oktopk_stats* stats);

/* Copies this rank's residual (the error feedback: what the calls so far held back, zero
 * where the last call sent this rank's entry) into `out`, host memory of n floats (n: the
 * handle's n); waits for the calls launched before it. Not collective. Method dense and
 * methods without error feedback have an all-zero residual. */
int oktopk_get_residual(const oktopk_handle* handle, float* out, int64_t n);

/* oktopk_get_residual into n values of type `dtype`, which must be the handle's residual type
 * (oktopk_get_dtype: OKTOPK_FLOAT64 for float64 gradients, OKTOPK_FLOAT32 otherwise). */
int oktopk_get_residual_typed(const oktopk_handle* handle, int dtype, void* out, int64_t n);

/* One segment of a handle's layout and its part of the last reduce call's output. */
typedef struct oktopk_segment_stats {
  int64_t offset; /* where the segment starts in the buffer */
  int64_t length;
  int64_t row_width; /* for OKTOPK_SEGMENT_ROWS; 1 for dense segments */
  int64_t nonzeros;  /* non-zero entries of the last output in the segment (the same on every
                        rank; 0 before the first call) */
  int32_t kind;      /* OKTOPK_SEGMENT_DENSE or OKTOPK_SEGMENT_ROWS */
  const char* name;  /* the segment's name ("" if none), valid while the handle lives */
} oktopk_segment_stats;

/* Sets *num_segments to the number of segments of the handle's layout (0 without one). */
int oktopk_get_num_segments(const oktopk_handle* handle, int64_t* num_segments);

/* Segment `index` (0 <= index < the number of segments) of the handle's layout, with its
 * non-zeros in the last reduce call's output on this rank; waits for the calls launched before
 * it. Over the segments, nonzeros sums to the non-zeros of the whole output. */
int oktopk_get_segment_stats(const oktopk_handle* handle, int64_t index,
                             oktopk_segment_stats* stats);

/* Sets *num_phases to the number of phases of the last reduce call on this rank (0 before the
 * first); waits for the calls launched before it. Launch no call between it and the
 * oktopk_get_phase_stats calls that read the phases: each reads the last call's. */
int oktopk_get_num_phases(const oktopk_handle* handle, int64_t* num_phases);

/* Phase `index` (0 <= index < oktopk_get_num_phases, phases in the order of their names) of the
 * last reduce call on this rank; waits for the calls launched before it. Over the phases, the
 * fields sum to oktopk_stats's. */
int oktopk_get_phase_stats(const oktopk_handle* handle, int64_t index, oktopk_phase_stats* phase);

/* Writes this rank's state (residual, thresholds, region boundaries, call counter) to
 * `path`, in the checkpoint format of docs/reference.md. Not collective: every rank saves its
 * own state, so give every rank its own path. The file is written under a temporary name and
 * renamed, so an existing checkpoint is never left half overwritten. */
int oktopk_save_state(const oktopk_handle* handle, const char* path);

/* Collective. Restores what oktopk_save_state wrote on this rank. If any rank's file is
 * missing, damaged or of another handle, every rank returns the same error and the handle is
 * unchanged. */
int oktopk_restore_state(oktopk_handle* handle, const char* path);

/* The state in memory: with buffer == NULL, sets *size to the bytes needed; otherwise writes
 * the state into buffer (capacity bytes; OKTOPK_ERROR_INVALID_ARGUMENT if too small) and sets
 * *size to the bytes written. Not collective. */
int oktopk_save_state_to_buffer(const oktopk_handle* handle, void* buffer, size_t capacity,
                                size_t* size);

/* Collective. oktopk_restore_state from `size` bytes in memory. */
int oktopk_restore_state_from_buffer(oktopk_handle* handle, const void* buffer, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* OKTOPK_C_API_H */
