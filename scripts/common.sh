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

# Compiler cache (ccache, installed with the other packages) under the dependency prefix, keyed
# on paths relative to the source tree: a rerun, or a fresh clone elsewhere, recompiles only
# what changed, also for nvcc and hipcc. OKTOPK_CCACHE=0 turns it off.
if [ "${OKTOPK_CCACHE:-1}" != 0 ]; then
  export CCACHE_DIR=${CCACHE_DIR:-$(dirname "$OKTOPK_DEPS_PREFIX")/ccache}
  export CCACHE_BASEDIR=$OKTOPK_SOURCE_DIR CCACHE_NOHASHDIR=true
  export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-8G}
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_C_COMPILER_LAUNCHER=ccache
fi

# oktopk_install_missing PACKAGE...: installs those of the Debian packages that are not yet
# installed (apt-get update first); needs root only when something is missing.
oktopk_install_missing() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  oktopk_log "installing Debian packages: ${missing[*]}"
  [ "$(id -u)" -eq 0 ] || { echo "oktopk: need root to install ${missing[*]}" >&2; return 1; }
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# bible-kjv and bible-kjv-text: the King James Bible (public domain) that oktopk-train's
# language model learns; the build prints it to build/data with scripts/kjv-corpus.sh.
oktopk_install_packages() {
  oktopk_install_missing cmake ninja-build g++ make libopenmpi-dev openmpi-bin libopenblas-dev \
    libgtest-dev zlib1g-dev dataset-fashion-mnist bible-kjv bible-kjv-text ca-certificates \
    gfortran ccache python3-dev python3-numpy python3-mpi4py python3-torch python3-venv \
    pybind11-dev
}

oktopk_codename() { (. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}"); }

# oktopk_apt_main_source SUITE: finds the system's own apt entry that serves the main component
# of SUITE (deb822 stanzas in the *.sources files of sources.list.d, one-line entries in
# sources.list and *.list; the first one in apt's reading order wins) and sets
#   OKTOPK_APT_URIS       its URIs, space-separated
#   OKTOPK_APT_SIGNED_BY  its Signed-By value as written after "Signed-By:" (a leading space,
#                         and for an inline key its continuation lines), empty when it has none
# so that a script can reach the same mirror the system uses. Exits with one line if none does.
oktopk_apt_main_source() {
  local suite=$1 list parts
  eval "$(apt-config shell list Dir::Etc::SourceList/f parts Dir::Etc::SourceParts/d)"
  local files=()
  [ -f "$list" ] && files+=("$list")
  local f  # apt's order: sources.list, then sources.list.d/ by name
  for f in "${parts%/}"/*; do
    case $f in *.list|*.sources) [ -f "$f" ] && files+=("$f") ;; esac
  done
  local found=""
  if ((${#files[@]})); then
    found=$(printf '%s\n' "${files[@]}" | awk -v suite="$suite" '
      function flush() {  # the deb822 stanza just read
        if (!done && nf_ok && enabled && types_ok && has(suites, suite) && has(comps, "main")) {
          print uris; if (signed != "") print signed; done = 1
        }
        nf_ok = 0; enabled = 1; types_ok = 0; suites = ""; comps = ""; uris = ""; signed = ""
        key = ""
      }
      function has(list, word,   n, i, w) {
        n = split(list, w, /[ \t]+/)
        for (i = 1; i <= n; i++) if (w[i] == word) return 1
        return 0
      }
      function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
      { files[++nfiles] = $0 }
      END {
        for (i = 1; i <= nfiles && !done; i++) {
          file = files[i]
          deb822 = (file ~ /\.sources$/)
          flush()
          while (!done && (getline line < file) > 0) {
            if (deb822) {
              if (line ~ /^#/) continue
              if (line ~ /^[ \t]*$/) { flush(); continue }
              if (line ~ /^[ \t]/) {  # a continuation line (an inline key)
                if (key == "signed-by") signed = signed "\n" line
                continue
              }
              c = index(line, ":")
              if (c == 0) continue
              key = tolower(trim(substr(line, 1, c - 1)))
              val = substr(line, c + 1)
              nf_ok = 1
              if (key == "types") types_ok = has(trim(val), "deb") || has(trim(val), "deb-src")
              else if (key == "uris") uris = trim(val)
              else if (key == "suites") suites = trim(val)
              else if (key == "components") comps = trim(val)
              else if (key == "enabled") enabled = (tolower(trim(val)) != "no")
              else if (key == "signed-by") signed = val
            } else {
              sub(/#.*/, "", line)
              n = split(line, w, /[ \t]+/)
              j = 1
              if (w[j] == "") j++
              if (w[j] != "deb" && w[j] != "deb-src") continue
              j++
              opts = ""
              if (substr(w[j], 1, 1) == "[") {  # [ options ], possibly spread over words
                while (j <= n) {
                  opts = opts " " w[j]
                  if (w[j] ~ /\]$/) break
                  j++
                }
                j++
                gsub(/[\[\]]/, " ", opts)
              }
              if (j + 2 > n || w[j + 1] != suite) continue
              comps = ""
              for (k = j + 2; k <= n; k++) comps = comps " " w[k]
              if (!has(comps, "main")) continue
              signed = ""
              m = split(opts, o, /[ \t]+/)
              for (k = 1; k <= m; k++) if (tolower(o[k]) ~ /^signed-by=/) signed = " " substr(o[k], 11)
              print w[j]; if (signed != "") print signed; done = 1
            }
          }
          if (deb822) flush()
          close(file)
        }
      }')
  fi
  if [ -z "$found" ]; then
    echo "oktopk: no apt source for the main component of '$suite' in $list or $parts (a deb822 .sources stanza or a one-line 'deb URI $suite main' entry is needed)" >&2
    exit 1
  fi
  OKTOPK_APT_URIS=${found%%$'\n'*}
  OKTOPK_APT_SIGNED_BY=""
  [[ $found == *$'\n'* ]] && OKTOPK_APT_SIGNED_BY=${found#*$'\n'}
  return 0
}

# Kokkos (OpenMP + Serial) and Kokkos Kernels (no ETI, OpenBLAS as BLAS) from the trilinos
# source package: Debian's binary libtrilinos-kokkos-dev is Serial-only with a broken CMake config.
oktopk_build_kokkos() {
  if [ -f "$OKTOPK_DEPS_PREFIX/.oktopk-complete" ]; then
    oktopk_log "reusing Kokkos in $OKTOPK_DEPS_PREFIX"; return
  fi
  local work; work=$(mktemp -d /tmp/oktopk-kokkos.XXXXXX)
  oktopk_log "building Kokkos 3.4.01 + Kokkos Kernels into $OKTOPK_DEPS_PREFIX (work dir $work)"
  # A private deb-src list, so the system's apt configuration is left untouched. It names the
  # mirror the system already uses for its own packages.
  mkdir -p "$work/apt/parts" "$work/apt/lists/partial"
  local suite; suite=$(oktopk_codename)
  oktopk_apt_main_source "$suite"
  {
    echo "Types: deb-src"
    echo "URIs: $OKTOPK_APT_URIS"
    echo "Suites: $suite"
    echo "Components: main"
    [ -z "$OKTOPK_APT_SIGNED_BY" ] || echo "Signed-By:$OKTOPK_APT_SIGNED_BY"
  } > "$work/apt/parts/oktopk-src.sources"
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
  local blas; blas=$(find /usr/lib -name 'libopenblas.so' | head -n 1)
  local blas_dir; blas_dir=$(dirname "$blas")
  # With a BLAS, Kokkos Kernels 3.4 enables Fortran only to learn how the compiler mangles BLAS
  # names, unless F77_BLAS_MANGLE is given: give it, so no Fortran compiler is needed. OpenBLAS
  # exports the gfortran names, lower case with a trailing underscore (dgemm_).
  nm -D "$blas" | grep -w 'dgemm_' > /dev/null ||
    { echo "oktopk: $blas exports no dgemm_, so F77_BLAS_MANGLE below would be wrong" >&2; exit 1; }
  cmake -S "$pkgs/kokkos-kernels" -B "$work/kk-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$OKTOPK_DEPS_PREFIX" -DKokkos_ROOT="$OKTOPK_DEPS_PREFIX" \
    -DBUILD_SHARED_LIBS=ON "${no_eti[@]}" -DKokkosKernels_ENABLE_TPL_BLAS=ON \
    -DBLAS_LIBRARIES=openblas -DBLAS_LIBRARY_DIRS="$blas_dir" \
    -DF77_BLAS_MANGLE="(name,NAME) name ## _" \
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
    -DOKTOPK_ENABLE_TESTS=ON -DOKTOPK_ENABLE_APPS=ON \
    -DOKTOPK_ENABLE_PYTHON=ON -DPython3_EXECUTABLE=/usr/bin/python3
  local targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  cmake --build "$OKTOPK_BUILD_DIR" -j "$OKTOPK_JOBS" "${targets[@]}"
}

# The current PyTorch the Python tests also run under (scripts/torch-current.sh), with the
# numpy and mpi4py it is tested with. numpy stays below 2 while Debian's pybind11 (2.10) builds
# the extension: pybind11 reads numpy 2's array layout only from 2.12 on.
OKTOPK_TORCH_PINS=(torch==2.15.0 numpy==1.26.4 mpi4py==4.1.2)
OKTOPK_TORCH_VENV=${OKTOPK_TORCH_VENV:-$(dirname "$OKTOPK_DEPS_PREFIX")/python-torch-2.15.0}

# oktopk_torch_venv: makes OKTOPK_TORCH_VENV with OKTOPK_TORCH_PINS from PyPI once; mpi4py from
# its source, against the system's MPI compiler wrapper (the MPI liboktopk links).
oktopk_torch_venv() {
  if [ -f "$OKTOPK_TORCH_VENV/.oktopk-complete" ]; then
    oktopk_log "reusing the Python environment $OKTOPK_TORCH_VENV"; return
  fi
  oktopk_log "making the Python environment $OKTOPK_TORCH_VENV (${OKTOPK_TORCH_PINS[*]})"
  rm -rf "$OKTOPK_TORCH_VENV"
  /usr/bin/python3 -m venv "$OKTOPK_TORCH_VENV"
  local pip=("$OKTOPK_TORCH_VENV/bin/python" -m pip --disable-pip-version-check)
  "${pip[@]}" install -q --progress-bar off "${OKTOPK_TORCH_PINS[@]:0:2}"
  MPICC=mpicc "${pip[@]}" install -q --progress-bar off --no-binary mpi4py "${OKTOPK_TORCH_PINS[2]}"
  touch "$OKTOPK_TORCH_VENV/.oktopk-complete"
}

oktopk_setup() {
  oktopk_install_packages
  oktopk_build_kokkos
}
