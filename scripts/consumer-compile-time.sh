#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# What OkTopk's headers cost a program that uses them: the compiler's user + system seconds
# (median of --reps) for four one-file programs, each compiled alone (-c, -O3):
#   kokkos-mpi   Kokkos_Core.hpp and mpi.h, nothing else (the floor)
#   umbrella     #include <oktopk/oktopk.hpp>
#   handle       oktopk.hpp, a function that makes an Ok-Topk handle and reduces once
#   example      examples/training_loop.cpp
#
#   scripts/consumer-compile-time.sh [--compiler gcc|nvcc] [--reps R] [--source DIR]
#
# gcc: g++ against the Kokkos 3.4 prefix scripts/test.sh builds (OpenMP); nvcc: Kokkos 4.6's
# nvcc_wrapper for sm_90 against the prefix scripts/portability.sh builds for CUDA. --source
# names the tree whose include/ is read (default: this one), to compare two trees in one run.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$here/scripts/common.sh"
compiler=gcc reps=3 source_dir=$here
while [ $# -gt 0 ]; do
  case $1 in
    --compiler) compiler=${2:?--compiler gcc|nvcc}; shift 2 ;;
    --reps) reps=${2:?--reps R}; shift 2 ;;
    --source) source_dir=$(cd "${2:?--source DIR}" && pwd); shift 2 ;;
    -h|--help) sed -n '3,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "consumer-compile-time.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
[[ $reps =~ ^[1-9][0-9]*$ ]] || { echo "consumer-compile-time.sh: --reps takes a positive count" >&2; exit 2; }
case $compiler in
  gcc)
    kokkos=$OKTOPK_DEPS_PREFIX
    cxx=(g++ -fopenmp) ;;
  nvcc)
    kokkos=$(dirname "$OKTOPK_DEPS_PREFIX")/kokkos-4.6.01-cuda
    export PATH=/usr/local/cuda/bin:$PATH
    cxx=("$kokkos/bin/nvcc_wrapper" -arch=sm_90 -extended-lambda -Wext-lambda-captures-this) ;;
  *) echo "consumer-compile-time.sh: --compiler takes gcc or nvcc, not '$compiler'" >&2; exit 2 ;;
esac
[ -f "$kokkos/include/Kokkos_Core.hpp" ] ||
  { echo "consumer-compile-time.sh: no Kokkos under $kokkos (scripts/test.sh, scripts/portability.sh cuda)" >&2; exit 1; }
command -v mpicxx >/dev/null ||
  { echo "consumer-compile-time.sh: needs mpicxx (Open MPI, scripts/test.sh installs it)" >&2; exit 1; }
command -v /usr/bin/time >/dev/null ||
  { echo "consumer-compile-time.sh: needs /usr/bin/time (Debian package time)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# config.hpp is what CMake generates; the version does not change what is parsed.
mkdir -p "$work/include/oktopk"
printf '#pragma once\n#define OKTOPK_VERSION_MAJOR 0\n#define OKTOPK_VERSION_MINOR 0\n#define OKTOPK_VERSION_PATCH 0\n#define OKTOPK_VERSION_STRING "0.0.0"\n#define OKTOPK_GPU_AWARE_MPI_DEFAULT "auto"\n' \
  >"$work/include/oktopk/config.hpp"
printf '#include <Kokkos_Core.hpp>\n#include <mpi.h>\nint main() { return 0; }\n' >"$work/kokkos-mpi.cpp"
printf '#include <oktopk/oktopk.hpp>\nint main() { return 0; }\n' >"$work/umbrella.cpp"
cat >"$work/handle.cpp" <<'EOF'
#include <oktopk/oktopk.hpp>
void reduce_once(const oktopk::Communicator& comm, Kokkos::View<float*> grad,
                 Kokkos::View<float*> out) {
  const Kokkos::DefaultExecutionSpace exec;
  oktopk::make_sparse_allreduce(exec, oktopk::Algorithm::OkTopk, comm, grad.extent(0))
      ->reduce(exec, grad, out);
}
EOF
cp "$source_dir/examples/training_loop.cpp" "$work/example.cpp"

flags=(-O3 -DNDEBUG -std=c++17 -DKOKKOS_DEPENDENCE -I"$source_dir/include" -I"$work/include"
  -isystem "$kokkos/include" $(mpicxx --showme:compile))
echo "consumer-compile-time: $compiler, $source_dir/include, median of $reps (user + system s)"
for program in kokkos-mpi umbrella handle example; do
  times=()
  for _ in $(seq 1 "$reps"); do
    if ! /usr/bin/time -o "$work/time" -f '%U %S' "${cxx[@]}" "${flags[@]}" \
      -c "$work/$program.cpp" -o "$work/$program.o" >"$work/log" 2>&1; then
      cat "$work/log" >&2
      echo "consumer-compile-time.sh: $program did not compile" >&2
      exit 1
    fi
    times+=("$(tail -1 "$work/time" | awk '{printf "%.2f", $1 + $2}')")
  done
  printf '%-12s %s\n' "$program" "$(printf '%s\n' "${times[@]}" | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')"
done
