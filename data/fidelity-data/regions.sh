#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# What fixed regions cost Ok-Topk's reduce_scatter (docs/benchmarks.md, "Balanced regions
# against fixed shards"): the same calls with the regions balanced by where the local selections
# lie (the default) and fixed at the equal shards (--option equal_regions=on, where a region's
# entries are its owner's shard and nothing is sent on to the shards' owners), on correlated
# synthetic gradients and on the MLP's training gradients, dumped at the same P and replayed.
# Prints one markdown row per gradient source, P and region choice: the mean over calls of the
# max over ranks of the bytes a rank moved, the worst call's words per k, and the split-and-reduce
# phase's bytes (max over ranks) and time (median over calls of the max over ranks).
# Usage: data/fidelity-data/regions.sh [P...] (default: 4 8). The gradient files go to
# $OKTOPK_REPLAY_DIR (default /tmp) and are removed afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."
case ${1:-} in -h|--help) sed -n '3,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMP_PROC_BIND=false
train=build/apps/oktopk-train/oktopk-train
bench=build/apps/oktopk-bench/oktopk-bench
dir=${OKTOPK_REPLAY_DIR:-/tmp}
ranks=("$@")
((${#ranks[@]})) || ranks=(4 8)
steps=60
# One bench run: prints "bytes_max words_per_call split_bytes split_seconds call_seconds".
measure() {
  local np=$1
  shift
  mpirun --oversubscribe -np "$np" $bench --algo oktopk --reduce-scatter --density 0.01 \
    --phases --format csv "$@" 2>/dev/null |
    awk -F, '$1 == "oktopk" && NF == 16 { bytes = $10; words = $15; call = $7 }
             $1 == "oktopk" && $2 == "split_reduce" { split_bytes = $5; split_time = $3 }
             END { print bytes, words, split_bytes, split_time, call }'
}
echo "| gradients | P | regions | bytes per rank, max over ranks | worst call's words per k | split_reduce bytes | split_reduce ms | call ms |"
echo "|---|---|---|---|---|---|---|---|"
for np in "${ranks[@]}"; do
  file=$dir/oktopk-regions-mlp-p$np.okg
  trap 'rm -f "$file"' EXIT
  mpirun --oversubscribe -np "$np" $train --model mlp --epochs 1 --seed 3 --density 0.01 \
    --batch 64 --lr 0.05 --algo dense --dump-gradients "$file" --dump-steps $steps \
    --steps-per-epoch $steps > /dev/null 2>&1
  names=("correlated, rho 0.9, n = 2^20" "MLP training")
  sources=("--dist correlated:0.9 --n 1048576 --iters 20 --warmup 5"
           "--dist file:$file --iters $((steps - 10)) --warmup 10")
  for s in 0 1; do
    for regions in balanced equal; do
      extra=()
      [ $regions = equal ] && extra=(--option equal_regions=on)
      # shellcheck disable=SC2086
      read -r bytes words split_bytes split_seconds call_seconds \
        <<< "$(measure "$np" ${sources[$s]} "${extra[@]}")"
      awk -v g="${names[$s]}" -v p="$np" -v r="$regions" -v b="$bytes" -v w="$words" \
          -v sb="$split_bytes" -v st="$split_seconds" -v c="$call_seconds" 'BEGIN {
        printf "| %s | %d | %s | %.0f | %.2f | %.0f | %.3f | %.3f |\n", g, p, r, b, w, sb,
               1000 * st, 1000 * c }'
    done
  done
  rm -f "$file"
done
