/* SPDX-License-Identifier: BSD-3-Clause */
/* The C interface: a handle made once, a reduce per step on host arrays, the stats of the last
 * call, and an error code checked on every call (the message from oktopk_last_error).
 *   mpirun -np 2 ./c_reduce */
#include <oktopk/c_api.h>

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Ends the job on a failed call: the same code comes back on every rank for agreed errors. */
static void check(int code, const char* what) {
  if (code != OKTOPK_SUCCESS) {
    fprintf(stderr, "c_reduce: %s failed (%d): %s\n", what, code, oktopk_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  check(oktopk_initialize(&argc, &argv), "oktopk_initialize");
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  const int64_t n = 50000;
  float* grad = malloc((size_t)n * sizeof *grad);
  float* out = malloc((size_t)n * sizeof *out);
  if (grad == NULL || out == NULL) MPI_Abort(MPI_COMM_WORLD, 1);

  oktopk_handle* handle = NULL;
  check(oktopk_create(MPI_COMM_WORLD, "oktopk", n, "density=0.01 warmup_iterations=2", &handle),
        "oktopk_create");
  for (int step = 0; step < 10; ++step) {
    for (int64_t i = 0; i < n; ++i) {
      grad[i] = (float)((i * 31 + rank * 7 + step) % 97) / 97.0f - 0.5f;
    }
    check(oktopk_reduce(handle, grad, out), "oktopk_reduce");
  }
  oktopk_stats stats;
  check(oktopk_get_stats(handle, &stats), "oktopk_get_stats");
  int64_t nonzeros = 0;
  for (int64_t i = 0; i < n; ++i) nonzeros += out[i] != 0.0f;
  if (rank == 0) {
    printf("c_reduce: %d ranks, oktopk %s: call %lld kept %lld entries (k = %lld), %lld non-zero\n",
           size, oktopk_version(), (long long)stats.iteration, (long long)stats.global_selected,
           (long long)stats.k, (long long)nonzeros);
  }
  check(oktopk_destroy(handle), "oktopk_destroy");
  free(grad);
  free(out);
  check(oktopk_finalize(), "oktopk_finalize");
  MPI_Finalize();
  return 0;
}
