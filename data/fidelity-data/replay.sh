#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Ok-Topk on replayed training gradients (docs/benchmarks.md, "Ok-Topk on replayed training
# gradients"): dumps each model's local gradients of its first dense training steps at P = 4
# (200 steps; 100 for the language model, whose gradient is 2 M floats), then replays them
# through oktopk-bench with three threshold settings (10 calls untimed, the rest timed and
# checked against the oracle) and prints one markdown row per trace and setting.
# Usage: data/fidelity-data/replay.sh [--velocities] [MODEL...] (default: mlp cnn lstm; lstm
# needs the King James text, see docs/tutorial.md). --velocities dumps what Ok-Topk's allreduce
# is given in training instead, the velocities of Ok-Topk training with momentum correction
# (oktopk-train's default). The gradient files (up to 3.3 GB for lstm) go to
# $OKTOPK_REPLAY_DIR (default /tmp) and are removed afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMP_PROC_BIND=false
train=build/apps/oktopk-train/oktopk-train
bench=build/apps/oktopk-bench/oktopk-bench
dir=${OKTOPK_REPLAY_DIR:-/tmp}
source_algo=dense
if [ "${1:-}" = --velocities ]; then
  source_algo=oktopk
  shift
fi
models=("$@")
((${#models[@]})) || models=(mlp cnn lstm)
declare -A schedule=([mlp]="--batch 64 --lr 0.05" [cnn]="--batch 32 --lr 0.01" [lstm]="")
declare -A steps=([mlp]=200 [cnn]=200 [lstm]=100)
settings=("defaults:"
          "reference:--option guard_low=0 --option guard_factor=1.3333 --option guard_exact=off --option repartition_period=64"
          "two-sided, no fallback, tau 64:--option guard_exact=off --option repartition_period=64")
echo "| model | n | k | setting | output / k | words per k, mean (max over ranks) | worst call's words per k | wrong |"
echo "|---|---|---|---|---|---|---|---|"
for model in "${models[@]}"; do
  file=$dir/oktopk-replay-$model.okg
  trap 'rm -f "$file"' EXIT
  # shellcheck disable=SC2086
  mpirun --oversubscribe -np 4 $train --model "$model" --epochs 1 --seed 3 --density 0.01 \
    ${schedule[$model]} --algo "$source_algo" --dump-gradients "$file" \
    --dump-steps "${steps[$model]}" --steps-per-epoch "${steps[$model]}" > /dev/null
  for s in "${settings[@]}"; do
    name=${s%%:*} options=${s#*:}
    # shellcheck disable=SC2086
    row=$(mpirun --oversubscribe -np 4 $bench --algo oktopk --dist "file:$file" \
      --iters $((steps[$model] - 10)) \
      --warmup 10 --density 0.01 --format csv --check $options 2>/dev/null | grep '^oktopk,')
    awk -F, -v model="$model" -v name="$name" '{
      printf "| %s | %s | %s | %s | %.3f | %.2f | %.2f | %s |\n", model, $3, $4, name, $14 / $4, $11, $15, $13
    }' <<< "$row"
  done
  rm -f "$file"
done
