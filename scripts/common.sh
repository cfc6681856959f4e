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

# oktopk_private_apt DIR TYPE COMPONENTS [SUITE]: an apt list, cache and state of their own
# under DIR, so that the system's apt configuration is left untouched, naming the mirror the
# system already uses for main (TYPE deb or deb-src, the COMPONENTS given, of SUITE: this
# system's own by default); updates it and leaves the apt-get options that use it in
# OKTOPK_PRIVATE_APT_OPTS.
oktopk_private_apt() {
  local dir=$1 type=$2 components=$3 suite=${4:-}
  mkdir -p "$dir/parts" "$dir/lists/partial" "$dir/cache/archives/partial"
  # The system's mirror serves the other suites too: its entry is found by this system's own.
  oktopk_apt_main_source "$(oktopk_codename)"
  [ -n "$suite" ] || suite=$(oktopk_codename)
  {
    echo "Types: $type"
    echo "URIs: $OKTOPK_APT_URIS"
    echo "Suites: $suite"
    echo "Components: $components"
    [ -z "$OKTOPK_APT_SIGNED_BY" ] || echo "Signed-By:$OKTOPK_APT_SIGNED_BY"
  } > "$dir/parts/oktopk.sources"
  OKTOPK_PRIVATE_APT_OPTS=(-o "Dir::Etc::SourceParts=$dir/parts" -o Dir::Etc::SourceList=/dev/null
                           -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir/cache"
                           -o APT::Sandbox::User=root)
  apt-get "${OKTOPK_PRIVATE_APT_OPTS[@]}" update -q
}

# oktopk_trilinos_packages WORK: downloads Debian's trilinos source package into WORK, unpacks
# its Kokkos and Kokkos Kernels there and prints the folder that holds them (packages/).
oktopk_trilinos_packages() {
  local work=$1
  oktopk_private_apt "$work/apt" deb-src main >&2
  (cd "$work" && apt-get "${OKTOPK_PRIVATE_APT_OPTS[@]}" source --download-only trilinos) >&2
  local tarball; tarball=$(ls "$work"/trilinos_*.orig.tar.* | head -n 1)
  tar -xf "$tarball" -C "$work" --wildcards '*/packages/kokkos/*' '*/packages/kokkos-kernels/*'
  ls -d "$work"/*/packages | head -n 1
}

# Kokkos (OpenMP + Serial) and Kokkos Kernels (no ETI, OpenBLAS as BLAS) from the trilinos
# source package: Debian's binary libtrilinos-kokkos-dev is Serial-only with a broken CMake config.
oktopk_build_kokkos() {
  if [ -f "$OKTOPK_DEPS_PREFIX/.oktopk-complete" ]; then
    oktopk_log "reusing Kokkos in $OKTOPK_DEPS_PREFIX"; return
  fi
  local work; work=$(mktemp -d /tmp/oktopk-kokkos.XXXXXX)
  oktopk_log "building Kokkos 3.4.01 + Kokkos Kernels into $OKTOPK_DEPS_PREFIX (work dir $work)"
  local pkgs; pkgs=$(oktopk_trilinos_packages "$work")

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

# A CUDA 12 that compiles for the P100 (sm_60): CUDA 13 (/usr/local/cuda) compiles for sm_75
# and newer only, and PyPI's CUDA 12 wheels hold ptxas and libnvvm but no nvcc, cicc or
# cudafe++ (nvidia-cuda-nvcc-cu12 12.0 to 12.9). Debian 13's non-free component has a whole
# CUDA 12.4 (sm_50 to sm_90), NVIDIA's own binaries, which need glibc 2.34 at most (Debian 12
# has 2.36) and take Debian 12's GCC 12 as host compiler; its nvidia-cuda-dev takes CUB, Thrust
# and libcu++ from Debian 13's main. Only these packages come from Debian 13, unpacked under
# the prefix, never installed.
OKTOPK_CUDA12_SUITE=trixie
OKTOPK_CUDA12_PINS=("nvidia-cuda-toolkit=12.4.131~12.4.1-2" "nvidia-cuda-dev=12.4.127~12.4.1-2"
                    "libcudart12=12.4.127~12.4.1-2"
                    libthrust-dev=2.3.2-2 libcub-dev=2.3.2-2 libcu++-dev=2.3.2-2)
OKTOPK_CUDA12_ROOT=${OKTOPK_CUDA12_ROOT:-$(dirname "$OKTOPK_DEPS_PREFIX")/cuda-12.4.131}

# oktopk_cuda12_toolkit: lays out OKTOPK_CUDA12_ROOT once as a CUDA toolkit root (bin/nvcc with
# its nvcc.profile, include/, lib64/ with libcudart and the libcuda stub, nvvm/) from the
# packages of OKTOPK_CUDA12_PINS, unpacked, not installed: the system's nvcc stays CUDA 13.
# Checks that a program compiles and links for sm_60.
oktopk_cuda12_toolkit() {
  local root=$OKTOPK_CUDA12_ROOT
  local recipe="recipe 1: $OKTOPK_CUDA12_SUITE ${OKTOPK_CUDA12_PINS[*]}"
  if [ -f "$root/.oktopk-complete" ] && [ "$(cat "$root/.oktopk-complete")" = "$recipe" ]; then
    oktopk_log "reusing CUDA 12.4 in $root"; return
  fi
  local start=$SECONDS work
  work=$(mktemp -d /tmp/oktopk-cuda12.XXXXXX)
  oktopk_log "laying out CUDA 12.4 in $root (work dir $work)"
  rm -rf "$root"   # an unstamped root is a layout that stopped half way
  # Debian's non-free component holds the toolkit; main its CUB, Thrust and libcu++.
  mkdir -p "$work/debs"
  oktopk_private_apt "$work/apt" deb "main non-free" "$OKTOPK_CUDA12_SUITE"
  (cd "$work/debs" &&
   apt-get "${OKTOPK_PRIVATE_APT_OPTS[@]}" download "${OKTOPK_CUDA12_PINS[@]}") || {
    echo "oktopk_cuda12_toolkit: cannot download ${OKTOPK_CUDA12_PINS[*]} from main and" \
         "non-free of $OKTOPK_CUDA12_SUITE at $OKTOPK_APT_URIS" >&2
    return 1; }

  local x="$work/root" multiarch deb
  multiarch=$(gcc -print-multiarch)
  mkdir -p "$x"
  for deb in "$work"/debs/*.deb; do
    case ${deb##*/} in
      # 0.9 GB, nearly all of it other libraries (cuBLAS, cuFFT, ...): the headers, the runtime
      # and the driver stub only.
      nvidia-cuda-dev_*)
        dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$x" ./usr/include \
          "./usr/lib/$multiarch/"{libcudart.so,libcudart_static.a,libcudadevrt.a,libculibos.a} \
          "./usr/lib/$multiarch/stubs/libcuda.so" ;;
      *) dpkg-deb -x "$deb" "$x" ;;
    esac
  done
  # Debian spreads the toolkit over /usr (nvcc's own profile names those folders): the layout of
  # NVIDIA's installer instead, under one root. usr/bin/nvcc is a script that runs the one below.
  local tk="$x/usr/lib/nvidia-cuda-toolkit" t
  mkdir -p "$root/bin" "$root/nvvm/bin" "$root/lib64"
  cp -a "$tk/bin/nvcc" "$tk/bin/crt" "$root/bin/"
  for t in cudafe++ ptxas fatbinary nvlink bin2c cuobjdump nvdisasm nvprune cu++filt; do
    cp -a "$x/usr/bin/$t" "$root/bin/"
  done
  cp -a "$tk/bin/cicc" "$root/nvvm/bin/"
  cp -a "$tk/libdevice" "$root/nvvm/"
  cp -a "$x/usr/include" "$root/include"
  cp -a "$x/usr/lib/$multiarch/." "$root/lib64/"
  cat > "$root/bin/nvcc.profile" <<'EOF'
TOP              = $(_HERE_)/..

NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice

LD_LIBRARY_PATH += $(TOP)/lib64:
PATH            += $(TOP)/nvvm/bin:$(_HERE_):

INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)

LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib64/stubs" "-L$(TOP)/lib64"

CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
EOF

  # The check: a kernel with a float atomic and Thrust, compiled and linked for sm_60 as Kokkos
  # compiles (-arch=sm_60: sm_60 code and compute_60 PTX, which newer GPUs' drivers compile
  # at load), against the shared runtime as Kokkos links it. No GPU is needed.
  cat > "$work/check.cu" <<'EOF'
#include <thrust/device_vector.h>
#include <thrust/sort.h>
__global__ void add(float* x, float v) { atomicAdd(x + threadIdx.x % 4, v); }
int main() {
  thrust::device_vector<float> x(4);
  add<<<1, 32>>>(thrust::raw_pointer_cast(x.data()), 1.f);
  thrust::sort(x.begin(), x.end());
  return cudaDeviceSynchronize() != cudaSuccess;
}
EOF
  "$root/bin/nvcc" -arch=sm_60 -cudart shared -o "$work/check" "$work/check.cu"
  local listed ptx
  listed=$("$root/bin/cuobjdump" --list-elf --list-ptx "$work/check")
  ptx=$("$root/bin/cuobjdump" -ptx "$work/check")
  if ! grep -q 'sm_60\.cubin' <<< "$listed" || ! grep -q '^\.target sm_60' <<< "$ptx"; then
    echo "oktopk_cuda12_toolkit: the check program holds no sm_60 code or compute_60 PTX:" >&2
    echo "$listed" >&2
    return 1
  fi
  echo "$recipe" > "$root/.oktopk-complete"
  rm -rf "$work"
  oktopk_log "CUDA 12.4 laid out in $root ($((SECONDS - start))s)"
}

# oktopk_work_dir NAME KEEP: sets OKTOPK_WORK to the folder KEEP (made where absent; it must be
# empty, and is left afterwards) or, when KEEP is empty, to a new temporary folder removed at
# exit. NAME (the script's) goes into the folder's name and the errors.
oktopk_work_dir() {
  local name=$1 keep=$2
  if [ -n "$keep" ]; then
    if [ -e "$keep" ] && [ -n "$(ls -A "$keep")" ]; then
      echo "oktopk: $name: --keep $keep: the folder is not empty" >&2; return 2
    fi
    mkdir -p "$keep"
    OKTOPK_WORK=$(cd "$keep" && pwd)
  else
    OKTOPK_WORK=$(mktemp -d "/tmp/oktopk-$name.XXXXXX")
    trap 'rm -rf "$OKTOPK_WORK"' EXIT
  fi
}

oktopk_setup() {
  oktopk_install_packages
  oktopk_build_kokkos
}
