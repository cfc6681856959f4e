#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The pip install path (pyproject.toml) as a user takes it, from this checkout, against the
# Kokkos of the README's set-up and the system's Open MPI:
#   1. an sdist, made in a fresh virtual environment (python -m build --sdist), then a wheel
#      built from it (pip wheel); the wheel must hold the package, its extension and liboktopk
#      beside it, and no headers or CMake files;
#   2. that wheel installed in a fresh virtual environment, numpy and mpi4py from PyPI: the
#      Python suite's handle tests at P = 1 and 2 and its dtype tests at P = 2, run against the
#      installed package (no build tree on the path, no LD_LIBRARY_PATH), and the import refused,
#      naming both libraries, when mpi4py loads MPICH;
#   3. `pip install .` in a fresh virtual environment over Debian's python3-torch: the DDP
#      hook's tests at P = 2 (a 2-rank DDP run through the hook) and the handle tests at P = 2.
#   scripts/pip-check.sh [--keep DIR]    (--keep: work in DIR, empty or new, and leave it;
#                                        default a temporary folder, removed)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
set -euo pipefail

keep=""
while (($#)); do
  case $1 in
    -h|--help) sed -n '3,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --keep) keep=${2:?"oktopk: pip-check.sh: --keep needs a folder"}; shift 2 ;;
    *) echo "oktopk: pip-check.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done

oktopk_setup   # Debian packages (python3-venv, MPICH for step 2's refusal) and Kokkos
oktopk_install_missing libmpich12
start=$SECONDS
oktopk_work_dir pip-check "$keep"
work=$OKTOPK_WORK
oktopk_log "pip-check: work dir $work"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off PYTHONDONTWRITEBYTECODE=1
unset PYTHONPATH LD_LIBRARY_PATH
# The suite's scripts and harness, without the source tree's package folder next to them.
suite=$work/suite
mkdir -p "$suite"
cp "$OKTOPK_SOURCE_DIR"/tests/python/{harness.py,test_handle.py,test_dtypes.py,test_ddp.py} "$suite"
mpirun_np() {
  local np=$1; shift
  mpirun --oversubscribe -n "$np" -x OMP_NUM_THREADS=1 "$@"
}
# run_suite PYTHON NP SCRIPT: one of the suite's scripts, which must report no failure.
run_suite() {
  local python=$1 np=$2 script=$3 log
  log=$work/${script%.py}-np$np-$(basename "$(dirname "$(dirname "$python")")").log
  oktopk_log "pip-check: $script at P = $np"
  (cd "$work" && mpirun_np "$np" "$python" -m mpi4py "$suite/$script") >"$log" 2>&1 || {
    tail -30 "$log" >&2; echo "oktopk: pip-check: $script at P = $np failed ($log)" >&2
    return 1
  }
  grep -Eq "[1-9][0-9]* passed, 0 failed" "$log" || {
    tail -30 "$log" >&2; echo "oktopk: pip-check: $script at P = $np did not pass ($log)" >&2
    return 1
  }
  tail -1 "$log"
}
# installed_from PYTHON VENV: the package that PYTHON imports lies in VENV.
installed_from() {
  local where
  where=$(cd "$work" && "$1" -c 'import oktopk, os; print(os.path.dirname(oktopk.__file__))')
  case $where in
    "$2"/*) oktopk_log "pip-check: oktopk imported from $where" ;;
    *) echo "oktopk: pip-check: oktopk imported from $where, not from $2" >&2; return 1 ;;
  esac
}

# 1. sdist, then a wheel from it.
t=$SECONDS
/usr/bin/python3 -m venv "$work/tools"
"$work/tools/bin/python" -m pip install -q build
"$work/tools/bin/python" -m build --sdist --outdir "$work/dist" "$OKTOPK_SOURCE_DIR" >"$work/sdist.log" 2>&1 ||
  { tail -30 "$work/sdist.log" >&2; exit 1; }
sdist=$(ls "$work"/dist/oktopk-*.tar.gz)
oktopk_log "pip-check: $(basename "$sdist"), $(($(stat -c %s "$sdist") / 1024)) KiB, in $((SECONDS - t)) s"
t=$SECONDS
"$work/tools/bin/python" -m pip wheel -v --no-deps --wheel-dir "$work/dist" "$sdist" \
  >"$work/wheel.log" 2>&1 || { tail -40 "$work/wheel.log" >&2; exit 1; }
wheel=$(ls "$work"/dist/oktopk-*.whl)
oktopk_log "pip-check: $(basename "$wheel"), $(($(stat -c %s "$wheel") / 1024)) KiB, built from the sdist in $((SECONDS - t)) s"
"$work/tools/bin/python" - "$wheel" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
needed = ["oktopk/__init__.py", "oktopk/torch.py", "oktopk/fsdp.py", "oktopk/liboktopk.so"]
missing = [n for n in needed if n not in names]
if not any(n.startswith("oktopk/_oktopk.") and n.endswith(".so") for n in names):
    missing.append("oktopk/_oktopk.*.so")
stray = [n for n in names if n.endswith((".h", ".hpp", ".cmake", ".mod", ".a"))
         or "/include/" in n or "/cmake/" in n or "/bin/" in n]
for n in names:
    print("  ", n)
if missing or stray:
    sys.exit(f"oktopk: pip-check: the wheel lacks {missing} or holds {stray}")
EOF

# 2. The wheel in a bare environment.
t=$SECONDS
bare=$work/bare
/usr/bin/python3 -m venv "$bare"
"$bare/bin/python" -m pip install -q "$wheel"
oktopk_log "pip-check: installed in $bare ($("$bare/bin/python" -c \
  'import numpy, mpi4py; print("numpy", numpy.__version__, "mpi4py", mpi4py.__version__)')) in $((SECONDS - t)) s"
installed_from "$bare/bin/python" "$bare"
run_suite "$bare/bin/python" 1 test_handle.py
run_suite "$bare/bin/python" 2 test_handle.py
run_suite "$bare/bin/python" 2 test_dtypes.py
# mpi4py's wheel loads the MPI named by MPI4PY_MPIABI, by its ABI's soname: Debian's MPICH has
# libmpich.so.12 only, so a folder gives it the name of MPICH's ABI, libmpi.so.12.
mkdir -p "$work/mpich-abi"
ln -sf "$(/sbin/ldconfig -p | awk '/libmpich\.so\.12 .*x86-64/ {print $NF; exit}')" \
  "$work/mpich-abi/libmpi.so.12"
refusal=$(cd "$work" && LD_LIBRARY_PATH=$work/mpich-abi MPI4PY_MPIABI=mpich \
  "$bare/bin/python" -c 'import oktopk' 2>&1) && {
  echo "oktopk: pip-check: oktopk imported beside mpi4py on MPICH" >&2; exit 1; }
echo "$refusal" | tail -1
echo "$refusal" | grep -q "ImportError: oktopk: the library was compiled against Open MPI .*another MPI (MPICH Version: 4" || {
  echo "oktopk: pip-check: the import failed, but not with the error naming both MPIs" >&2; exit 1; }

# 3. pip install . beside Debian's torch.
t=$SECONDS
ddp=$work/ddp
/usr/bin/python3 -m venv --system-site-packages "$ddp"
"$ddp/bin/python" -m pip install -q "$OKTOPK_SOURCE_DIR" >"$work/install.log" 2>&1 ||
  { tail -40 "$work/install.log" >&2; exit 1; }
oktopk_log "pip-check: pip install . in $((SECONDS - t)) s ($("$ddp/bin/python" -c \
  'import torch, numpy, mpi4py; print("torch", torch.__version__, "numpy", numpy.__version__, "mpi4py", mpi4py.__version__)'))"
installed_from "$ddp/bin/python" "$ddp"
run_suite "$ddp/bin/python" 2 test_ddp.py
run_suite "$ddp/bin/python" 2 test_handle.py
oktopk_log "pip-check: passed in $((SECONDS - start)) s"
