#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# One line per run of run.sh in DIR: the median and max over the timed calls of a call's time
# (s), the library's bytes per rank per call (all of them; those of the node_ phases, inside
# the host; and those between nodes, '-' in runs made before the library split them), the
# bytes each host's link carried up per call (the shapers' counters over the 13 calls, the
# handle's set-up included, over 13), and the output's non-zeros.
dir=${1:?usage: summary.sh DIR}
for f in "$dir"/H*.txt; do
  tag=$(basename "${f%.txt}")
  awk -v tag="$tag" '
    BEGIN { between = "-" }
    $1 ~ /^(dense|topka|oktopk)$/ && $2 ~ /^[0-9]+$/ && NF > 10 {
      med = $7; max = $8; lib = $10; nnz = $12; if (NF >= 16) between = sprintf("%.0f", $16)
    }
    $2 ~ /^node_/ && (NF == 5 || NF == 6) { node += $5 }
    /oktopk-nb-h[0-9]+:/ { split($0, a, /[:,]/); up += a[2]; hosts++ }
    END {
      printf "%-18s %8.4f %8.4f %11.0f %11.0f %11s %11.0f %9s\n", tag, med, max, lib, node,
             between, up / 13 / hosts, nnz
    }' "$f"
done
