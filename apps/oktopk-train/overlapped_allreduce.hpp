// SPDX-License-Identifier: BSD-3-Clause
// oktopk-train --overlap on: the dense baseline that a framework's data-parallel wrapper runs
// (PyTorch DDP's buckets). The gradient's blocks are summed by MPI_Iallreduce as soon as the
// backward pass has finished them, the last layer's first, while the pass goes on through the
// earlier layers; the step then waits for every sum. The values go as float32, or divided by P,
// rounded to bfloat16 and summed by an MPI operation that rounds every partial sum to bfloat16
// (DDP's bf16_compress_hook on a backend that sums bfloat16).
#pragma once

#include <oktopk/communicator.hpp>
#include <oktopk/half.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <cstdint>
#include <vector>

namespace oktopk::train {

class OverlappedDenseAllreduce {
 public:
  using Exec = Kokkos::DefaultExecutionSpace;
  using Vector = Kokkos::View<float*, Exec::memory_space>;
  enum class Values { Float32, BFloat16 };

  /// Not collective. At most `bucket_entries` entries per MPI_Iallreduce. MPI reads the Views'
  /// memory directly, so that memory must be the host's (std::invalid_argument otherwise, as
  /// for n < 0 or bucket_entries outside 1..INT_MAX).
  OverlappedDenseAllreduce(const Communicator& comm, std::int64_t n, Values values,
                           std::int64_t bucket_entries);
  ~OverlappedDenseAllreduce();
  OverlappedDenseAllreduce(const OverlappedDenseAllreduce&) = delete;
  OverlappedDenseAllreduce& operator=(const OverlappedDenseAllreduce&) = delete;

  /// Before the step's backward pass: nothing launched yet.
  void begin_step();
  /// Collective, in the same sequence of `from` on every rank: entries [from, n) of `grad` are
  /// final. Launches the sums of those not launched yet (into `out`), and progresses those in
  /// flight. `from` never grows within a step.
  void ready(const Exec& exec, const Vector& grad, const Vector& out, std::int64_t from);
  /// Collective: launches what is left, waits for every sum and writes the average over the
  /// ranks into `out`. Throws std::runtime_error (on every rank: the sums are the same
  /// everywhere) if the average holds NaN or Inf.
  void finish(const Exec& exec, const Vector& grad, const Vector& out);
  /// The bytes a rank sends per step on a ring allreduce of these values: 2 (P - 1) / P of them
  /// per bucket (MPI picks its own algorithm; the ring's count is the least any sends).
  double bytes_per_step() const { return bytes_per_step_; }

  // Public only because CUDA forbids extended lambdas in private member functions.
  /// Launches the sum of entries [first, end).
  void launch(const Exec& exec, const Vector& grad, const Vector& out, std::int64_t first,
              std::int64_t end);

 private:
  void progress();

  Communicator comm_;
  std::int64_t n_;
  Values values_;
  std::int64_t bucket_entries_;
  MPI_Op sum_bfloat16_ = MPI_OP_NULL;
  // The bfloat16 values and their sums: two buffers, since Open MPI 4.1's nonblocking allreduce
  // runs an in-place call as a binomial tree (the whole vector through the root's link at every
  // level), and a large call with separate buffers, P >= 4 and a commutative operation as a
  // reduce-scatter and an allgather.
  Kokkos::View<bfloat16*, Exec::memory_space> rounded_;
  Kokkos::View<bfloat16*, Exec::memory_space> summed_;
  std::int64_t launched_from_ = 0;  // [launched_from_, n) launched
  std::vector<MPI_Request> requests_;
  double bytes_per_step_ = 0.0;
};

}  // namespace oktopk::train
