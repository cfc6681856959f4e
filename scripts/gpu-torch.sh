#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The PyTorch checks for a machine with a GPU: the Transformer language model
# (apps/torch-ddp-lm/train.py) on CUDA tensors through plain DDP, PyTorch's PowerSGD hook
# (rank 4) and OkTopk's hook at density 0.01, P ranks sharing the GPUs (gloo), the same steps
# and seed for all three; then OkTopk's exact top-k selection against torch.topk on the same
# tensors (apps/torch-topk-bench/bench.py, n = 2^24 and 2^26). Writes what they print to
# LOGDIR/log and ends with the final line of each run.
#
#   scripts/gpu-torch.sh [--device cuda|cpu] [--np P] [--steps S] [--n "N..."] LOGDIR
#     (defaults: cuda, 2, 300, "16777216 67108864")
#
# Needs, in the environment: python3 with torch, mpi4py and the oktopk package on PYTHONPATH
# (a build of OkTopk for CUDA, for --device cuda), mpiexec, and the King James Bible text
# (OKTOPK_KJV_TEXT, default build/data/kjv-verses.txt: scripts/kjv-corpus.sh makes it).
# --device cpu runs the same on the CPU, as the test suite does (gpu_torch_cpu).
set -u
case ${1:-} in -h|--help) sed -n '3,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
device=cuda np=2 steps=300 sizes="16777216 67108864"
while [ $# -gt 1 ]; do
  case $1 in
    --device) device=${2:?}; shift 2 ;;
    --np) np=${2:?}; shift 2 ;;
    --steps) steps=${2:?}; shift 2 ;;
    --n) sizes=${2:?}; shift 2 ;;
    *) echo "gpu-torch.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
[ $# -eq 1 ] || { echo "gpu-torch.sh: name the log folder (--help)" >&2; exit 2; }
case $device in cuda|cpu) ;; *) echo "gpu-torch.sh: --device cuda or cpu, not '$device'" >&2; exit 2 ;; esac
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
logdir=$1
mkdir -p "$logdir"
exec > >(tee -a "$logdir/log") 2>&1
python=${OKTOPK_PYTHON:-python3}
text=${OKTOPK_KJV_TEXT:-$root/build/data/kjv-verses.txt}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMP_PROC_BIND=false
t0=$SECONDS
stamp() { echo "=== [$((SECONDS - t0)) s] $*"; }
status=0
finals=()
for hook in none powersgd oktopk; do
  stamp "language model, --hook $hook, $np ranks, $steps steps, $device"
  out=$(mpiexec --oversubscribe -n "$np" "$python" -m mpi4py "$root/apps/torch-ddp-lm/train.py" \
          --data "$text" --hook "$hook" --density 0.01 --steps "$steps" --device "$device" \
          --start-iter 10 --log-every 50 2>&1)
  rc=$?
  echo "$out"
  echo "rc=$rc"
  ((rc == 0)) || status=1
  finals+=("$hook: $(echo "$out" | grep '^final' | tail -n 1)")
done
stamp "selection: oktopk against torch.topk, n = $sizes"
# shellcheck disable=SC2086  # the sizes are words
"$python" "$root/apps/torch-topk-bench/bench.py" --device "$device" --n $sizes --reps 10
rc=$?
echo "rc=$rc"
((rc == 0)) || status=1
stamp "done"
printf '%s\n' "${finals[@]}"
exit "$status"
