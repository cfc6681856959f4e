#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The bed runs behind docs/benchmarks.md, "Several ranks per host: flat and hierarchical"
# (root; about 12 minutes on 2 cores): dense, TopkA and Ok-Topk, flat and with
# hierarchical=on, on 2 and 4 emulated hosts of 2 ranks each (scripts/netbench.sh
# --ranks-per-host 2), n = 2^24, density 0.01, lognormal gradients drawn once per rank
# (--shifted-draws), 3 warm-up and 10 timed calls; one netbench run per row, so that the
# links' byte counters belong to it. Output: data/link-data/hierarchical/<rate>[-sparse]/
# H<hosts>_<method>_<mode>.txt
#   run.sh [--sparse-result] [--tag TAG] [RATE [HOSTS [METHODS]]]
#   (defaults: 1gbit, "2 4", "dense topka oktopk"; --tag TAG writes to <rate>-TAG instead)
# As run: run.sh; run.sh 100mbit 2 "topka oktopk"; run.sh --sparse-result 1gbit 2 oktopk;
# run.sh --tag split 1gbit 2 (the traffic inside and between nodes, beside the links').
set -u
cd "$(dirname "$0")/../../.."
flags=()
suffix=""
if [ "${1:-}" = --sparse-result ]; then
  flags=(--sparse-result)
  suffix=-sparse
  shift
fi
if [ "${1:-}" = --tag ]; then
  suffix="$suffix-${2:?run.sh: --tag needs a name}"
  shift 2
fi
rate=${1:-1gbit}
hosts=${2:-2 4}
methods=${3:-dense topka oktopk}
out=data/link-data/hierarchical/$rate$suffix
mkdir -p "$out"
for H in $hosts; do
  validate=""
  for method in $methods; do
    for mode in flat hier; do
      extra=("${flags[@]}")
      [ "$mode" = hier ] && extra+=(--option hierarchical=on)
      bash scripts/netbench.sh --hosts "$H" --ranks-per-host 2 --rate "$rate" $validate -- \
        build/apps/oktopk-bench/oktopk-bench --algo "$method" --n 16777216 --iters 10 --warmup 3 \
        --dist lognormal --shifted-draws --phases "${extra[@]}" > "$out/H${H}_${method}_$mode.txt" \
        2> /dev/null
      echo "H${H}_${method}_$mode: exit $?"
      validate=--no-validate
    done
  done
done
