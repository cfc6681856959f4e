#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The bed runs behind docs/scaling.md, as run (as root, about 6 minutes). The P = 1 compute
# runs were repeated by hand with the OMPI_ALLOW_* variables, which the first pass lacked.
set -u
cd "$(dirname "$0")/../.."
B=build/apps/oktopk-bench/oktopk-bench
D=data/scaling-data
export OMP_NUM_THREADS=1 OMP_PROC_BIND=false OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for P in 2 4 8; do
  # alpha/beta fit: MPI_Allreduce (and dense) at four sizes
  for e in 16 18 20 22; do
    bash scripts/netbench.sh --hosts $P --rate 1gbit --no-validate -- \
      $B --algo dense --mpi-baseline --n $((1 << e)) --iters 5 --warmup 1 --format csv \
      > $D/fit_P${P}_n2e${e}.csv 2> $D/fit_P${P}_n2e${e}.log
  done
  n=4194304; [ $P = 8 ] && n=2097152
  bash scripts/netbench.sh --hosts $P --rate 1gbit -- \
    $B --algo all --mpi-baseline --n $n --iters 5 --warmup 2 --format csv --phases \
    --trace $D/trace_P${P}.csv > $D/bed_P${P}.csv 2> $D/bed_P${P}.log
done
# compute term: every method alone (P = 1, no messages), same sizes
for n in 4194304 2097152; do
  mpirun -np 1 $B --algo all --n $n --iters 5 --warmup 2 --format csv > $D/compute_P1_n$n.csv 2>/dev/null
done
build/apps/oktopk-kernel-bench/oktopk-kernel-bench --n 4194304 --reps 5 --format csv > $D/kernel_bench.csv 2>/dev/null
echo bed-done
