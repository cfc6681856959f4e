#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Fault injection for one method: makes rank 1 fail at every fault point of every phase that
# fault_program reaches (OKTOPK_FAULT=list), with every kind (alloc, mpi, invariant), and checks
# that the job ends within 10 s of the failure (the failing rank stamps the moment it fails:
# OKTOPK_FAULT_STAMP), with a non-zero status and the failing rank's line
#   oktopk: rank 1: <cause> in phase <phase> of <method> call <t>
# Then the same for kill (SIGKILL, as kill -9): ends within 10 s of it, non-zero. A run that
# has not ended by what a run without a fault took plus 10 s (starting MPI alone can take
# seconds on a loaded host) is stopped and counted as a hang.
#
#   check_faults.sh METHOD NP [KEY=VALUE...] -- MPIEXEC_COMMAND... FAULT_PROGRAM
# KEY=VALUE are options for fault_program (to reach branches the defaults do not take).
# Ends with "N passed, M failed".
set -uo pipefail
method=$1 np=$2
shift 2
settings=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do settings+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
launch=("$@")
calls=3
grace=10
scratch=$(mktemp -d) || exit 1
trap 'rm -rf "$scratch"' EXIT
stamp="$scratch/stamp"

fail() { echo "FAIL: $*"; failed=$((failed + 1)); }
passed=0 failed=0

t0=$(date +%s.%N)
listing=$(OKTOPK_FAULT=list timeout 300 "${launch[@]}" "$method" "$calls" "${settings[@]}" 2>&1 </dev/null)
rc=$?
# A faulty run may take what a whole run without a fault takes, plus the grace.
limit=$(awk -v a="$t0" -v b="$(date +%s.%N)" -v g="$grace" 'BEGIN { printf "%d", b - a + g + 0.999 }')
points=$(printf '%s\n' "$listing" | sed -n 's/^point //p')
if [ "$rc" -ne 0 ] || [ -z "$points" ] || ! grep -q "^fault_program: ok" <<<"$listing"; then
  echo "$listing"
  echo "0 passed, 1 failed"
  exit 1
fi
echo "$method${settings[*]:+ (${settings[*]})} at P = $np: a run without a fault took $((limit - grace)) s or less; each faulty run gets $limit s"
echo "fault points (phase point first-call):"
printf '  %s\n' "$points"

# one_case PHASE POINT CALL KIND: one faulty run and its checks.
one_case() {
  local phase=$1 point=$2 call=$3 kind=$4 start end out rc
  rm -f "$stamp"
  start=$(date +%s.%N)
  # stdin closed: mpiexec would otherwise read the rest of the list this loop reads.
  out=$(OKTOPK_FAULT="1:$phase:$call:$kind:$point" OKTOPK_FAULT_STAMP="$stamp" \
          timeout -k 5 "$limit" "${launch[@]}" "$method" "$calls" "${settings[@]}" 2>&1 </dev/null)
  rc=$?
  end=$(date +%s.%N)
  local took; took=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
  local what="$kind at $point of $phase, call $call"
  # timeout's 124 (or 137 after -k), or anything that took the whole limit; 137 alone is also
  # how mpiexec reports a rank killed by SIGKILL.
  if [ "$rc" -eq 124 ] || awk -v t="$took" -v l="$limit" 'BEGIN { exit !(t >= l) }'; then
    fail "$what: still running after ${limit} s (hang)"; printf '%s\n' "$out" | tail -n 5; return
  fi
  if [ "$rc" -eq 0 ]; then
    fail "$what: exit status 0"; printf '%s\n' "$out" | tail -n 5; return
  fi
  if [ ! -s "$stamp" ]; then
    fail "$what: the fault was not injected (no stamp)"; printf '%s\n' "$out" | tail -n 5; return
  fi
  local after
  after=$(awk -v s="$(cat "$stamp")" -v e="$end" 'BEGIN { printf "%.1f", e - s / 1e9 }')
  if awk -v t="$after" -v g="$grace" 'BEGIN { exit !(t > g) }'; then
    fail "$what: the job ended ${after} s after the failure (more than ${grace} s)"; return
  fi
  if [ "$kind" != kill ]; then
    local cause
    case $kind in
      alloc) cause="out of memory (std::bad_alloc)" ;;
      invariant) cause="oktopk: internal invariant broken (injected)" ;;
      mpi) cause="oktopk::impl::fault_injection::point: MPI_Send failed: " ;;
    esac
    local line
    line=$(printf '%s\n' "$out" | grep -F "oktopk: rank 1: $cause" | head -n 1)
    if [[ $line != *" in phase $phase of $method call $call" ]]; then
      fail "$what: no line 'oktopk: rank 1: $cause... in phase $phase of $method call $call'"
      printf '%s\n' "$out" | tail -n 8
      return
    fi
  fi
  echo "ok: $what: exit $rc ${after} s after the failure (${took} s in all)"
  passed=$((passed + 1))
}

while read -r phase point call; do
  [ "$point" = construct ] && continue  # make_sparse_allreduce agrees instead: below
  for kind in alloc mpi invariant; do
    one_case "$phase" "$point" "$call" "$kind"
  done
done <<<"$points"
# kill -9 of one rank, in the first phase a sparse call (after the dense warm-up) passes.
read -r phase point call <<<"$(printf '%s\n' "$points" | awk '$3 > 1' | head -n 1)"
if [ -n "${phase:-}" ]; then
  one_case "$phase" "$point" "$call" kill
else
  one_case "$(printf '%s\n' "$points" | head -n 1 | cut -d' ' -f1)" enter 1 kill
fi

# An allocation failure of rank 1 while the handle is built: every rank throws the same error,
# with rank 1's cause (make_sparse_allreduce agrees on it and carries the cause), the program
# prints it on every rank and exits 1.
start=$(date +%s)
out=$(OKTOPK_FAULT="1:other:0:alloc:construct" timeout -k 5 "$limit" "${launch[@]}" "$method" \
        "$calls" "${settings[@]}" 2>&1 </dev/null)
rc=$?
expected="fault_program: oktopk::make_sparse_allreduce: rank 1 could not build the handle: out of memory (std::bad_alloc)"
if [ "$rc" -eq 124 ] || (( $(date +%s) - start >= limit )); then
  fail "alloc while building the handle: still running after ${limit} s (hang)"
elif [ "$rc" -eq 0 ] || [ "$(grep -cF "$expected" <<<"$out")" -ne "$np" ]; then
  fail "alloc while building the handle: exit $rc, expected $np lines '$expected'"
  printf '%s\n' "$out" | tail -n 8
else
  echo "ok: alloc while building the handle: every rank threw, exit $rc"
  passed=$((passed + 1))
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
