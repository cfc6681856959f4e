#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Installs what is missing, builds into build/, and runs the main job: the kernel benchmark at
# n = 2^26, density 0.01 on 2 OpenMP threads (the numbers in docs/benchmarks.md).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
oktopk_setup
oktopk_configure_and_build oktopk-kernel-bench
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
"$OKTOPK_BUILD_DIR/apps/oktopk-kernel-bench/oktopk-kernel-bench" \
  --n $((1 << 26)) --density 0.01 --reps 10 --format table "$@"
