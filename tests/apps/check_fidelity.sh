#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A training fidelity check: runs a baseline training command and a candidate one, each of which
# prints one line "final test_acc=0.XXXX ...", and fails unless the candidate's accuracy is at
# most TOLERANCE (in accuracy, 0.005 = half a point) below the baseline's.
#   check_fidelity.sh [--require PATH] [--skip-if REGEX] [--seeds "S1 S2 ..."] TOLERANCE
#                     BASELINE_COMMAND... ::: CANDIDATE_COMMAND...
# --require: exit 77 (skipped) when PATH, e.g. a dataset, does not exist.
# --skip-if: exit 77 (skipped) when a command fails with a line matching REGEX (grep -E), e.g.
# a program's message that this PyTorch lacks what it needs.
# --seeds: run both commands once per seed, with "--seed S" appended, and compare the means (a
# single seed's gap swings by most of a point with the arithmetic: docs/benchmarks.md, "The
# 3-epoch MLP result and the thread count").
# The commands' outputs are shown when the check fails, or when they print no accuracy.
set -uo pipefail
usage='usage: check_fidelity.sh [--require PATH] [--skip-if REGEX] [--seeds "S1 S2 ..."]'
usage+=' TOLERANCE BASELINE_COMMAND... ::: CANDIDATE_COMMAND...'
seeds=("")
skip_if=""
while [ $# -gt 0 ]; do
  case $1 in
    --require)
      [ -e "${2:-}" ] ||
        { echo "check_fidelity.sh: skipped: ${2:-(no path)} does not exist"; exit 77; }
      shift 2 ;;
    --skip-if)
      [ -n "${2:-}" ] || { echo "$usage" >&2; exit 2; }
      skip_if=$2
      shift 2 ;;
    --seeds)
      read -r -a seeds <<< "${2:-}"
      [ ${#seeds[@]} -gt 0 ] || { echo "$usage" >&2; exit 2; }
      shift 2 ;;
    *) break ;;
  esac
done
[ $# -ge 4 ] || { echo "$usage" >&2; exit 2; }
tolerance=$1; shift
baseline=() candidate=()
while [ $# -gt 0 ] && [ "$1" != ":::" ]; do baseline+=("$1"); shift; done
[ $# -gt 1 ] || { echo "$usage" >&2; exit 2; }
shift
candidate=("$@")

# Runs a command; prints its accuracy, or fails with its output.
accuracy() {
  local log
  log=$(mktemp)
  if ! "$@" > "$log" 2>&1; then
    if [ -n "$skip_if" ] && grep -Eq -- "$skip_if" "$log"; then
      echo "check_fidelity.sh: skipped: $(grep -Em1 -- "$skip_if" "$log")" >&2; rm -f "$log"
      return 77
    fi
    echo "check_fidelity.sh: failed: $*" >&2; cat "$log" >&2; rm -f "$log"; return 1
  fi
  local value
  value=$(sed -n 's/^final test_acc=\([0-9.]*\).*/\1/p' "$log")
  if [ "$(printf '%s\n' "$value" | grep -c .)" -ne 1 ]; then
    echo "check_fidelity.sh: no single 'final test_acc=' line from: $*" >&2; cat "$log" >&2
    rm -f "$log"; return 1
  fi
  rm -f "$log"
  echo "$value"
}

base_values=() cand_values=()
for seed in "${seeds[@]}"; do
  extra=()
  [ -n "$seed" ] && extra=(--seed "$seed")
  base=$(accuracy "${baseline[@]}" "${extra[@]}") || exit $?
  cand=$(accuracy "${candidate[@]}" "${extra[@]}") || exit $?
  echo "${seed:+seed $seed: }baseline test_acc=$base candidate test_acc=$cand"
  base_values+=("$base") cand_values+=("$cand")
done
mean() { printf '%s\n' "$@" | awk '{ s += $1 } END { printf "%.4f", s / NR }'; }
base=$(mean "${base_values[@]}") cand=$(mean "${cand_values[@]}")
gap=$(awk -v b="$base" -v c="$cand" 'BEGIN { printf "%.4f", b - c }')
echo "baseline mean $base, candidate mean $cand: the candidate is $gap below (allowed $tolerance)"
if [ ${#seeds[@]} -gt 1 ]; then
  # The spread of the per-seed gaps, from which a test's tolerance is derived.
  paste -d ' ' <(printf '%s\n' "${base_values[@]}") <(printf '%s\n' "${cand_values[@]}") |
    awk '{ d[NR] = $1 - $2; s += d[NR] }
         END { m = s / NR; for (i = 1; i <= NR; i++) v += (d[i] - m) ^ 2
               sd = sqrt(v / (NR - 1))
               printf "per-seed gaps: standard deviation %.4f, standard error of the mean %.4f\n",
                      sd, sd / sqrt(NR) }'
fi
if awk -v g="$gap" -v t="$tolerance" 'BEGIN { exit !(g <= t) }'; then
  echo "fidelity: within tolerance"
else
  echo "fidelity: FAILED, the candidate trails the baseline by more than $tolerance"
  exit 1
fi
