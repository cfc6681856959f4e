#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Builds OkTopk's CUDA programs against Debian's MPICH into build-cuda-mpich/ and packs them into
# one archive for a machine that has a GPU but no MPI: the kernel and API unit tests, the kernel
# benchmark, the MPI test programs of the device paths, the C programs (test_c_api and
# test_c_stream, on a non-blocking stream behind a slow producer kernel), oktopk-bench, with
# every shared library they load that such a machine may lack (MPICH and the UCX, hwloc, numa,
# udev and slurm libraries it loads, Kokkos, the CUDA runtime) and MPICH's launcher. The MPICH
# build matters: singleton and `mpiexec.hydra -launcher fork` runs need no daemon, where Open
# MPI's need its whole installation. Where `scripts/portability.sh cuda-p100` has built its
# Kokkos prefix, the P100 build's kernel unit tests and kernel benchmark (sm_60 code and
# compute_60 PTX, by CUDA 12.4) go into the archive's build-p100/ too, with CUDA 12.4's
# runtime. scripts/gpu-run.sh runs the archive's programs there.
#
#   scripts/gpu-pack.sh ARCHIVE      e.g. .gpu/pack.tar.xz (about 45 MB)
#
# Needs nvcc (/usr/local/cuda) and the Kokkos 4.6 CUDA prefix that `scripts/portability.sh cuda`
# builds under $OKTOPK_DEPS_ROOT (default /opt/oktopk-deps); targets Kokkos_ARCH_HOPPER90.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
set -euo pipefail

case ${1:-} in
  -h|--help) sed -n '3,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") echo "gpu-pack.sh: name the archive to write (--help)" >&2; exit 2 ;;
esac
archive=$(realpath -m "$1")
prefix=${OKTOPK_DEPS_ROOT:-/opt/oktopk-deps}/kokkos-4.6.01-cuda
build=$OKTOPK_SOURCE_DIR/build-cuda-mpich
[ -x "$prefix/bin/nvcc_wrapper" ] ||
  { echo "gpu-pack.sh: $prefix is missing: run scripts/portability.sh cuda first" >&2; exit 1; }
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
oktopk_install_missing libmpich-dev mpich

cmake -S "$OKTOPK_SOURCE_DIR" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$prefix/bin/nvcc_wrapper" -DCMAKE_CXX_EXTENSIONS=OFF \
  -DKokkos_ROOT="$prefix" -DKokkosKernels_ROOT="$prefix" -DOKTOPK_ENABLE_TESTS=ON \
  -DOKTOPK_ENABLE_APPS=ON -DOKTOPK_WARNINGS_AS_ERRORS=ON -DOKTOPK_ENABLE_PYTHON=OFF \
  -DOKTOPK_ENABLE_FAULT_TESTS=OFF \
  -DMPI_C_COMPILER=/usr/bin/mpicc.mpich -DMPI_CXX_COMPILER=/usr/bin/mpicxx.mpich \
  -DMPIEXEC_EXECUTABLE=/usr/bin/mpiexec.mpich -DMPI_Fortran_COMPILER=/usr/bin/mpif90.mpich \
  >/dev/null
suites=(methods mpi_staging dense_allreduce s2 baselines async host_syncs)
programs=(tests/oktopk_unit_tests tests/oktopk_unit_api_tests
          apps/oktopk-kernel-bench/oktopk-kernel-bench apps/oktopk-bench/oktopk-bench
          tests/bindings/oktopk_test_c_api tests/bindings/oktopk_test_c_stream)
for s in "${suites[@]}"; do programs+=("tests/oktopk_test_$s"); done
targets=()
for p in "${programs[@]}"; do targets+=("$(basename "$p")"); done
cmake --build "$build" -j "$OKTOPK_JOBS" --target "${targets[@]}"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build" "$stage/lib/ucx" "$stage/bin"
for p in "${programs[@]}"; do cp "$build/$p" "$stage/build/"; done

p100_prefix=${OKTOPK_DEPS_ROOT:-/opt/oktopk-deps}/kokkos-4.6.01-cuda-pascal60
p100_programs=(tests/oktopk_unit_tests apps/oktopk-kernel-bench/oktopk-kernel-bench)
if [ -f "$p100_prefix/.oktopk-complete" ] && [ -x "$OKTOPK_CUDA12_ROOT/bin/nvcc" ]; then
  p100_build=$OKTOPK_SOURCE_DIR/build-cuda-p100-mpich
  (
    export PATH="$OKTOPK_CUDA12_ROOT/bin:$PATH"
    cmake -S "$OKTOPK_SOURCE_DIR" -B "$p100_build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CXX_COMPILER="$p100_prefix/bin/nvcc_wrapper" -DCMAKE_CXX_EXTENSIONS=OFF \
      -DCUDAToolkit_ROOT="$OKTOPK_CUDA12_ROOT" -DKokkos_ROOT="$p100_prefix" \
      -DKokkosKernels_ROOT="$p100_prefix" -DOKTOPK_ENABLE_TESTS=ON -DOKTOPK_ENABLE_APPS=ON \
      -DOKTOPK_WARNINGS_AS_ERRORS=ON -DOKTOPK_ENABLE_PYTHON=OFF -DOKTOPK_ENABLE_FAULT_TESTS=OFF \
      -DMPI_C_COMPILER=/usr/bin/mpicc.mpich -DMPI_CXX_COMPILER=/usr/bin/mpicxx.mpich \
      -DMPIEXEC_EXECUTABLE=/usr/bin/mpiexec.mpich -DMPI_Fortran_COMPILER=/usr/bin/mpif90.mpich \
      >/dev/null
    cmake --build "$p100_build" -j "$OKTOPK_JOBS" --target oktopk_unit_tests oktopk-kernel-bench
  )
  mkdir -p "$stage/build-p100" "$stage/lib-p100"
  for p in "${p100_programs[@]}"; do cp "$p100_build/$p" "$stage/build-p100/"; done
  # Their own Kokkos (the same sonames as the sm_90 build's) and CUDA 12.4's runtime, in a
  # folder of their own that gpu-run.sh puts first on the library path.
  for p in "$stage"/build-p100/*; do
    LD_LIBRARY_PATH="$OKTOPK_CUDA12_ROOT/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$p" |
      awk '$3 ~ /^\// {print $3}'
  done | sort -u | grep -E '/(libkokkos[a-z]*|libcudart)\.so' |
    while read -r lib; do cp -L "$lib" "$stage/lib-p100/"; done
else
  oktopk_log "gpu-pack: no P100 build ($p100_prefix: run scripts/portability.sh cuda-p100 first)"
fi

# The libraries the programs load, but not the C library's own (the GPU machine's are newer)
# nor libcuda (its driver's).
for p in "$stage"/build/* /usr/bin/mpiexec.hydra /usr/bin/hydra_pmi_proxy; do
  ldd "$p" | awk '$3 ~ /^\// {print $3}'
done | sort -u |
  grep -v -E '/(libc|libm|libdl|libpthread|librt|libresolv|libgcc_s|libstdc\+\+)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
cp -L /usr/lib/x86_64-linux-gnu/ucx/libuct_cma.so.0 "$stage/lib/ucx/"
cp /usr/bin/mpiexec.hydra /usr/bin/hydra_pmi_proxy "$stage/bin/"
mkdir -p "$(dirname "$archive")"
tar -C "$stage" -cf - . | xz -T"$OKTOPK_JOBS" -6 >"$archive"
oktopk_log "gpu-pack: $archive ($(du -h "$archive" | cut -f1))"
