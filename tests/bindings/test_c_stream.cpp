/* SPDX-License-Identifier: BSD-3-Clause */
/* The C interface on a caller's GPU stream, as a CUDA or HIP program uses it (device builds
 * only; it needs a GPU to run). Each call's gradient is written by a deliberately slow kernel
 * on a non-blocking stream, into a buffer that held NaN until then, and the reduce is called at
 * once, with no synchronisation: the call must wait for that kernel on the stream (a call that
 * read the buffer early would see NaN and fail, or reduce the wrong values) and must have
 * finished when it returns (the result is read back on the legacy default stream, which does
 * not wait for a non-blocking one). Every method's result, synchronous and asynchronous, must
 * be the bits of a twin handle fed the same gradients from host arrays. Host pointers, the
 * wrong dtype and cudaStreamPerThread are refused on every rank. Prints "N passed, N failed"
 * on rank 0. */
#include "rank_checks.h"

#include <oktopk/c_api.h>

#include <mpi.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
#define gpuError_t hipError_t
#define gpuSuccess hipSuccess
#define gpuStream_t hipStream_t
#define gpuStreamNonBlocking hipStreamNonBlocking
#define gpuStreamPerThread hipStreamPerThread
#define gpuStreamCreateWithFlags hipStreamCreateWithFlags
#define gpuStreamDestroy hipStreamDestroy
#define gpuSetDevice hipSetDevice
#define gpuMalloc hipMalloc
#define gpuFree hipFree
#define gpuMemsetAsync hipMemsetAsync
#define gpuMemcpy hipMemcpy
#define gpuMemcpyDeviceToHost hipMemcpyDeviceToHost
#define gpuGetErrorString hipGetErrorString
#define gpuGetLastError hipGetLastError
#else
#include <cuda_runtime.h>
#define gpuError_t cudaError_t
#define gpuSuccess cudaSuccess
#define gpuStream_t cudaStream_t
#define gpuStreamNonBlocking cudaStreamNonBlocking
#define gpuStreamPerThread cudaStreamPerThread
#define gpuStreamCreateWithFlags cudaStreamCreateWithFlags
#define gpuStreamDestroy cudaStreamDestroy
#define gpuSetDevice cudaSetDevice
#define gpuMalloc cudaMalloc
#define gpuFree cudaFree
#define gpuMemsetAsync cudaMemsetAsync
#define gpuMemcpy cudaMemcpy
#define gpuMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define gpuGetErrorString cudaGetErrorString
#define gpuGetLastError cudaGetLastError
#endif

/* A runtime failure is not a check: the program cannot go on. */
static void gpu_ok(gpuError_t code, const char* what) {
  if (code != gpuSuccess) {
    fprintf(stderr, "rank %d: FAILED: %s: %s\n", rank, what, gpuGetErrorString(code));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

/* Deterministic gradient of rank r, the same on the host and the device. */
__host__ __device__ static float gradient_value(int r, int64_t i, int call) {
  const uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(r * 40503u + call * 977u);
  const float small = (float)(h % 1000u) / 1000.0f - 0.5f;
  return (h % 37u == 0u) ? 8.0f * small + (small < 0 ? -4.0f : 4.0f) : small;
}

/* Spins for `cycles` clock cycles (a tenth of a second or so), then writes the gradient. */
__global__ static void produce_slowly(float* grad, int64_t n, int r, int call, long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    grad[i] = gradient_value(r, i, call);
}

static const long long slow_cycles = 200000000LL;

/* Every rank's message names `bad_rank` and holds `reason`. */
static int agreed_message(int bad_rank, const char* reason) {
  char head[64];
  snprintf(head, sizeof head, "rank %d: ", bad_rank);
  const char* at = strstr(oktopk_last_error(), head);
  return at != NULL && strstr(at, reason) != NULL;
}

static void test_method(const char* method, int64_t n, gpuStream_t stream, int asynchronous) {
  char what[256];
  const char* options = "density=0.02 threshold_period=2 repartition_period=4";
  oktopk_handle* device_handle = NULL;
  oktopk_handle* host_handle = NULL;
  snprintf(what, sizeof what, "%s: create the handles", method);
  check(oktopk_create(MPI_COMM_WORLD, method, n, options, &device_handle) == OKTOPK_SUCCESS &&
            oktopk_create(MPI_COMM_WORLD, method, n, options, &host_handle) == OKTOPK_SUCCESS,
        what);
  if (device_handle == NULL || host_handle == NULL) return;

  float* grad = NULL;
  float* out = NULL;
  gpu_ok(gpuMalloc((void**)&grad, (size_t)n * sizeof(float)), "gpuMalloc grad");
  gpu_ok(gpuMalloc((void**)&out, (size_t)n * sizeof(float)), "gpuMalloc out");
  float* host_grad = (float*)malloc((size_t)n * sizeof(float));
  float* host_out = (float*)malloc((size_t)n * sizeof(float));
  float* result = (float*)malloc((size_t)n * sizeof(float));

  int codes_ok = 1, same = 1;
  const int calls = 5;
  for (int call = 0; call < calls; ++call) {
    /* All bits set is a NaN: a call that reads grad before the producer wrote it fails. */
    gpu_ok(gpuMemsetAsync(grad, 0xff, (size_t)n * sizeof(float), stream), "memset grad");
    gpu_ok(gpuMemsetAsync(out, 0xff, (size_t)n * sizeof(float), stream), "memset out");
    produce_slowly<<<256, 256, 0, stream>>>(grad, n, rank, call, slow_cycles);
    gpu_ok(gpuGetLastError(), "launch produce_slowly");
    if (asynchronous) {
      oktopk_request* request = NULL;
      codes_ok &= oktopk_reduce_on_stream_async(device_handle, OKTOPK_FLOAT32, grad, out, stream,
                                                &request) == OKTOPK_SUCCESS;
      codes_ok &= request != NULL && oktopk_wait(request) == OKTOPK_SUCCESS;
      if (request != NULL) oktopk_request_free(request);
    } else {
      codes_ok &= oktopk_reduce_on_stream(device_handle, OKTOPK_FLOAT32, grad, out, stream) ==
                  OKTOPK_SUCCESS;
    }
    /* The legacy default stream does not wait for a non-blocking stream: this reads what the
     * call left in `out` when it returned. */
    gpu_ok(gpuMemcpy(result, out, (size_t)n * sizeof(float), gpuMemcpyDeviceToHost), "read out");

    for (int64_t i = 0; i < n; ++i) host_grad[i] = gradient_value(rank, i, call);
    codes_ok &= oktopk_reduce(host_handle, host_grad, host_out) == OKTOPK_SUCCESS;
    same &= memcmp(result, host_out, (size_t)n * sizeof(float)) == 0;
  }
  snprintf(what, sizeof what, "%s (%s): every call on the stream returns OKTOPK_SUCCESS", method,
           asynchronous ? "async" : "sync");
  check(codes_ok, what);
  snprintf(what, sizeof what,
           "%s (%s): after a slow producer, the stream's result is the host twin's bits", method,
           asynchronous ? "async" : "sync");
  check(same, what);

  free(result);
  free(host_out);
  free(host_grad);
  gpu_ok(gpuFree(out), "gpuFree out");
  gpu_ok(gpuFree(grad), "gpuFree grad");
  oktopk_destroy(host_handle);
  oktopk_destroy(device_handle);
}

/* A host array or the wrong dtype on the last rank, and cudaStreamPerThread everywhere, fail on
 * every rank. */
static void test_refusals(int64_t n, gpuStream_t stream) {
  oktopk_handle* handle = NULL;
  check(oktopk_create(MPI_COMM_WORLD, "oktopk", n, "density=0.02", &handle) == OKTOPK_SUCCESS,
        "refusals: create");
  if (handle == NULL) return;
  float* grad = NULL;
  float* out = NULL;
  gpu_ok(gpuMalloc((void**)&grad, (size_t)n * sizeof(float)), "gpuMalloc grad");
  gpu_ok(gpuMalloc((void**)&out, (size_t)n * sizeof(float)), "gpuMalloc out");
  float* host_grad = (float*)calloc((size_t)n, sizeof(float));
  const int last = size - 1;
  const void* g = rank == last ? (const void*)host_grad : (const void*)grad;
  check(oktopk_reduce_on_stream(handle, OKTOPK_FLOAT32, g, out, stream) ==
                OKTOPK_ERROR_INVALID_ARGUMENT &&
            agreed_message(last, "grad is pageable host memory"),
        "a host array on the last rank is refused on every rank, naming that rank");
  check(oktopk_reduce_on_stream(handle, rank == last ? OKTOPK_FLOAT64 : OKTOPK_FLOAT32, grad, out,
                                stream) == OKTOPK_ERROR_INVALID_ARGUMENT &&
            agreed_message(last, "the arrays are OKTOPK_FLOAT64, the handle's gradients"),
        "the wrong dtype on the last rank is refused on every rank, naming that rank");
  check(oktopk_reduce_on_stream(handle, OKTOPK_FLOAT32, grad, out, (void*)gpuStreamPerThread) ==
                OKTOPK_ERROR_INVALID_ARGUMENT &&
            agreed_message(0, "PerThread"),
        "the per-thread default stream is refused on every rank");
  free(host_grad);
  gpu_ok(gpuFree(out), "gpuFree out");
  gpu_ok(gpuFree(grad), "gpuFree grad");
  oktopk_destroy(handle);
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (oktopk_initialize(&argc, &argv) != OKTOPK_SUCCESS) {
    fprintf(stderr, "rank %d: FAILED: oktopk_initialize: %s\n", rank, oktopk_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int device = -1;
  check(oktopk_get_device(&device) == OKTOPK_SUCCESS && device >= 0, "get_device");
  gpu_ok(gpuSetDevice(device < 0 ? 0 : device), "set the handles' device");
  gpuStream_t stream;
  gpu_ok(gpuStreamCreateWithFlags(&stream, gpuStreamNonBlocking), "create a stream");

  const int64_t n = (int64_t)1 << 20;
  const char* methods[] = {"dense", "topka", "topkdsa", "gtopk", "gaussiank", "oktopk", "s2"};
  for (size_t m = 0; m < sizeof methods / sizeof methods[0]; ++m) {
    test_method(methods[m], n, stream, 0);
    test_method(methods[m], n, stream, 1);
  }
  test_refusals(n, stream);

  gpu_ok(gpuStreamDestroy(stream), "destroy the stream");
  oktopk_finalize();
  if (rank == 0) printf("%d passed, %d failed\n", passed, failed);
  MPI_Finalize();
  return failed == 0 ? 0 : 1;
}
