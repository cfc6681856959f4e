#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Words per rank over k for oktopk and topka at P = 2..16 (docs/benchmarks.md):
#   bash scripts/bench-sweep.sh > sweep.csv
# Expects a build in build/ (scripts/test.sh makes one). Ranks beyond the cores are
# oversubscribed, so only the traffic columns mean something here, not the times.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMP_PROC_BIND=false
echo "dist,algo,P,n,k,density,iters,time_s_med,time_s_max,bytes_per_rank_avg,bytes_per_rank_max,words_per_rank_max_over_k,nnz_out,wrong,nnz_out_avg,words_per_call_max_over_k,between_nodes_bytes_per_rank_max"
for dist in lognormal correlated:0.5; do
  for P in $(seq 2 16); do
    mpirun --oversubscribe -np "$P" build/apps/oktopk-bench/oktopk-bench --algo oktopk,topka \
      --n 4194304 --density 0.01 --iters 10 --warmup 5 --dist "$dist" --format csv 2>/dev/null |
      grep -v "^algo" | sed "s/^/$dist,/"
  done
done
