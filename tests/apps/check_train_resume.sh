#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Checkpoint and restart of oktopk-train, for ctest.
#
#   check_train_resume.sh EPOCHS STOP SCRATCH [--checkpoint-every N] -- COMMAND...
#       COMMAND (oktopk-train through mpiexec, with its training flags) runs three times:
#       EPOCHS epochs uninterrupted; STOP epochs with --checkpoint (and --checkpoint-every N if
#       given); then EPOCHS epochs with --resume. The resumed run must end with the same
#       "final parameter_digest=" and "final test_acc=" (lstm: "final test_ppl=") lines, and
#       print the same lines as the uninterrupted run for the epochs it runs (all columns but
#       seconds). Checkpoints go to SCRATCH/ckpt.rank<R>.
set -u

fail() {
  echo "check_train_resume: $*" >&2
  exit 1
}

epochs=${1:?EPOCHS}
stop=${2:?STOP}
scratch=${3:?SCRATCH}
shift 3
every=()
if [ "${1:-}" = --checkpoint-every ]; then
  every=(--checkpoint-every "${2:?N}")
  shift 2
fi
[ "${1:-}" = -- ] || fail "usage: EPOCHS STOP SCRATCH [--checkpoint-every N] -- COMMAND..."
shift

rm -rf "$scratch"
mkdir -p "$scratch" || fail "cannot create $scratch"

# run OUT COMMAND...: stdout (rank 0's lines) to OUT, stderr apart: other ranks' warnings
# (Kokkos' oversubscription notice) interleave there mid-line.
run() {
  local out=$1
  shift
  echo "+ $*" >&2
  "$@" > "$out" 2> "$out.err"
  local status=$?
  cat "$out" "$out.err"
  [ $status -eq 0 ] || fail "the command failed with status $status"
}

run "$scratch/full.txt" "$@" --epochs "$epochs"
run "$scratch/first.txt" "$@" --epochs "$stop" --checkpoint "$scratch/ckpt" "${every[@]}"
ls "$scratch"/ckpt.rank* > /dev/null 2>&1 || fail "no checkpoint files were written"
ls "$scratch"/*.tmp > /dev/null 2>&1 && fail "temporary checkpoint files were left behind"
run "$scratch/resumed.txt" "$@" --epochs "$epochs" --resume "$scratch/ckpt"
grep -q "^# resumed from " "$scratch/resumed.txt" || fail "the resumed run did not say it resumed"

# The epoch lines without the seconds column (4), and the final lines.
summary() {
  # Test accuracy (classifiers) or "ppl=" and the test perplexity (lstm) in column 3.
  grep -E '^ *[0-9]+ +[0-9.]+ +([0-9]\.[0-9]{4}|ppl=[0-9]+\.[0-9]{2}) +[0-9.]+ +[0-9]+ +[0-9]\.[0-9]{5}$' "$1" |
    awk '{ $4 = ""; print }'
  grep -E '^final (test_acc|test_ppl|parameter_digest)=' "$1"
}
summary "$scratch/full.txt" > "$scratch/full.sum"
summary "$scratch/resumed.txt" > "$scratch/resumed.sum"
grep -q '^final parameter_digest=[0-9a-f]\{16\}$' "$scratch/full.sum" ||
  fail "no parameter digest line"
# Every line the resumed run printed must be in the uninterrupted run's, in the same order.
resumed_lines=$(wc -l < "$scratch/resumed.sum")
tail -n "$resumed_lines" "$scratch/full.sum" > "$scratch/full.tail"
diff "$scratch/full.tail" "$scratch/resumed.sum" ||
  fail "the resumed run differs from the uninterrupted one"
[ "$resumed_lines" -ge 3 ] || fail "the resumed run printed no epoch line"
rm -rf "$scratch"
echo "check_train_resume: ok (final lines identical)"
