#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Portability check, run by CI after scripts/test.sh: builds OkTopk against Kokkos 4.6.01
# (OpenMP: library, tests and apps, then the portability tests below) and a Kokkos develop
# snapshot (OpenMP: the library, the unit tests and the methods against the oracle at P = 1, 2
# and 4), and against Kokkos
# 4.6.01 for CUDA (library, unit and binding tests, the Python package, apps, the S2 suite; every
# program then read by scripts/check-lambda-odr.py, the PTX of three units by
# scripts/check-gpu-reads.py), for CUDA on the P100 (cuda-p100: every target for sm_60 with
# compute_60 PTX, by CUDA 12.4, with the same program checks) and HIP (the same as cuda but the
# apps and the S2 suite; its Python package is also imported), compile only: no GPU is needed.
# Warnings are errors in OkTopk's own targets (OKTOPK_WARNINGS_AS_ERRORS), never in the Kokkos
# headers.
#
# The portability tests are those whose outcome can depend on the Kokkos version: the kernel
# unit tests, every MPI suite and the bindings at P = 1 and 2 (the method suite and Ok-Topk's
# schedule also at P = 4), the apps' runs at P <= 2 and the package consumer. Larger and odd
# rank counts, host staging, fault injection and the training fidelity checks exercise OkTopk's
# own MPI code, which does not change with Kokkos: scripts/test.sh runs them with Kokkos 3.4
# (the fault program is not even built here: it compiles the methods itself).
#
#   scripts/portability.sh [CONFIG...]    CONFIG: openmp-4.6 openmp-develop hip cuda cuda-p100
#                                         (default: all)
#
# Each configuration builds into build-<CONFIG>/ at the repository root. The dependencies are
# built once, from the archives in $OKTOPK_SHARED_DIR, under $OKTOPK_DEPS_ROOT/<name>/ (with a
# .oktopk-complete stamp), so a rerun only rebuilds OkTopk.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
set -euo pipefail

OKTOPK_DEPS_ROOT=${OKTOPK_DEPS_ROOT:-/opt/oktopk-deps}
OKTOPK_SHARED_DIR=${OKTOPK_SHARED_DIR:-$OKTOPK_SOURCE_DIR/../shared/deps}
OKTOPK_PORTABILITY_CONFIGS=(openmp-4.6 openmp-develop hip cuda cuda-p100)
OKTOPK_PORTABILITY_DEFAULT=("${OKTOPK_PORTABILITY_CONFIGS[@]}")

KOKKOS_46=kokkos-4.6.01
KK_46=kokkos-kernels-4.6.02
KOKKOS_DEVELOP=kokkos-develop-20250620
KK_DEVELOP=kokkos-kernels-develop-20250820
# CUDA 13 changed three runtime signatures that Kokkos 4.6.01 predates (cudaGraphAddDependencies,
# cudaMemAdvise, cudaMemPrefetchAsync); the repository's own patch adapts them under
# CUDART_VERSION >= 13000, so older CUDA builds the same code as before, and is applied for
# CUDA 13 and newer only.
CUDA13_PATCH=$OKTOPK_SOURCE_DIR/cmake/patches/kokkos-4.6.01-cuda13.patch

oktopk_port_usage() {
  echo "usage: scripts/portability.sh [CONFIG...]  (CONFIG: ${OKTOPK_PORTABILITY_CONFIGS[*]};" \
       "default: ${OKTOPK_PORTABILITY_DEFAULT[*]})"
}

# The archive's path, or a one-line error when it is not there.
oktopk_port_archive() {
  local f="$OKTOPK_SHARED_DIR/$1"
  if [ ! -f "$f" ]; then
    echo "oktopk: portability: $f is missing (set OKTOPK_SHARED_DIR to the folder with the Kokkos archives)" >&2
    return 1
  fi
  echo "$f"
}

# oktopk_port_gcc12_workaround KOKKOS_TREE
# GCC 12.2 to 12.4 skip the constexpr default constructor of SharedAllocationTracker inside the
# develop snapshot's mdspan-based View, so destroying any default View crashes
# (data/kokkos-develop-gcc12/README.md; kokkos#8187, fixed upstream by kokkos#8223). The fix is
# the same one word upstream made: that constructor is no longer constexpr. Other compilers and
# Kokkos releases with the fix need nothing.
oktopk_port_gcc12_workaround() {
  local header="$1/core/src/impl/Kokkos_SharedAlloc.hpp"
  local version; version=$(c++ -dumpfullversion 2>/dev/null || echo 0)
  case $version in 12.[2-4]*) ;; *) return 0 ;; esac
  local before='KOKKOS_FORCEINLINE_FUNCTION constexpr SharedAllocationTracker()'
  grep -qF "$before" "$header" || {
    echo "oktopk: portability: $header has no '$before' to patch (GCC $version workaround)" >&2
    return 1; }
  sed -i "s/$before/KOKKOS_FORCEINLINE_FUNCTION SharedAllocationTracker()/" "$header"
  oktopk_log "portability: GCC $version: SharedAllocationTracker() made non-constexpr (kokkos#8187)"
}

# oktopk_port_deps NAME BACKEND KOKKOS KOKKOS_KERNELS [CUDA_ARCH [HOST_CXX]]
# Builds Kokkos and Kokkos Kernels (archive top folders KOKKOS and KOKKOS_KERNELS) for BACKEND
# (openmp, cuda or hip) into $OKTOPK_DEPS_ROOT/NAME, unless its stamp says it is already there.
# CUDA: with the nvcc on PATH, for Kokkos_ARCH_<CUDA_ARCH> (HOPPER90 or PASCAL60; HOPPER90 when
# not given).
oktopk_port_deps() {
  local name=$1 backend=$2 kokkos=$3 kk=$4 cuda_arch=${5:-HOPPER90}
  local prefix="$OKTOPK_DEPS_ROOT/$name"
  # The stamp holds the recipe it was built by: a prefix built by an older recipe (say, before
  # the GCC 12 workaround) is rebuilt rather than reused.
  local recipe="recipe 2: $backend $kokkos $kk"
  local patch="" sm=""
  if [ "$backend" = cuda ]; then
    case $cuda_arch in
      HOPPER90) sm=sm_90 ;;
      PASCAL60) sm=sm_60 ;;
      *) echo "oktopk: portability: no CUDA arch known for Kokkos_ARCH_$cuda_arch" >&2; return 1 ;;
    esac
    local nvcc_version
    nvcc_version=$(nvcc --version | sed -n 's/^Cuda compilation tools, release .*, V//p')
    [ "${nvcc_version%%.*}" -lt 13 ] || patch=$CUDA13_PATCH
    # A CUDA prefix records the patch it was built with (another patch rebuilds it), and the
    # arch and nvcc where they are not the default configuration's.
    [ -z "$patch" ] || recipe+=" patch $(sha256sum < "$CUDA13_PATCH" | cut -c1-16)"
    [ "$cuda_arch" = HOPPER90 ] || recipe+=" $cuda_arch nvcc $nvcc_version"
  fi
  if [ -f "$prefix/.oktopk-complete" ] && [ "$(cat "$prefix/.oktopk-complete")" = "$recipe" ]; then
    oktopk_log "reusing $name in $prefix"; return
  fi
  local kokkos_tgz kk_tgz
  kokkos_tgz=$(oktopk_port_archive "$kokkos.tar.gz")
  kk_tgz=$(oktopk_port_archive "$kk.tar.gz")

  local start=$SECONDS work
  work=$(mktemp -d /tmp/oktopk-port-deps.XXXXXX)
  oktopk_log "building $name into $prefix (work dir $work)"
  rm -rf "$prefix"   # an unstamped prefix is a build that stopped half way
  tar -xzf "$kokkos_tgz" -C "$work"
  tar -xzf "$kk_tgz" -C "$work"

  if [ "$kokkos" = "$KOKKOS_DEVELOP" ]; then
    oktopk_port_gcc12_workaround "$work/$kokkos"
  fi

  local kokkos_opts=(-DKokkos_ENABLE_SERIAL=ON) cxx=()
  case $backend in
    openmp) kokkos_opts+=(-DKokkos_ENABLE_OPENMP=ON) ;;
    cuda)
      [ -z "$patch" ] || (cd "$work/$kokkos" && patch -p1 < "$patch")
      # CUDA 13 rejects nvcc_wrapper's default sm_70, which compiles what names no arch (CMake's
      # compiler check): the configuration's arch instead. Kokkos installs this copy as
      # $prefix/bin/nvcc_wrapper, the compiler OkTopk's CUDA build then uses.
      local wrapper="$work/$kokkos/bin/nvcc_wrapper"
      sed -i "s/^default_arch=\"sm_[0-9]*\"/default_arch=\"$sm\"/" "$wrapper"
      grep -q "^default_arch=\"$sm\"" "$wrapper"
      cxx=(-DCMAKE_CXX_COMPILER="$wrapper")
      # Kokkos_ENABLE_CUDA_LAMBDA is deprecated in 4.6 (device lambdas are always on) but still
      # accepted; ON is its default there.
      kokkos_opts+=(-DKokkos_ENABLE_CUDA=ON "-DKokkos_ARCH_$cuda_arch=ON" -DKokkos_ENABLE_CUDA_LAMBDA=ON) ;;
    hip)
      cxx=(-DCMAKE_CXX_COMPILER=hipcc)
      kokkos_opts+=(-DKokkos_ENABLE_HIP=ON -DKokkos_ARCH_AMD_GFX90A=ON -DKokkos_ENABLE_ROCTHRUST=OFF) ;;
    *) echo "oktopk: portability: unknown backend $backend" >&2; return 1 ;;
  esac

  local t=$SECONDS
  cmake -S "$work/$kokkos" -B "$work/kokkos-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    "${cxx[@]}" -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON \
    "${kokkos_opts[@]}"
  cmake --build "$work/kokkos-build" -j "$OKTOPK_JOBS" --target install
  oktopk_log "portability: $name: Kokkos built ($((SECONDS - t))s)"

  if [ "$backend" = cuda ]; then
    cxx=(-DCMAKE_CXX_COMPILER="$prefix/bin/nvcc_wrapper")
    grep -q "^default_arch=\"$sm\"" "$prefix/bin/nvcc_wrapper" || {
      echo "oktopk: portability: $prefix/bin/nvcc_wrapper does not default to $sm" >&2; return 1; }
  fi
  # No explicit instantiations (every kernel is instantiated where it is called) and no TPLs:
  # KokkosBlas::gemm then uses Kokkos Kernels' own implementation. The BLAS, MKL, MAGMA and
  # ARMPL TPLs would make CMake enable Fortran; the CUDA ones default to ON with CUDA.
  local kk_opts=(-DKokkosKernels_ADD_DEFAULT_ETI=OFF -DKokkosKernels_ETI_ONLY=OFF)
  for v in DOUBLE FLOAT COMPLEX_DOUBLE COMPLEX_FLOAT OFFSET_INT OFFSET_SIZE_T ORDINAL_INT \
           LAYOUTLEFT LAYOUTRIGHT; do
    kk_opts+=("-DKokkosKernels_INST_$v=OFF")
  done
  for tpl in BLAS LAPACK CBLAS LAPACKE MKL MAGMA ARMPL CUBLAS CUSPARSE CUSOLVER \
             ROCBLAS ROCSPARSE ROCSOLVER SUPERLU CHOLMOD METIS; do
    kk_opts+=("-DKokkosKernels_ENABLE_TPL_$tpl=OFF")
  done
  t=$SECONDS
  cmake -S "$work/$kk" -B "$work/kk-build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cxx[@]}" \
    -DCMAKE_INSTALL_PREFIX="$prefix" -DKokkos_ROOT="$prefix" -DBUILD_SHARED_LIBS=ON \
    "${kk_opts[@]}" -DKokkosKernels_ENABLE_TESTS=OFF -DKokkosKernels_ENABLE_EXAMPLES=OFF
  cmake --build "$work/kk-build" -j "$OKTOPK_JOBS" --target install
  oktopk_log "portability: $name: Kokkos Kernels built ($((SECONDS - t))s)"

  echo "$recipe" > "$prefix/.oktopk-complete"
  rm -rf "$work"
  oktopk_log "portability: $name built ($((SECONDS - start))s)"
}

# oktopk_port_config CONFIG: dependencies, configure, build, and (OpenMP only) ctest.
oktopk_port_config() {
  local config=$1 deps backend kokkos kk cxx=() cuda_arch=() toolkit=()
  case $config in
    openmp-4.6)     deps=kokkos-4.6.01-openmp;  backend=openmp; kokkos=$KOKKOS_46;      kk=$KK_46 ;;
    openmp-develop) deps=kokkos-develop-openmp; backend=openmp; kokkos=$KOKKOS_DEVELOP; kk=$KK_DEVELOP ;;
    hip)            deps=kokkos-4.6.01-hip;     backend=hip;    kokkos=$KOKKOS_46;      kk=$KK_46 ;;
    cuda)           deps=kokkos-4.6.01-cuda;    backend=cuda;   kokkos=$KOKKOS_46;      kk=$KK_46 ;;
    cuda-p100)      deps=kokkos-4.6.01-cuda-pascal60; backend=cuda; kokkos=$KOKKOS_46;  kk=$KK_46
                    cuda_arch=(PASCAL60) ;;
    *) echo "oktopk: portability: unknown configuration '$config'" >&2; return 1 ;;
  esac
  local prefix="$OKTOPK_DEPS_ROOT/$deps" build="$OKTOPK_SOURCE_DIR/build-$config"
  case $backend in
    hip)
      oktopk_install_missing hipcc libamdhip64-dev rocm-device-libs
      # hipcc prints a harmless traceback when it finds no GPU to take the target from.
      export HCC_AMDGPU_TARGET=gfx90a
      # Hardware float atomic add instead of compare-and-swap loops (docs/tutorial.md, HIP recipe):
      # every atomic in OkTopk targets device memory, where that instruction is valid.
      cxx=(-DCMAKE_CXX_COMPILER=hipcc -DCMAKE_CXX_FLAGS=-munsafe-fp-atomics) ;;
    cuda)
      # nvcc_wrapper runs the nvcc it finds on PATH, and so does scripts/check-gpu-reads.py.
      if [ "$config" = cuda-p100 ]; then
        # CUDA 13 compiles for sm_75 and newer only (scripts/common.sh, oktopk_cuda12_toolkit).
        oktopk_cuda12_toolkit
        export PATH="$OKTOPK_CUDA12_ROOT/bin:$PATH"
        toolkit=(-DCUDAToolkit_ROOT="$OKTOPK_CUDA12_ROOT")
      elif ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
        export PATH="/usr/local/cuda/bin:$PATH"
      fi
      command -v nvcc >/dev/null || { echo "oktopk: portability: cuda: nvcc not found" >&2; return 1; }
      # Kokkos for CUDA allows no GNU extensions and would otherwise say so at configure time.
      cxx=(-DCMAKE_CXX_COMPILER="$prefix/bin/nvcc_wrapper" -DCMAKE_CXX_EXTENSIONS=OFF) ;;
  esac
  oktopk_port_deps "$deps" "$backend" "$kokkos" "$kk" "${cuda_arch[@]}"

  # The develop snapshot is checked for what a coming Kokkos release changes in OkTopk's own
  # kernels and API use; the apps add no Kokkos use of their own that 4.6 does not check.
  # HIP compiles the same apps' kernels CUDA already compiles for a device: it checks the library
  # and the kernel tests, where the two backends differ (atomics, memory spaces).
  local apps=ON
  [ "$config" != openmp-develop ] && [ "$config" != hip ] || apps=OFF
  # The Python package on the device backends: its module is compiled by nvcc_wrapper or hipcc
  # as every GPU user's would be (the OpenMP package is the default configuration's).
  local python=OFF
  [ "$backend" = openmp ] || python=ON
  local t=$SECONDS
  # CMake keeps the paths it found (the CUDA runtime among them) in its cache: a build folder
  # configured against other dependencies (another Kokkos recipe or toolkit) starts afresh.
  local configured_for
  configured_for="$(cat "$prefix/.oktopk-complete") ${toolkit[*]}"
  if [ -f "$build/CMakeCache.txt" ] &&
     [ "$(cat "$build/.oktopk-configured-for" 2>/dev/null)" != "$configured_for" ]; then
    oktopk_log "portability: $config: dependencies changed: configuring $build afresh"
    rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
  fi
  cmake -S "$OKTOPK_SOURCE_DIR" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cxx[@]}" \
    "${toolkit[@]}" -DKokkos_ROOT="$prefix" -DKokkosKernels_ROOT="$prefix" \
    -DOKTOPK_ENABLE_TESTS=ON -DOKTOPK_ENABLE_APPS="$apps" -DOKTOPK_WARNINGS_AS_ERRORS=ON \
    -DOKTOPK_ENABLE_PYTHON="$python" -DPython3_EXECUTABLE=/usr/bin/python3 \
    -DOKTOPK_ENABLE_HOST_STAGING_TESTS=OFF -DOKTOPK_ENABLE_FAULT_TESTS=OFF
  echo "$configured_for" > "$build/.oktopk-configured-for"
  # Every target on the CPU; on a device backend the library, the kernel and API unit tests, the
  # bindings' tests, the Python package and (CUDA) the apps: the MPI test programs only call the
  # library, compiled here, and run on the CPU configurations (an nvcc compile of each would
  # double this check).
  # Keep going past a failing target, so that one run reports every error.
  local targets=()
  [ "$backend" = openmp ] ||
    targets=(--target oktopk oktopk_unit_tests oktopk_unit_api_tests tests/bindings/all
             oktopk_python)
  [ "$backend" = openmp ] || [ "$apps" = OFF ] || targets+=(apps/all)
  # The develop snapshot: the library, the kernel and API unit tests and the methods against
  # the oracle, which is what a coming Kokkos can change; Kokkos 4.6 runs the rest.
  [ "$config" != openmp-develop ] ||
    targets=(--target oktopk oktopk_unit_tests oktopk_unit_api_tests oktopk_test_methods)
  # The S2 suite, whose own copy of the sketch kernels crashed the library's on a GPU: the
  # program check below reads it (docs/design.md, the rules).
  [ "$backend" != cuda ] || targets+=(oktopk_test_s2)
  # The P100: every target (the library, every test program, the apps, the Fortran module and
  # the Python package), so that each program a P100 runs is known to compile and link for it.
  [ "$config" != cuda-p100 ] || targets=()
  if ! cmake --build "$build" -j "$OKTOPK_JOBS" "${targets[@]}" -- -k 0 2>&1 |
       tee "$build/portability-build.log"
  then
    oktopk_log "portability: $config: build failed ($((SECONDS - t))s); its diagnostics, once each:"
    grep -E ': (fatal )?(error|warning)[: ]|: error #|: warning #' "$build/portability-build.log" |
      sort -u >&2 || true
    return 1
  fi
  oktopk_log "portability: $config: built ($((SECONDS - t))s)"
  # The HIP runtime loads without a GPU: the module must import and name its backend (the CUDA
  # one needs the driver's libcuda, which only a machine with a GPU has).
  if [ "$backend" = hip ]; then
    PYTHONPATH="$build/python" /usr/bin/python3 -c \
      'import oktopk, sys; sys.exit(oktopk.backend() != "HIP")' || {
      echo "oktopk: portability: hip: the Python package does not import as a HIP build" >&2
      return 1; }
  fi
  # nvcc's host-side wrappers of KOKKOS_LAMBDA keep their function pointers per translation unit:
  # a kernel template that two units instantiate alike can call through a null pointer on a GPU
  # (scripts/check-lambda-odr.py says how). Every program and module built here is read for it.
  if [ "$backend" = cuda ]; then
    local programs=()
    mapfile -t programs < <(find "$build" -path '*/CMakeFiles' -prune -o -type f \
      \( -name '*.so' -o -perm -u+x ! -name '*.sh' ! -name '*.py' \) -print | sort)
    ((${#programs[@]})) || {
      echo "oktopk: portability: cuda: no program found in $build to check" >&2; return 1; }
    /usr/bin/python3 "$OKTOPK_SOURCE_DIR/scripts/check-lambda-odr.py" "${programs[@]}" || {
      echo "oktopk: portability: cuda: a program can call a lambda through a null pointer" \
           "(above; make that kernel a named functor)" >&2
      return 1; }
    # The kernels whose threads loop over a gradient keep several reads in flight per thread:
    # the PTX of the units that instantiate them is read for it (scripts/check-gpu-reads.py).
    /usr/bin/python3 "$OKTOPK_SOURCE_DIR/scripts/check-gpu-reads.py" "$build" || {
      echo "oktopk: portability: cuda: a streaming kernel waits out its reads one at a time" \
           "(above)" >&2
      return 1; }
  fi
  # A GPU newer than the P100 runs the P100 build from its compute_60 PTX, which the driver
  # compiles at load: nvcc embeds it beside the sm_60 code for Kokkos' -arch=sm_60.
  if [ "$config" = cuda-p100 ]; then
    local p listed
    for p in "$build/liboktopk.a" "$build/tests/oktopk_unit_tests"; do
      listed=$(cuobjdump --list-elf --list-ptx "$p" | grep -E '^(ELF|PTX) file' || true)
      if ! grep -q '^ELF file.*\.sm_60\.cubin$' <<< "$listed" ||
         ! grep -q '^PTX file.*\.sm_60\.ptx$' <<< "$listed" || grep -vq '\.sm_60\.' <<< "$listed"
      then
        echo "oktopk: portability: cuda-p100: $p does not hold sm_60 code and compute_60 PTX" \
             "alone:" >&2
        echo "$listed" >&2
        return 1
      fi
    done
  fi
  # oktopk-train needs Kokkos Kernels: make sure this configuration really compiled it.
  [ "$apps" = OFF ] || [ -x "$build/apps/oktopk-train/oktopk-train" ] || {
    echo "oktopk: portability: $config: oktopk-train was not built" >&2; return 1; }

  if [ "$backend" = openmp ]; then
    t=$SECONDS
    # The portability tests (see the top of this file). unit_large_vector needs about 12 GiB
    # and the Python package is built by the default configuration only: scripts/test.sh runs
    # both.
    local select=(-E '^unit_large_vector$|_np[3-9]$|^fidelity_|^bench_memory_limit$')
    local at_four='^(methods|oktopk_schedule)_np4$'
    if [ "$config" = openmp-develop ]; then
      select=(-R '^(unit_kernels|unit_api|methods_np[12])$') at_four='^methods_np4$'
    fi
    (cd "$build" && ctest --output-on-failure -j "$OKTOPK_JOBS" "${select[@]}" &&
       ctest --output-on-failure -j "$OKTOPK_JOBS" -R "$at_four") 2>&1 |
      tee "$build/portability-ctest.log"
    oktopk_log "portability: $config: tests passed ($((SECONDS - t))s)"
  fi
}

main() {
  local configs=("$@")
  for c in "${configs[@]}"; do
    case $c in -h|--help) oktopk_port_usage; return 0 ;; esac
  done
  ((${#configs[@]})) || configs=("${OKTOPK_PORTABILITY_DEFAULT[@]}")
  for c in "${configs[@]}"; do
    if [[ " ${OKTOPK_PORTABILITY_CONFIGS[*]} " != *" $c "* ]]; then
      echo "oktopk: portability: unknown configuration '$c'" >&2; oktopk_port_usage >&2; return 2
    fi
  done
  if [ ! -d "$OKTOPK_SHARED_DIR" ]; then
    echo "oktopk: portability: $OKTOPK_SHARED_DIR is missing (set OKTOPK_SHARED_DIR to the folder with the Kokkos archives)" >&2
    return 1
  fi
  oktopk_install_packages

  local ok=() failed=() start rc
  for c in "${configs[@]}"; do
    start=$SECONDS
    # A subshell per configuration: its failure (set -e) stops it alone, and the exported
    # environment of one (HCC_AMDGPU_TARGET) does not leak into the next.
    set +e
    (set -e; oktopk_port_config "$c")
    rc=$?
    set -e
    if [ "$rc" -eq 0 ]; then
      oktopk_log "portability: $c ok ($((SECONDS - start))s)"; ok+=("$c")
    else
      oktopk_log "portability: $c FAILED ($((SECONDS - start))s)"; failed+=("$c")
    fi
  done
  if ((${#failed[@]})); then
    oktopk_log "portability: ${#ok[@]} of ${#configs[@]} configurations ok; failed: ${failed[*]}"
    return 1
  fi
  oktopk_log "portability: all ${#configs[@]} configurations ok (${configs[*]})"
}

main "$@"; exit
