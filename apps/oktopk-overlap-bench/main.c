/* SPDX-License-Identifier: BSD-3-Clause */
/* oktopk-overlap-bench: how much of the reduce time asynchronous calls hide behind compute.
 * Each step imitates backprop over B buckets: a compute phase per bucket, after which that
 * bucket's gradient is ready. "blocking" reduces each bucket right after its compute phase;
 * "async" launches it (oktopk_reduce_async) and goes on with the next bucket's compute, waiting
 * for all at the end of the step. Both run in one process, alternating step by step, on the
 * same data, and must give the same bits. Written in C, over the C interface. */
#include <oktopk/c_api.h>

#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank = 0;

static void usage(FILE* to) {
  fprintf(to,
          "Usage: mpirun -np P oktopk-overlap-bench [options]\n"
          "  --algo NAME        method (dense topka topkdsa gtopk gaussiank oktopk s2; oktopk)\n"
          "  --n N              floats per bucket (1048576)\n"
          "  --buckets B        buckets per step (4)\n"
          "  --density D        density (0.01)\n"
          "  --compute-ms T     compute per bucket, in milliseconds (20)\n"
          "  --steps S          measured steps per mode (10), after 2 warm-up steps\n"
          "  --help             this text\n"
          "Prints, on rank 0, the median step time (max over ranks) of each mode, the reduce\n"
          "time alone, and the fraction of it that async hid behind compute.\n");
}

static void fail(const char* message) {
  if (rank == 0) fprintf(stderr, "oktopk-overlap-bench: %s\n", message);
  MPI_Finalize();
  exit(1);
}

static long parse_long(const char* flag, const char* text, long low, long high) {
  char* end = NULL;
  errno = 0;
  const long v = strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || errno == ERANGE || v < low || v > high) {
    char message[256];
    snprintf(message, sizeof message, "%s must be an integer in [%ld, %ld], got '%s'", flag, low,
             high, text);
    fail(message);
  }
  return v;
}

static double parse_double(const char* flag, const char* text, double low, double high) {
  char* end = NULL;
  errno = 0;
  const double v = strtod(text, &end);
  if (*text == '\0' || *end != '\0' || errno == ERANGE || !(v >= low && v <= high)) {
    char message[256];
    snprintf(message, sizeof message, "%s must be a number in [%g, %g], got '%s'", flag, low, high,
             text);
    fail(message);
  }
  return v;
}

/* Work that keeps one core busy for about `ms` milliseconds, and that the compiler cannot drop:
 * a stand-in for a layer's backward pass. */
static double compute(double ms, double seed) {
  const double start = MPI_Wtime();
  double x = seed;
  while ((MPI_Wtime() - start) * 1e3 < ms) {
    for (int i = 0; i < 1000; ++i) x = x * 0.999999 + 1e-7 * sin(x);
  }
  return x;
}

static int compare_doubles(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median(double* v, int count) {
  qsort(v, (size_t)count, sizeof *v, compare_doubles);
  return count % 2 ? v[count / 2] : 0.5 * (v[count / 2 - 1] + v[count / 2]);
}

static void fill(float* g, int64_t n, int r, int bucket, int step) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t h = (uint32_t)i * 2654435761u ^ (uint32_t)(r * 40503 + bucket * 977 + step);
    g[i] = (float)(h % 20001u) / 10000.0f - 1.0f;
  }
}

static void require(int code, const char* what) {
  if (code == OKTOPK_SUCCESS) return;
  char message[1024];
  snprintf(message, sizeof message, "%s: %s", what, oktopk_last_error());
  fprintf(stderr, "oktopk-overlap-bench: rank %d: %s\n", rank, message);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

int main(int argc, char** argv) {
  int provided = MPI_THREAD_SINGLE, size = 1;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  const char* algo = "oktopk";
  long n = 1048576, buckets = 4, steps = 10;
  double density = 0.01, compute_ms = 20.0;
  for (int i = 1; i < argc; ++i) {
    const char* flag = argv[i];
    if (strcmp(flag, "--help") == 0) {
      if (rank == 0) usage(stdout);
      MPI_Finalize();
      return 0;
    }
    if (strncmp(flag, "--kokkos", 8) == 0) continue;
    if (i + 1 >= argc) {
      char message[256];
      snprintf(message, sizeof message, "%s needs a value (see --help)", flag);
      fail(message);
    }
    const char* value = argv[++i];
    if (strcmp(flag, "--algo") == 0) {
      algo = value;
    } else if (strcmp(flag, "--n") == 0) {
      n = parse_long(flag, value, 1, 1L << 30);
    } else if (strcmp(flag, "--buckets") == 0) {
      buckets = parse_long(flag, value, 1, 64);
    } else if (strcmp(flag, "--steps") == 0) {
      steps = parse_long(flag, value, 1, 100000);
    } else if (strcmp(flag, "--density") == 0) {
      density = parse_double(flag, value, 0.0, 1.0);
    } else if (strcmp(flag, "--compute-ms") == 0) {
      compute_ms = parse_double(flag, value, 0.0, 1e5);
    } else {
      char message[256];
      snprintf(message, sizeof message, "unknown option '%s' (see --help)", flag);
      fail(message);
    }
  }
  if (provided != MPI_THREAD_MULTIPLE)
    fail("MPI does not provide MPI_THREAD_MULTIPLE: asynchronous calls would not overlap");
  require(oktopk_initialize(&argc, &argv), "oktopk_initialize");

  char options[64];
  snprintf(options, sizeof options, "density=%.17g", density);
  /* Twin handles per bucket, one per mode, so that both see the same history. */
  oktopk_handle** blocking = calloc((size_t)buckets, sizeof *blocking);
  oktopk_handle** async = calloc((size_t)buckets, sizeof *async);
  float** grad = calloc((size_t)buckets, sizeof *grad);
  float** out_blocking = calloc((size_t)buckets, sizeof *out_blocking);
  float** out_async = calloc((size_t)buckets, sizeof *out_async);
  oktopk_request** requests = calloc((size_t)buckets, sizeof *requests);
  for (long b = 0; b < buckets; ++b) {
    require(oktopk_create(MPI_COMM_WORLD, algo, n, options, &blocking[b]), "oktopk_create");
    require(oktopk_create(MPI_COMM_WORLD, algo, n, options, &async[b]), "oktopk_create");
    grad[b] = malloc((size_t)n * sizeof(float));
    out_blocking[b] = malloc((size_t)n * sizeof(float));
    out_async[b] = malloc((size_t)n * sizeof(float));
  }

  const int warmup = 2;
  double* t_blocking = calloc((size_t)steps, sizeof(double));
  double* t_async = calloc((size_t)steps, sizeof(double));
  double* t_reduce = calloc((size_t)steps, sizeof(double));
  double sink = 0.0;
  int identical = 1;
  for (long step = 0; step < warmup + steps; ++step) {
    for (long b = 0; b < buckets; ++b) fill(grad[b], n, rank, (int)b, (int)step);

    /* blocking: compute bucket b, then reduce it */
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime(), reduce_seconds = 0.0;
    for (long b = 0; b < buckets; ++b) {
      sink += compute(compute_ms, (double)b);
      const double r0 = MPI_Wtime();
      require(oktopk_reduce(blocking[b], grad[b], out_blocking[b]), "oktopk_reduce");
      reduce_seconds += MPI_Wtime() - r0;
    }
    double local[2] = {MPI_Wtime() - start, reduce_seconds}, global[2];
    MPI_Allreduce(local, global, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (step >= warmup) {
      t_blocking[step - warmup] = global[0];
      t_reduce[step - warmup] = global[1];
    }

    /* async: compute bucket b, launch it, go on */
    MPI_Barrier(MPI_COMM_WORLD);
    start = MPI_Wtime();
    for (long b = 0; b < buckets; ++b) {
      sink += compute(compute_ms, (double)b);
      require(oktopk_reduce_async(async[b], grad[b], out_async[b], &requests[b]),
              "oktopk_reduce_async");
    }
    for (long b = 0; b < buckets; ++b) {
      require(oktopk_wait(requests[b]), "oktopk_wait");
      require(oktopk_request_free(requests[b]), "oktopk_request_free");
    }
    local[0] = MPI_Wtime() - start;
    MPI_Allreduce(local, global, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (step >= warmup) t_async[step - warmup] = global[0];
    for (long b = 0; b < buckets; ++b)
      identical &= memcmp(out_blocking[b], out_async[b], (size_t)n * sizeof(float)) == 0;
    if (rank == 0 && step >= warmup && (step - warmup + 1) % 5 == 0)
      fprintf(stderr, "oktopk-overlap-bench: %ld of %ld steps\n", step - warmup + 1, steps);
  }
  int all_identical = 0;
  MPI_Allreduce(&identical, &all_identical, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);

  const double compute_s = (double)buckets * compute_ms * 1e-3;
  const double blocking_s = median(t_blocking, (int)steps);
  const double async_s = median(t_async, (int)steps);
  const double reduce_s = median(t_reduce, (int)steps);
  /* The share of the reduce time that no longer adds to the step. */
  const double hidden = reduce_s > 0 ? (blocking_s - async_s) / reduce_s : 0.0;
  if (rank == 0) {
    printf(
        "algo=%s P=%d n_per_bucket=%ld buckets=%ld density=%g compute_ms_per_bucket=%g "
        "steps=%ld\n",
        algo, size, n, buckets, density, compute_ms, steps);
    printf(
        "compute_s=%.4f reduce_s=%.4f blocking_step_s=%.4f async_step_s=%.4f "
        "speedup=%.3f hidden_fraction=%.3f identical=%s\n",
        compute_s, reduce_s, blocking_s, async_s, async_s > 0 ? blocking_s / async_s : 0.0, hidden,
        all_identical ? "yes" : "no");
  }
  for (long b = 0; b < buckets; ++b) {
    require(oktopk_destroy(blocking[b]), "oktopk_destroy");
    require(oktopk_destroy(async[b]), "oktopk_destroy");
    free(grad[b]);
    free(out_blocking[b]);
    free(out_async[b]);
  }
  free(blocking);
  free(async);
  free(grad);
  free(out_blocking);
  free(out_async);
  free(requests);
  free(t_blocking);
  free(t_async);
  free(t_reduce);
  require(oktopk_finalize(), "oktopk_finalize");
  MPI_Finalize();
  if (sink == 12345.678) printf("\n"); /* keeps the compute loop alive */
  return all_identical ? 0 : 1;
}
