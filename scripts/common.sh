# SPDX-License-Identifier: BSD-3-Clause
# Shared by scripts/main.sh and scripts/test.sh: install what is missing, then configure and
# build into build/. Every step is idempotent, so running a script twice is safe and cheap.
set -euo pipefail

OKTOPK_SOURCE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OKTOPK_BUILD_DIR=${OKTOPK_BUILD_DIR:-$OKTOPK_SOURCE_DIR/build}
# Kokkos 3.4.01 + Kokkos Kernels built from Debian's trilinos source package land here, once.
OKTOPK_DEPS_PREFIX=${OKTOPK_DEPS_PREFIX:-/opt/oktopk-deps/kokkos-3.4.01}
OKTOPK_JOBS=${OKTOPK_JOBS:-$(nproc)}

# OpenMPI refuses to start as root without these; they are harmless for other users.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_PROC_BIND=${OMP_PROC_BIND:-false}

oktopk_log() { echo "[oktopk] $*"; }

oktopk_install_packages() {
  local wanted=(cmake ninja-build g++ make libopenmpi-dev openmpi-bin libopenblas-dev
                libgtest-dev zlib1g-dev dataset-fashion-mnist ca-certificates)
  local missing=()
  for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    oktopk_log "installing Debian packages: ${missing[*]}"
    [ "$(id -u)" -eq 0 ] || { echo "oktopk: need root to install ${missing[*]}" >&2; exit 1; }
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
}

# Kokkos (OpenMP + Serial) and Kokkos Kernels (no ETI, OpenBLAS as BLAS) from the trilinos
# source package: Debian's binary libtrilinos-kokkos-dev is Serial-only with a broken CMake config.
oktopk_build_kokkos() {
  if [ -f "$OKTOPK_DEPS_PREFIX/.oktopk-complete" ]; then
    oktopk_log "reusing Kokkos in $OKTOPK_DEPS_PREFIX"; return
  fi
  local work; work=$(mktemp -d /tmp/oktopk-kokkos.XXXXXX)
  oktopk_log "building Kokkos 3.4.01 + Kokkos Kernels into $OKTOPK_DEPS_PREFIX (work dir $work)"
  # A private deb-src list, so the system's apt configuration is left untouched.
  mkdir -p "$work/apt/parts" "$work/apt/lists/partial"
  local suite; suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
  cat > "$work/apt/parts/oktopk-src.sources" <<SRC
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: $suite
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  local apt_opts=(-o "Dir::Etc::SourceParts=$work/apt/parts" -o Dir::Etc::SourceList=/dev/null
                  -o "Dir::State::Lists=$work/apt/lists" -o APT::Sandbox::User=root)
  apt-get "${apt_opts[@]}" update -q
  (cd "$work" && apt-get "${apt_opts[@]}" source --download-only trilinos)
  local tarball; tarball=$(ls "$work"/trilinos_*.orig.tar.* | head -n 1)
  tar -xf "$tarball" -C "$work" --wildcards '*/packages/kokkos/*' '*/packages/kokkos-kernels/*'
  local pkgs; pkgs=$(ls -d "$work"/*/packages | head -n 1)

  cmake -S "$pkgs/kokkos" -B "$work/kokkos-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$OKTOPK_DEPS_PREFIX" -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON \
    -DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_OPENMP=ON
  cmake --build "$work/kokkos-build" -j "$OKTOPK_JOBS" --target install

  local no_eti=()
  for v in DOUBLE FLOAT EXECSPACE_OPENMP EXECSPACE_SERIAL MEMSPACE_HOSTSPACE OFFSET_INT \
           OFFSET_SIZE_T ORDINAL_INT LAYOUTLEFT LAYOUTRIGHT; do
    no_eti+=("-DKokkosKernels_INST_$v=OFF")
  done
  local blas_dir; blas_dir=$(dirname "$(find /usr/lib -name 'libopenblas.so' | head -n 1)")
  cmake -S "$pkgs/kokkos-kernels" -B "$work/kk-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$OKTOPK_DEPS_PREFIX" -DKokkos_ROOT="$OKTOPK_DEPS_PREFIX" \
    -DBUILD_SHARED_LIBS=ON "${no_eti[@]}" -DKokkosKernels_ENABLE_TPL_BLAS=ON \
    -DBLAS_LIBRARIES=openblas -DBLAS_LIBRARY_DIRS="$blas_dir" \
    -DKokkosKernels_ENABLE_TESTS=OFF -DKokkosKernels_ENABLE_EXAMPLES=OFF
  cmake --build "$work/kk-build" -j "$OKTOPK_JOBS" --target install

  touch "$OKTOPK_DEPS_PREFIX/.oktopk-complete"
  rm -rf "$work"
}

# Both scripts share one configuration, so switching between them never rebuilds everything.
# Arguments: the targets to build (all when none are given).
oktopk_configure_and_build() {
  cmake -S "$OKTOPK_SOURCE_DIR" -B "$OKTOPK_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DKokkos_ROOT="$OKTOPK_DEPS_PREFIX" -DKokkosKernels_ROOT="$OKTOPK_DEPS_PREFIX" \
    -DOKTOPK_ENABLE_TESTS=ON -DOKTOPK_ENABLE_APPS=ON
  local targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  cmake --build "$OKTOPK_BUILD_DIR" -j "$OKTOPK_JOBS" "${targets[@]}"
}

oktopk_setup() {
  oktopk_install_packages
  oktopk_build_kokkos
}
