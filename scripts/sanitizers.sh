#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Sanitizer check, run by CI: builds OkTopk's tests with AddressSanitizer and
# UndefinedBehaviorSanitizer (GCC; Kokkos 3.4.01 from scripts/common.sh, itself not
# instrumented) into build-sanitizers/, then runs the kernel and API unit tests, every MPI suite
# and the C and Fortran bindings at P = 2 and 3, and MPI staging and the method suite with every
# buffer staged through a separate host copy at P = 3. Any report fails the run: UBSan stops at
# its first finding, ASan always does. The other host-staging runs (the same code paths through
# the other suites, at sanitizer speed) and the other rank counts run in scripts/test.sh.
#
#   scripts/sanitizers.sh [CTEST ARGS...]     e.g. -R communicator to run fewer tests
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
start=$SECONDS

build=${OKTOPK_SANITIZER_BUILD_DIR:-$OKTOPK_SOURCE_DIR/build-sanitizers}
oktopk_setup

flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
# The apps are left out: their library paths are those the tests run, and they would double
# the build time. -O1 and line tables only (-g1), as the sanitizers' own documentation
# suggests: reports keep their file:line stacks, and the instrumented build takes far less
# time than at -O2 with full debug information.
optimize="-O1 -g1 -DNDEBUG"
cmake -S "$OKTOPK_SOURCE_DIR" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$optimize" -DCMAKE_C_FLAGS_RELWITHDEBINFO="$optimize" \
  -DKokkos_ROOT="$OKTOPK_DEPS_PREFIX" -DOKTOPK_ENABLE_TESTS=ON -DOKTOPK_ENABLE_APPS=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
# Only the programs the tests below run: an instrumented compile takes about twice as long.
suites=(communicator distributed_kth factory methods oktopk_schedule dense_allreduce s2 layout
        baselines mpi_staging checkpoint async sparse_result wire sparse_wire value_types
        half_gradients reduce_scatter)
staged=(mpi_staging methods)
targets=(oktopk_unit_tests oktopk_unit_api_tests oktopk_test_c_api)
for t in "${suites[@]}"; do targets+=("oktopk_test_$t"); done
bindings='c_api|c_api_single'
# The Fortran program exists where CMake found a Fortran compiler and MPI's Fortran bindings.
if ninja -C "$build" -t query oktopk_test_fortran >/dev/null 2>&1; then
  targets+=(oktopk_test_fortran)
  bindings+='|fortran'
fi
cmake --build "$build" -j "$OKTOPK_JOBS" --target "${targets[@]}"
join() { local IFS='|'; echo "$*"; }
tests="^unit_kernels\$|^unit_api\$|^($(join "${suites[@]}")|$bindings)_np[23]\$"
tests+="|^($(join "${staged[@]}"))_host_staging_np3\$"

# Leak checking is off: Open MPI and the OpenMP runtime keep allocations until exit on purpose,
# and LeakSanitizer reports them as leaks. Everything else ASan checks stays on.
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=0:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
log="$build/sanitizers.log"
status=0
(cd "$build" &&
 ctest -j "$OKTOPK_JOBS" --output-on-failure \
   -R "$tests" "$@") >"$log" 2>&1 || status=$?
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
