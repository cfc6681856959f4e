// SPDX-License-Identifier: BSD-3-Clause
// A Kokkos tool library that does nothing: loaded by a test (KOKKOS_TOOLS_LIBS, or
// KOKKOS_PROFILE_LIBRARY before Kokkos 3.5) to check that oktopk-kernel-bench --kernel-times
// refuses to replace a tool's callbacks.
#include <cstdint>

extern "C" void kokkosp_init_library(int, std::uint64_t, std::uint32_t, void*) {}
extern "C" void kokkosp_begin_parallel_for(const char*, std::uint32_t, std::uint64_t*) {}
extern "C" void kokkosp_end_parallel_for(std::uint64_t) {}
