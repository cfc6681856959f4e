#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# One rank short of memory must end the job with that rank's message, never hang (the
# robustness issue's reproduction): for each limit, rank 0 runs COMMAND unlimited and rank 1
# under `ulimit -v LIMIT_KB`, in one MPI job. Each run must end within SECONDS, either with
# status 0 (enough memory) or non-zero with a line naming rank 1's failure and its CAUSE:
#   oktopk-bench: rank 1: CAUSE                       (the program's own allocation)
#   oktopk: rank 1: CAUSE in phase P of M call T      (inside a collective call)
#   ...make_sparse_allreduce: rank 1 could not build the handle: CAUSE   (agreed on: every
#                                                     rank throws it, rank 0 prints it)
# where CAUSE says what ran out: "out of memory (std::bad_alloc)" (a host std::vector), or
# Kokkos's allocation failure with the View's label (Kokkos 3: 'Kokkos failed to allocate memory
# for label "L" ...'; Kokkos 4: '... memory space failed to allocate S (label="L")').
# The limits must include at least one that fails and one that passes, so that the sweep
# crosses the boundary wherever this build's footprint puts it.
#
#   check_memory_limit.sh SECONDS LIMIT_KB... -- MPIEXEC [FLAGS...] -- COMMAND...
# Ends with "N passed, M failed".
set -u
seconds=$1
shift
limits=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do limits+=("$1"); shift; done
shift
mpiexec=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do mpiexec+=("$1"); shift; done
shift
command=("$@")
if [ ${#limits[@]} -eq 0 ] || [ ${#mpiexec[@]} -eq 0 ] || [ ${#command[@]} -eq 0 ]; then
  echo "usage: check_memory_limit.sh SECONDS LIMIT_KB... -- MPIEXEC [FLAGS...] -- COMMAND..." >&2
  exit 2
fi

passed=0 failed=0 ended_ok=0 ended_failing=0
cause='(out of memory \(std::bad_alloc\)|.*failed to allocate .*label[ =]"[^"]+")'
pattern="(^oktopk-bench: rank 1: $cause|^oktopk: rank 1: $cause.* in phase .* call [0-9]+\$"
pattern+="|make_sparse_allreduce: rank 1 could not build the handle: $cause)"
for limit in "${limits[@]}"; do
  start=$(date +%s.%N)
  out=$(timeout -k 5 "$seconds" "${mpiexec[@]}" -n 1 "${command[@]}" : \
          -n 1 bash -c 'ulimit -v "$0" && exec "$@"' "$limit" "${command[@]}" 2>&1 </dev/null)
  rc=$?
  took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "FAIL: rank 1 limited to $limit KiB: still running after $seconds s (hang)"
    printf '%s\n' "$out" | tail -n 5
    failed=$((failed + 1))
  elif [ "$rc" -eq 0 ]; then
    echo "ok: rank 1 limited to $limit KiB: enough, exit 0 after $took s"
    passed=$((passed + 1)) ended_ok=$((ended_ok + 1))
  elif line=$(printf '%s\n' "$out" | grep -E -m 1 "$pattern"); then
    echo "ok: rank 1 limited to $limit KiB: exit $rc after $took s: $line"
    passed=$((passed + 1)) ended_failing=$((ended_failing + 1))
  else
    echo "FAIL: rank 1 limited to $limit KiB: exit $rc after $took s without rank 1's message and cause"
    printf '%s\n' "$out" | tail -n 8
    failed=$((failed + 1))
  fi
done
if [ "$ended_ok" -eq 0 ] || [ "$ended_failing" -eq 0 ]; then
  echo "FAIL: the limits do not cross the boundary ($ended_ok runs had enough memory, $ended_failing failed): widen them"
  failed=$((failed + 1))
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
