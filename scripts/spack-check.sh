#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The Spack package (spack/spack_repo/oktopk) checked against a real Spack, as a site would use
# it, with this machine's GCC, Open MPI, CMake, make and the README's Kokkos 3.4.01 (and its
# Kokkos Kernels) as externals, and clingo from PyPI:
#   1. spack audit packages oktopk;
#   2. oktopk@main concretized: everything external but the compiler's runtime (gcc-runtime);
#   3. a spack dev-build of a copy of this checkout (the package's cmake_args, installed into
#      a store in the work folder), then tests/consumer/project built against that install with
#      find_package(OkTopk) and run at P = 2;
#   4. a GPU spec, oktopk@main+cuda cuda_arch=60 %gcc ^kokkos@3.7, concretized without the
#      externals: Kokkos must come out +cuda +cuda_lambda cuda_arch=60;
#   5. oktopk@main+python+apps concretized without them: Kokkos +shared, with py-pybind11,
#      py-numpy, py-mpi4py, kokkos-kernels and zlib-api's provider among the dependencies.
#   scripts/spack-check.sh --spack DIR [--spec SPEC] [--keep DIR2]
#     --spack DIR   a Spack checkout (its bin/spack); Spack is on neither PyPI nor Debian
#     --spec SPEC   what step 2 and 3 build (default oktopk@main)
#     --keep DIR2   work in DIR2, empty or new, and leave it (default a temporary folder,
#                   removed)
# Spack's configuration and caches go to the work folder (SPACK_USER_CONFIG_PATH,
# SPACK_USER_CACHE_PATH), never to ~/.spack.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
set -euo pipefail

spack_root="" spec="oktopk@main" keep=""
while (($#)); do
  case $1 in
    -h|--help) sed -n '3,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --spack) spack_root=${2:?"oktopk: spack-check.sh: --spack needs a folder"}; shift 2 ;;
    --spec) spec=${2:?"oktopk: spack-check.sh: --spec needs a spec"}; shift 2 ;;
    --keep) keep=${2:?"oktopk: spack-check.sh: --keep needs a folder"}; shift 2 ;;
    *) echo "oktopk: spack-check.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
[ -n "$spack_root" ] || { echo "oktopk: spack-check.sh: name a Spack checkout with --spack DIR" >&2; exit 2; }
[ -x "$spack_root/bin/spack" ] || { echo "oktopk: spack-check.sh: no bin/spack in '$spack_root'" >&2; exit 2; }
spack_root=$(cd "$spack_root" && pwd)

oktopk_setup   # the Debian packages and the README's Kokkos, which become externals
start=$SECONDS
oktopk_work_dir spack-check "$keep"
work=$OKTOPK_WORK
oktopk_log "spack-check: Spack $(git -C "$spack_root" describe --always 2>/dev/null || echo '?') in $spack_root, work dir $work"

# Spack's concretizer needs clingo: from PyPI, in an environment under the dependency prefix.
clingo_venv=$(dirname "$OKTOPK_DEPS_PREFIX")/python-clingo
if ! "$clingo_venv/bin/python" -c "import clingo" 2>/dev/null; then
  oktopk_log "spack-check: clingo into $clingo_venv"
  rm -rf "$clingo_venv"
  /usr/bin/python3 -m venv "$clingo_venv"
  "$clingo_venv/bin/python" -m pip install -q --disable-pip-version-check clingo==5.8.3
fi
export SPACK_USER_CONFIG_PATH=$work/user-config SPACK_USER_CACHE_PATH=$work/user-cache
export SPACK_PYTHON=$clingo_venv/bin/python
# The store, stages and caches in the work folder; the externals in a scope of their own, so
# that step 4 concretizes without them.
mkdir -p "$work/site" "$work/externals"
cat >"$work/site/config.yaml" <<EOF
config:
  install_tree:
    root: $work/store
  build_stage: [$work/stage]
  source_cache: $work/source-cache
  misc_cache: $work/misc-cache
  build_jobs: $OKTOPK_JOBS
EOF
cat >"$work/externals/packages.yaml" <<EOF
packages:
  kokkos:
    buildable: false
    externals:
    - spec: kokkos@3.4.01 +openmp +serial +shared ~cuda ~rocm
      prefix: $OKTOPK_DEPS_PREFIX
  kokkos-kernels:
    buildable: false
    externals:
    - spec: kokkos-kernels@3.4.01 +shared
      prefix: $OKTOPK_DEPS_PREFIX
EOF
spack() { "$SPACK_PYTHON" "$spack_root/bin/spack" -C "$work/site" "$@"; }
spack_external() { "$SPACK_PYTHON" "$spack_root/bin/spack" -C "$work/site" -C "$work/externals" "$@"; }
# concretized FILE: the lines of spack spec's output after its "Concretized" heading.
concretized() { awk 'found; /^Concretized/ {found = 1}' "$1"; }
step() { oktopk_log "spack-check: $* ($((SECONDS - start)) s)"; }

step "compilers, externals, the repository"
spack compiler find >"$work/compilers.log"
spack external find --not-buildable cmake gmake openmpi >"$work/externals.log"
spack repo add "$OKTOPK_SOURCE_DIR/spack/spack_repo/oktopk" >"$work/repo.log"
spack repo list

step "1. spack audit packages oktopk"
spack audit packages oktopk | tee "$work/audit.log"

step "2. spack spec -I $spec"
spack_external spec -I "$spec" | tee "$work/spec.log"
# Lines of packages to build start with " - " ("[+]" installed, "[e]" external); only oktopk
# and the compiler's runtime may be among them.
built=$(concretized "$work/spec.log" | grep -E '^ *- ' | grep -Ev -- ' (\^)?(oktopk|gcc-runtime)@' || true)
if [ -n "$built" ]; then
  echo "oktopk: spack-check: $spec would build more than oktopk:" >&2
  echo "$built" >&2; exit 1
fi
grep -Eq '\[e\] +\^kokkos@3\.4\.01' "$work/spec.log" ||
  { echo "oktopk: spack-check: the README's Kokkos was not taken as external" >&2; exit 1; }

step "3. spack dev-build of a copy of the checkout"
mkdir -p "$work/source"
(cd "$OKTOPK_SOURCE_DIR" && git ls-files -z | xargs -0 cp --parents -t "$work/source")
(cd "$work/source" && spack_external dev-build "$spec") >"$work/dev-build.log" 2>&1 ||
  { tail -40 "$work/dev-build.log" >&2; exit 1; }
prefix=$(spack_external location -i "$spec")
oktopk_log "spack-check: installed in $prefix"
[ -f "$prefix/lib/cmake/OkTopk/OkTopkConfig.cmake" ] ||
  { echo "oktopk: spack-check: no OkTopkConfig.cmake under $prefix" >&2; exit 1; }
cmake -S "$OKTOPK_SOURCE_DIR/tests/consumer/project" -B "$work/consumer" -DOkTopk_ROOT="$prefix" \
  -DKokkos_ROOT="$OKTOPK_DEPS_PREFIX" >"$work/consumer.log" 2>&1 &&
  cmake --build "$work/consumer" >>"$work/consumer.log" 2>&1 ||
  { tail -30 "$work/consumer.log" >&2; exit 1; }
mpirun --oversubscribe -n 2 -x OMP_NUM_THREADS=1 "$work/consumer/oktopk_consumer" | tee "$work/consumer-run.log"
grep -q "oktopk consumer: ok" "$work/consumer-run.log"

step "4. a GPU spec: oktopk@main+cuda cuda_arch=60 %gcc ^kokkos@3.7"
spack spec oktopk@main+cuda cuda_arch=60 %gcc ^kokkos@3.7 | tee "$work/gpu-spec.log"
kokkos_line=$(concretized "$work/gpu-spec.log" | grep -E '\^kokkos@' | head -1 || true)
# One variant a line: "+cuda", "~rocm", "cuda_arch=60".
kokkos_variants=$(echo "$kokkos_line" | sed -E 's/([+~ ])/\n\1/g; s/^ +//; s/\n +/\n/g')
for needed in +cuda +cuda_lambda cuda_arch=60; do
  grep -qFx -- "$needed" <<<"$kokkos_variants" || {
    echo "oktopk: spack-check: the GPU spec's Kokkos lacks $needed: $kokkos_line" >&2; exit 1; }
done
step "5. oktopk@main+python+apps %gcc"
spack spec oktopk@main+python+apps %gcc | tee "$work/python-spec.log"
concretized "$work/python-spec.log" | grep -Eq '\^kokkos@[^ ]*\+shared' ||
  { echo "oktopk: spack-check: +python's Kokkos is not +shared" >&2; exit 1; }
for needed in py-pybind11 py-numpy py-mpi4py kokkos-kernels 'zlib(-ng)?'; do
  concretized "$work/python-spec.log" | grep -Eq "\^${needed}@" ||
    { echo "oktopk: spack-check: +python+apps lacks the dependency $needed" >&2; exit 1; }
done
step "passed"
