#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A training fidelity check: runs a baseline training command and a candidate one, each of which
# prints one line "final test_acc=0.XXXX ...", and fails unless the candidate's accuracy is at
# most TOLERANCE (in accuracy, 0.005 = half a point) below the baseline's.
#   check_fidelity.sh [--require PATH] TOLERANCE BASELINE_COMMAND... ::: CANDIDATE_COMMAND...
# --require: exit 77 (skipped) when PATH, e.g. a dataset, does not exist. The commands' outputs
# are shown when the check fails, or when they print no accuracy.
set -uo pipefail
usage="usage: check_fidelity.sh [--require PATH] TOLERANCE BASELINE_COMMAND... ::: CANDIDATE_COMMAND..."
if [ "${1:-}" = --require ]; then
  [ -e "${2:-}" ] || { echo "check_fidelity.sh: skipped: ${2:-(no path)} does not exist"; exit 77; }
  shift 2
fi
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

base=$(accuracy "${baseline[@]}") || exit 1
cand=$(accuracy "${candidate[@]}") || exit 1
gap=$(awk -v b="$base" -v c="$cand" 'BEGIN { printf "%.4f", b - c }')
echo "baseline test_acc=$base candidate test_acc=$cand (candidate below baseline by $gap, allowed $tolerance)"
if awk -v g="$gap" -v t="$tolerance" 'BEGIN { exit !(g <= t) }'; then
  echo "fidelity: within tolerance"
else
  echo "fidelity: FAILED, the candidate trails the baseline by more than $tolerance"
  exit 1
fi
