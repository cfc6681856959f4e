#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The Python tests (the package, the DDP hook, the example programs and the fidelity checks)
# under a current PyTorch from PyPI, beside the Debian torch 1.13 that scripts/test.sh runs
# them with. The interpreter is Debian's python3 (the build's extension is for it) in a virtual
# environment with pinned torch, numpy and mpi4py, made once under the dependency prefix and
# reused; mpi4py is compiled there against the system's MPI, the one liboktopk links.
#   scripts/torch-current.sh [CTEST_ARGUMENT...]     (default: ctest -L python)
# PyPI's Linux torch wheels are CUDA builds: with their NVIDIA libraries the environment takes
# 5.4 GB (they run on a CPU).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
case ${1:-} in -h|--help) sed -n '3,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
oktopk_setup
oktopk_torch_venv
oktopk_configure_and_build
oktopk_log "Python tests under $("$OKTOPK_TORCH_VENV/bin/python" -c \
  'import torch, numpy, mpi4py; print("torch", torch.__version__, "numpy", numpy.__version__, "mpi4py", mpi4py.__version__)')"
cd "$OKTOPK_BUILD_DIR"
args=("$@")
((${#args[@]})) || args=(-L python)
OKTOPK_TEST_PYTHON=$OKTOPK_TORCH_VENV/bin/python ctest --output-on-failure -j "$OKTOPK_JOBS" "${args[@]}"
