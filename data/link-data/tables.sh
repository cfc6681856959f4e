#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The tables of docs/benchmarks.md, "Time on links", from the runs of run.sh: per rate, alpha
# and beta fitted on the rate's own MPI_Allreduce rows and 32-byte check phases (each P apart),
# the compute term from one P = 1 run of every method (compute_P1.csv) and the copy bandwidth
# of oktopk-kernel-bench (kernel_bench.csv), then every row beside its prediction and its
# counted floor; after the 1gbit table, a paragraph on Ok-Topk's and dense's floors at P = 4,
# n = 2^24, density 0.01.
set -eu
cd "$(dirname "$0")/../.."
D=data/link-data
A="/usr/bin/python3 scripts/alphabeta.py"
copy_gbs=$(awk -F, '$1 == "copy" { for (i = 1; i <= NF; ++i) if (h[i] == "gb_per_s") print $i }
                    $1 == "kernel" { for (i = 1; i <= NF; ++i) h[i] = $i }' $D/kernel_bench.csv)
for rate in 1gbit 10gbit; do
  runs=$(ls $D/${rate}_P*_n*_d*.csv 2>/dev/null | grep -v trace || true)
  [ -n "$runs" ] || continue
  base=$(ls $D/${rate}_P*_n*_d0.01.csv | grep -v -e _oktopk -e _s2 -e trace)
  $A fit --network $base --small $base --compute $D/compute_P1.csv \
    --kernel-bench $D/kernel_bench.csv --cores 2 --out $D/params_$rate.json > $D/fit_$rate.txt
  largest=$(ls $D/${rate}_P*_n24_d0.01_oktopk.csv | sort -V | tail -1)
  echo "### $rate"
  echo
  note=()
  if [ $rate = 1gbit ]; then note=(--note 4:16777216:0.01); fi
  $A table --params $D/params_$rate.json --rate $rate --mem-bw "$copy_gbs" \
    --counts ${largest%.csv}.trace.csv:$largest "${note[@]}" $runs
  echo
done
