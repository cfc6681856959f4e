#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# oktopk-train's sparse result against its dense one, for ctest.
#
#   check_train_sparse_result.sh -- COMMAND...
#       COMMAND (oktopk-train through mpiexec, with its training flags) runs twice, with
#       --sparse-result on and off. The first must say "result=sparse" and the second
#       "result=dense"; both must print the same epoch lines (all columns but seconds) and the
#       same "final parameter_digest=": the step applied to the result's entries alone updates
#       the parameters exactly as the step over all of them does.
set -u

fail() {
  echo "check_train_sparse_result: $*" >&2
  exit 1
}

[ "${1:-}" = -- ] || fail "usage: -- COMMAND..."
shift

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

run "$scratch/sparse" "$@" --sparse-result on
run "$scratch/dense" "$@" --sparse-result off
grep -q ' result=sparse ' "$scratch/sparse" || fail "--sparse-result on did not say result=sparse"
grep -q ' result=dense ' "$scratch/dense" || fail "--sparse-result off did not say result=dense"

# Epoch lines without their seconds column (the 4th), and the final lines.
summary() {
  awk '/^ +[0-9]+ / { $4 = ""; print } /^final / { print }' "$1"
}
summary "$scratch/sparse" > "$scratch/sparse.summary"
summary "$scratch/dense" > "$scratch/dense.summary"
grep -q '^final parameter_digest=' "$scratch/sparse.summary" || fail "no final digest"
diff "$scratch/sparse.summary" "$scratch/dense.summary" >&2 ||
  fail "the sparse result trained other parameters than the dense one"
echo "check_train_sparse_result: the same epochs and parameters with either result"
