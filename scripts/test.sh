#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Installs what is missing, builds everything into build/, and runs the whole test suite.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
oktopk_setup
oktopk_configure_and_build
cd "$OKTOPK_BUILD_DIR"
ctest --output-on-failure -j "$OKTOPK_JOBS" "$@"
