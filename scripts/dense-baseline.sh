#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The dense method against a bare MPI_Allreduce of the same gradients (oktopk-bench
# --mpi-baseline: both rows from one run), per dense_allreduce choice and size, over several
# rounds that alternate the choices; prints, per size and choice, the median over rounds of
# dense / bare (each a median over calls of the max over ranks) and the rounds' ratios.
#
#   scripts/dense-baseline.sh [--np P] [--rounds R] [--sizes "20 22 24"] [--modes "auto mpi ring"]
#                             [--iters I]
#
# Sizes are powers of two (n = 2^E). Expects a build in build/ (scripts/test.sh makes one).
# Ranks beyond the cores share them: times then move with the scheduler, hence the rounds.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
np=4 rounds=5 sizes="20 22 24" modes="auto mpi ring" iters=20
while [ $# -gt 0 ]; do
  case $1 in
    --np) np=${2:?--np P}; shift 2 ;;
    --rounds) rounds=${2:?--rounds R}; shift 2 ;;
    --sizes) sizes=${2:?--sizes LIST}; shift 2 ;;
    --modes) modes=${2:?--modes LIST}; shift 2 ;;
    --iters) iters=${2:?--iters I}; shift 2 ;;
    -h|--help) sed -n '3,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "dense-baseline.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
bench=build/apps/oktopk-bench/oktopk-bench
[ -x "$bench" ] || { echo "dense-baseline.sh: $bench is missing: run scripts/test.sh" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMP_PROC_BIND=false
results=$(mktemp)
trap 'rm -f "$results"' EXIT
for round in $(seq 1 "$rounds"); do
  for e in $sizes; do
    for mode in $modes; do
      echo "dense-baseline: round $round/$rounds, n = 2^$e, $mode" >&2
      mpirun --oversubscribe -np "$np" "$bench" --algo dense --n $((1 << e)) --iters "$iters" \
        --warmup 3 --mpi-baseline --dense-allreduce "$mode" --format csv 2>/dev/null |
        awk -F, -v e="$e" -v m="$mode" '$1 == "dense" {d = $7} $1 == "mpi_allreduce" {b = $7}
          END {if (d == "" || b == "") exit 1; printf "%s %s %.6g %.6g %.4f\n", e, m, d, b, d / b}' \
        >>"$results"
    done
  done
done
echo "P = $np, $rounds rounds of $iters timed calls (median over calls of the max over ranks)"
echo "| n | dense_allreduce | dense, ms (median) | bare, ms (median) | dense / bare, median | per round |"
echo "|---|---|---|---|---|---|"
for e in $sizes; do
  for mode in $modes; do
    awk -v e="$e" -v m="$mode" '
      function median(a, k,   i, j, t) {
        for (i = 1; i <= k; ++i) for (j = i + 1; j <= k; ++j) if (a[j] < a[i]) {t = a[i]; a[i] = a[j]; a[j] = t}
        return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
      }
      $1 == e && $2 == m {++k; d[k] = $3; b[k] = $4; r[k] = $5; list = list sprintf(" %.2f", $5)}
      END {printf "| 2^%s | %s | %.2f | %.2f | %.2f |%s |\n", e, m, 1e3 * median(d, k),
                  1e3 * median(b, k), median(r, k), list}' "$results"
  done
done
