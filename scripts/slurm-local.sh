#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A one-machine Slurm, to check that OkTopk's programs launch the way supercomputers launch
# them. Brings up munged, slurmctld and slurmd on this machine (configuration, key, state and
# logs in one temporary folder, ports 16817-16818, so a real Slurm's defaults are not touched),
# submits a batch job that runs oktopk-bench --check with srun and with mpirun inside the
# allocation, waits for it, checks both outputs, and tears everything down, also after an error
# or Ctrl-C. Objects a crashed run left behind (daemons and folders named oktopk-slurm.*) are
# cleared first. Needs root (it installs slurmctld, slurmd, slurm-client and munge if missing).
#
#   scripts/slurm-local.sh [--ranks P] [--bench PATH] [--keep DIR]
#     --ranks P      tasks of the job (default 4; the node may be oversubscribed)
#     --bench PATH   oktopk-bench to run (default build/apps/oktopk-bench/oktopk-bench)
#     --keep DIR     copy the job script, its outputs and the daemons' logs to DIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
set -euo pipefail

OKTOPK_SLURM_PREFIX=oktopk-slurm
ranks=4
bench=$OKTOPK_BUILD_DIR/apps/oktopk-bench/oktopk-bench
keep=""

usage() { sed -n '11,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case $1 in
    --ranks) ranks=${2:?--ranks needs a value}; shift 2 ;;
    --bench) bench=${2:?--bench needs a value}; shift 2 ;;
    --keep) keep=${2:?--keep needs a value}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "oktopk: slurm-local: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[[ $ranks =~ ^[1-9][0-9]*$ ]] || { echo "oktopk: slurm-local: --ranks must be a positive integer, got '$ranks'" >&2; exit 2; }
[ -x "$bench" ] || { echo "oktopk: slurm-local: $bench is not an executable (build first: bash scripts/main.sh, or pass --bench)" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "oktopk: slurm-local: needs root (it starts munged, slurmctld and slurmd)" >&2; exit 2; }

oktopk_install_missing slurmctld slurmd slurm-client munge

# oktopk_slurm_pids: the processes this script started, directly or through Slurm: the
# daemons name their /tmp/oktopk-slurm.* configuration on their command line, and everything
# they start (slurmstepd, the job's tasks) inherits SLURM_CONF pointing there.
oktopk_slurm_pids() {
  local pid
  for pid in $(pgrep -f "/tmp/$OKTOPK_SLURM_PREFIX\.[A-Za-z0-9]+/" || true); do echo "$pid"; done
  for pid in /proc/[0-9]*; do
    pid=${pid#/proc/}
    [ "$pid" != $$ ] || continue
    if tr '\0' '\n' 2>/dev/null < "/proc/$pid/environ" |
       grep -q "^SLURM_CONF=/tmp/$OKTOPK_SLURM_PREFIX\."; then
      echo "$pid"
    fi
  done | sort -u
}

# oktopk_slurm_clear WHAT: stops those processes and removes the folders this script makes,
# and nothing else: at the start, what a killed run left; at the end, ours.
oktopk_slurm_clear() {
  local pids
  pids=$(oktopk_slurm_pids)
  if [ -n "$pids" ]; then
    oktopk_log "slurm-local: stopping $1"
    # Jobs first, while slurmctld still runs, so that Slurm ends their steps itself.
    # Only our own slurmctld (its configuration is in our folder), never a cluster's.
    local conf=${dir:-/nonexistent}/slurm.conf
    if [ -f "$conf" ]; then
      SLURM_CONF=$conf timeout 10 scancel --full --quiet --user=root 2>/dev/null || true
      for _ in $(seq 50); do
        [ -z "$(SLURM_CONF=$conf squeue -h 2>/dev/null)" ] && break
        sleep 0.1
      done
    fi
    kill $(oktopk_slurm_pids) 2>/dev/null || true
    for _ in $(seq 50); do [ -z "$(oktopk_slurm_pids)" ] && break; sleep 0.1; done
    pids=$(oktopk_slurm_pids)
    [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
  fi
  rm -rf /tmp/"$OKTOPK_SLURM_PREFIX".*
}

dir=""
oktopk_slurm_clear "daemons a previous run left behind"

dir=$(mktemp -d "/tmp/$OKTOPK_SLURM_PREFIX.XXXXXX")
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$keep" ]; then
    mkdir -p "$keep"
    cp -r "$dir/log" "$dir/job" "$keep/" 2>/dev/null || true
  fi
  oktopk_slurm_clear "the daemons"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# munged insists on a key readable by its user alone and a socket folder everyone can enter.
chmod 755 "$dir"
mkdir -m 700 "$dir/key"
mkdir -m 755 "$dir/run"
mkdir -p "$dir/state" "$dir/spool" "$dir/log" "$dir/job"
mungekey --create --keyfile="$dir/key/munge.key"
munged --key-file="$dir/key/munge.key" --socket="$dir/run/munge.sock" \
  --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" \
  --seed-file="$dir/key/munged.seed"

host=$(hostname -s)
cpus=$(nproc)
cat > "$dir/slurm.conf" <<EOF
# Written by scripts/slurm-local.sh: one node, this machine, reached over the loopback.
ClusterName=oktopk
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=16817
SlurmdPort=16818
AuthType=auth/munge
AuthInfo=socket=$dir/run/munge.sock
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=oktopk Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:$ranks
EOF
export SLURM_CONF=$dir/slurm.conf
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"

state=""
for _ in $(seq 120); do
  state=$(sinfo -h -n "$host" -o %T 2>/dev/null || true)
  [ "$state" = idle ] && break
  sleep 0.5
done
[ "$state" = idle ] || {
  echo "oktopk: slurm-local: node $host is '${state:-unreachable}', not idle, after 60 s; slurmctld log:" >&2
  tail -n 20 "$dir/log/slurmctld.log" >&2 || true
  exit 1
}
oktopk_log "slurm-local: Slurm $(sinfo --version | awk '{print $2}') up: node $host, $cpus CPUs, partition oktopk"

# The job: the same check through srun (PMIx, as Debian's Open MPI is built) and through
# mpirun inside the allocation (it reads the allocation from Slurm's environment).
bench_args=(--algo all --n 20000 --iters 4 --warmup 2 --check --format csv)
cat > "$dir/job/check.sbatch" <<EOF
#!/bin/bash
#SBATCH --job-name=oktopk-check
#SBATCH --ntasks=$ranks
#SBATCH --overcommit
#SBATCH --output=$dir/job/slurm-%j.out
export OMP_NUM_THREADS=1 OMP_PROC_BIND=false
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
srun --mpi=pmix $bench ${bench_args[*]} > $dir/job/srun.csv 2> $dir/job/srun.err
echo "srun exit status \$?"
mpirun $bench ${bench_args[*]} > $dir/job/mpirun.csv 2> $dir/job/mpirun.err
echo "mpirun exit status \$?"
EOF
start=$SECONDS
job=$(sbatch --parsable --wait "$dir/job/check.sbatch") || {
  echo "oktopk: slurm-local: the batch job failed; its output:" >&2
  cat "$dir"/job/slurm-*.out >&2 || true
  exit 1
}
oktopk_log "slurm-local: job $job done ($((SECONDS - start)) s)"
cat "$dir/job/slurm-$job.out"

checker=$OKTOPK_SOURCE_DIR/tests/apps/check_bench_csv.sh
failed=0
for launcher in srun mpirun; do
  grep -q "^$launcher exit status 0$" "$dir/job/slurm-$job.out" || {
    echo "oktopk: slurm-local: $launcher failed; its errors:" >&2
    cat "$dir/job/$launcher.err" >&2; failed=1; continue; }
  if bash "$checker" csv all -- cat "$dir/job/$launcher.csv" &&
     awk -F, -v p="$ranks" 'NR > 1 && NF == 15 && $2 != p { bad = 1 } END { exit bad }' \
       "$dir/job/$launcher.csv"; then
    oktopk_log "slurm-local: $launcher: every method at P = $ranks, wrong = 0"
  else
    echo "oktopk: slurm-local: $launcher: the output does not pass the check:" >&2
    cat "$dir/job/$launcher.csv" >&2; failed=1
  fi
done
exit "$failed"
