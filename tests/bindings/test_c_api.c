/* SPDX-License-Identifier: BSD-3-Clause */
/* The C interface as a C program uses it, at any number of ranks: every method's result is the
 * same bits on every rank, in place equals out of place, dense is the mean, errors are codes
 * (the same on every rank for NaN, mismatched n, a bad method or option), stats and state
 * round trips, sparse results are the dense ones' entries. Prints "N passed, N failed" on
 * rank 0; exits non-zero on any failure. */
#include <oktopk/c_api.h>

#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size;
/* In the checkpoint files' names: ctest runs the two modes at once in the same folder. */
static const char* mode = "threads";
static int passed, failed;

/* Counts a check on every rank; a check fails if it fails on any rank. */
static void check(int ok, const char* what) {
  int all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  if (all_ok) {
    ++passed;
  } else {
    ++failed;
    if (!ok)
      fprintf(stderr, "rank %d: FAILED: %s (last error: %s)\n", rank, what, oktopk_last_error());
  }
}

/* Deterministic gradient of rank r: a few large entries over small noise, distinct per rank. */
static float gradient_value(int r, int64_t i, int call) {
  const uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(r * 40503u + call * 977u);
  const float small = (float)(h % 1000u) / 1000.0f - 0.5f;
  return (h % 37u == 0u) ? 8.0f * small + (small < 0 ? -4.0f : 4.0f) : small;
}

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

  const char* methods[] = {"dense", "topka", "topkdsa", "gtopk", "gaussiank", "oktopk", "s2"};
  for (size_t m = 0; m < sizeof methods / sizeof methods[0]; ++m) test_method(methods[m], 3001);
  test_errors();
  test_layout_methods();
  test_layout_errors();
  test_async();

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
