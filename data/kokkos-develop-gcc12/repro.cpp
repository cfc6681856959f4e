// SPDX-License-Identifier: BSD-3-Clause
// Kokkos develop 28848df (June 2025) built and used with GCC 12.2: destroying a default-
// constructed View dereferences a null allocation record (SIGSEGV in
// SharedAllocationRecord<void, void>::decrement). See README.md beside this file.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard guard(argc, argv);
  {
    Kokkos::View<int*> empty;
    std::uintptr_t bits = 0;
    std::memcpy(&bits, &empty.impl_track(), sizeof bits);
    // 0x1 (DO_NOT_DEREF_FLAG) is what SharedAllocationTracker's constructor stores; 0x0 means
    // the constructor was skipped, and the destructor below decrements a record at address 0.
    std::printf("default View's tracker bits: %#lx\n", static_cast<unsigned long>(bits));
    std::fflush(stdout);
  }
  std::printf("survived\n");
  return 0;
}
