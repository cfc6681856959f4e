#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Runs the programs of a scripts/gpu-pack.sh archive on a machine with a GPU (the archive holds
# the libraries and MPICH's launcher they need) and writes what they print to LOGDIR/log.
#
#   scripts/gpu-run.sh ARCHIVE LOGDIR [STEP...]
#     unit     the kernel unit tests on the GPU (Kokkos's default space)
#     api      the API unit tests
#     bench    oktopk-kernel-bench at n = 2^26, float32 and bfloat16, 20 repetitions, with
#              the launches of count_above, the selections and the k-th timed one by one
#              (--kernel-times)
#     stream   test_c_stream at P = 1, 2, 3: device buffers on a non-blocking stream
#     mpi      the MPI test programs of the device paths at P = 2 (methods also at P = 3),
#              test_c_api at P = 2 and the host synchronisation counts at P = 8
#     s2       the S2 suite at P = 2, one test at a time (the first that fails again under
#              cuda-gdb, for the stack at the fault)
#     collective  oktopk-bench, every method, n = 2^24, P = 1 and 2
#     p100     the P100 build's kernel unit tests and kernel bench (float32, n = 2^26), from
#              its compute_60 PTX, which the driver compiles for this GPU at load (in the
#              archive when scripts/gpu-pack.sh found the cuda-p100 prefix)
#   (default: unit bench stream mpi s2 api, then p100 where the archive has it). Ranks share the one GPU; MPI is staged through
#   host memory (Debian's MPICH is not GPU-aware: OKTOPK_GPU_AWARE_MPI=auto finds that).
set -u
case ${1:-} in -h|--help) sed -n '3,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
[ $# -ge 2 ] || { echo "gpu-run.sh: ARCHIVE LOGDIR [STEP...] (--help)" >&2; exit 2; }
archive=$1 logdir=$2
shift 2
mkdir -p "$logdir"
exec > >(tee -a "$logdir/log") 2>&1
root=$(mktemp -d)
t0=$SECONDS
stamp() { echo "=== [$((SECONDS - t0)) s] $*"; }
stamp "unpack $archive"
tar -C "$root" -xJf "$archive" || exit 1
export LD_LIBRARY_PATH=$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$root/bin:$PATH
export UCX_TLS=self,sm,tcp UCX_WARN_UNUSED_ENV_VARS=n UCX_MODULE_DIR=$root/lib/ucx
export OMP_NUM_THREADS=1
b=$root/build
nvidia-smi -L 2>/dev/null || true
mpirun() { local np=$1; shift; timeout 150 mpiexec.hydra -launcher fork -n "$np" "$@" </dev/null; }
steps=("$@")
if ((${#steps[@]} == 0)); then
  steps=(unit bench stream mpi s2 api)
  [ ! -d "$root/build-p100" ] || steps+=(p100)
fi
for s in "${steps[@]}"; do
  case $s in
    unit)
      stamp "unit kernels"
      timeout 300 "$b/oktopk_unit_tests" --gtest_brief=1 2>&1 | tail -n 40
      echo "rc=${PIPESTATUS[0]}" ;;
    api)
      stamp "unit api"
      timeout 120 "$b/oktopk_unit_api_tests" --gtest_brief=1 2>&1 | tail -n 30
      echo "rc=${PIPESTATUS[0]}" ;;
    bench)
      for dt in float32 bfloat16; do
        stamp "kernel bench n=2^26 $dt"
        timeout 180 "$b/oktopk-kernel-bench" --n 67108864 --reps 20 --format table --dtype $dt \
          --kernel-times count_above,threshold_select,select_by_region,exact_kth,exact_kth_no_gather
        echo "rc=$?"
      done ;;
    stream)
      for np in 1 2 3; do
        stamp "c_stream P=$np"
        mpirun "$np" "$b/oktopk_test_c_stream" 2>&1 | tail -n 40
        echo "rc=${PIPESTATUS[0]}"
      done ;;
    mpi)
      for t in methods mpi_staging dense_allreduce baselines async; do
        stamp "$t P=2"
        mpirun 2 "$b/oktopk_test_$t" --gtest_brief=1 2>&1 | tail -n 40
        echo "rc=${PIPESTATUS[0]}"
      done
      stamp "methods P=3"
      mpirun 3 "$b/oktopk_test_methods" --gtest_brief=1 2>&1 | tail -n 30
      echo "rc=${PIPESTATUS[0]}"
      stamp "c_api P=2"
      mpirun 2 "$b/oktopk_test_c_api" 2>&1 | tail -n 20
      echo "rc=${PIPESTATUS[0]}"
      stamp "host_syncs P=8"
      mpirun 8 "$b/oktopk_test_host_syncs" --gtest_brief=1 2>&1 | tail -n 30
      echo "rc=${PIPESTATUS[0]}" ;;
    s2)
      tests=$("$b/oktopk_test_s2" --gtest_list_tests 2>/dev/null |
                sed -n 's/^  \([A-Za-z0-9_]*\).*/\1/p')
      for t in $tests; do
        stamp "s2 P=2: S2.$t"
        mpirun 2 "$b/oktopk_test_s2" --gtest_brief=1 --gtest_filter="S2.$t" 2>&1 | tail -n 25
        rc=${PIPESTATUS[0]}
        echo "rc=$rc"
        # The first test that fails, again at P = 1 under the debugger (if the machine has
        # one): the faulting address and the stack's words, which name the return addresses
        # (a backtrace does not unwind from a jump to address 0).
        if ((rc != 0)) && [ -z "${traced:-}" ] && command -v cuda-gdb >/dev/null; then
          traced=1
          UCX_HANDLE_ERRORS=none timeout 100 cuda-gdb -q -batch -ex run \
            -ex 'p $_siginfo._sifields._sigfault.si_addr' -ex 'p/x $pc' -ex 'x/32a $sp' \
            --args "$b/oktopk_test_s2" --gtest_filter="S2.$t" </dev/null 2>&1 |
            grep -v -E '^\[(New )?Thread|Detaching' | c++filt | cut -c1-300 | tail -n 40
        fi
      done ;;
    collective)
      for np in 1 2; do
        stamp "oktopk-bench P=$np"
        mpirun "$np" "$b/oktopk-bench" --n 16777216 --iters 20 --warmup 5 --format table 2>&1 |
          tail -n 20
        echo "rc=${PIPESTATUS[0]}"
      done ;;
    p100)
      p=$root/build-p100
      [ -d "$p" ] || { echo "gpu-run.sh: the archive holds no P100 build"; continue; }
      p100_libs=$root/lib-p100:$LD_LIBRARY_PATH
      stamp "P100 build: unit kernels (compute_60 PTX, compiled at load)"
      LD_LIBRARY_PATH=$p100_libs timeout 300 "$p/oktopk_unit_tests" --gtest_brief=1 2>&1 |
        tail -n 40
      echo "rc=${PIPESTATUS[0]}"
      stamp "P100 build: kernel bench n=2^26 float32"
      LD_LIBRARY_PATH=$p100_libs timeout 180 "$p/oktopk-kernel-bench" --n 67108864 --reps 20 \
        --format table
      echo "rc=$?" ;;
    *) echo "gpu-run.sh: unknown step $s" ;;
  esac
done
stamp done
rm -rf "$root"
