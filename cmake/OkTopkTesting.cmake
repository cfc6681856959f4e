# SPDX-License-Identifier: BSD-3-Clause
# oktopk_add_mpi_test(NAME name SOURCES a.cpp ... NP 1 2 3 4 [TIMEOUT s])
# Builds one executable, oktopk_test_<name>, linked with the shared MPI test main, and registers
# one ctest test per rank count, named <name>_np<N>, run through mpiexec.
# oktopk_add_mpi_test_run(NAME name PROGRAM target NP ... [TIMEOUT s] [ARGS a ...]
#                         [ENVIRONMENT V=x ...])
# registers such tests for a program already built, with its arguments and more environment.
# PROCESSORS tells ctest how many cores a test occupies so `ctest -j` does not oversubscribe
# more than it must.

# OpenMPI refuses more ranks than cores unless told; MPICH has no such flag and rejects it.
execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _oktopk_mpiexec_version
                ERROR_QUIET)
set(OKTOPK_MPIEXEC_EXTRA_FLAGS "")
if(_oktopk_mpiexec_version MATCHES "Open MPI|OpenRTE")
  set(OKTOPK_MPIEXEC_EXTRA_FLAGS --oversubscribe)
endif()
# Every test that launches ranks gets OKTOPK_MPI_TEST_ENVIRONMENT. Open MPI yields the core while
# it waits once it knows it is oversubscribed; MPICH polls. MPICH's own CI runs oversubscribed
# with MPIR_CVAR_POLLS_BEFORE_YIELD=1 (ch3:nemesis) and the progress throttle (ch4, MPICH 5.0
# and later: it yields after polls without progress; ENABLE_HEAVY_YIELD makes that a sleep).
# MPICH 4.0 built for ch4 (Debian 12's) has none of them, so there P > cores stays slow: see
# docs/operations.md, "More ranks than cores". MPICH ignores the MPIR_CVAR_* variables it does
# not have.
set(OKTOPK_MPICH_YIELD_ENVIRONMENT "")
if(_oktopk_mpiexec_version MATCHES "HYDRA|MPICH")
  set(OKTOPK_MPICH_YIELD_ENVIRONMENT MPIR_CVAR_POLLS_BEFORE_YIELD=1
      MPIR_CVAR_CH4_PROGRESS_THROTTLE=1 MPIR_CVAR_CH4_PROGRESS_THROTTLE_NO_PROGRESS_COUNT=1
      MPIR_CVAR_ENABLE_HEAVY_YIELD=1)
endif()
set(OKTOPK_MPI_TEST_ENVIRONMENT OMP_NUM_THREADS=1 OMP_PROC_BIND=false OMPI_ALLOW_RUN_AS_ROOT=1
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ${OKTOPK_MPICH_YIELD_ENVIRONMENT})

function(oktopk_add_mpi_test_run)
  cmake_parse_arguments(ARG "" "NAME;PROGRAM;TIMEOUT" "NP;ARGS;ENVIRONMENT" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set(environment ${OKTOPK_MPI_TEST_ENVIRONMENT} ${ARG_ENVIRONMENT})
  foreach(np IN LISTS ARG_NP)
    add_test(NAME ${ARG_NAME}_np${np}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np}
                     ${OKTOPK_MPIEXEC_EXTRA_FLAGS} ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${ARG_PROGRAM}>
                     ${MPIEXEC_POSTFLAGS} ${ARG_ARGS})
    # One thread per rank: ranks already share the cores.
    set_tests_properties(${ARG_NAME}_np${np} PROPERTIES
      PROCESSORS ${np} TIMEOUT ${ARG_TIMEOUT} LABELS mpi
      ENVIRONMENT "${environment}")
  endforeach()
endfunction()

function(oktopk_add_mpi_test)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT" "SOURCES;NP" ${ARGN})
  set(exe oktopk_test_${ARG_NAME})
  add_executable(${exe} ${ARG_SOURCES})
  target_link_libraries(${exe} PRIVATE oktopk_mpi_test_main OkTopk::oktopk)
  oktopk_add_mpi_test_run(NAME ${ARG_NAME} PROGRAM ${exe} NP ${ARG_NP} TIMEOUT ${ARG_TIMEOUT})
endfunction()
