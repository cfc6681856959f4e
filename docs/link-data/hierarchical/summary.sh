#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# One line per run of run.sh in DIR: the median and max over the timed calls of a call's time
# (s), the library's bytes per rank per call (all of them, and those of the node_ phases, inside
# the host), the bytes each host's link carried up per call (the shapers' counters over the
# 13 calls, the handle's set-up included, over 13), and the output's non-zeros.
dir=${1:?usage: summary.sh DIR}
for f in "$dir"/H*.txt; do
  tag=$(basename "${f%.txt}")
  awk -v tag="$tag" '
    $1 ~ /^(dense|topka|oktopk)$/ && $2 ~ /^[0-9]+$/ && NF > 10 { med = $7; max = $8; lib = $10; nnz = $12 }
    $2 ~ /^node_/ && NF == 5 { node += $5 }
    /oktopk-nb-h[0-9]+:/ { split($0, a, /[:,]/); up += a[2]; hosts++ }
    END { printf "%-18s %8.4f %8.4f %11.0f %11.0f %11.0f %9s\n", tag, med, max, lib, node, up / 13 / hosts, nnz }' "$f"
done
