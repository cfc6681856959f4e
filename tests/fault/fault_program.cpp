// SPDX-License-Identifier: BSD-3-Clause
// A few reduce() calls of one method, built with OKTOPK_FAULT_INJECTION so that OKTOPK_FAULT can
// make one rank fail in a chosen phase of a chosen call
// (include/oktopk/impl/comm/fault_injection.hpp). check_faults.sh runs it under mpiexec for every
// phase it lists.
//
//   fault_program ALGORITHM CALLS [KEY=VALUE...]
//       prints "fault_program: ok" on rank 0 after CALLS calls; with OKTOPK_FAULT=list, rank 1
//       (rank 0 on one rank) prints first "point PHASE POINT CALL" for each fault point it
//       passed. KEY=VALUE sets an option (Options::set_from_string) over the defaults below,
//       to reach branches they do not take (balancing=on, TopkDSA's dense switch).
#include <oktopk/any_space.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

namespace {

int run(const std::string& name, int calls, const std::vector<std::string>& settings) {
  using Exec = Kokkos::DefaultExecutionSpace;
  const oktopk::Communicator comm(MPI_COMM_WORLD);
  const std::int64_t n = 6000;
  // One dense warm-up call, then sparse calls: every phase of the method is reached by call 3.
  auto options = oktopk::Options().set_density(0.02).set_warmup_iterations(1);
  for (const auto& setting : settings) options.set_from_string(setting);
  Exec exec;
  auto allreduce =
      oktopk::make_sparse_allreduce(exec, oktopk::algorithm_from_string(name), comm, n, options);
  Kokkos::View<float*> grad("grad", n);
  Kokkos::View<float*> out("out", n);
  const int rank = comm.rank();
  for (int call = 1; call <= calls; ++call) {
    Kokkos::parallel_for(
        "fill", Kokkos::RangePolicy<Exec>(exec, 0, n), KOKKOS_LAMBDA(std::int64_t i) {
          // Distinct magnitudes that differ by rank and call.
          const std::uint32_t h =
              static_cast<std::uint32_t>(i * 2654435761u + rank * 40503u + call * 9973u);
          grad(i) = (static_cast<float>(h % 100003u) - 50001.0f) * 1e-5f;
        });
    allreduce->reduce(exec, grad, out);
  }
  exec.fence();
#ifdef OKTOPK_FAULT_INJECTION
  if (oktopk::impl::fault_injection::spec().list && rank == (comm.size() > 1 ? 1 : 0)) {
    for (const auto& [where, call] : oktopk::impl::fault_injection::passed()) {
      std::printf("point %s %s %lld\n", where.first.c_str(), where.second.c_str(),
                  static_cast<long long>(call));
    }
  }
#endif
  if (rank == 0) std::printf("fault_program: ok\n");
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  int status = 0;
  if (argc < 3) {
    std::fprintf(stderr, "usage: fault_program ALGORITHM CALLS [KEY=VALUE...]\n");
    status = 2;
  } else {
    Kokkos::ScopeGuard kokkos(argc, argv);
    try {
      status = run(argv[1], std::atoi(argv[2]), std::vector<std::string>(argv + 3, argv + argc));
    } catch (const std::exception& e) {
      // Errors every rank sees alike (a bad name, a bad OKTOPK_FAULT) land here on every rank.
      std::fprintf(stderr, "fault_program: %s\n", e.what());
      status = 1;
    }
  }
  MPI_Finalize();
  return status;
}
