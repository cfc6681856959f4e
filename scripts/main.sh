#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Installs what is missing, builds into build/, and runs the main job: data-parallel training of
# the MLP on Fashion-MNIST with 4 ranks, first with Ok-Topk at density 0.01, then with a dense
# allreduce, and prints accuracy, time and bytes per rank side by side.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
oktopk_setup
oktopk_configure_and_build oktopk-train
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=1
# Four ranks on fewer cores: each rank's Kokkos would warn of oversubscription, and the four
# warnings would interleave with the results.
export KOKKOS_DISABLE_WARNINGS=ON
epochs=${OKTOPK_EPOCHS:-5}
train() {  # $1 = algorithm; the per-epoch CSV lands in build/main-$1.csv
  mpirun --oversubscribe -np 4 "$OKTOPK_BUILD_DIR/apps/oktopk-train/oktopk-train" \
    --model mlp --algo "$1" --density 0.01 --epochs "$epochs" --lr 0.05 --lr-decay 0.8 \
    --csv "$OKTOPK_BUILD_DIR/main-$1.csv" "${@:2}"
}
train oktopk
train dense
echo
echo "4 ranks, MLP, $epochs epochs          test_acc  seconds  bytes/rank/step"
for algo in oktopk dense; do
  awk -F, -v a="$algo" 'NR > 1 { s += $4; acc = $3; b += $5; n++ }
    END { printf "%-33s %9.4f %8.1f %16.0f\n", a (a == "oktopk" ? " (density 0.01)" : ""), acc, s, b / n }' \
    "$OKTOPK_BUILD_DIR/main-$algo.csv"
done
awk -F, 'FNR > 1 { b[FILENAME] += $5; n[FILENAME]++ }
  END { for (f in b) m[f] = b[f] / n[f];
        printf "dense moves %.0fx the bytes of oktopk\n", m[ARGV[2]] / m[ARGV[1]] }' \
  "$OKTOPK_BUILD_DIR/main-oktopk.csv" "$OKTOPK_BUILD_DIR/main-dense.csv"
