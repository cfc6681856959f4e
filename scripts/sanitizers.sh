#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Sanitizer check, run by CI: builds OkTopk's tests with AddressSanitizer and
# UndefinedBehaviorSanitizer (GCC; Kokkos 3.4.01 from scripts/common.sh, itself not
# instrumented) into build-sanitizers/, then runs the kernel and API unit tests and every MPI
# test at P = 2 and 3. Any report fails the run: UBSan stops at its first finding, ASan always
# does.
#
#   scripts/sanitizers.sh [CTEST ARGS...]     e.g. -R communicator to run fewer tests
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
start=$SECONDS

build=${OKTOPK_SANITIZER_BUILD_DIR:-$OKTOPK_SOURCE_DIR/build-sanitizers}
oktopk_setup

flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
# The apps are left out: their library paths are those the tests run, and they would double
# the build time.
cmake -S "$OKTOPK_SOURCE_DIR" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKokkos_ROOT="$OKTOPK_DEPS_PREFIX" -DOKTOPK_ENABLE_TESTS=ON -DOKTOPK_ENABLE_APPS=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$build" -j "$OKTOPK_JOBS"

# Leak checking is off: Open MPI and the OpenMP runtime keep allocations until exit on purpose,
# and LeakSanitizer reports them as leaks. Everything else ASan checks stays on.
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=0:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
log="$build/sanitizers.log"
status=0
(cd "$build" &&
 ctest -j "$OKTOPK_JOBS" --output-on-failure -R '^unit_kernels$|^unit_api$|_np[23]$' -E '^consumer|^fault_' \
   "$@") >"$log" 2>&1 || status=$?
summary=$(grep -E '^[0-9]+% tests passed' "$log" | tail -n 1)
# A report inside a test that still passed (a rank whose report did not change its exit status)
# fails the run as well.
if grep -qE 'ERROR: AddressSanitizer|runtime error:' "$log"; then
  grep -E -A 20 'ERROR: AddressSanitizer|runtime error:' "$log" | head -n 80
  status=1
fi
if ((status != 0)); then
  grep -v -E '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* Passed ' "$log" | tail -n 200
fi
oktopk_log "sanitizers (address, undefined): ${summary:-ctest did not run} ($((SECONDS - start)) s, log $log)"
exit "$status"
