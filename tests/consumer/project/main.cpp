// SPDX-License-Identifier: BSD-3-Clause
// Uses the installed OkTopk the way a user's code would: the communicator and a kernel.
#include <oktopk/oktopk.hpp>

#include <cstdio>

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  int status = 1;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    const oktopk::Communicator comm(MPI_COMM_WORLD);
    Kokkos::DefaultExecutionSpace exec;
    Kokkos::View<float*> x("consumer::x", 8);
    Kokkos::parallel_for(
        "consumer::fill", Kokkos::RangePolicy<>(exec, 0, 8),
        KOKKOS_LAMBDA(int i) { x(i) = static_cast<float>(i % 4); });
    const std::int64_t local = oktopk::count_above(exec, x, 1.5f);  // 2 and 3, twice
    std::int64_t total = 0;
    comm.allreduce(&local, &total, 1, MPI_SUM);
    if (total == 4 * comm.size()) status = 0;
    if (comm.rank() == 0) {
      std::printf("oktopk consumer: %s (OkTopk %s, %d ranks)\n", status == 0 ? "ok" : "WRONG",
                  OKTOPK_VERSION_STRING, comm.size());
    }
  }
  MPI_Finalize();
  return status;
}
