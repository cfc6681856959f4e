#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# OkTopk's benchmark under SimGrid's SMPI: every rank of an unmodified MPI program runs in one
# process, each charged the compute it measures between MPI calls, and the messages are
# simulated over a platform file, so hundreds of ranks run here with no rank's compute
# slowing another's (docs/simulation.md).
#
#   scripts/smpi.sh build                  installs Debian's libsimgrid-dev, builds Kokkos 3.4.01
#                                          Serial (shared, under the dependency prefix) and
#                                          oktopk-bench, oktopk-kernel-bench with smpicxx into
#                                          build-smpi/
#   scripts/smpi.sh run [OPTIONS] -- BENCH_ARGS...
#                                          one oktopk-bench run under smpirun (options below)
#   scripts/smpi.sh smoke                  CI's check: build, then every method at P = 16 on the
#                                          Piz Daint platform with --check; fails unless every
#                                          row has wrong = 0
#   scripts/smpi.sh tables [--platform daint|fattree] [--network-only | --compute-speedup S]
#                          [--np-list "16 32 64 128 256"] [--out DIR]
#                                          the weak-scaling tables of docs/simulation.md:
#                                          the P100's compute factor (or S), then every method
#                                          at each P on the platform (default daint), compute
#                                          charged and not (--network-only: not only); writes
#                                          DIR (default data/smpi), its plot included, and
#                                          prints the tables
#   scripts/smpi.sh targets [--out DIR]    the three targets of docs/simulation.md: the
#                                          bfloat16 wire against the bfloat16 dense ring, the
#                                          slowest call against the median, hierarchical
#                                          against flat
#   scripts/smpi.sh calibrate [--out DIR]  SMPI against the emulated cluster (root): fits the
#                                          bed's links from Open MPI's allreduce on it at
#                                          P = 2, 4, 8, then every method at those P on the
#                                          bed and under SMPI with the fitted links
#   scripts/smpi.sh all [--np-list LIST] [--out DIR]
#                                          every table of docs/simulation.md in one run (root):
#                                          tables on Piz Daint, the fat tree's network-only
#                                          tables, targets, then calibrate (--np-list goes to
#                                          both tables)
#   scripts/smpi.sh platforms              writes the platform files and prints their paths
#
# run's options:
#   --platform daint|fattree|gpunodes|bed  the machine (scripts/smpi_platforms.py; default
#                                       daint)
#   --np P                              ranks, one per host (daint, fattree) or GPU (gpunodes)
#   --compute-speedup S                 charge compute S times faster than measured here (the
#                                       target node's speed over this CPU's; default 1)
#   --no-compute                        charge no compute: the network alone
#   --bed-link LAT,BW                   bed only: links of LAT s and BW bytes/s (calibrate's)
#   --maxmin-precision X                SimGrid's maxmin/precision (its default 1e-5): a run
#                                       that aborts with "Cannot saturate more a constraint
#                                       that has no active element" takes 1e-4
# Everything after -- goes to oktopk-bench (its --help lists it).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
set -euo pipefail

OKTOPK_SMPI_BUILD_DIR=${OKTOPK_SMPI_BUILD_DIR:-$OKTOPK_SOURCE_DIR/build-smpi}
OKTOPK_SMPI_KOKKOS=${OKTOPK_SMPI_KOKKOS:-$(dirname "$OKTOPK_DEPS_PREFIX")/kokkos-3.4.01-serial}
# The simulated hosts' speed in flop/s: the platforms' hosts have this speed, and SMPI charges
# a rank's measured compute seconds times host-speed / platform speed, so that the two equal
# charges it 1:1 (--compute-speedup changes the platform's side).
OKTOPK_SMPI_HOST_SPEED=1Gf

oktopk_smpi_usage() { sed -n '/^#   scripts\/smpi.sh build/,/^# Everything after/p' "$0" | sed 's/^# \{0,1\}//'; }

# Kokkos 3.4.01 with Serial only, shared: SMPI runs the ranks in one process, so each needs its
# own copy of Kokkos's global state, which SMPI gives only to a shared library it loads once per
# rank (smpi/privatize-libs). OpenMP would start threads that SMPI does not know.
oktopk_smpi_kokkos() {
  local recipe="recipe 1: kokkos 3.4.01 serial shared"
  if [ -f "$OKTOPK_SMPI_KOKKOS/.oktopk-complete" ] &&
     [ "$(cat "$OKTOPK_SMPI_KOKKOS/.oktopk-complete")" = "$recipe" ]; then
    oktopk_log "smpi: reusing Kokkos Serial in $OKTOPK_SMPI_KOKKOS"; return
  fi
  local work start=$SECONDS; work=$(mktemp -d /tmp/oktopk-smpi-kokkos.XXXXXX)
  oktopk_log "smpi: building Kokkos 3.4.01 Serial into $OKTOPK_SMPI_KOKKOS (work dir $work)"
  rm -rf "$OKTOPK_SMPI_KOKKOS"
  local pkgs; pkgs=$(oktopk_trilinos_packages "$work")
  cmake -S "$pkgs/kokkos" -B "$work/kokkos-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$OKTOPK_SMPI_KOKKOS" -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON \
    -DKokkos_ENABLE_SERIAL=ON
  cmake --build "$work/kokkos-build" -j "$OKTOPK_JOBS" --target install
  echo "$recipe" > "$OKTOPK_SMPI_KOKKOS/.oktopk-complete"
  rm -rf "$work"
  oktopk_log "smpi: Kokkos Serial built in $((SECONDS - start)) s"
}

# The library and oktopk-bench, compiled by smpicxx (SMPI's mpi.h, its main wrapper). SMPI's
# mpi.h replaces malloc and realloc by macros, which break Kokkos's headers:
# SMPI_NO_OVERRIDE_MALLOC keeps the C library's (the buffers are real memory, as on a machine).
oktopk_smpi_build() {
  oktopk_install_packages
  oktopk_install_missing libsimgrid-dev
  oktopk_smpi_kokkos
  local start=$SECONDS
  # smpicxx is a compiler wrapper, so CMake's FindMPI takes it as an MPI compiler that needs no
  # flags. The tests, Python and Fortran are not built: only the benchmark runs under SMPI.
  CXX=smpicxx CC=smpicc cmake -S "$OKTOPK_SOURCE_DIR" -B "$OKTOPK_SMPI_BUILD_DIR" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DKokkos_ROOT="$OKTOPK_SMPI_KOKKOS" \
    -DCMAKE_CXX_FLAGS=-DSMPI_NO_OVERRIDE_MALLOC -DCMAKE_C_FLAGS=-DSMPI_NO_OVERRIDE_MALLOC \
    -DOKTOPK_ENABLE_TESTS=OFF -DOKTOPK_ENABLE_APPS=ON -DOKTOPK_ENABLE_PYTHON=OFF \
    -DOKTOPK_ENABLE_FORTRAN=OFF -DOKTOPK_WARNINGS_AS_ERRORS=ON
  cmake --build "$OKTOPK_SMPI_BUILD_DIR" -j "$OKTOPK_JOBS" --target oktopk-bench oktopk-kernel-bench
  oktopk_log "smpi: oktopk-bench built in $((SECONDS - start)) s"
}

oktopk_smpi_platforms() {
  /usr/bin/python3 "$OKTOPK_SOURCE_DIR/scripts/smpi_platforms.py" --out "$OKTOPK_SMPI_BUILD_DIR/platforms"
}

# oktopk_smpi_platform_files NAME P [SPEEDUP [BED_LINK]]: writes the platform and its host
# file into build-smpi/platforms/, prints their paths, one per line.
oktopk_smpi_platform_files() {
  local link=()
  [ -z "${4:-}" ] || link=(--bed-link "$4")
  /usr/bin/python3 "$OKTOPK_SOURCE_DIR/scripts/smpi_platforms.py" --out "$OKTOPK_SMPI_BUILD_DIR/platforms" \
    --platform "$1" --np "$2" --speedup "${3:-1}" "${link[@]}"
}

# oktopk_smpi_run [--platform NAME] [--np P] [--compute-speedup S | --no-compute]
#                 [--bed-link LAT,BW] [--maxmin-precision X] -- BENCH_ARGS
oktopk_smpi_run() {
  local platform=daint np=16 speedup=1 compute=yes bed_link="" precision=""
  while [ $# -gt 0 ]; do
    case $1 in
      --platform) platform=$2; shift 2 ;;
      --maxmin-precision) precision=$2; shift 2 ;;
      --bed-link) bed_link=$2; shift 2 ;;
      --np) np=$2; shift 2 ;;
      --compute-speedup) speedup=$2; shift 2 ;;
      --no-compute) compute=no; shift ;;
      --) shift; break ;;
      -h|--help) oktopk_smpi_usage; return 0 ;;
      *) echo "oktopk: smpi.sh run: unknown option '$1' (--help lists them)" >&2; return 2 ;;
    esac
  done
  local bench="$OKTOPK_SMPI_BUILD_DIR/apps/oktopk-bench/oktopk-bench"
  [ -x "$bench" ] || { echo "oktopk: smpi.sh run: no $bench: run scripts/smpi.sh build" >&2; return 1; }
  local files; files=$(oktopk_smpi_platform_files "$platform" "$np" "$speedup" "$bed_link")
  local xml hosts; { read -r xml; read -r hosts; } <<< "$files"
  # Under the name the benchmark needs it by (libkokkoscore.so.3.4): SMPI privatizes a library
  # by that name only, and under another (the file's own, .so.3.4.01) the ranks share it.
  local needed; needed=$(readelf -d "$bench" | sed -n 's/.*(NEEDED).*\[\(libkokkoscore\.so[^]]*\)\]/\1/p')
  [ -n "$needed" ] || { echo "oktopk: smpi.sh run: $bench does not link libkokkoscore" >&2; return 1; }
  local kokkos_lib="$OKTOPK_SMPI_KOKKOS/lib/$needed"
  local cfg=(
    # Each rank its own copy of Kokkos's state; the full path, as SMPI dlopens it.
    "--cfg=smpi/privatize-libs:$kokkos_lib"
    # The MPICH selection of collective algorithms (SMPI's default is linear).
    --cfg=smpi/coll-selector:mpich
    # The platforms' figures are the links' effective bandwidth and latency: SMPI's default
    # factors by message size (fitted on a Gigabit Ethernet cluster, up to 11.6x the latency
    # of a large message) do not apply to them.
    --cfg=smpi/bw-factor:0:1 --cfg=smpi/lat-factor:0:1
    "--cfg=smpi/host-speed:$OKTOPK_SMPI_HOST_SPEED"
    # One rank at a time keeps the measured compute free of the others.
    --cfg=contexts/nthreads:1
  )
  [ "$compute" = yes ] || cfg+=(--cfg=smpi/simulate-computation:no)
  [ -z "$precision" ] || cfg+=("--cfg=maxmin/precision:$precision")
  # Kokkos's own threads: none (Serial), and no OpenMP runtime to start any.
  OMP_NUM_THREADS=1 smpirun -np "$np" -platform "$xml" -hostfile "$hosts" "${cfg[@]}" \
    --log=root.thres:warning --log=smpi_config.thres:warning \
    "$bench" "$@"
}

# CI's check: every method at P = 16 with --check; a row with wrong != 0, a missing row or a
# non-zero exit fails it, as does a run with a bad argument that exits 0.
oktopk_smpi_smoke() {
  oktopk_smpi_build
  local start=$SECONDS out; out=$(mktemp /tmp/oktopk-smpi-smoke.XXXXXX.csv)
  local methods=dense,topka,topkdsa,gtopk,gaussiank,oktopk,s2
  oktopk_smpi_run --platform daint --np 16 -- --algo "$methods" --n 262144 --density 0.01 \
    --iters 5 --warmup 1 --check --format csv > "$out"
  /usr/bin/python3 - "$out" "$methods" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
want = sys.argv[2].split(",")
got = {r["algo"]: r for r in rows}
missing = [m for m in want if m not in got]
wrong = [f"{m} (wrong = {got[m]['wrong']})" for m in want if m in got and got[m]["wrong"] != "0"]
if missing or wrong:
    sys.exit("oktopk: smpi smoke: " + "; ".join(
        (["no row for " + ", ".join(missing)] if missing else []) + wrong))
for m in want:
    print(f"[oktopk] smpi smoke: {m}: wrong = 0, {1e3 * float(got[m]['time_s_med']):.3f} ms per call")
EOF
  rm -f "$out"
  # A failure ends the simulation with a non-zero status, as mpiexec would.
  if oktopk_smpi_run --platform daint --np 16 -- --algo oktopk --n 0 > /dev/null 2>&1; then
    echo "oktopk: smpi smoke: a run with --n 0 exited 0" >&2; return 1
  fi
  oktopk_log "smpi: smoke test passed in $((SECONDS - start)) s"
}

# The P100's copy bandwidth in GB/s: NVIDIA's peak of 732 GB/s times the 0.81 of its peak
# (4.8 TB/s) that the H200's copy reached (3.87 TB/s, docs/benchmarks.md), the one GPU measured.
OKTOPK_SMPI_P100_COPY_GBS=590

# The A100's (40 GB, Perlmutter's GPU nodes): its peak of 1555 GB/s times the same 0.81.
OKTOPK_SMPI_A100_COPY_GBS=1260

# oktopk_smpi_kernel_times OUT: this machine's kernel times, one core (Serial), for the speedups.
oktopk_smpi_kernel_times() {
  oktopk_log "smpi: timing the kernels on one core here (oktopk-kernel-bench, n = 2^26)"
  smpirun -np 1 -platform "$(oktopk_smpi_platform_files daint 1 | head -n 1)" \
    --cfg=smpi/host-speed:$OKTOPK_SMPI_HOST_SPEED --log=root.thres:warning \
    "$OKTOPK_SMPI_BUILD_DIR/apps/oktopk-kernel-bench/oktopk-kernel-bench" \
    --n 67108864 --reps 3 --dtype float32 --format csv > "$1/kernels-here.csv"
}

# oktopk_smpi_speedup DIR GBS: the factor for a GPU of copy bandwidth GBS, from DIR's kernel times.
oktopk_smpi_speedup() {
  /usr/bin/python3 "$OKTOPK_SOURCE_DIR/scripts/smpi_tables.py" speedup --cpu "$1/kernels-here.csv" \
    --gpu-copy-gbs "$2"
}

# oktopk_smpi_targets [--out DIR]: the three targets the emulated cluster could not measure (its
# ranks share 2 cores), on simulated hosts with cores of their own: Ok-Topk on the bfloat16
# wire against the bfloat16 dense ring (goal 5x) and its slowest call against the median (goal
# 1.3x), each in the bed's setting (4 hosts at 1 Gbit/s, n = 2^24, compute as measured here) and
# on Piz Daint (P = 64, compute as on a P100); hierarchical against flat on nodes of 4 GPUs
# (goal 1.5x, compute as on an A100).
oktopk_smpi_targets() {
  local out="$OKTOPK_SOURCE_DIR/data/smpi"
  while [ $# -gt 0 ]; do
    case $1 in
      --out) out=$2; shift 2 ;;
      *) echo "oktopk: smpi.sh targets: unknown option '$1'" >&2; return 2 ;;
    esac
  done
  oktopk_smpi_build
  mkdir -p "$out"
  local start=$SECONDS
  [ -f "$out/kernels-here.csv" ] || oktopk_smpi_kernel_times "$out"
  local p100 a100
  p100=$(oktopk_smpi_speedup "$out" "$OKTOPK_SMPI_P100_COPY_GBS" | head -n 1)
  a100=$(oktopk_smpi_speedup "$out" "$OKTOPK_SMPI_A100_COPY_GBS" | head -n 1)
  oktopk_log "smpi: targets: compute charged ${p100}x (P100) and ${a100}x (A100) faster than here"
  local bed=(--n 16777216 --density 0.01 --dist correlated:0.5)
  oktopk_smpi_run --platform bed --np 4 -- --algo dense,oktopk --wire bf16 "${bed[@]}" \
    --iters 10 --warmup 3 --format csv > "$out/target-bf16-bed-4.csv"
  oktopk_smpi_run --platform bed --np 4 -- --algo oktopk "${bed[@]}" --iters 20 --warmup 10 \
    --format csv > "$out/target-calls-bed-4.csv"
  oktopk_log "smpi: targets: the bed's setting done"
  local daint=(--platform daint --np 64 --compute-speedup "$p100")
  oktopk_smpi_run "${daint[@]}" -- --algo dense,oktopk --wire bf16 --n 4194304 --density 0.01 \
    --iters 5 --warmup 1 --format csv > "$out/target-bf16-daint-64.csv"
  oktopk_smpi_run "${daint[@]}" -- --algo oktopk --n 4194304 --density 0.01 --iters 30 \
    --warmup 2 --format csv > "$out/target-calls-daint-64.csv"
  oktopk_log "smpi: targets: Piz Daint done"
  local mode
  for mode in off on; do
    oktopk_smpi_run --platform gpunodes --np 64 --compute-speedup "$a100" -- --algo dense,oktopk \
      --n 4194304 --density 0.01 --dist lognormal --shifted-draws --iters 5 --warmup 1 \
      --option node_size=4 --option hierarchical=$mode --format csv \
      > "$out/target-hierarchical-$mode-gpunodes-64.csv"
  done
  oktopk_log "smpi: targets: GPU nodes done"
  /usr/bin/python3 "$OKTOPK_SOURCE_DIR/scripts/smpi_tables.py" targets --dir "$out" | tee "$out/targets.md"
  oktopk_log "smpi: targets in $((SECONDS - start)) s"
}

# oktopk_smpi_calibrate [--out DIR]: the emulated cluster of scripts/netbench.sh (1 Gbit/s, one
# rank per host, the hosts sharing this machine's cores) against SMPI on the bed platform. The
# links' latency and bandwidth are fitted from Open MPI's allreduce on the bed at P = 2, 4, 8
# and n = 2^16 to 2^22; then every method runs at those P on both, SMPI charging compute as
# measured here (each rank a core of its own) and, apart, max(1, P/2) times slower, as the bed's
# ranks share 2 cores. Needs root (network namespaces).
oktopk_smpi_calibrate() {
  local out="$OKTOPK_SOURCE_DIR/data/smpi"
  while [ $# -gt 0 ]; do
    case $1 in
      --out) out=$2; shift 2 ;;
      *) echo "oktopk: smpi.sh calibrate: unknown option '$1'" >&2; return 2 ;;
    esac
  done
  [ "$(id -u)" = 0 ] || { echo "oktopk: smpi.sh calibrate: the emulated cluster needs root" >&2; return 1; }
  oktopk_setup
  oktopk_configure_and_build oktopk-bench
  oktopk_smpi_build
  mkdir -p "$out"
  local start=$SECONDS P e n
  local bench="$OKTOPK_BUILD_DIR/apps/oktopk-bench/oktopk-bench"
  local netbench=(bash "$OKTOPK_SOURCE_DIR/scripts/netbench.sh" --rate 1gbit)
  export OMP_NUM_THREADS=1 OMP_PROC_BIND=false OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  for P in 2 4 8; do
    for e in 16 18 20 22; do
      "${netbench[@]}" --hosts "$P" --no-validate -- "$bench" --algo dense --mpi-baseline \
        --n $((1 << e)) --iters 5 --warmup 1 --format csv > "$out/bed-fit-$P-2e$e.csv"
    done
  done
  local link; link=$(/usr/bin/python3 "$OKTOPK_SOURCE_DIR/scripts/smpi_tables.py" bed-link --dir "$out")
  oktopk_log "smpi: calibrate: the bed's links: $link (latency s, bytes/s)"
  echo "$link" > "$out/bed-link.txt"
  for P in 2 4 8; do
    n=4194304; [ "$P" != 8 ] || n=2097152
    local args=(--algo all --n "$n" --density 0.01 --iters 5 --warmup 2 --format csv)
    "${netbench[@]}" --hosts "$P" -- "$bench" "${args[@]}" > "$out/bed-$P.csv"
    oktopk_smpi_run --platform bed --bed-link "$link" --np "$P" -- "${args[@]}" \
      > "$out/bed-smpi-$P.csv"
    oktopk_smpi_run --platform bed --bed-link "$link" --np "$P" \
      --compute-speedup "$(awk -v p="$P" 'BEGIN { print (p > 2 ? 2 / p : 1) }')" -- "${args[@]}" \
      > "$out/bed-smpi-shared-$P.csv"
    oktopk_log "smpi: calibrate: P = $P done"
  done
  /usr/bin/python3 "$OKTOPK_SOURCE_DIR/scripts/smpi_tables.py" calibration --dir "$out" \
    | tee "$out/calibration.md"
  oktopk_log "smpi: calibrate in $((SECONDS - start)) s"
}

# oktopk_smpi_tables [--platform daint|fattree] [--network-only | --compute-speedup S]
#                    [--np-list LIST] [--out DIR]
oktopk_smpi_tables() {
  local nps="16 32 64 128 256" out="$OKTOPK_SOURCE_DIR/data/smpi" platform=daint network_only=0
  local speedup=""
  while [ $# -gt 0 ]; do
    case $1 in
      --platform) platform=$2; shift 2 ;;
      --network-only) network_only=1; shift ;;
      --compute-speedup) speedup=$2; shift 2 ;;
      --np-list) nps=$2; shift 2 ;;
      --out) out=$2; shift 2 ;;
      *) echo "oktopk: smpi.sh tables: unknown option '$1'" >&2; return 2 ;;
    esac
  done
  # The model's figures, the platform's: latency across a route, bandwidth of a link.
  local model
  case $platform in
    daint) model=(--alpha 1e-6 --bandwidth 10e9) ;;
    fattree) model=(--alpha 1e-6 --bandwidth 12.5e9) ;;
    *) echo "oktopk: smpi.sh tables: --platform takes daint or fattree, not '$platform'" >&2
       return 2 ;;
  esac
  oktopk_smpi_build
  oktopk_install_missing python3-matplotlib
  mkdir -p "$out"
  local start=$SECONDS
  if [ "$network_only" = 0 ] && [ -z "$speedup" ]; then
    # One core here against the H200, kernel by kernel, scaled to the P100's bandwidth.
    oktopk_smpi_kernel_times "$out"
    local factors; factors=$(oktopk_smpi_speedup "$out" "$OKTOPK_SMPI_P100_COPY_GBS")
    speedup=$(head -n 1 <<< "$factors")
    oktopk_log "smpi: a P100 runs the kernels $speedup times as fast as one core here" \
      "(lowest and highest kernel: $(tail -n 2 <<< "$factors" | paste -sd ' '))"
    echo "$factors" > "$out/p100-speedup.txt"
  fi
  local P bench=(--algo all --n 1048576 --density 0.01 --iters 3 --warmup 1 --format csv)
  for P in $nps; do
    local t=$SECONDS
    if [ "$network_only" = 0 ]; then
      oktopk_smpi_run --platform "$platform" --np "$P" --compute-speedup "$speedup" -- \
        "${bench[@]}" > "$out/$platform-$P.csv"
    fi
    oktopk_smpi_run --platform "$platform" --np "$P" --no-compute -- "${bench[@]}" \
      > "$out/$platform-net-$P.csv"
    oktopk_log "smpi: $platform, P = $P done in $((SECONDS - t)) s"
  done
  local plot=()
  [ "$network_only" = 1 ] || plot=(--plot "$out/weak-$platform.png")
  /usr/bin/python3 "$OKTOPK_SOURCE_DIR/scripts/smpi_tables.py" weak --dir "$out" \
    --platform "$platform" "${model[@]}" "${plot[@]}" | tee "$out/tables-$platform.md"
  oktopk_log "smpi: tables in $((SECONDS - start)) s"
}

# oktopk_smpi_all [--np-list LIST] [--out DIR]: every table of docs/simulation.md, one after
# another; root is checked first, as calibrate needs it after an hour of the others.
oktopk_smpi_all() {
  local nps="16 32 64 128 256" out="$OKTOPK_SOURCE_DIR/data/smpi"
  while [ $# -gt 0 ]; do
    case $1 in
      --np-list) nps=$2; shift 2 ;;
      --out) out=$2; shift 2 ;;
      *) echo "oktopk: smpi.sh all: unknown option '$1'" >&2; return 2 ;;
    esac
  done
  [ "$(id -u)" = 0 ] || { echo "oktopk: smpi.sh all: calibrate's emulated cluster needs root" >&2; return 1; }
  local start=$SECONDS
  oktopk_smpi_tables --np-list "$nps" --out "$out"
  oktopk_smpi_tables --platform fattree --network-only --np-list "$nps" --out "$out"
  oktopk_smpi_targets --out "$out"
  oktopk_smpi_calibrate --out "$out"
  oktopk_log "smpi: all in $((SECONDS - start)) s"
}

case ${1:-} in
  build) oktopk_smpi_build ;;
  run) shift; oktopk_smpi_run "$@" ;;
  smoke) oktopk_smpi_smoke ;;
  tables) shift; oktopk_smpi_tables "$@" ;;
  targets) shift; oktopk_smpi_targets "$@" ;;
  calibrate) shift; oktopk_smpi_calibrate "$@" ;;
  all) shift; oktopk_smpi_all "$@" ;;
  platforms) oktopk_smpi_platforms ;;
  -h|--help) oktopk_smpi_usage ;;
  *) oktopk_smpi_usage >&2; exit 2 ;;
esac
