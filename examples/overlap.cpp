// SPDX-License-Identifier: BSD-3-Clause
// A reduce that runs while the rank computes: reduce_async launches the call on the execution
// space instance it is given (on a GPU, that instance's stream) and returns a request; the
// program works on other data meanwhile and waits before it reads the result. Two layers'
// gradients, two handles, launched in the order every rank uses.
//   mpirun -np 2 ./overlap
#include <oktopk/oktopk.hpp>

#include <cstdint>
#include <cstdio>

namespace example {

using Exec = Kokkos::DefaultExecutionSpace;
using Vector = Kokkos::View<float*, Exec::memory_space>;

void fill_gradient(const Exec& exec, const Vector& grad, int rank, int layer) {
  Kokkos::parallel_for(
      "example::fill", Kokkos::RangePolicy<Exec>(exec, 0, grad.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t i) {
        grad(i) = static_cast<float>((i * 37 + rank * 11 + layer) % 101) / 101.0f - 0.5f;
      });
}

double sum(const Exec& exec, const Vector& v) {
  double total = 0.0;
  Kokkos::parallel_reduce(
      "example::sum", Kokkos::RangePolicy<Exec>(exec, 0, v.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t i, double& s) { s += v(i); }, total);
  return total;
}

}  // namespace example

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    using example::Exec;
    using example::Vector;
    const oktopk::Communicator comm(MPI_COMM_WORLD);
    const std::int64_t sizes[2] = {200000, 50000};
    Exec exec;
    const auto options = oktopk::Options{}.set_density(0.01);
    auto layer0 =
        oktopk::make_sparse_allreduce(exec, oktopk::Algorithm::OkTopk, comm, sizes[0], options);
    auto layer1 =
        oktopk::make_sparse_allreduce(exec, oktopk::Algorithm::TopkA, comm, sizes[1], options);
    Vector grad0("example::grad0", sizes[0]), out0("example::out0", sizes[0]);
    Vector grad1("example::grad1", sizes[1]), out1("example::out1", sizes[1]);
    Vector other("example::other", sizes[0]);

    example::fill_gradient(exec, grad0, comm.rank(), 0);
    example::fill_gradient(exec, grad1, comm.rank(), 1);
    // The backward pass would produce the last layer first: launch it as soon as it is ready.
    oktopk::ReduceRequest first = layer0->reduce_async(exec, grad0, out0);
    oktopk::ReduceRequest second = layer1->reduce_async(exec, grad1, out1);
    // Work that does not touch grad or out while the calls run.
    example::fill_gradient(exec, other, comm.rank(), 2);
    const double unrelated = example::sum(exec, other);
    first.wait();  // rethrows what the call threw, on every rank alike
    second.wait();
    const double totals[2] = {example::sum(exec, out0), example::sum(exec, out1)};
    // The outputs are the same on every rank: their sums must agree to the last bit.
    double low[2], high[2];
    comm.allreduce(totals, low, 2, MPI_MIN);
    comm.allreduce(totals, high, 2, MPI_MAX);
    if (low[0] != high[0] || low[1] != high[1]) status = 1;
    if (comm.rank() == 0) {
      std::printf(
          "overlap: %d ranks: %s kept %lld of %lld entries, %s %lld of %lld; outputs %s on "
          "every rank (meanwhile computed %.4g)\n",
          comm.size(), oktopk::to_string(layer0->algorithm()).c_str(),
          static_cast<long long>(layer0->stats().global_selected), static_cast<long long>(sizes[0]),
          oktopk::to_string(layer1->algorithm()).c_str(),
          static_cast<long long>(layer1->stats().global_selected), static_cast<long long>(sizes[1]),
          status == 0 ? "the same" : "DIFFERENT", unrelated);
    }
  }
  MPI_Finalize();
  return status;
}
