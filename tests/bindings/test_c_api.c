/* SPDX-License-Identifier: BSD-3-Clause */
/* The C interface as a C program uses it, at any number of ranks: every method's result is the
 * same bits on every rank, in place equals out of place, dense is the mean, errors are codes
 * (the same on every rank for NaN, mismatched n, a bad method or option), stats and state
 * round trips, sparse results are the dense ones' entries; the same for float64, bfloat16 and
 * float16 gradients through the typed functions, and arrays of the wrong type refused. Prints "N
 * passed, N failed" on rank 0; exits non-zero on any failure. */
#include "rank_checks.h"

#include <oktopk/c_api.h>

#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* In the checkpoint files' names: ctest runs the two modes at once in the same folder. */
static const char* mode = "threads";

/* Deterministic gradient of rank r: a few large entries over small noise, distinct per rank. */
static float gradient_value(int r, int64_t i, int call) {
  const uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(r * 40503u + call * 977u);
  const float small = (float)(h % 1000u) / 1000.0f - 0.5f;
  return (h % 37u == 0u) ? 8.0f * small + (small < 0 ? -4.0f : 4.0f) : small;
}

static int phases_add_up(const oktopk_handle* h, const oktopk_stats* stats);

static void fill(float* g, int64_t n, int r, int call) {
  for (int64_t i = 0; i < n; ++i) g[i] = gradient_value(r, i, call);
}

/* The same bits on every rank. */
static int identical_on_all_ranks(const float* v, int64_t n) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    memcpy(&bits, &v[i], sizeof bits);
    h = (h ^ bits) * 1099511628211ull;
  }
  uint64_t lo = 0, hi = 0;
  MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

/* Every rank's message names `rank` and holds `reason`, after `where`. */
static int agreed_message(const char* where, int bad_rank, const char* reason) {
  char head[160];
  snprintf(head, sizeof head, "%s: rank %d: ", where, bad_rank);
  const char* message = oktopk_last_error();
  const char* at = strstr(message, head);
  return at != NULL && strstr(at + strlen(head), reason) != NULL;
}

static int64_t nonzeros(const float* v, int64_t n) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += v[i] != 0.0f;
  return count;
}

static void test_method(const char* method, int64_t n) {
  char what[256];
  oktopk_handle* a = NULL;
  oktopk_handle* b = NULL;
  const char* options = "density=0.02, threshold_period=4 repartition_period=8";
  snprintf(what, sizeof what, "%s: create", method);
  check(oktopk_create(MPI_COMM_WORLD, method, n, options, &a) == OKTOPK_SUCCESS && a != NULL, what);
  check(oktopk_create(MPI_COMM_WORLD, method, n, options, &b) == OKTOPK_SUCCESS && b != NULL, what);
  if (a == NULL || b == NULL) return;

  const char* name = NULL;
  int64_t n_seen = -1, k = -1;
  snprintf(what, sizeof what, "%s: describe", method);
  check(oktopk_describe(a, &name, &n_seen, &k) == OKTOPK_SUCCESS && strcmp(name, method) == 0 &&
            n_seen == n && k == (int64_t)floor(0.02 * (double)n),
        what);

  float* grad = malloc((size_t)n * sizeof(float));
  float* out = malloc((size_t)n * sizeof(float));
  float* inplace = malloc((size_t)n * sizeof(float));
  int same = 1, identical = 1, mean_ok = 1, sparse_ok = 1, codes_ok = 1;
  const int calls = 6;
  int residual_ok = 1;
  for (int call = 0; call < calls; ++call) {
    fill(grad, n, rank, call);
    memcpy(inplace, grad, (size_t)n * sizeof(float));
    codes_ok &= oktopk_reduce(a, grad, out) == OKTOPK_SUCCESS;
    codes_ok &= oktopk_reduce(b, inplace, inplace) == OKTOPK_SUCCESS;
    if (call == 0) {
      /* After the first call the residual is the gradient where this rank's entry was held
       * back and zero where it was sent (dense sends everything). */
      float* residual = malloc((size_t)n * sizeof(float));
      residual_ok &= oktopk_get_residual(a, residual, n) == OKTOPK_SUCCESS;
      int64_t held = 0;
      for (int64_t i = 0; i < n; ++i) {
        residual_ok &= residual[i] == 0.0f || residual[i] == grad[i];
        held += residual[i] != 0.0f;
      }
      const int holds_nothing = strcmp(method, "dense") == 0 || strcmp(method, "s2") == 0;
      residual_ok &= holds_nothing ? held == 0 : held > 0 && held < n;
      free(residual);
    }
    same &= memcmp(out, inplace, (size_t)n * sizeof(float)) == 0;
    identical &= identical_on_all_ranks(out, n);
    if (strcmp(method, "dense") == 0) {
      for (int64_t i = 0; i < n; ++i) {
        double mean = 0.0;
        for (int r = 0; r < size; ++r) mean += gradient_value(r, i, call);
        mean /= size;
        mean_ok &= fabs(out[i] - mean) <= 1e-5 * (1.0 + fabs(mean));
      }
    } else if (strcmp(method, "s2") != 0) {
      /* Not empty and far from dense (each method's own bound is tested in C++). */
      sparse_ok &= nonzeros(out, n) <= 2 * (int64_t)size * k;
      sparse_ok &= nonzeros(out, n) > 0;
    }
  }
  snprintf(what, sizeof what, "%s: every reduce returns OKTOPK_SUCCESS", method);
  check(codes_ok, what);
  snprintf(what, sizeof what, "%s: the residual after the first call is what it held back", method);
  check(residual_ok, what);
  snprintf(what, sizeof what, "%s: oktopk_get_residual refuses another n and a NULL array", method);
  check(oktopk_get_residual(a, grad, n - 1) == OKTOPK_ERROR_INVALID_ARGUMENT &&
            strncmp(oktopk_last_error(), "oktopk_get_residual: n is ", 26) == 0 &&
            oktopk_get_residual(a, NULL, n) == OKTOPK_ERROR_INVALID_ARGUMENT,
        what);
  snprintf(what, sizeof what, "%s: in place equals out of place", method);
  check(same, what);
  snprintf(what, sizeof what, "%s: the same bits on every rank", method);
  check(identical, what);
  snprintf(what, sizeof what, "%s: dense is the mean, sparse keeps at most 2 P k entries", method);
  check(mean_ok && sparse_ok, what);

  oktopk_stats stats;
  snprintf(what, sizeof what, "%s: stats of the last call", method);
  check(oktopk_get_stats(a, &stats) == OKTOPK_SUCCESS && stats.iteration == calls && stats.k == k &&
            (size == 1 || stats.bytes_sent > 0) && (size == 1 || stats.messages_sent > 0) &&
            stats.seconds >= 0.0,
        what);
  snprintf(what, sizeof what, "%s: the phases add up to the call's stats", method);
  check(phases_add_up(a, &stats), what);

  /* State: save, reduce once, restore, reduce the same gradient again: the same output. */
  char path[128];
  snprintf(path, sizeof path, "c_api_state_%s_%s_np%d_rank%d.okst", mode, method, size, rank);
  float* first = malloc((size_t)n * sizeof(float));
  fill(grad, n, rank, calls);
  snprintf(what, sizeof what, "%s: save, reduce, restore, reduce gives the same output", method);
  int state_ok = oktopk_save_state(a, path) == OKTOPK_SUCCESS;
  state_ok &= oktopk_reduce(a, grad, first) == OKTOPK_SUCCESS;
  state_ok &= oktopk_restore_state(a, path) == OKTOPK_SUCCESS;
  state_ok &= oktopk_reduce(a, grad, out) == OKTOPK_SUCCESS;
  state_ok &= memcmp(first, out, (size_t)n * sizeof(float)) == 0;
  check(state_ok, what);
  remove(path);

  /* The same through memory, restored into the other handle (same history, same options). */
  size_t bytes = 0;
  snprintf(what, sizeof what, "%s: state through memory moves to another handle", method);
  state_ok = oktopk_save_state_to_buffer(a, NULL, 0, &bytes) == OKTOPK_SUCCESS && bytes > 0;
  void* buffer = malloc(bytes);
  size_t written = 0;
  state_ok &=
      oktopk_save_state_to_buffer(a, buffer, bytes, &written) == OKTOPK_SUCCESS && written == bytes;
  state_ok &=
      oktopk_save_state_to_buffer(a, buffer, bytes - 1, &written) == OKTOPK_ERROR_INVALID_ARGUMENT;
  state_ok &= oktopk_restore_state_from_buffer(b, buffer, bytes) == OKTOPK_SUCCESS;
  fill(grad, n, rank, calls + 1);
  state_ok &= oktopk_reduce(a, grad, first) == OKTOPK_SUCCESS;
  state_ok &= oktopk_reduce(b, grad, out) == OKTOPK_SUCCESS;
  state_ok &= memcmp(first, out, (size_t)n * sizeof(float)) == 0;
  check(state_ok, what);

  /* Sparse results from the handle with the same history: the dense output's entries. */
  snprintf(what, sizeof what, "%s: oktopk_reduce_sparse returns oktopk_reduce's entries", method);
  int sparse_same = 1;
  float* scattered = malloc((size_t)n * sizeof(float));
  for (int call = 2; call < 5; ++call) {
    fill(grad, n, rank, calls + call);
    const int32_t* indices = NULL;
    const float* values = NULL;
    int64_t count = -1;
    sparse_same &= oktopk_reduce(a, grad, out) == OKTOPK_SUCCESS;
    sparse_same &= oktopk_reduce_sparse(b, grad, &indices, &values, &count) == OKTOPK_SUCCESS;
    sparse_same &= count >= 0 && count <= n && (count == 0 || (indices != NULL && values != NULL));
    if (!sparse_same) break;
    memset(scattered, 0, (size_t)n * sizeof(float));
    for (int64_t e = 0; e < count; ++e) {
      sparse_same &= indices[e] >= 0 && indices[e] < n && (e == 0 || indices[e] > indices[e - 1]);
      if (indices[e] >= 0 && indices[e] < n) scattered[indices[e]] = values[e];
    }
    for (int64_t i = 0; i < n; ++i) sparse_same &= scattered[i] == out[i];
    sparse_same &= identical_on_all_ranks(scattered, n);
  }
  check(sparse_same, what);
  free(scattered);

  /* A damaged checkpoint on rank 0 only: every rank gets the same error code. */
  if (rank == 0) ((unsigned char*)buffer)[bytes / 2] ^= 0x5a;
  const int code = oktopk_restore_state_from_buffer(b, buffer, bytes);
  snprintf(what, sizeof what, "%s: a damaged checkpoint is an error on every rank", method);
  check(code == OKTOPK_ERROR_RUNTIME || code == OKTOPK_ERROR_INVALID_ARGUMENT, what);

  free(buffer);
  free(first);
  free(grad);
  free(out);
  free(inplace);
  check(oktopk_destroy(a) == OKTOPK_SUCCESS && oktopk_destroy(b) == OKTOPK_SUCCESS, "destroy");
}

static void test_errors(void) {
  const int64_t n = 500;
  oktopk_handle* h = NULL;
  float* grad = calloc((size_t)n, sizeof(float));
  float* out = calloc((size_t)n, sizeof(float));

  /* NaN on the last rank only: the same error on every rank, and the handle still works. */
  check(oktopk_create(MPI_COMM_WORLD, "oktopk", n, "density=0.05", &h) == OKTOPK_SUCCESS,
        "create for the error tests");
  fill(grad, n, rank, 0);
  if (rank == size - 1) grad[7] = NAN;
  int code = oktopk_reduce(h, grad, out);
  check(code == OKTOPK_ERROR_INVALID_ARGUMENT && strstr(oktopk_last_error(), "NaN or Inf"),
        "NaN on one rank: OKTOPK_ERROR_INVALID_ARGUMENT on every rank");
  grad[7] = 1.0f;
  check(oktopk_reduce(h, grad, out) == OKTOPK_SUCCESS, "the handle works after a NaN error");

  /* A NULL array on rank 0 only is an empty one: the length error, on every rank. */
  code = oktopk_reduce(h, rank == 0 ? NULL : grad, out);
  check(code == OKTOPK_ERROR_INVALID_ARGUMENT && strstr(oktopk_last_error(), "length"),
        "NULL gradient on one rank: OKTOPK_ERROR_INVALID_ARGUMENT on every rank");
  /* No count on the last rank only: it still joins, and every rank fails. */
  const int32_t* indices = NULL;
  const float* values = NULL;
  int64_t count = 0;
  code = oktopk_reduce_sparse(h, grad, &indices, &values, rank == size - 1 ? NULL : &count);
  check(code == OKTOPK_ERROR_INVALID_ARGUMENT && indices == NULL && values == NULL &&
            (rank == size - 1 ? strstr(oktopk_last_error(), "must not be NULL") != NULL
                              : strstr(oktopk_last_error(), "reduce_sparse") != NULL),
        "oktopk_reduce_sparse without count on one rank: OKTOPK_ERROR_INVALID_ARGUMENT on every "
        "rank");
  check(oktopk_reduce_sparse(h, grad, &indices, &values, &count) == OKTOPK_SUCCESS && count > 0,
        "the handle works after a NULL count");
  check(oktopk_reduce(NULL, grad, out) == OKTOPK_ERROR_INVALID_ARGUMENT &&
            strstr(oktopk_last_error(), "oktopk_reduce: handle is NULL") != NULL,
        "NULL handle");
  check(oktopk_destroy(h) == OKTOPK_SUCCESS, "destroy");

  /* Mismatched n: every rank fails, and no handle is returned. */
  h = (oktopk_handle*)1;
  code = oktopk_create(MPI_COMM_WORLD, "topka", size > 1 ? n + rank : n, NULL, &h);
  check(size == 1 || (code == OKTOPK_ERROR_INVALID_ARGUMENT && h == NULL &&
                      strstr(oktopk_last_error(), "oktopk::make_sparse_allreduce") != NULL),
        "mismatched n: OKTOPK_ERROR_INVALID_ARGUMENT on every rank");
  if (code == OKTOPK_SUCCESS) oktopk_destroy(h);

  /* An unknown method or option on the last rank only: every rank fails, naming that rank. */
  code = oktopk_create(MPI_COMM_WORLD, rank == size - 1 ? "nosuch" : "topka", n, NULL, &h);
  char expected[64];
  snprintf(expected, sizeof expected, "oktopk_create: rank %d", size - 1);
  check(code == OKTOPK_ERROR_INVALID_ARGUMENT && h == NULL &&
            strstr(oktopk_last_error(), expected) != NULL,
        "unknown method on one rank: OKTOPK_ERROR_INVALID_ARGUMENT on every rank");
  code = oktopk_create(MPI_COMM_WORLD, "topka", n, rank == size - 1 ? "densty=0.1" : "", &h);
  check(code == OKTOPK_ERROR_INVALID_ARGUMENT && h == NULL &&
            (rank != size - 1 || strstr(oktopk_last_error(), "unknown option 'densty'")),
        "unknown option on one rank: OKTOPK_ERROR_INVALID_ARGUMENT on every rank");
  code = oktopk_create(MPI_COMM_WORLD, "topka", n, "density=2", &h);
  check(code == OKTOPK_ERROR_INVALID_ARGUMENT && strstr(oktopk_last_error(), "density"),
        "density out of range");
  code = oktopk_create(MPI_COMM_WORLD, "topka", n, "density", &h);
  check(code == OKTOPK_ERROR_INVALID_ARGUMENT && strstr(oktopk_last_error(), "key=value"),
        "an option without '='");
  code = oktopk_create(MPI_COMM_WORLD, "topka", -1, NULL, &h);
  check(code == OKTOPK_ERROR_INVALID_ARGUMENT, "negative n");

  /* A missing checkpoint file on the last rank only: the same error on every rank. */
  check(oktopk_create(MPI_COMM_WORLD, "gtopk", n, NULL, &h) == OKTOPK_SUCCESS, "create gtopk");
  char path[128];
  snprintf(path, sizeof path, "c_api_missing_%s_np%d_rank%d.okst", mode, size, rank);
  if (rank != size - 1) oktopk_save_state(h, path);
  code = oktopk_restore_state(h, path);
  check(code != OKTOPK_SUCCESS, "missing checkpoint on one rank: an error on every rank");
  remove(path);
  check(oktopk_reduce(h, grad, out) == OKTOPK_SUCCESS, "the handle works after a bad restore");
  check(oktopk_save_state(h, "/nonexistent-folder/state.okst") == OKTOPK_ERROR_RUNTIME,
        "unwritable checkpoint path");

  /* Kokkos stays up while a handle lives. */
  check(oktopk_finalize() == OKTOPK_ERROR_RUNTIME &&
            strstr(oktopk_last_error(), "not destroyed") != NULL,
        "finalize refuses while a handle lives");
  check(oktopk_destroy(h) == OKTOPK_SUCCESS && oktopk_destroy(NULL) == OKTOPK_SUCCESS,
        "destroy, and destroy(NULL)");
  free(grad);
  free(out);
}

/* A fused buffer of embedding-like rows then dense entries: rank r's gradient touches a few
 * rows (distinct per rank and call) and every dense entry. */
enum { layout_rows = 30, layout_width = 40, layout_dense = 801 };
static const int64_t layout_n = layout_rows * layout_width + layout_dense;

static void fill_fused(float* g, int r, int call) {
  fill(g, layout_n, r, call);
  for (int64_t i = 0; i < layout_rows * layout_width; ++i) {
    const int64_t row = i / layout_width;
    if ((row * 7 + r * 3 + call) % 5 != 0) g[i] = 0.0f;
  }
}

/* oktopk_create_with_layout for the fused buffer: segment 0 rows, segment 1 dense. */
static int create_fused(const char* method, const char* options, oktopk_handle** h) {
  const int64_t lengths[2] = {layout_rows * layout_width, layout_dense};
  const int kinds[2] = {OKTOPK_SEGMENT_ROWS, OKTOPK_SEGMENT_DENSE};
  const int64_t widths[2] = {layout_width, 0};
  const char* const names[2] = {"embedding", NULL};
  return oktopk_create_with_layout(MPI_COMM_WORLD, method, layout_n, options, 2, lengths, kinds,
                                   widths, names, h);
}

/* Every method with a layout: s2 averages the dense segment exactly; the others give the bits
 * they give without one; per-segment counts add up to the output's non-zeros. */
static void test_layout_methods(void) {
  const char* methods[] = {"dense", "topka", "topkdsa", "gtopk", "gaussiank", "oktopk", "s2"};
  const char* options = "density=0.02 threshold_period=4";
  const int64_t n = layout_n;
  const int64_t dense_begin = layout_rows * layout_width;
  float* grad = malloc((size_t)n * sizeof(float));
  float* with = malloc((size_t)n * sizeof(float));
  float* without = malloc((size_t)n * sizeof(float));
  char what[256];
  for (size_t m = 0; m < sizeof methods / sizeof methods[0]; ++m) {
    const char* method = methods[m];
    const int s2 = strcmp(method, "s2") == 0;
    oktopk_handle* fused = NULL;
    oktopk_handle* plain = NULL;
    snprintf(what, sizeof what, "%s: create with a layout", method);
    check(create_fused(method, options, &fused) == OKTOPK_SUCCESS && fused != NULL, what);
    check(oktopk_create(MPI_COMM_WORLD, method, n, options, &plain) == OKTOPK_SUCCESS, what);
    if (fused == NULL || plain == NULL) continue;

    int64_t count = -1, plain_count = -1;
    oktopk_segment_stats seg[2];
    snprintf(what, sizeof what, "%s: the layout as given, counts 0 before the first call", method);
    int ok = oktopk_get_num_segments(fused, &count) == OKTOPK_SUCCESS && count == 2;
    ok &= oktopk_get_num_segments(plain, &plain_count) == OKTOPK_SUCCESS && plain_count == 0;
    ok &= oktopk_get_segment_stats(fused, 0, &seg[0]) == OKTOPK_SUCCESS;
    ok &= oktopk_get_segment_stats(fused, 1, &seg[1]) == OKTOPK_SUCCESS;
    ok &= seg[0].offset == 0 && seg[0].length == dense_begin && seg[0].row_width == layout_width &&
          seg[0].kind == OKTOPK_SEGMENT_ROWS && strcmp(seg[0].name, "embedding") == 0 &&
          seg[0].nonzeros == 0;
    ok &= seg[1].offset == dense_begin && seg[1].length == layout_dense && seg[1].row_width == 1 &&
          seg[1].kind == OKTOPK_SEGMENT_DENSE && strcmp(seg[1].name, "") == 0 &&
          seg[1].nonzeros == 0;
    check(ok, what);

    int codes_ok = 1, same = 1, dense_exact = 1, counts_ok = 1, identical = 1;
    for (int call = 0; call < 5; ++call) {
      fill_fused(grad, rank, call);
      codes_ok &= oktopk_reduce(fused, grad, with) == OKTOPK_SUCCESS;
      codes_ok &= oktopk_reduce(plain, grad, without) == OKTOPK_SUCCESS;
      identical &= identical_on_all_ranks(with, n);
      if (s2) {
        for (int64_t i = dense_begin; i < n; ++i) {
          double mean = 0.0;
          for (int r = 0; r < size; ++r) mean += gradient_value(r, i, call);
          mean /= size;
          dense_exact &= fabs(with[i] - mean) <= 1e-5 * (1.0 + fabs(mean));
        }
      } else {
        same &= memcmp(with, without, (size_t)n * sizeof(float)) == 0;
      }
      counts_ok &= oktopk_get_segment_stats(fused, 0, &seg[0]) == OKTOPK_SUCCESS &&
                   oktopk_get_segment_stats(fused, 1, &seg[1]) == OKTOPK_SUCCESS &&
                   seg[0].nonzeros == nonzeros(with, dense_begin) &&
                   seg[1].nonzeros == nonzeros(with + dense_begin, layout_dense) &&
                   seg[0].nonzeros + seg[1].nonzeros == nonzeros(with, n);
    }
    snprintf(what, sizeof what, "%s with a layout: every reduce returns OKTOPK_SUCCESS", method);
    check(codes_ok, what);
    snprintf(what, sizeof what, "%s with a layout: the same bits on every rank", method);
    check(identical, what);
    snprintf(what, sizeof what,
             s2 ? "%s with a layout: the dense segment is the exact mean"
                : "%s with a layout: the same output as without one",
             method);
    check(same && dense_exact, what);
    snprintf(what, sizeof what, "%s with a layout: per-segment non-zeros sum to the output's",
             method);
    check(counts_ok, what);
    oktopk_destroy(fused);
    oktopk_destroy(plain);
  }
  free(grad);
  free(with);
  free(without);
}

/* A bad layout on the last rank only fails on every rank with the function's name and that
 * rank; layouts that differ across ranks fail on every rank too. */
static void test_layout_errors(void) {
  const int last = rank == size - 1;
  const int64_t n = 100;
  int64_t lengths[2] = {60, 40};
  int kinds[2] = {OKTOPK_SEGMENT_ROWS, OKTOPK_SEGMENT_DENSE};
  int64_t widths[2] = {10, 1};
  char expected[96];
  snprintf(expected, sizeof expected, "oktopk_create_with_layout: rank %d: ", size - 1);
  struct {
    const char* what;
    const char* message; /* expected after "oktopk_create_with_layout: rank R: " */
  } cases[] = {
      {"negative length", "segment 1: length must be >= 0, got -40"},
      {"unknown kind",
       "segment 0: kind must be OKTOPK_SEGMENT_DENSE (0) or OKTOPK_SEGMENT_ROWS "
       "(1), got 7"},
      {"row width 0", "segment 0: row width must be >= 1, got 0"},
      {"NULL lengths", "lengths is NULL with num_segments = 2"},
      {"NULL kinds", "kinds is NULL with num_segments = 2"},
      {"segments short of n", "the segments cover [0, 99), not [0, n = 100)"},
      {"segments past n", "segment 1: it ends at 60 + 41, past n = 100"},
      {"negative num_segments", "num_segments must be >= 0, got -1"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
    int64_t my_lengths[2] = {lengths[0], lengths[1]};
    int my_kinds[2] = {kinds[0], kinds[1]};
    int64_t my_widths[2] = {widths[0], widths[1]};
    const int64_t* lengths_arg = my_lengths;
    const int* kinds_arg = my_kinds;
    int64_t count = 2;
    if (last) {
      switch (c) {
        case 0:
          my_lengths[1] = -40;
          break;
        case 1:
          my_kinds[0] = 7;
          break;
        case 2:
          my_widths[0] = 0;
          break;
        case 3:
          lengths_arg = NULL;
          break;
        case 4:
          kinds_arg = NULL;
          break;
        case 5:
          my_lengths[1] = 39;
          break;
        case 6:
          my_lengths[1] = 41;
          break;
        default:
          count = -1;
          break;
      }
    }
    oktopk_handle* h = (oktopk_handle*)1;
    const int code = oktopk_create_with_layout(MPI_COMM_WORLD, "s2", n, NULL, count, lengths_arg,
                                               kinds_arg, my_widths, NULL, &h);
    const char* error = oktopk_last_error();
    char what[160];
    snprintf(what, sizeof what, "layout with %s on the last rank: the error on every rank",
             cases[c].what);
    check(code == OKTOPK_ERROR_INVALID_ARGUMENT && h == NULL &&
              strncmp(error, expected, strlen(expected)) == 0 &&
              strcmp(error + strlen(expected), cases[c].message) == 0,
          what);
    if (code == OKTOPK_SUCCESS) oktopk_destroy(h);
  }

  /* Valid everywhere but different names on the ranks: the factory's agreement check. */
  const char* const names[2] = {rank == 0 ? "first" : "other", "rest"};
  oktopk_handle* h = (oktopk_handle*)1;
  const int code = oktopk_create_with_layout(MPI_COMM_WORLD, "topka", n, NULL, 2, lengths, kinds,
                                             widths, names, &h);
  check(size == 1 ? code == OKTOPK_SUCCESS
                  : code == OKTOPK_ERROR_INVALID_ARGUMENT && h == NULL &&
                        strstr(oktopk_last_error(), "oktopk::make_sparse_allreduce") != NULL &&
                        strstr(oktopk_last_error(), "layout") != NULL,
        "layouts that differ across ranks: OKTOPK_ERROR_INVALID_ARGUMENT on every rank");
  if (code == OKTOPK_SUCCESS) {
    oktopk_segment_stats seg;
    check(
        oktopk_get_segment_stats(h, 2, &seg) == OKTOPK_ERROR_INVALID_ARGUMENT &&
            strstr(oktopk_last_error(), "oktopk_get_segment_stats: index 2") == oktopk_last_error(),
        "segment index out of range");
    oktopk_destroy(h);
  }
  /* No segments is oktopk_create, NULL arrays allowed. */
  h = NULL;
  int64_t count = -1;
  check(oktopk_create_with_layout(MPI_COMM_WORLD, "gtopk", n, NULL, 0, NULL, NULL, NULL, NULL,
                                  &h) == OKTOPK_SUCCESS &&
            oktopk_get_num_segments(h, &count) == OKTOPK_SUCCESS && count == 0,
        "an empty layout is no layout");
  oktopk_destroy(h);
}

/* Four handles with calls in flight at once, completed out of order by oktopk_test, give what
 * the same calls made blocking on twin handles give; calls launched in different orders on
 * different ranks fail on every rank instead of mixing handles. */
static void test_async(void) {
  enum { handles = 4, rounds = 3 };
  const char* methods[handles] = {"oktopk", "topka", "gtopk", "dense"};
  const int64_t sizes[handles] = {4000, 3000, 2500, 1000};
  oktopk_handle* async[handles];
  oktopk_handle* blocking[handles];
  float* grad[handles];
  float* out[handles];
  float* expected[handles];
  int ok = 1;
  for (int h = 0; h < handles; ++h) {
    ok &= oktopk_create(MPI_COMM_WORLD, methods[h], sizes[h], "density=0.01", &async[h]) ==
          OKTOPK_SUCCESS;
    ok &= oktopk_create(MPI_COMM_WORLD, methods[h], sizes[h], "density=0.01", &blocking[h]) ==
          OKTOPK_SUCCESS;
    grad[h] = malloc((size_t)sizes[h] * sizeof(float));
    out[h] = malloc((size_t)sizes[h] * sizeof(float));
    expected[h] = malloc((size_t)sizes[h] * sizeof(float));
  }
  check(ok, "async: create four handles and their twins");
  int same = 1, completed_out_of_order = 1;
  for (int round = 0; round < rounds; ++round) {
    oktopk_request* requests[handles];
    for (int h = 0; h < handles; ++h) {
      fill(grad[h], sizes[h], rank + h, round);
      ok &= oktopk_reduce_async(async[h], grad[h], out[h], &requests[h]) == OKTOPK_SUCCESS;
    }
    /* Tested from the last launched to the first, until all are done. */
    int done_count = 0, done[handles] = {0, 0, 0, 0}, first_done = -1;
    while (done_count < handles) {
      for (int h = handles - 1; h >= 0; --h) {
        if (done[h]) continue;
        int finished = 0;
        ok &= oktopk_test(requests[h], &finished) == OKTOPK_SUCCESS;
        if (finished) {
          done[h] = 1;
          ++done_count;
          if (first_done < 0) first_done = h;
        }
      }
    }
    completed_out_of_order &= first_done >= 0;
    for (int h = 0; h < handles; ++h) {
      ok &= oktopk_wait(requests[h]) == OKTOPK_SUCCESS;
      ok &= oktopk_request_free(requests[h]) == OKTOPK_SUCCESS;
      ok &= oktopk_reduce(blocking[h], grad[h], expected[h]) == OKTOPK_SUCCESS;
      same &= memcmp(out[h], expected[h], (size_t)sizes[h] * sizeof(float)) == 0;
    }
  }
  check(ok && completed_out_of_order, "async: launch, test out of order, wait, free");
  check(same, "async: four handles in flight equal blocking calls bit for bit");

  /* Rank 0 launches handle 0 then 1, the others 1 then 0: both fail on every rank. */
  if (size > 1) {
    oktopk_request* first = NULL;
    oktopk_request* second = NULL;
    const int a = rank == 0 ? 0 : 1, b = rank == 0 ? 1 : 0;
    fill(grad[0], sizes[0], rank, 9);
    fill(grad[1], sizes[1], rank, 9);
    ok = oktopk_reduce_async(async[a], grad[a], out[a], &first) == OKTOPK_SUCCESS &&
         oktopk_reduce_async(async[b], grad[b], out[b], &second) == OKTOPK_SUCCESS;
    const int code_first = oktopk_wait(first);
    const int found = strstr(oktopk_last_error(), "launch calls in the same order") != NULL;
    const int code_second = oktopk_wait(second);
    check(ok && code_first == OKTOPK_ERROR_INVALID_ARGUMENT &&
              code_second == OKTOPK_ERROR_INVALID_ARGUMENT && found,
          "async: calls launched in different orders fail on every rank");
    int finished = 0;
    check(oktopk_test(first, &finished) == OKTOPK_ERROR_INVALID_ARGUMENT && finished == 1,
          "async: oktopk_test reports a failed call as done, with its error");
    oktopk_request_free(first);
    oktopk_request_free(second);
    /* The handles are unchanged: the next calls, in one order, match their twins again. */
    same = 1;
    for (int h = 0; h < 2; ++h) {
      ok &= oktopk_reduce(async[h], grad[h], out[h]) == OKTOPK_SUCCESS;
      ok &= oktopk_reduce(blocking[h], grad[h], expected[h]) == OKTOPK_SUCCESS;
      same &= memcmp(out[h], expected[h], (size_t)sizes[h] * sizeof(float)) == 0;
    }
    check(ok && same, "async: the handles are unchanged after the order error");
  }
  for (int h = 0; h < handles; ++h) {
    oktopk_destroy(async[h]);
    oktopk_destroy(blocking[h]);
    free(grad[h]);
    free(out[h]);
    free(expected[h]);
  }
}

/* ---- Gradient types other than float32 (oktopk_create_typed and the *_typed functions). */

/* Round to nearest, ties to even, for the finite values the tests use (0 and normals). */
static uint16_t to_bfloat16(float x) {
  uint32_t bits;
  memcpy(&bits, &x, sizeof bits);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}
static float from_bfloat16(uint16_t b) {
  const uint32_t bits = (uint32_t)b << 16;
  float x;
  memcpy(&x, &bits, sizeof x);
  return x;
}
static uint16_t to_float16(float x) {
  if (x == 0.0f) return signbit(x) ? 0x8000u : 0u;
  int e = 0;
  frexp(x, &e); /* |x| = m 2^e, m in [0.5, 1) */
  const double r = ldexp(nearbyint(ldexp((double)x, 11 - e)), e - 11);
  const double m = frexp(fabs(r), &e); /* rounding may carry into the next binade */
  return (uint16_t)((r < 0 ? 0x8000u : 0u) | (uint32_t)(e - 1 + 15) << 10 |
                    (uint32_t)((2.0 * m - 1.0) * 1024.0));
}
static float from_float16(uint16_t h) {
  if ((h & 0x7fffu) == 0) return (h & 0x8000u) ? -0.0f : 0.0f;
  const double v = ldexp(1.0 + (double)(h & 1023u) / 1024.0, (int)((h >> 10) & 31u) - 15);
  return (float)((h & 0x8000u) ? -v : v);
}

static size_t dtype_bytes(int dtype) {
  return dtype == OKTOPK_FLOAT64 ? 8 : dtype == OKTOPK_FLOAT32 ? 4 : 2;
}
static const char* dtype_label(int dtype) {
  return dtype == OKTOPK_FLOAT64    ? "float64"
         : dtype == OKTOPK_BFLOAT16 ? "bfloat16"
         : dtype == OKTOPK_FLOAT16  ? "float16"
                                    : "float32";
}
/* values[i] as a double, and x stored as dtype at values[i]. */
static double typed_get(int dtype, const void* values, int64_t i) {
  switch (dtype) {
    case OKTOPK_FLOAT64:
      return ((const double*)values)[i];
    case OKTOPK_BFLOAT16:
      return from_bfloat16(((const uint16_t*)values)[i]);
    case OKTOPK_FLOAT16:
      return from_float16(((const uint16_t*)values)[i]);
    default:
      return ((const float*)values)[i];
  }
}
static void typed_set(int dtype, void* values, int64_t i, float x) {
  switch (dtype) {
    case OKTOPK_FLOAT64:
      ((double*)values)[i] = x;
      break;
    case OKTOPK_BFLOAT16:
      ((uint16_t*)values)[i] = to_bfloat16(x);
      break;
    case OKTOPK_FLOAT16:
      ((uint16_t*)values)[i] = to_float16(x);
      break;
    default:
      ((float*)values)[i] = x;
  }
}
static void fill_typed(int dtype, void* g, int64_t n, int r, int call) {
  for (int64_t i = 0; i < n; ++i) typed_set(dtype, g, i, gradient_value(r, i, call));
}
static int same_bytes_on_all_ranks(const void* v, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ ((const unsigned char*)v)[i]) * 1099511628211ull;
  uint64_t lo = 0, hi = 0;
  MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

/* One method on gradients of one type: results the same bits on every rank, dense the mean
 * within the type's rounding, sparse results of the right size, reduce_sparse_typed the same
 * entries as reduce_typed, the residual in its own type, state round trips, async equal to
 * blocking, in place equal to out of place. */
static void test_typed_method(const char* method, int dtype, int64_t n) {
  char what[256];
  const char* options = "density=0.02 threshold_period=4 repartition_period=8";
  oktopk_handle* a = NULL;
  oktopk_handle* b = NULL;
  snprintf(what, sizeof what, "%s %s: create_typed, get_dtype", method, dtype_label(dtype));
  int ok = oktopk_create_typed(MPI_COMM_WORLD, method, n, dtype, options, 0, NULL, NULL, NULL, NULL,
                               &a) == OKTOPK_SUCCESS;
  ok &= oktopk_create_typed(MPI_COMM_WORLD, method, n, dtype, options, 0, NULL, NULL, NULL, NULL,
                            &b) == OKTOPK_SUCCESS;
  int got = -1, residual_dtype = -1;
  ok &= a != NULL && oktopk_get_dtype(a, &got, &residual_dtype) == OKTOPK_SUCCESS;
  ok &=
      got == dtype && residual_dtype == (dtype == OKTOPK_FLOAT64 ? OKTOPK_FLOAT64 : OKTOPK_FLOAT32);
  check(ok, what);
  if (a == NULL || b == NULL) return;
  const size_t bytes = dtype_bytes(dtype);
  const size_t residual_bytes = dtype_bytes(residual_dtype);
  void* grad = malloc((size_t)n * bytes);
  void* out = malloc((size_t)n * bytes);
  void* twin = malloc((size_t)n * bytes);
  void* residual = malloc((size_t)n * residual_bytes);
  const int dense = strcmp(method, "dense") == 0;
  /* Dense: P roundings of each term to a 16-bit type and one of the average, of the sum of
   * magnitudes (docs/reference.md, "Values on the wire"); float64 sums floats exactly but for its
   * order. */
  const double unit = dtype == OKTOPK_BFLOAT16  ? 0x1p-8
                      : dtype == OKTOPK_FLOAT16 ? 0x1p-11
                                                : 0x1p-50;
  int64_t k = 0;
  oktopk_describe(a, NULL, NULL, &k);
  int codes_ok = 1, identical = 1, mean_ok = 1, sparse_ok = 1, residual_ok = 1, twin_ok = 1;
  const int calls = 5;
  for (int call = 0; call < calls; ++call) {
    fill_typed(dtype, grad, n, rank, call);
    codes_ok &= oktopk_reduce_typed(a, dtype, grad, out) == OKTOPK_SUCCESS;
    /* The twin in place: the same output. */
    memcpy(twin, grad, (size_t)n * bytes);
    codes_ok &= oktopk_reduce_typed(b, dtype, twin, twin) == OKTOPK_SUCCESS;
    twin_ok &= memcmp(out, twin, (size_t)n * bytes) == 0;
    identical &= same_bytes_on_all_ranks(out, (size_t)n * bytes);
    if (call == 0) {
      /* What the first call held back: this rank's gradient, or 0 where it was sent. A 16-bit
       * gradient's values are sent as they are, but TopkDSA and Ok-Topk send their regions'
       * sums rounded to the type, and gTopk its merged sets up the tree and the final set from
       * the root: the rank that rounded a sum keeps its rounding error, at most unit * |sum| <=
       * unit * (sum over ranks of |gradient|) at that entry (doubled: the gradients are
       * gradient_value rounded to the type), once, since a rank sends at most one set. */
      const int sends_sums = strcmp(method, "topkdsa") == 0 || strcmp(method, "oktopk") == 0 ||
                             strcmp(method, "gtopk") == 0;
      const int rounds_sums = sends_sums && (dtype == OKTOPK_BFLOAT16 || dtype == OKTOPK_FLOAT16);
      residual_ok &= oktopk_get_residual_typed(a, residual_dtype, residual, n) == OKTOPK_SUCCESS;
      int64_t held = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double r = typed_get(residual_dtype, residual, i);
        const double g = typed_get(dtype, grad, i);
        double magnitudes = 0.0;
        for (int q = 0; rounds_sums && q < size; ++q) magnitudes += fabs(gradient_value(q, i, 0));
        const double sum_error = 2.0 * unit * magnitudes;
        residual_ok &= fabs(r) <= sum_error || fabs(r - g) <= sum_error;
        held += r != 0.0;
      }
      residual_ok &= dense || strcmp(method, "s2") == 0 ? held == 0 : held > 0 && held < n;
    }
    if (dense) {
      for (int64_t i = 0; i < n; ++i) {
        double mean = 0.0, magnitude = 0.0;
        for (int r = 0; r < size; ++r) {
          const double g =
              dtype == OKTOPK_BFLOAT16  ? from_bfloat16(to_bfloat16(gradient_value(r, i, call)))
              : dtype == OKTOPK_FLOAT16 ? from_float16(to_float16(gradient_value(r, i, call)))
                                        : gradient_value(r, i, call);
          mean += g;
          magnitude += fabs(g);
        }
        mean /= size;
        magnitude /= size;
        mean_ok &= fabs(typed_get(dtype, out, i) - mean) <= (size + 2) * unit * magnitude + 1e-30;
      }
    } else if (strcmp(method, "s2") != 0) {
      int64_t nonzero = 0;
      for (int64_t i = 0; i < n; ++i) nonzero += typed_get(dtype, out, i) != 0.0;
      sparse_ok &= nonzero > 0 && nonzero <= 2 * (int64_t)size * k;
    }
  }
  snprintf(what, sizeof what, "%s %s: every reduce_typed returns OKTOPK_SUCCESS", method,
           dtype_label(dtype));
  check(codes_ok, what);
  snprintf(what, sizeof what, "%s %s: the same bits on every rank, in place as out of place",
           method, dtype_label(dtype));
  check(identical && twin_ok, what);
  snprintf(what, sizeof what, "%s %s: dense is the mean, sparse keeps at most 2 P k entries",
           method, dtype_label(dtype));
  check(mean_ok && sparse_ok, what);
  snprintf(what, sizeof what, "%s %s: the residual after the first call, in its own type", method,
           dtype_label(dtype));
  check(residual_ok, what);

  /* Sparse results: the entries of the twin's dense output (same history). */
  int sparse_same = 1;
  for (int call = calls; call < calls + 2; ++call) {
    fill_typed(dtype, grad, n, rank, call);
    const int32_t* indices = NULL;
    const void* values = NULL;
    int64_t count = -1;
    sparse_same &=
        oktopk_reduce_sparse_typed(a, dtype, grad, &indices, &values, &count) == OKTOPK_SUCCESS;
    sparse_same &= oktopk_reduce_typed(b, dtype, grad, out) == OKTOPK_SUCCESS;
    sparse_same &= count >= 0 && count <= n;
    if (!sparse_same) break;
    memset(twin, 0, (size_t)n * bytes);
    for (int64_t e = 0; e < count; ++e) {
      sparse_same &= indices[e] >= 0 && indices[e] < n && (e == 0 || indices[e] > indices[e - 1]);
      if (indices[e] >= 0 && indices[e] < n)
        memcpy((char*)twin + (size_t)indices[e] * bytes, (const char*)values + (size_t)e * bytes,
               bytes);
    }
    for (int64_t i = 0; i < n; ++i)
      sparse_same &= typed_get(dtype, twin, i) == typed_get(dtype, out, i);
  }
  snprintf(what, sizeof what, "%s %s: reduce_sparse_typed returns reduce_typed's entries", method,
           dtype_label(dtype));
  check(sparse_same, what);

  /* State: save, reduce, restore, reduce: the same output; async equals blocking. */
  char path[160];
  snprintf(path, sizeof path, "c_api_state_%s_%s_%s_np%d_rank%d.okst", mode, method,
           dtype_label(dtype), size, rank);
  fill_typed(dtype, grad, n, rank, calls + 2);
  int state_ok = oktopk_save_state(a, path) == OKTOPK_SUCCESS;
  state_ok &= oktopk_reduce_typed(a, dtype, grad, twin) == OKTOPK_SUCCESS;
  state_ok &= oktopk_restore_state(a, path) == OKTOPK_SUCCESS;
  oktopk_request* request = NULL;
  state_ok &= oktopk_reduce_async_typed(a, dtype, grad, out, &request) == OKTOPK_SUCCESS;
  state_ok &= oktopk_wait(request) == OKTOPK_SUCCESS;
  oktopk_request_free(request);
  state_ok &= memcmp(twin, out, (size_t)n * bytes) == 0;
  remove(path);
  snprintf(what, sizeof what, "%s %s: save, reduce, restore, reduce_async gives the same output",
           method, dtype_label(dtype));
  check(state_ok, what);

  free(grad);
  free(out);
  free(twin);
  free(residual);
  check(oktopk_destroy(a) == OKTOPK_SUCCESS && oktopk_destroy(b) == OKTOPK_SUCCESS, "destroy");
}

/* Arrays or handles of the wrong type: an error on every rank, never a hang, and the handle
 * unchanged. */
static void test_typed_errors(void) {
  const int64_t n = 400;
  oktopk_handle* h = NULL;
  oktopk_handle* twin = NULL;
  double* grad = malloc((size_t)n * sizeof(double));
  double* out = malloc((size_t)n * sizeof(double));
  double* expected = malloc((size_t)n * sizeof(double));
  float* floats = malloc((size_t)n * sizeof(float));
  fill_typed(OKTOPK_FLOAT64, grad, n, rank, 0);
  fill(floats, n, rank, 0);
  check(oktopk_create_typed(MPI_COMM_WORLD, "topka", n, OKTOPK_FLOAT64, "density=0.05", 0, NULL,
                            NULL, NULL, NULL, &h) == OKTOPK_SUCCESS &&
            oktopk_create_typed(MPI_COMM_WORLD, "topka", n, OKTOPK_FLOAT64, "density=0.05", 0, NULL,
                                NULL, NULL, NULL, &twin) == OKTOPK_SUCCESS,
        "typed errors: create two float64 handles");

  int code = oktopk_reduce(h, floats, floats);
  check(code == OKTOPK_ERROR_INVALID_ARGUMENT &&
            strstr(oktopk_last_error(),
                   "oktopk_reduce: rank 0: the arrays are OKTOPK_FLOAT32, the handle's gradients "
                   "OKTOPK_FLOAT64 (use oktopk_reduce_typed)") != NULL,
        "oktopk_reduce on a float64 handle: refused, naming the typed function");
  /* The wrong type on rank 0 only: every rank fails with rank 0's reason. */
  code = oktopk_reduce_typed(h, rank == 0 ? OKTOPK_FLOAT32 : OKTOPK_FLOAT64, grad, out);
  check(code == OKTOPK_ERROR_INVALID_ARGUMENT &&
            agreed_message("oktopk_reduce_typed", 0, "the arrays are OKTOPK_FLOAT32"),
        "the wrong dtype on one rank: OKTOPK_ERROR_INVALID_ARGUMENT on every rank");
  const int32_t* indices = NULL;
  const void* values = NULL;
  int64_t count = 0;
  code = oktopk_reduce_sparse_typed(h, rank == size - 1 ? OKTOPK_BFLOAT16 : OKTOPK_FLOAT64, grad,
                                    &indices, &values, &count);
  check(
      code == OKTOPK_ERROR_INVALID_ARGUMENT && values == NULL && count == 0 &&
          agreed_message("oktopk_reduce_sparse_typed", size - 1, "the arrays are OKTOPK_BFLOAT16"),
      "reduce_sparse_typed with the wrong dtype on one rank: an error on every rank");
  /* NULL arrays: valid on every backend (device pointers in GPU builds). */
  code = oktopk_reduce_device_typed(h, OKTOPK_FLOAT32, NULL, NULL);
  check(code == OKTOPK_ERROR_INVALID_ARGUMENT &&
            strstr(oktopk_last_error(),
                   "oktopk_reduce_device_typed: rank 0: the arrays are OKTOPK_FLOAT32") != NULL,
        "reduce_device_typed with the wrong dtype: refused on every rank");
  oktopk_request* request = NULL;
  code = oktopk_reduce_async_typed(h, rank == 0 ? OKTOPK_FLOAT16 : OKTOPK_FLOAT64, grad, out,
                                   &request);
  const int waited = oktopk_wait(request);
  oktopk_request_free(request);
  check(code == OKTOPK_SUCCESS && waited == OKTOPK_ERROR_INVALID_ARGUMENT,
        "reduce_async_typed with the wrong dtype on one rank: the request fails on every rank");
  /* The rejected calls left the handle as its twin. */
  check(oktopk_reduce_typed(h, OKTOPK_FLOAT64, grad, out) == OKTOPK_SUCCESS &&
            oktopk_reduce_typed(twin, OKTOPK_FLOAT64, grad, expected) == OKTOPK_SUCCESS &&
            memcmp(out, expected, (size_t)n * sizeof(double)) == 0,
        "the handle is unchanged after the dtype errors");
  check(oktopk_get_residual(h, floats, n) == OKTOPK_ERROR_INVALID_ARGUMENT &&
            strstr(oktopk_last_error(), "oktopk_get_residual_typed") != NULL &&
            oktopk_get_residual_typed(h, OKTOPK_FLOAT64, out, n) == OKTOPK_SUCCESS,
        "a float64 handle's residual: float64 only");

  /* A float64 checkpoint refused by a float32 handle, on every rank. */
  size_t bytes = 0;
  oktopk_save_state_to_buffer(h, NULL, 0, &bytes);
  void* state = malloc(bytes);
  oktopk_save_state_to_buffer(h, state, bytes, &bytes);
  oktopk_handle* single = NULL;
  check(oktopk_create(MPI_COMM_WORLD, "topka", n, "density=0.05", &single) == OKTOPK_SUCCESS,
        "create a float32 handle");
  code = oktopk_restore_state_from_buffer(single, state, bytes);
  check(code == OKTOPK_ERROR_INVALID_ARGUMENT || code == OKTOPK_ERROR_RUNTIME,
        "a float64 checkpoint into a float32 handle: an error on every rank");
  free(state);
  oktopk_destroy(single);

  /* A bfloat16 handle's residual is float32. */
  oktopk_handle* half = NULL;
  check(
      oktopk_create_typed(MPI_COMM_WORLD, "gaussiank", n, OKTOPK_BFLOAT16, NULL, 0, NULL, NULL,
                          NULL, NULL, &half) == OKTOPK_SUCCESS &&
          oktopk_get_residual_typed(half, OKTOPK_FLOAT32, floats, n) == OKTOPK_SUCCESS &&
          oktopk_get_residual(half, floats, n) == OKTOPK_SUCCESS &&
          oktopk_get_residual_typed(half, OKTOPK_BFLOAT16, out, n) == OKTOPK_ERROR_INVALID_ARGUMENT,
      "a bfloat16 handle's residual is float32");
  oktopk_destroy(half);

  /* Bad types at create: on every rank, naming the rank or the type. */
  oktopk_handle* none = (oktopk_handle*)1;
  code = oktopk_create_typed(MPI_COMM_WORLD, "dense", n, rank == size - 1 ? 7 : OKTOPK_FLOAT64,
                             NULL, 0, NULL, NULL, NULL, NULL, &none);
  char expected_text[64];
  snprintf(expected_text, sizeof expected_text, "oktopk_create_typed: rank %d", size - 1);
  check(code == OKTOPK_ERROR_INVALID_ARGUMENT && none == NULL &&
            strstr(oktopk_last_error(), expected_text) != NULL,
        "an unknown dtype on one rank: OKTOPK_ERROR_INVALID_ARGUMENT on every rank");
  if (size > 1) {
    code = oktopk_create_typed(MPI_COMM_WORLD, "oktopk", n,
                               rank == 0 ? OKTOPK_BFLOAT16 : OKTOPK_FLOAT16, NULL, 0, NULL, NULL,
                               NULL, NULL, &none);
    check(code == OKTOPK_ERROR_INVALID_ARGUMENT && none == NULL &&
              strstr(oktopk_last_error(), "gradient type") != NULL,
          "different dtypes across ranks: OKTOPK_ERROR_INVALID_ARGUMENT on every rank");
  }
  code = oktopk_create_typed(MPI_COMM_WORLD, "topka", n, OKTOPK_FLOAT64, "wire=bf16", 0, NULL, NULL,
                             NULL, NULL, &none);
  check(code == OKTOPK_ERROR_INVALID_ARGUMENT && none == NULL &&
            strstr(oktopk_last_error(), "wire=bf16") != NULL,
        "wire=bf16 with float64 gradients: refused");
  check(oktopk_get_dtype(NULL, NULL, NULL) == OKTOPK_ERROR_INVALID_ARGUMENT, "get_dtype(NULL)");

  /* A layout with a type: the typed create takes segments too. */
  const int64_t lengths[2] = {100, n - 100};
  const int kinds[2] = {OKTOPK_SEGMENT_ROWS, OKTOPK_SEGMENT_DENSE};
  const int64_t widths[2] = {10, 1};
  oktopk_handle* fused = NULL;
  int64_t segments = 0;
  check(oktopk_create_typed(MPI_COMM_WORLD, "s2", n, OKTOPK_FLOAT64, NULL, 2, lengths, kinds,
                            widths, NULL, &fused) == OKTOPK_SUCCESS &&
            oktopk_get_num_segments(fused, &segments) == OKTOPK_SUCCESS && segments == 2 &&
            oktopk_reduce_typed(fused, OKTOPK_FLOAT64, grad, out) == OKTOPK_SUCCESS &&
            same_bytes_on_all_ranks(out, (size_t)n * sizeof(double)),
        "create_typed with a layout (s2, float64)");
  oktopk_destroy(fused);

  oktopk_destroy(h);
  oktopk_destroy(twin);
  free(grad);
  free(out);
  free(expected);
  free(floats);
}

/* A handle, its twin (made alike, for the bits a call must give) and host arrays of n floats,
 * grad filled with this rank's gradient of call 0. */
typedef struct {
  oktopk_handle* h;
  oktopk_handle* twin;
  float* grad;
  float* out;
  float* expected;
} twins;

static twins make_twins(const char* method, int64_t n, const char* options, const char* what) {
  twins t = {NULL, NULL, NULL, NULL, NULL};
  check(oktopk_create(MPI_COMM_WORLD, method, n, options, &t.h) == OKTOPK_SUCCESS &&
            oktopk_create(MPI_COMM_WORLD, method, n, options, &t.twin) == OKTOPK_SUCCESS,
        what);
  t.grad = malloc((size_t)n * sizeof(float));
  t.out = malloc((size_t)n * sizeof(float));
  t.expected = malloc((size_t)n * sizeof(float));
  fill(t.grad, n, rank, 0);
  return t;
}

static void free_twins(twins* t) {
  oktopk_destroy(t->h);
  oktopk_destroy(t->twin);
  free(t->grad);
  free(t->out);
  free(t->expected);
}

/* oktopk_reduce_on_stream and its async form: the caller's stream (NULL in a CPU build, the
 * only stream it takes) gives the bits of oktopk_reduce; a bad argument on one rank fails the
 * call on every rank, naming that rank and the reason, and leaves the handle as its twin. In a
 * GPU build these host arrays are what every rank refuses. */
static void test_on_stream(void) {
  const int64_t n = 2001;
  int device = -2;
  check(oktopk_get_device(&device) == OKTOPK_SUCCESS && device >= -1, "get_device");
  check(oktopk_get_device(NULL) == OKTOPK_ERROR_INVALID_ARGUMENT, "get_device(NULL)");
  twins t = make_twins("oktopk", n, "density=0.02", "on_stream: create a handle and its twin");
  oktopk_handle* h = t.h;
  oktopk_handle* twin = t.twin;
  float* grad = t.grad;
  float* out = t.out;
  float* expected = t.expected;
  int code = 0;
  if (device >= 0) {
    code = oktopk_reduce_on_stream(h, OKTOPK_FLOAT32, grad, out, NULL);
    check(code == OKTOPK_ERROR_INVALID_ARGUMENT &&
              agreed_message("oktopk_reduce_on_stream", 0, "grad is pageable host memory"),
          "on_stream (GPU build): host arrays refused on every rank");
  } else {
    int same = 1;
    for (int call = 0; call < 3; ++call) {
      fill(grad, n, rank, call);
      same &= oktopk_reduce_on_stream(h, OKTOPK_FLOAT32, grad, out, NULL) == OKTOPK_SUCCESS &&
              oktopk_reduce(twin, grad, expected) == OKTOPK_SUCCESS &&
              memcmp(out, expected, (size_t)n * sizeof(float)) == 0;
    }
    oktopk_request* request = NULL;
    same &= oktopk_reduce_on_stream_async(h, OKTOPK_FLOAT32, grad, out, NULL, &request) ==
                OKTOPK_SUCCESS &&
            oktopk_wait(request) == OKTOPK_SUCCESS &&
            oktopk_reduce(twin, grad, expected) == OKTOPK_SUCCESS &&
            memcmp(out, expected, (size_t)n * sizeof(float)) == 0;
    oktopk_request_free(request);
    check(same, "on_stream (CPU build), sync and async: the bits of oktopk_reduce");

    int token = 0;
    code = oktopk_reduce_on_stream(h, OKTOPK_FLOAT32, grad, out, rank == size - 1 ? &token : NULL);
    check(code == OKTOPK_ERROR_INVALID_ARGUMENT &&
              agreed_message("oktopk_reduce_on_stream", size - 1,
                             "oktopk::execution_space_on_stream: a stream was given"),
          "on_stream (CPU build): a stream on the last rank fails every rank, naming it");
    request = NULL;
    code = oktopk_reduce_on_stream_async(h, OKTOPK_FLOAT32, grad, out,
                                         rank == size - 1 ? &token : NULL, &request);
    const int waited = oktopk_wait(request);
    check(code == OKTOPK_SUCCESS && waited == OKTOPK_ERROR_INVALID_ARGUMENT &&
              agreed_message("oktopk_reduce_on_stream_async", size - 1, "a stream was given"),
          "on_stream_async (CPU build): a stream on the last rank fails every request");
    oktopk_request_free(request);
  }
  code = oktopk_reduce_on_stream(h, OKTOPK_FLOAT32, rank == 0 ? NULL : grad, out, NULL);
  check(code == OKTOPK_ERROR_INVALID_ARGUMENT &&
            agreed_message("oktopk_reduce_on_stream", 0, "grad is NULL, with n = 2001"),
        "on_stream: a NULL grad on rank 0 fails every rank, naming it");
  /* In a GPU build these host arrays are refused on rank 0 first; test_c_stream checks the
   * dtype with device arrays there. */
  if (device < 0) {
    code = oktopk_reduce_on_stream(h, rank == size - 1 ? OKTOPK_FLOAT64 : OKTOPK_FLOAT32, grad, out,
                                   NULL);
    check(
        code == OKTOPK_ERROR_INVALID_ARGUMENT &&
            agreed_message("oktopk_reduce_on_stream", size - 1,
                           "the arrays are OKTOPK_FLOAT64, the handle's gradients OKTOPK_FLOAT32"),
        "on_stream: the wrong dtype on the last rank fails every rank, naming it");
  }
  code = oktopk_reduce_device(h, grad, rank == 0 ? NULL : out);
  check(code == OKTOPK_ERROR_INVALID_ARGUMENT &&
            agreed_message("oktopk_reduce_device", 0, device >= 0 ? "grad is" : "out is NULL"),
        "reduce_device: arrays refused on one rank fail every rank, naming it");
  if (device < 0) {
    check(oktopk_reduce(h, grad, out) == OKTOPK_SUCCESS &&
              oktopk_reduce(twin, grad, expected) == OKTOPK_SUCCESS &&
              memcmp(out, expected, (size_t)n * sizeof(float)) == 0,
          "on_stream: the handle is unchanged after the refused calls");
  }
  free_twins(&t);
}

/* oktopk_reduce_refused and its async form: the refusing rank's reason reaches every rank, whose
 * reduce (dense, sparse or asynchronous) fails instead of waiting, and the handle is unchanged;
 * oktopk_get_backend names the build's execution space, and oktopk_get_gpu_aware_mpi says how
 * GPU buffers reach MPI. */
static void test_refused(void) {
  const char* backend = NULL;
  check(oktopk_get_backend(&backend) == OKTOPK_SUCCESS && backend != NULL && backend[0] != '\0',
        "get_backend");
  check(oktopk_get_backend(NULL) == OKTOPK_ERROR_INVALID_ARGUMENT, "get_backend(NULL)");
  {
    int device_pointers = -1;
    const char* reason = NULL;
    check(oktopk_get_gpu_aware_mpi(&device_pointers, &reason) == OKTOPK_SUCCESS &&
              (device_pointers == 0 || device_pointers == 1) && reason != NULL && reason[0] != '\0',
          "get_gpu_aware_mpi");
    /* A build for CPUs hands host memory to MPI as it is. */
    if (strcmp(backend, "Serial") == 0 || strcmp(backend, "OpenMP") == 0 ||
        strcmp(backend, "Threads") == 0)
      check(device_pointers == 0 && strstr(reason, "no GPU backend") != NULL,
            "get_gpu_aware_mpi without a GPU");
    check(oktopk_get_gpu_aware_mpi(NULL, NULL) == OKTOPK_SUCCESS, "get_gpu_aware_mpi(NULL, NULL)");
  }
  const int64_t n = 1501;
  twins t = make_twins("topka", n, "density=0.03", "refused: create a handle and its twin");
  oktopk_handle* h = t.h;
  float* grad = t.grad;
  float* out = t.out;
  const int last = rank == size - 1;
  int code =
      last ? oktopk_reduce_refused(h, "grad is a tensor on meta") : oktopk_reduce(h, grad, out);
  check(code == OKTOPK_ERROR_INVALID_ARGUMENT &&
            agreed_message(last ? "oktopk_reduce_refused" : "oktopk_reduce", size - 1,
                           "grad is a tensor on meta"),
        "refused on the last rank: every rank's reduce fails with its reason");
  const int32_t* indices = NULL;
  const float* values = NULL;
  int64_t count = -1;
  code = rank == 0 ? oktopk_reduce_refused(h, NULL)
                   : oktopk_reduce_sparse(h, grad, &indices, &values, &count);
  check(code == OKTOPK_ERROR_INVALID_ARGUMENT &&
            agreed_message(rank == 0 ? "oktopk_reduce_refused" : "oktopk_reduce_sparse", 0,
                           "(no reason given)") &&
            (rank == 0 || (count == 0 && indices == NULL && values == NULL)),
        "refused (NULL reason) on rank 0 while the others reduce_sparse: every rank fails");
  oktopk_request* request = NULL;
  code = last ? oktopk_reduce_refused_async(h, "out is read-only", &request)
              : oktopk_reduce_async(h, grad, out, &request);
  const int waited = oktopk_wait(request);
  check(code == OKTOPK_SUCCESS && waited == OKTOPK_ERROR_INVALID_ARGUMENT &&
            agreed_message(last ? "oktopk_reduce_refused_async" : "oktopk_reduce_async", size - 1,
                           "out is read-only"),
        "refused_async on the last rank: every request fails with its reason");
  oktopk_request_free(request);
  check(oktopk_reduce_refused_async(h, "x", NULL) == OKTOPK_ERROR_INVALID_ARGUMENT &&
            oktopk_reduce_refused(NULL, "x") == OKTOPK_ERROR_INVALID_ARGUMENT,
        "refused: a NULL request or handle is refused on this rank alone");
  check(oktopk_reduce(h, grad, out) == OKTOPK_SUCCESS &&
            oktopk_reduce(t.twin, grad, t.expected) == OKTOPK_SUCCESS &&
            memcmp(out, t.expected, (size_t)n * sizeof(float)) == 0,
        "refused: the handle is unchanged, as its twin");
  free_twins(&t);
}

/* The last call's phases: named, each within range, and summing to the call's stats, inside and
 * between nodes; an index past the end is refused. */
static int phases_add_up(const oktopk_handle* h, const oktopk_stats* stats) {
  int64_t count = -1;
  int ok = oktopk_get_num_phases(h, &count) == OKTOPK_SUCCESS && count > 0;
  oktopk_phase_stats sum;
  memset(&sum, 0, sizeof sum);
  for (int64_t i = 0; ok && i < count; ++i) {
    oktopk_phase_stats phase;
    ok &= oktopk_get_phase_stats(h, i, &phase) == OKTOPK_SUCCESS;
    ok &= phase.name[0] != '\0' && memchr(phase.name, '\0', sizeof phase.name) != NULL;
    ok &= phase.bytes_sent_between_nodes >= 0 && phase.bytes_sent_between_nodes <= phase.bytes_sent;
    ok &= phase.bytes_received_between_nodes >= 0 &&
          phase.bytes_received_between_nodes <= phase.bytes_received;
    sum.bytes_sent += phase.bytes_sent;
    sum.bytes_received += phase.bytes_received;
    sum.messages_sent += phase.messages_sent;
    sum.messages_received += phase.messages_received;
    sum.bytes_sent_between_nodes += phase.bytes_sent_between_nodes;
    sum.bytes_received_between_nodes += phase.bytes_received_between_nodes;
  }
  ok &= sum.bytes_sent == stats->bytes_sent && sum.bytes_received == stats->bytes_received &&
        sum.messages_sent == stats->messages_sent &&
        sum.messages_received == stats->messages_received &&
        sum.bytes_sent_between_nodes == stats->bytes_sent_between_nodes &&
        sum.bytes_received_between_nodes == stats->bytes_received_between_nodes;
  oktopk_phase_stats past;
  ok &= oktopk_get_phase_stats(h, count, &past) == OKTOPK_ERROR_INVALID_ARGUMENT &&
        strstr(oktopk_last_error(), "oktopk_get_phase_stats: index ") == oktopk_last_error();
  ok &= oktopk_get_phase_stats(h, 0, NULL) == OKTOPK_ERROR_INVALID_ARGUMENT &&
        oktopk_get_num_phases(h, NULL) == OKTOPK_ERROR_INVALID_ARGUMENT;
  return ok;
}

/* Traffic inside and between nodes: nodes of one rank send every byte between nodes, one node
 * none; with two ranks a node, the hierarchical mode's node phases stay inside the node and its
 * method's phases cross between nodes only. */
static void test_node_traffic(void) {
  const int64_t n = 4001;
  float* grad = malloc((size_t)n * sizeof(float));
  float* out = malloc((size_t)n * sizeof(float));
  char options[96];
  for (int layout = 0; layout < 3; ++layout) {
    if (layout == 2 && size % 2 != 0) continue;
    if (layout == 0) snprintf(options, sizeof options, "density=0.01 node_size=1");
    if (layout == 1) snprintf(options, sizeof options, "density=0.01 node_size=%d", size);
    if (layout == 2) snprintf(options, sizeof options, "density=0.01 node_size=2 hierarchical=on");
    oktopk_handle* h = NULL;
    int ok = oktopk_create(MPI_COMM_WORLD, "oktopk", n, options, &h) == OKTOPK_SUCCESS;
    for (int call = 1; ok && call <= 3; ++call) {
      fill(grad, n, rank, call);
      ok &= oktopk_reduce(h, grad, out) == OKTOPK_SUCCESS;
    }
    oktopk_stats stats;
    ok &= oktopk_get_stats(h, &stats) == OKTOPK_SUCCESS && phases_add_up(h, &stats);
    ok &= size == 1 || stats.bytes_sent > 0;
    if (layout == 0)
      ok &= stats.bytes_sent_between_nodes == stats.bytes_sent &&
            stats.bytes_received_between_nodes == stats.bytes_received;
    if (layout == 1)
      ok &= stats.bytes_sent_between_nodes == 0 && stats.bytes_received_between_nodes == 0;
    if (layout == 2) {
      int64_t count = 0;
      ok &= oktopk_get_num_phases(h, &count) == OKTOPK_SUCCESS;
      int node_phases = 0;
      for (int64_t i = 0; ok && i < count; ++i) {
        oktopk_phase_stats phase;
        ok &= oktopk_get_phase_stats(h, i, &phase) == OKTOPK_SUCCESS;
        if (strncmp(phase.name, "node_", 5) == 0) {
          ++node_phases;
          ok &= phase.bytes_sent > 0 && phase.bytes_sent_between_nodes == 0 &&
                phase.bytes_received_between_nodes == 0;
        } else if (strcmp(phase.name, "hierarchy_check") != 0) {
          ok &= phase.bytes_sent_between_nodes == phase.bytes_sent &&
                phase.bytes_received_between_nodes == phase.bytes_received;
        }
      }
      ok &= node_phases == 2;
    }
    char what[160];
    snprintf(what, sizeof what, "traffic inside and between nodes with %s", options);
    check(ok, what);
    if (h != NULL) oktopk_destroy(h);
  }
  free(grad);
  free(out);
}

/* oktopk_mpi_library names the MPI this test runs with: the one whose mpi.h it was compiled
 * against is the one linked, so MPI_Get_library_version names the same family and release. */
static void test_mpi_library(void) {
  const char* compiled = oktopk_mpi_library();
  char running[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(running, &length);
  const char* release = NULL;
  int same_family = 0;
  if (strncmp(compiled, "Open MPI ", 9) == 0) {
    release = compiled + 9;
    same_family = strncmp(running, "Open MPI v", 10) == 0 &&
                  strncmp(running + 10, release, strlen(release)) == 0;
  } else if (strncmp(compiled, "MPICH ", 6) == 0) {
    release = compiled + 6;
    const char* version = strstr(running, "MPICH Version:");
    same_family = version != NULL && strstr(version, release) != NULL;
  }
  check(release != NULL && strlen(release) >= 3 && same_family, "mpi_library names the MPI run");
}

/* reduce_scatter: each rank's shard is the slice of a twin's oktopk_reduce (the sparse methods
 * bit for bit; Dense within its rounding), for equal shards (NULL offsets) and given ones,
 * float32 and float64; gTopk, a wrong dtype and a wrong shard length fail on every rank. */
static void test_reduce_scatter(void) {
  const int64_t n = 3001;
  const int dtypes[] = {OKTOPK_FLOAT32, OKTOPK_FLOAT64};
  const char* methods[] = {"oktopk", "topka", "topkdsa", "gaussiank", "dense"};
  const size_t dense = 4;
  int64_t* offsets = malloc((size_t)(size + 1) * sizeof(int64_t));
  for (int r = 0; r <= size; ++r) offsets[r] = (int64_t)r * n / size;
  /* Given offsets: everything from rank 1 on shifted towards the end. */
  int64_t* given = malloc((size_t)(size + 1) * sizeof(int64_t));
  for (int r = 0; r <= size; ++r) given[r] = r == size ? n : (int64_t)r * (n / (2 * size));
  for (size_t m = 0; m < sizeof methods / sizeof methods[0]; ++m) {
    for (size_t t = 0; t < 2; ++t) {
      const int dtype = dtypes[t];
      const size_t width = dtype == OKTOPK_FLOAT64 ? sizeof(double) : sizeof(float);
      oktopk_handle* twin = NULL;
      oktopk_handle* h = NULL;
      int ok = oktopk_create_typed(MPI_COMM_WORLD, methods[m], n, dtype, "density=0.02", 0, NULL,
                                   NULL, NULL, NULL, &twin) == OKTOPK_SUCCESS &&
               oktopk_create_typed(MPI_COMM_WORLD, methods[m], n, dtype, "density=0.02", 0, NULL,
                                   NULL, NULL, NULL, &h) == OKTOPK_SUCCESS;
      void* grad = malloc((size_t)n * width);
      void* out = malloc((size_t)n * width);
      void* shard = malloc((size_t)n * width);
      int64_t differ = 0;
      for (int call = 0; call < 4 && ok; ++call) {
        const int64_t* bounds = call % 2 == 0 ? offsets : given;
        const int64_t begin = bounds[rank];
        const int64_t length = bounds[rank + 1] - begin;
        fill_typed(dtype, grad, n, rank, call);
        ok =
            oktopk_reduce_typed(twin, dtype, grad, out) == OKTOPK_SUCCESS &&
            oktopk_reduce_scatter_typed(h, dtype, grad, shard, length, call % 2 == 0 ? NULL : given,
                                        call % 2 == 0 ? 0 : size + 1) == OKTOPK_SUCCESS;
        for (int64_t j = 0; j < length && ok; ++j) {
          const double a = dtype == OKTOPK_FLOAT64 ? ((double*)shard)[j] : ((float*)shard)[j];
          const double b =
              dtype == OKTOPK_FLOAT64 ? ((double*)out)[begin + j] : ((float*)out)[begin + j];
          const int same_bits =
              memcmp((char*)shard + j * width, (char*)out + (begin + j) * width, width) == 0;
          if (m != dense ? !same_bits : !(fabs(a - b) <= 1e-5 * (fabs(b) + 1.0))) ++differ;
        }
      }
      char what[160];
      snprintf(what, sizeof what, "reduce_scatter %s %s: the shards are reduce's slices",
               methods[m], dtype == OKTOPK_FLOAT64 ? "float64" : "float32");
      check(ok && differ == 0, what);
      oktopk_stats twin_stats, stats;
      check(oktopk_get_stats(twin, &twin_stats) == OKTOPK_SUCCESS &&
                oktopk_get_stats(h, &stats) == OKTOPK_SUCCESS && twin_stats.reduce_scatter == 0 &&
                stats.reduce_scatter == 1,
            "reduce_scatter: the stats say which call was a reduce-scatter");
      if (m == 0 && dtype == OKTOPK_FLOAT32) {
        const int64_t length = offsets[rank + 1] - offsets[rank];
        int code =
            oktopk_reduce_scatter(h, grad, shard, rank == size - 1 ? length + 1 : length, NULL, 0);
        check(code == OKTOPK_ERROR_INVALID_ARGUMENT &&
                  strstr(oktopk_last_error(), "reduce_scatter: rank ") != NULL,
              "reduce_scatter with a wrong shard length on one rank: an error on every rank");
        code = oktopk_reduce_scatter_typed(h, rank == 0 ? OKTOPK_FLOAT64 : OKTOPK_FLOAT32, grad,
                                           shard, length, NULL, 0);
        check(code == OKTOPK_ERROR_INVALID_ARGUMENT &&
                  agreed_message("oktopk_reduce_scatter_typed", 0, "the arrays are OKTOPK_FLOAT64"),
              "reduce_scatter with the wrong dtype on one rank: an error on every rank");
      }
      oktopk_destroy(twin);
      oktopk_destroy(h);
      free(grad);
      free(out);
      free(shard);
    }
  }
  oktopk_handle* gtopk = NULL;
  float* g = malloc((size_t)n * sizeof(float));
  fill(g, n, rank, 0);
  check(oktopk_create(MPI_COMM_WORLD, "gtopk", n, "density=0.02", &gtopk) == OKTOPK_SUCCESS &&
            oktopk_reduce_scatter(gtopk, g, g, offsets[rank + 1] - offsets[rank], NULL, 0) ==
                OKTOPK_ERROR_INVALID_ARGUMENT &&
            strstr(oktopk_last_error(), "has no reduce-scatter") != NULL,
        "reduce_scatter of gtopk: refused on every rank");
  oktopk_destroy(gtopk);
  free(g);
  free(offsets);
  free(given);
}

int main(int argc, char** argv) {
  /* --single: MPI without threads, so that queued calls run in oktopk_test and oktopk_wait;
   * otherwise MPI_THREAD_MULTIPLE and OkTopk's progress thread. */
  const int single = argc > 1 && strcmp(argv[1], "--single") == 0;
  if (single) mode = "single";
  int provided = MPI_THREAD_SINGLE;
  if (single) {
    MPI_Init(&argc, &argv);
  } else {
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  oktopk_handle* early = (oktopk_handle*)1;
  check(oktopk_create(MPI_COMM_WORLD, "dense", 10, NULL, &early) == OKTOPK_ERROR_RUNTIME &&
            early == NULL && strstr(oktopk_last_error(), "oktopk_initialize") != NULL,
        "create before oktopk_initialize");
  check(oktopk_initialize(&argc, &argv) == OKTOPK_SUCCESS, "initialize");
  check(oktopk_initialize(NULL, NULL) == OKTOPK_SUCCESS, "initialize twice");
  check(strlen(oktopk_version()) >= 5, "version");
  test_mpi_library();

  const char* methods[] = {"dense", "topka", "topkdsa", "gtopk", "gaussiank", "oktopk", "s2"};
  for (size_t m = 0; m < sizeof methods / sizeof methods[0]; ++m) test_method(methods[m], 3001);
  test_errors();
  test_layout_methods();
  test_layout_errors();
  test_async();
  test_on_stream();
  test_refused();
  test_node_traffic();
  const int dtypes[] = {OKTOPK_FLOAT64, OKTOPK_BFLOAT16, OKTOPK_FLOAT16};
  for (size_t t = 0; t < sizeof dtypes / sizeof dtypes[0]; ++t)
    for (size_t m = 0; m < sizeof methods / sizeof methods[0]; ++m)
      test_typed_method(methods[m], dtypes[t], 2001);
  test_typed_errors();
  test_reduce_scatter();

  check(oktopk_finalize() == OKTOPK_SUCCESS, "finalize");
  if (rank == 0) {
    printf("mode: %s\n", single ? "no progress thread (MPI_Init)"
                         : provided == MPI_THREAD_MULTIPLE
                             ? "progress thread (MPI_THREAD_MULTIPLE)"
                             : "no progress thread (MPI_THREAD_MULTIPLE not provided)");
    printf("%d passed, %d failed\n", passed, failed);
  }
  MPI_Finalize();
  return failed == 0 ? 0 : 1;
}
