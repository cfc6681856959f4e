#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Runs oktopk-bench (through mpiexec) for ctest and checks what it printed.
#
#   check_bench_csv.sh csv ALGOS -- COMMAND...
#       COMMAND exits 0 and prints the CSV header, then one row per method of ALGOS (a comma
#       list, or all) in that order, each with wrong == 0 (the --mpi-baseline row,
#       mpi_allreduce or mpi_reduce_scatter_block, with wrong '-' and a positive time).
#   check_bench_csv.sh replay ALGOS FILE -- COMMAND...
#       COMMAND --dump-gradients FILE, then COMMAND --dist file:FILE: both pass the csv check,
#       and their rows are equal apart from the time columns (7 and 8).
#   check_bench_csv.sh between all|none ALGOS -- COMMAND...
#       the csv check, and every row's between_nodes_bytes_per_rank_max equal to its
#       bytes_per_rank_max (all: every rank a node of its own) or 0 (none: one node), with
#       bytes_per_rank_max > 0.
#   check_bench_csv.sh output zero|nonzero REGEX [LINES] -- COMMAND...
#       COMMAND's exit status is (non)zero and exactly one line (or LINES lines) of its output
#       (stdout and stderr) matches the extended REGEX: rank 0 alone speaks.
set -u

header="algo,P,n,k,density,iters,time_s_med,time_s_max,bytes_per_rank_avg,bytes_per_rank_max,words_per_rank_max_over_k,nnz_out,wrong,nnz_out_avg,words_per_call_max_over_k,between_nodes_bytes_per_rank_max"
all="dense,topka,topkdsa,gtopk,gaussiank,oktopk,s2"

fail() {
  echo "check_bench_csv: $*" >&2
  exit 1
}

mode=${1:-}
[ $# -ge 1 ] && shift
scratch=$(mktemp -d) || fail "mktemp failed"
trap 'rm -rf "$scratch"' EXIT

# check_csv FILE ALGOS: the CSV block (up to the first empty line) of FILE.
check_csv() {
  local file=$1 algos=$2
  [ "$algos" = all ] && algos=$all
  awk -F, -v header="$header" -v algos="$algos" '
    NR == 1 { if ($0 != header) { print "bad header: " $0; bad = 1 }; next }
    /^$/ { exit }
    {
      names = names (rows++ ? "," : "") $1
      if (NF != 16) { print "row with " NF " fields: " $0; bad = 1 }
      else if ($16 < 0 || $16 > $10) { print "between-node bytes outside [0, bytes]: " $0; bad = 1 }
      else if ($1 == "mpi_allreduce" || $1 == "mpi_reduce_scatter_block") {  # --mpi-baseline: a bare sum, not checked
        if ($13 != "-" || $7 <= 0) { print "baseline row: " $0; bad = 1 }
      }
      else if ($13 != "0") { print "method " $1 ": wrong = " $13; bad = 1 }
    }
    END {
      if (names != algos) { print "rows for [" names "], expected [" algos "]"; bad = 1 }
      exit bad
    }' "$file"
}

# run OUT COMMAND...: runs COMMAND with stdout to OUT (and echoed for the ctest log).
run() {
  local out=$1
  shift
  echo "+ $*" >&2
  "$@" > "$out"
  local status=$?
  cat "$out"
  return $status
}

case $mode in
  csv)
    algos=${1:?ALGOS}
    [ "${2:-}" = -- ] || fail "usage: csv ALGOS -- COMMAND..."
    shift 2
    run "$scratch/out.csv" "$@" || fail "the command failed with status $?"
    check_csv "$scratch/out.csv" "$algos" || fail "CSV check failed"
    ;;
  between)
    share=${1:?all|none}
    case $share in all | none) ;; *) fail "between: expected all or none, got '$share'" ;; esac
    algos=${2:?ALGOS}
    [ "${3:-}" = -- ] || fail "usage: between all|none ALGOS -- COMMAND..."
    shift 3
    run "$scratch/out.csv" "$@" || fail "the command failed with status $?"
    check_csv "$scratch/out.csv" "$algos" || fail "CSV check failed"
    awk -F, -v share="$share" '
      NR == 1 { next }
      /^$/ { exit }
      {
        expected = share == "all" ? $10 : 0
        if ($10 <= 0 || $16 != expected) {
          print $1 ": between_nodes_bytes_per_rank_max " $16 ", expected " expected; bad = 1
        }
      }
      END { exit bad }' "$scratch/out.csv" || fail "between-node bytes check failed"
    ;;
  replay)
    algos=${1:?ALGOS}
    file=${2:?FILE}
    [ "${3:-}" = -- ] || fail "usage: replay ALGOS FILE -- COMMAND..."
    shift 3
    rm -f "$file"
    run "$scratch/generated.csv" "$@" --dump-gradients "$file" || fail "the generating run failed"
    check_csv "$scratch/generated.csv" "$algos" || fail "CSV check of the generating run failed"
    run "$scratch/replayed.csv" "$@" --dist "file:$file" || fail "the replaying run failed"
    check_csv "$scratch/replayed.csv" "$algos" || fail "CSV check of the replaying run failed"
    for f in generated replayed; do
      awk '/^$/ { exit } { print }' "$scratch/$f.csv" | cut -d, -f1-6,9-15 > "$scratch/$f.rows"
    done
    diff "$scratch/generated.rows" "$scratch/replayed.rows" ||
      fail "the replayed run differs from the generating run"
    rm -f "$file"
    ;;
  output)
    expect=${1:?zero|nonzero}
    regex=${2:?REGEX}
    lines=1
    if [ "${3:-}" != -- ]; then
      lines=${3:-}
      [[ $lines =~ ^[0-9]+$ ]] || fail "usage: output zero|nonzero REGEX [LINES] -- COMMAND..."
      shift
    fi
    [ "${3:-}" = -- ] || fail "usage: output zero|nonzero REGEX [LINES] -- COMMAND..."
    shift 3
    echo "+ $*" >&2
    "$@" > "$scratch/out.txt" 2>&1
    status=$?
    cat "$scratch/out.txt"
    case $expect in
      zero) [ $status -eq 0 ] || fail "exit status $status, expected 0" ;;
      nonzero) [ $status -ne 0 ] || fail "exit status 0, expected non-zero" ;;
      *) fail "expected zero or nonzero, got '$expect'" ;;
    esac
    matches=$(grep -c -E -- "$regex" "$scratch/out.txt")
    [ "$matches" -eq "$lines" ] ||
      fail "$matches output lines match '$regex', expected exactly $lines"
    ;;
  *)
    fail "unknown mode '$mode' (csv, between, replay or output)"
    ;;
esac
echo "check_bench_csv: ok"
