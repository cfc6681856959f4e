/* SPDX-License-Identifier: BSD-3-Clause */
/* The tally of the C interface's test programs (test_c_api.c, test_c_stream.cpp): this rank and
 * the world's size, and checks counted on every rank, each failing if it fails on any rank. The
 * program prints "N passed, N failed" on rank 0 at its end. */
#ifndef OKTOPK_TESTS_RANK_CHECKS_H
#define OKTOPK_TESTS_RANK_CHECKS_H

#include <oktopk/c_api.h>

#include <mpi.h>
#include <stdio.h>

static int rank, size;
static int passed, failed;

/* Collective: counts a check on every rank; it fails if it fails on any rank, and the ranks
 * where it failed say so. */
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

#endif
