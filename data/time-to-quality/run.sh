#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The runs behind docs/benchmarks.md, "Time to quality on the emulated cluster" (root): the
# embedding-heavy language model (oktopk-train --model lstm, vocabulary 10,000, embedding 1024,
# 64 LSTM units: 11,168,784 parameters) trained on 4 emulated hosts at 1 Gbit/s
# (scripts/netbench.sh), 4 windows of 20 words per rank per step, SGD learning rate 1, momentum
# 0.9, epochs of 50 steps (the test perplexity after every one, outside the timed steps).
# Output: data/time-to-quality/<variant>.csv (oktopk-train --csv) and <variant>.log.
#   run.sh VARIANT EPOCHS
# VARIANT: dense-fp32-mpi, dense-fp32-ring, dense-bf16, dense-fp32-overlap, dense-bf16-overlap,
# oktopk, topka, gaussiank (density 0.01 for the sparse methods, momentum correction on).
set -eu -o pipefail
cd "$(dirname "$0")/../.."
variant=${1:?run.sh VARIANT EPOCHS}
epochs=${2:?run.sh VARIANT EPOCHS}
case $variant in
  dense-fp32-mpi) flags=(--algo dense) ;;
  dense-fp32-ring) flags=(--algo dense --option dense_allreduce=ring) ;;
  dense-bf16) flags=(--algo dense --wire bf16) ;;
  dense-fp32-overlap) flags=(--algo dense --overlap on) ;;
  dense-bf16-overlap) flags=(--algo dense --wire bf16 --overlap on) ;;
  oktopk | topka | gaussiank) flags=(--algo "$variant" --density 0.01) ;;
  *) echo "run.sh: unknown variant '$variant'" >&2; exit 2 ;;
esac
out=data/time-to-quality
export OMP_WAIT_POLICY=passive OPENBLAS_NUM_THREADS=1 OMP_PROC_BIND=false
bash scripts/netbench.sh --hosts 4 --rate 1gbit --no-validate \
  --mpirun-arg -x --mpirun-arg OMP_WAIT_POLICY --mpirun-arg -x --mpirun-arg OPENBLAS_NUM_THREADS -- \
  build/apps/oktopk-train/oktopk-train --model lstm --vocab 10000 --embed 1024 --hidden 64 \
  --batch 4 --bptt 20 --lr 1 --steps-per-epoch 50 --epochs "$epochs" "${flags[@]}" \
  --csv "$PWD/$out/$variant.csv" 2>&1 | grep -v "^\[" > "$out/$variant.log"
