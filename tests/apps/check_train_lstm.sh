#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# oktopk-train --model lstm end to end, for ctest.
#
#   check_train_lstm.sh TEXT VOCAB -- COMMAND...
#       Exits 77 (ctest's SKIP_RETURN_CODE) when the verses file TEXT is missing. Otherwise
#       COMMAND --text TEXT --vocab VOCAB (oktopk-train through mpiexec) must exit 0 and print
#       epoch lines "EPOCH LOSS ppl=X SECONDS BYTES DENSITY" and one line
#       "final test_ppl=X (parameters identical on all P ranks)", every X a finite number below
#       VOCAB (a model that learned nothing predicts about as badly as uniform guessing, X = VOCAB).
set -u

fail() {
  echo "check_train_lstm: $*" >&2
  exit 1
}

text=${1:?TEXT}
vocab=${2:?VOCAB}
shift 2
[ "${1:-}" = -- ] || fail "usage: TEXT VOCAB -- COMMAND..."
shift
if [ ! -f "$text" ]; then
  echo "check_train_lstm: $text is missing (Debian packages bible-kjv and bible-kjv-text): skipped"
  exit 77
fi

out=$(mktemp) || fail "mktemp failed"
trap 'rm -f "$out" "$out.err"' EXIT
echo "+ $* --text $text --vocab $vocab" >&2
# stdout (rank 0's lines) apart from stderr, where other ranks' notices interleave mid-line.
"$@" --text "$text" --vocab "$vocab" > "$out" 2> "$out.err"
status=$?
cat "$out" "$out.err"
[ $status -eq 0 ] || fail "the command failed with status $status"

epoch_lines=$(grep -cE '^ *[0-9]+ +[0-9]+\.[0-9]{4} +ppl=[0-9]+\.[0-9]{2} +[0-9.]+ +[0-9]+ +[0-9]\.[0-9]{5}$' "$out")
[ "$epoch_lines" -ge 1 ] || fail "no epoch line of the form 'EPOCH LOSS ppl=X SECONDS BYTES DENSITY'"
[ "$(grep -cE '^final test_ppl=[0-9]+\.[0-9]{2} \(parameters identical on all [0-9]+ ranks\)$' "$out")" -eq 1 ] ||
  fail "no single line 'final test_ppl=X (parameters identical on all P ranks)'"
# Every perplexity printed: finite (a NaN or inf fails the patterns above) and below VOCAB.
grep -oE 'ppl=[0-9.]+' "$out" | cut -d= -f2 | awk -v vocab="$vocab" '
  { if (!($1 > 0 && $1 < vocab)) { print "check_train_lstm: perplexity " $1 " is not in (0, " vocab ")"; bad = 1 } }
  END { exit bad }' || exit 1
echo "check_train_lstm: ok"
