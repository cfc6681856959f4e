#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Trains MODEL with every method at P ranks and prints a Markdown table of the final epoch:
#   bash scripts/train-table.sh MODEL P EPOCHS BATCH LR LR_DECAY [EXTRA_RUNS...]
# BATCH is the mini-batch per rank.
# EXTRA_RUNS are "algo:density" pairs added after the default ones (every method at 0.01).
# OKTOPK_TRAIN_ARGS: more oktopk-train flags for every run (e.g. "--seed 3" or
# "--momentum-correction off"). For lstm, test_acc is the test perplexity.
# Expects a build in build/ (scripts/main.sh or scripts/test.sh make one).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
model=$1 ranks=$2 epochs=$3 batch=$4 lr=$5 decay=$6; shift 6
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export OMP_PROC_BIND=false OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=1
runs=(dense:1 topka:0.01 topkdsa:0.01 gtopk:0.01 gaussiank:0.01 oktopk:0.01 s2:0.01 "$@")
echo "| model | algo | density | epochs | batch | test_acc | train_loss | s/epoch | bytes/rank/step | achieved density |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for run in "${runs[@]}"; do
  algo=${run%%:*} density=${run##*:}
  csv=$(mktemp)
  # shellcheck disable=SC2086  # OKTOPK_TRAIN_ARGS is split into flags on purpose
  mpirun --oversubscribe -np "$ranks" build/apps/oktopk-train/oktopk-train --model "$model" \
    --algo "$algo" --density "$density" --epochs "$epochs" --batch "$batch" --lr "$lr" \
    --lr-decay "$decay" --csv "$csv" ${OKTOPK_TRAIN_ARGS:-} > /dev/null 2>&1 ||
    { echo "| $model | $algo | $density | $epochs | $batch | FAILED | | | | |"; continue; }
  # Accuracy and loss of the last epoch; seconds, bytes and density averaged over epochs.
  awk -F, -v m="$model" -v a="$algo" -v d="$density" -v e="$epochs" -v b="$batch" 'NR > 1 {
      s += $4; acc = $3; loss = $2; bytes += $5; dens += $6 }
    END { n = NR - 1; printf "| %s | %s | %s | %s | %s | %.4f | %.4f | %.2f | %.0f | %.5f |\n",
          m, a, d, e, b, acc, loss, s / n, bytes / n, dens / n }' "$csv"
  rm -f "$csv"
done
