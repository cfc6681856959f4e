#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The bed runs behind docs/benchmarks.md, "Time on links" (root; about 45 minutes on 2 cores):
# every method at P = 2, 4, 8 hosts, n = 2^24 and 2^26, density 0.01 and 0.001, 1 and 10 Gbit/s,
# through scripts/netbench.sh. The first run of each bed validates it (dense at least at the
# ring bound). Gradients: --dist correlated:0.5 --shifted-draws (drawn once per rank, rotated
# and sign-flipped per call: drawing 2^26 normals per call would take longer than most calls).
# S2 decodes all n entries of these dense gradients on every rank (seconds per call
# on 2 cores), so it runs apart with fewer calls; Ok-Topk runs apart with more warm-up calls.
# `--only RATE:P` limits the sweep, e.g. to repeat one bed. Output:
# data/link-data/<rate>_P<P>_n<e>_d<density>[_oktopk|_s2].{csv,log}, and Ok-Topk's message
# traces (*.trace.csv).
set -u
cd "$(dirname "$0")/../.."
B=${OKTOPK_BENCH:-build/apps/oktopk-bench/oktopk-bench}  # the binary measured
D=data/link-data
only=${2:-}
[ "${1:-}" = --only ] || only=""
export OMP_NUM_THREADS=1 OMP_PROC_BIND=false OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for rate in 1gbit 10gbit; do
  for P in 2 4 8; do
    [ -n "$only" ] && [ "$only" != "$rate:$P" ] && continue
    validate=""
    for e in 24 26; do
      for d in 0.01 0.001; do
        name=${rate}_P${P}_n${e}_d${d}
        echo "$(date +%T) $name" >&2
        bash scripts/netbench.sh --hosts $P --rate $rate $validate -- \
          $B --algo dense,topka,topkdsa,gtopk,gaussiank --mpi-baseline --n $((1 << e)) \
          --density $d --dist correlated:0.5 --shifted-draws --iters 3 --warmup 1 --format csv \
          --phases > $D/$name.csv 2> $D/$name.log
        # Ok-Topk's thresholds adapt over its first calls: 8 warm-up calls reach its steady
        # state (at P = 2, n = 2^22, commit e1b6b64, its words per k go 4.4, 1.9, 1.8, 1.9 after
        # 1, 8, 16, 40).
        bash scripts/netbench.sh --hosts $P --rate $rate --no-validate -- \
          $B --algo oktopk --n $((1 << e)) --density $d --dist correlated:0.5 --shifted-draws \
          --iters 3 --warmup 8 --format csv --phases --trace $D/${name}_oktopk.trace.csv \
          > $D/${name}_oktopk.csv 2> $D/${name}_oktopk.log
        validate=--no-validate
        iters=2; [ $e = 26 ] && iters=1
        bash scripts/netbench.sh --hosts $P --rate $rate --no-validate -- \
          $B --algo s2 --n $((1 << e)) --density $d --dist correlated:0.5 --shifted-draws \
          --iters $iters --warmup 0 --format csv > $D/${name}_s2.csv 2> $D/${name}_s2.log
      done
    done
  done
done
echo links-done >&2
