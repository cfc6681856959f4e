#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Runs oktopk-bench --trace (through mpiexec) for ctest and holds the trace to the bench's own
# report: the trace lists the messages behind the bytes columns, so summing it must give them.
#
#   check_bench_trace.sh TRACE -- COMMAND...
#       runs COMMAND --format csv --phases --trace TRACE; it must exit 0, and TRACE must have
#       the documented header and well-formed rows (peer -1 exactly for collectives), a row
#       set for every method of the CSV, every rank and every timed call, and
#         per method: mean over calls of max(sent, received) per rank, averaged and maxed over
#                     ranks = bytes_per_rank_avg and bytes_per_rank_max;
#         per method and phase: mean over calls of the max over ranks of max(sent, received)
#                     = the --phases table's bytes_per_rank_max (0 for phases not in TRACE;
#                     mpi_allreduce, which has no phase table, only by the first check);
#       both to the 0.1 the CSV prints.
set -u

header="algo,call,rank,phase,operation,peer,bytes_sent,bytes_received"

fail() {
  echo "check_bench_trace: $*" >&2
  exit 1
}

trace=${1:-}
[ -n "$trace" ] && [ "${2:-}" = "--" ] || fail "usage: check_bench_trace.sh TRACE -- COMMAND..."
shift 2
scratch=$(mktemp -d) || fail "mktemp failed"
trap 'rm -rf "$scratch"' EXIT
rm -f "$trace"

echo "+ $* --format csv --phases --trace $trace" >&2
"$@" --format csv --phases --trace "$trace" > "$scratch/out" || {
  cat "$scratch/out"
  fail "the command failed"
}
cat "$scratch/out"
[ -s "$trace" ] || fail "no trace file $trace"
first=$(head -n 1 "$trace")
[ "$first" = "$header" ] || fail "bad trace header: '$first', expected '$header'"

# The bench's CSV: the method table, an empty line, then the phase table.
awk -F, '
  FNR == 1 { file++ }
  file == 1 && $1 == "algo" && $2 == "P" { next }  # the method header
  file == 1 && $1 == "algo" && $2 == "phase" { phases = 1; next }
  file == 1 && NF == 0 { next }
  file == 1 && phases {
    reported_phase[$1 "," $2] = $5
    has_phases[$1] = 1
    next
  }
  file == 1 {
    # Numeric P and iters, or the loops below would compare strings and never end.
    if (NF != 16 || $2 !~ /^[0-9]+$/ || $6 !~ /^[0-9]+$/) { print "bad CSV row: " $0; bad = 1; next }
    algos[++n_algos] = $1; P[$1] = $2 + 0; iters[$1] = $6 + 0
    reported_avg[$1] = $9; reported_max[$1] = $10
    k[$1] = $4 + 0; reported_call_words[$1] = $15
    next
  }
  FNR == 1 { next }  # the trace header, checked above
  {
    if (NF != 8) { print "trace row with " NF " fields: " $0; bad = 1; next }
    op = $5
    collective = (op == "allreduce" || op == "alltoall" || op == "allgather" ||
                  op == "allgatherv" || op == "bcast")
    if (!collective && op != "send" && op != "recv") { print "unknown operation: " $0; bad = 1 }
    if (collective != ($6 == -1)) { print "peer does not match the operation: " $0; bad = 1 }
    if ($7 < 0 || $8 < 0 || $7 + $8 == 0) { print "bad byte counts: " $0; bad = 1 }
    if (!($1 in P)) { print "trace row of a method the CSV does not list: " $0; bad = 1; next }
    if ($2 < 0 || $2 >= iters[$1] || $3 < 0 || $3 >= P[$1]) { print "call or rank out of range: " $0; bad = 1 }
    key = $1 SUBSEP $2 SUBSEP $3
    seen[key] = 1
    sent[key] += $7; received[key] += $8
    pkey = $1 SUBSEP $4 SUBSEP $2 SUBSEP $3
    psent[pkey] += $7; preceived[pkey] += $8
    phases_of[$1 SUBSEP $4] = 1
  }
  function differs(a, b) { d = a - b; return d > 0.051 || d < -0.051 }
  function larger(a, b) { return a > b ? a : b }
  END {
    if (n_algos == 0) { print "no method rows in the CSV"; exit 1 }
    for (i = 1; i <= n_algos; i++) {
      a = algos[i]
      sum = 0; top = 0; worst_call = 0
      for (r = 0; r < P[a]; r++) {
        mine = 0
        for (c = 0; c < iters[a]; c++) {
          key = a SUBSEP c SUBSEP r
          if (!(key in seen)) { print a ": no trace rows for call " c " of rank " r; bad = 1 }
          mine += larger(sent[key], received[key])
          worst_call = larger(worst_call, larger(sent[key], received[key]))
        }
        mine /= iters[a]
        sum += mine; top = larger(top, mine)
      }
      # words_per_call_max_over_k: the worst (call, rank), to the 4 decimals printed.
      if (k[a] > 0) {
        d = worst_call / 4 / k[a] - reported_call_words[a]
        if (d > 0.00006 || d < -0.00006) {
          print a ": worst call " worst_call / 4 / k[a] " words per k in the trace, " reported_call_words[a] " reported"
          bad = 1
        }
      }
      if (differs(sum / P[a], reported_avg[a]) || differs(top, reported_max[a])) {
        printf "%s: trace gives bytes per rank avg %.1f, max %.1f; the CSV says %s, %s\n",
               a, sum / P[a], top, reported_avg[a], reported_max[a]
        bad = 1
      }
      for (pk in reported_phase) {
        split(pk, parts, ",")
        if (parts[1] != a) continue
        ph = parts[2]
        mean = 0
        if ((a SUBSEP ph) in phases_of) {
          for (c = 0; c < iters[a]; c++) {
            top = 0
            for (r = 0; r < P[a]; r++) {
              k2 = a SUBSEP ph SUBSEP c SUBSEP r
              top = larger(top, larger(psent[k2], preceived[k2]))
            }
            mean += top
          }
          mean /= iters[a]
        }
        if (differs(mean, reported_phase[pk])) {
          printf "%s, phase %s: trace gives %.1f bytes per rank, the CSV says %s\n",
                 a, ph, mean, reported_phase[pk]
          bad = 1
        }
        checked++
      }
    }
    for (pk in phases_of) {
      split(pk, parts, SUBSEP)
      # The mpi_allreduce baseline row has no phase table.
      if ((parts[1] in has_phases) && !((parts[1] "," parts[2]) in reported_phase)) {
        print parts[1] ", phase " parts[2] ": in the trace, not in the --phases table"; bad = 1
      }
    }
    if (!bad) printf "check_bench_trace: %d methods, %d phases agree with the CSV\n", n_algos, checked
    exit bad
  }' "$scratch/out" "$trace" || fail "the trace does not match the bench's report"
