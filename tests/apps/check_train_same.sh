#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Two ways of running oktopk-train that must train the same parameters, for ctest.
#
#   check_train_same.sh FLAG MARK COLUMNS -- COMMAND...
#       COMMAND (oktopk-train through mpiexec, with its training flags) runs twice, with
#       "FLAG on" and "FLAG off". MARK is the word the first run's header must hold, or two
#       words "ON/OFF", one for each run's header ("result=sparse/result=dense"); a single
#       word must then be missing from the second run's header. Both runs
#       must print the same epoch lines, columns COLUMNS (comma-separated numbers: seconds, say,
#       which differ between any two runs) left out, and the same "final parameter_digest=".
#   Used for --sparse-result (the step applied to the result's entries alone updates the
#   parameters exactly as the step over all of them) and --overlap (at P = 2 the buckets summed
#   during the backward pass give the blocking allreduce's average bit for bit).
set -u

fail() {
  echo "check_train_same: $*" >&2
  exit 1
}

flag=${1:?FLAG} mark=${2:?MARK} columns=${3:?COLUMNS}
shift 3
[ "${1:-}" = -- ] || fail "usage: FLAG MARK COLUMNS -- COMMAND..."
shift
mark_on=${mark%%/*}
mark_off=${mark#*/}

scratch=$(mktemp -d) || fail "cannot create a scratch folder"
trap 'rm -rf "$scratch"' EXIT

# run OUT COMMAND...: stdout (rank 0's lines) to OUT, stderr apart.
run() {
  local out=$1
  shift
  echo "+ $*" >&2
  "$@" > "$out" 2> "$out.err"
  local code=$?
  cat "$out"
  [ "$code" -eq 0 ] || { cat "$out.err" >&2; fail "exit code $code: $*"; }
}

run "$scratch/on" "$@" "$flag" on
run "$scratch/off" "$@" "$flag" off
grep -q " $mark_on " "$scratch/on" || fail "$flag on did not say $mark_on"
if [ "$mark_off" != "$mark" ]; then
  grep -q " $mark_off " "$scratch/off" || fail "$flag off did not say $mark_off"
elif grep -q " $mark_on " "$scratch/off"; then
  fail "$flag off said $mark_on"
fi

# Epoch lines without the COLUMNS, and the final lines.
summary() {
  awk -v drop="$columns" 'BEGIN { n = split(drop, d, ",") }
    /^ +[0-9]+ / { for (i = 1; i <= n; ++i) $d[i] = ""; print } /^final / { print }' "$1"
}
summary "$scratch/on" > "$scratch/on.summary"
summary "$scratch/off" > "$scratch/off.summary"
grep -q '^final parameter_digest=' "$scratch/on.summary" || fail "no final digest"
[ "$(grep -vc '^final ' "$scratch/on.summary")" -ge 1 ] || fail "no epoch lines"
diff "$scratch/on.summary" "$scratch/off.summary" >&2 ||
  fail "$flag on trained other parameters than $flag off"
echo "check_train_same: the same epochs and parameters with $flag on and off"
