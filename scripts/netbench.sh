#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# An emulated cluster on one machine, for timing the collectives on links instead of shared
# memory. H network namespaces are the hosts, each with one veth link to a bridge in a switch
# namespace; tbf shapes both directions of every link to the given rate. Open MPI starts in
# the first host and launches its daemons in the others through `ip netns exec` with a
# hostname of their own (unshare --uts), so ranks on different hosts share no memory: TCP over
# the links only. Ranks on one host talk through shared memory (Open MPI's vader), as the
# GPUs of one node do over their own links, and find each other as one node
# (MPI_COMM_TYPE_SHARED).
#
#   scripts/netbench.sh [OPTIONS] -- PROGRAM [ARGS...]
#     --hosts H          emulated hosts, 2 to 64 (default 4)
#     --ranks-per-host L ranks on each host, 1 to 16 (default 1): ranks hL to hL+L-1 on host h
#     --rate R           link rate, tc syntax: 100mbit, 1gbit, 10gbit (default 1gbit)
#     --mtu M            link MTU, 576 to 65535 (default 1500)
#     --delay D          one-way delay per link (needs netem, which tc reports if it is missing)
#     --bench PATH       oktopk-bench for the validation run (default build/apps/...)
#     --mpirun-arg ARG   one more mpirun argument (repeatable), e.g. --mca coll_tuned_...
#     --no-validate      skip the validation run
#     --keep-bed         leave the bed up afterwards (the next run clears it)
#
# PROGRAM runs under mpirun with H x L ranks, L per host. Before it, the bed is validated: a dense
# allreduce through oktopk-bench must take at least 2(H-1)/H * bytes / rate (what any allreduce
# must send through each host's link), or the traffic is not crossing the shaped links and
# nothing is reported. Afterwards the bytes each link's shaper passed are printed. Needs root. Every object it makes is named oktopk-nb*
# (namespaces, /etc/netns/oktopk-nb-*, a temporary folder); it removes them on exit, also after
# an error or Ctrl-C, and a run first removes what a killed run left. Nothing outside those
# namespaces is touched: the test subnet exists only inside them, with no route anywhere else.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
set -euo pipefail

NB=oktopk-nb
NB_SUBNET_PREFIX=10.213.47
NB_SUBNET=$NB_SUBNET_PREFIX.0/24

hosts=4 ranks_per_host=1 rate=1gbit mtu=1500 delay="" validate=1 keep_bed=0
bench=$OKTOPK_BUILD_DIR/apps/oktopk-bench/oktopk-bench
mpirun_extra=()

usage() { sed -n '12,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
die() { echo "oktopk: netbench: $*" >&2; exit 2; }
while (($#)); do
  case $1 in
    --hosts) hosts=${2:?--hosts needs a value}; shift 2 ;;
    --ranks-per-host) ranks_per_host=${2:?--ranks-per-host needs a value}; shift 2 ;;
    --rate) rate=${2:?--rate needs a value}; shift 2 ;;
    --mtu) mtu=${2:?--mtu needs a value}; shift 2 ;;
    --delay) delay=${2:?--delay needs a value}; shift 2 ;;
    --bench) bench=${2:?--bench needs a value}; shift 2 ;;
    --mpirun-arg) mpirun_extra+=("${2:?--mpirun-arg needs a value}"); shift 2 ;;
    --no-validate) validate=0; shift ;;
    --keep-bed) keep_bed=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "oktopk: netbench: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
(($#)) || { echo "oktopk: netbench: no PROGRAM given (after --)" >&2; usage >&2; exit 2; }
[[ $hosts =~ ^[0-9]+$ ]] && ((hosts >= 2 && hosts <= 64)) || die "--hosts must be 2 to 64, got '$hosts'"
[[ $ranks_per_host =~ ^[0-9]+$ ]] && ((ranks_per_host >= 1 && ranks_per_host <= 16)) ||
  die "--ranks-per-host must be 1 to 16, got '$ranks_per_host'"
[[ $mtu =~ ^[0-9]+$ ]] && ((mtu >= 576 && mtu <= 65535)) || die "--mtu must be 576 to 65535, got '$mtu'"
# The rate in bit/s, for the validation bound.
rate_bps=$(awk -v r="$rate" 'BEGIN {
  if (match(r, /^[0-9]+(\.[0-9]+)?/) == 0) exit 1
  v = substr(r, 1, RLENGTH); u = tolower(substr(r, RLENGTH + 1))
  m["bit"] = 1; m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9
  if (!(u in m) || v <= 0) exit 1
  printf "%.0f", v * m[u] }') || die "--rate must be a number with kbit, mbit or gbit, got '$rate'"
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces and tc)"
if ((validate)) && [ ! -x "$bench" ]; then
  die "$bench is not an executable (build first, pass --bench, or --no-validate)"
fi
command -v mpirun >/dev/null || die "mpirun not found (Open MPI: apt-get install openmpi-bin)"
mpirun --version 2>&1 | grep -q "Open MPI" ||
  die "mpirun is not Open MPI's; the bed launches through Open MPI's rsh agent"
oktopk_install_missing iproute2

ns() { echo "$NB-$1"; }  # ns h0, ns sw
addr() { echo "$NB_SUBNET_PREFIX.$(($1 + 1))"; }

# Everything a run makes, and nothing else: the processes inside our namespaces, the
# namespaces (their veths go with them), their /etc/netns files and temporary folders.
nb_clear() {
  local n
  for n in $(ip netns list 2>/dev/null | awk -v p="^$NB-" '$1 ~ p { print $1 }'); do
    local pids; pids=$(ip netns pids "$n" 2>/dev/null || true)
    [ -z "$pids" ] || kill $pids 2>/dev/null || true
  done
  for n in $(ip netns list 2>/dev/null | awk -v p="^$NB-" '$1 ~ p { print $1 }'); do
    local pids; pids=$(ip netns pids "$n" 2>/dev/null || true)
    [ -z "$pids" ] || { sleep 0.5; kill -9 $(ip netns pids "$n" 2>/dev/null) 2>/dev/null || true; }
    ip netns delete "$n"
  done
  rm -rf /etc/netns/"$NB"-* /tmp/"$NB".*
  rmdir /etc/netns 2>/dev/null || true  # once empty: it only ever holds per-namespace files
}
if ip netns list 2>/dev/null | grep -q "^$NB-"; then
  oktopk_log "netbench: removing a bed a previous run left behind"
fi
nb_clear

work=$(mktemp -d "/tmp/$NB.XXXXXX")
on_exit() {
  local rc=$?
  trap - EXIT INT TERM
  if ((keep_bed)); then
    oktopk_log "netbench: bed left up (--keep-bed): namespaces $(ns h0)..$(ns h$((hosts - 1))), $(ns sw)"
  else
    nb_clear
  fi
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# tbf needs a bucket of at least one (GSO-sized) packet and enough for the timer's resolution:
# 4 ms at the rate, at least 128 KiB.
burst=$(awk -v b="$rate_bps" 'BEGIN { x = b / 8 * 0.004; if (x < 131072) x = 131072; printf "%d", x }')
shape() {  # shape NAMESPACE DEVICE
  ip netns exec "$1" tc qdisc add dev "$2" root handle 1: tbf rate "$rate" burst "$burst" latency 100ms
  if [ -n "$delay" ]; then
    ip netns exec "$1" tc qdisc add dev "$2" parent 1:1 handle 10: netem delay "$delay" ||
      die "--delay needs the netem qdisc, which this kernel does not have"
  fi
}

ip netns add "$(ns sw)"
ip -n "$(ns sw)" link add br0 type bridge
ip -n "$(ns sw)" link set br0 up
ip -n "$(ns sw)" link set lo up
hostfile=$work/hostfile
: > "$hostfile"
for ((i = 0; i < hosts; i++)); do
  h=$(ns h$i)
  ip netns add "$h"
  ip -n "$h" link add eth0 type veth peer name p$i netns "$(ns sw)"
  ip -n "$h" link set lo up
  ip -n "$h" link set eth0 mtu "$mtu"
  ip -n "$(ns sw)" link set p$i mtu "$mtu"
  ip -n "$h" addr add "$(addr $i)/24" dev eth0
  ip -n "$h" link set eth0 up
  ip -n "$(ns sw)" link set p$i master br0
  ip -n "$(ns sw)" link set p$i up
  shape "$h" eth0
  shape "$(ns sw)" p$i
  echo "$h slots=$ranks_per_host" >> "$hostfile"
done
# Every host knows every other by name (ip netns exec mounts /etc/netns/NAME/hosts as /etc/hosts).
for ((i = 0; i < hosts; i++)); do
  mkdir -p "/etc/netns/$(ns h$i)"
  { echo "127.0.0.1 localhost"
    for ((j = 0; j < hosts; j++)); do echo "$(addr $j) $(ns h$j)"; done
  } > "/etc/netns/$(ns h$i)/hosts"
done

# Open MPI's remote launch agent: like ssh HOST COMMAND, into that host's namespace.
agent=$work/agent
cat > "$agent" <<EOF
#!/bin/sh
host=\$1; shift
exec ip netns exec "\$host" unshare --uts sh -c "hostname \$host; \$*"
EOF
chmod +x "$agent"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# By slot: a host's ranks are consecutive, as under Slurm's default block distribution.
ranks=$((hosts * ranks_per_host))
mpirun_args=(--hostfile "$hostfile" -np "$ranks" --map-by slot
  --mca plm_rsh_agent "$agent" --mca plm_rsh_no_tree_spawn 1
  --mca pml ob1 --mca btl tcp,vader,self
  --mca btl_tcp_if_include "$NB_SUBNET" --mca oob_tcp_if_include "$NB_SUBNET"
  -x OMP_NUM_THREADS -x OMP_PROC_BIND "${mpirun_extra[@]}")
on_bed() {  # on_bed PROGRAM ARGS...: mpirun from the first host
  ip netns exec "$(ns h0)" unshare --uts sh -c 'hostname "$0"; exec "$@"' \
    "$(ns h0)" mpirun "${mpirun_args[@]}" "$@"
}
oktopk_log "netbench: $hosts hosts x $ranks_per_host ranks at $rate (MTU $mtu${delay:+, delay $delay}), subnet $NB_SUBNET"

# Bytes each link's shapers passed so far: "host up down" per line.
link_bytes() {
  for ((i = 0; i < hosts; i++)); do
    local up down
    up=$(ip netns exec "$(ns h$i)" tc -s qdisc show dev eth0 | awk '/tbf/ { f = 1 } f && /Sent/ { print $2; exit }')
    down=$(ip netns exec "$(ns sw)" tc -s qdisc show dev p$i | awk '/tbf/ { f = 1 } f && /Sent/ { print $2; exit }')
    echo "$(ns h$i) $up $down"
  done
}

if ((validate)); then
  n_val=4194304
  out=$work/validate.csv
  on_bed "$bench" --algo dense --n "$n_val" --iters 3 --warmup 1 --format csv > "$out" ||
    { cat "$out" >&2; echo "oktopk: netbench: the validation run failed" >&2; exit 1; }
  measured=$(awk -F, '$1 == "dense" { print $7 }' "$out")
  [ -n "$measured" ] || { cat "$out" >&2; echo "oktopk: netbench: no dense row in the validation output" >&2; exit 1; }
  read -r bound ok < <(awk -v p="$hosts" -v n="$n_val" -v r="$rate_bps" -v t="$measured" 'BEGIN {
    b = 2 * (p - 1) / p * 4 * n * 8 / r; printf "%.4g %d\n", b, (t >= b) }')
  if [ "$ok" != 1 ]; then
    echo "oktopk: netbench: dense allreduce of $n_val floats took $measured s, under the ring bound $bound s at $rate: the traffic is not crossing the shaped links; refusing to report" >&2
    exit 1
  fi
  oktopk_log "netbench: validated: dense allreduce of $n_val floats $measured s per call >= ring bound $bound s"
fi

before=$(link_bytes)
set +e
on_bed "$@"
status=$?
set -e
after=$(link_bytes)
oktopk_log "netbench: bytes through each link's shapers during PROGRAM (host: up, down):"
join <(echo "$before" | sort) <(echo "$after" | sort) |
  awk '{ printf "[oktopk]   %s: %d, %d\n", $1, $4 - $2, $5 - $3 }'
exit "$status"
