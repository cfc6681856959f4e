// SPDX-License-Identifier: BSD-3-Clause
// A training loop's gradient exchange with an Ok-Topk handle: made once, called every step.
// The "model" is a least-squares fit whose data differ a little by rank; each step's gradient
// goes through the sparse allreduce, and SGD applies the average. Run with any number of ranks:
//   mpirun -np 2 ./training_loop
#include <oktopk/oktopk.hpp>

#include <cstdint>
#include <cstdio>

namespace example {

using Exec = Kokkos::DefaultExecutionSpace;
using Vector = Kokkos::View<float*, Exec::memory_space>;

// The gradient of the rank's loss 0.5 sum_i scale_i (w_i - target_i)^2: a target shared by
// the ranks plus a little of the rank's own (its data), and curvatures from 0.01 to 1, so the
// gradient has a few large entries and many small ones, as training gradients do.
void compute_gradient(const Exec& exec, const Vector& w, int rank, const Vector& grad) {
  Kokkos::parallel_for(
      "example::gradient", Kokkos::RangePolicy<Exec>(exec, 0, w.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const float scale = static_cast<float>(i % 100 + 1) / 100.0f;
        const float target =
            static_cast<float>(i % 7) - 3.0f + 0.1f * static_cast<float>((i + rank) % 3 - 1);
        grad(i) = scale * (w(i) - target);
      });
}

void sgd_step(const Exec& exec, const Vector& w, const Vector& averaged, float lr) {
  Kokkos::parallel_for(
      "example::sgd", Kokkos::RangePolicy<Exec>(exec, 0, w.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t i) { w(i) -= lr * averaged(i); });
}

float squared_norm(const Exec& exec, const Vector& v) {
  float sum = 0.0f;
  Kokkos::parallel_reduce(
      "example::norm", Kokkos::RangePolicy<Exec>(exec, 0, v.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t i, float& s) { s += v(i) * v(i); }, sum);
  return sum;
}

}  // namespace example

using example::Exec;
using example::Vector;

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    const oktopk::Communicator comm(MPI_COMM_WORLD);
    Exec exec;  // on a GPU: the instance (stream) the model's kernels run on
    constexpr std::int64_t n = 100000;
    constexpr int steps = 50;

    // Collective: every rank makes the same handle. 1 % of the entries per call, the first
    // 5 calls dense while the residual fills.
    auto allreduce =
        oktopk::make_sparse_allreduce(exec, oktopk::Algorithm::OkTopk, comm, n,
                                      oktopk::Options{}.set_density(0.01).set_warmup_iterations(5));

    Vector w("example::w", n), grad("example::grad", n), averaged("example::averaged", n);
    std::int64_t bytes_sent = 0;  // by this rank, over all calls
    float first_norm = 0.0f;
    for (int step = 0; step < steps; ++step) {
      example::compute_gradient(exec, w, comm.rank(), grad);
      if (step == 0) first_norm = example::squared_norm(exec, grad);
      allreduce->reduce(exec, grad, averaged);  // the same bits on every rank
      example::sgd_step(exec, w, averaged, 0.5f);
      bytes_sent += allreduce->stats().total_traffic().bytes_sent;
    }
    example::compute_gradient(exec, w, comm.rank(), grad);
    const float last_norm = example::squared_norm(exec, grad);
    const oktopk::ReduceStats& last = allreduce->stats();
    if (comm.rank() == 0) {
      std::printf(
          "training_loop: %d ranks, %d steps of %s at k = %lld of n = %lld: last call kept %lld "
          "entries; rank 0 sent %lld bytes in all; |grad|^2 on rank 0 went from %.4g to %.4g\n",
          comm.size(), steps, oktopk::to_string(allreduce->algorithm()).c_str(),
          static_cast<long long>(allreduce->k()), static_cast<long long>(n),
          static_cast<long long>(last.global_selected), static_cast<long long>(bytes_sent),
          static_cast<double>(first_norm), static_cast<double>(last_norm));
    }
    // The fit must have moved towards the ranks' common optimum.
    if (!(last_norm < first_norm)) status = 1;
  }
  MPI_Finalize();
  return status;
}
