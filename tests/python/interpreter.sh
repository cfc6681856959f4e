#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The Python tests' interpreter: OKTOPK_TEST_PYTHON where it is set (scripts/torch-current.sh
# names a virtual environment's, with another PyTorch), else the one the package was built for.
#   interpreter.sh BUILT_FOR ARGUMENTS...
set -euo pipefail
built_for=$1
shift
exec "${OKTOPK_TEST_PYTHON:-$built_for}" "$@"
