// SPDX-License-Identifier: BSD-3-Clause
#include "overlapped_allreduce.hpp"

#include <oktopk/error.hpp>

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace oktopk::train {

namespace {

constexpr const char* where = "oktopk::train::OverlappedDenseAllreduce";

void check(int rc, const char* call) {
  if (rc != MPI_SUCCESS) {
    throw std::runtime_error(std::string(where) + ": " + call + " failed (MPI error " +
                             std::to_string(rc) + ")");
  }
}

/// MPI_User_function: inout[i] = bfloat16(in[i] + inout[i]), each sum rounded as a backend
/// that sums bfloat16 rounds it.
void sum_bfloat16(void* in, void* inout, int* length, MPI_Datatype*) {
  const auto* a = static_cast<const bfloat16*>(in);
  auto* b = static_cast<bfloat16*>(inout);
  for (int i = 0; i < *length; ++i) b[i] = round_to<bfloat16>(to_float(a[i]) + to_float(b[i]));
}

}  // namespace

OverlappedDenseAllreduce::OverlappedDenseAllreduce(const Communicator& comm, std::int64_t n,
                                                   Values values, std::int64_t bucket_entries)
    : comm_(comm), n_(n), values_(values), bucket_entries_(bucket_entries) {
  if (!Kokkos::SpaceAccessibility<Kokkos::HostSpace, Exec::memory_space>::accessible) {
    throw std::invalid_argument(std::string(where) +
                                ": MPI reads the gradient directly, so it must be in host "
                                "memory (a host build: Serial or OpenMP)");
  }
  if (n < 0) throw std::invalid_argument(std::string(where) + ": n < 0");
  if (bucket_entries < 1 || bucket_entries > std::numeric_limits<int>::max()) {
    throw std::invalid_argument(std::string(where) + ": bucket_entries " +
                                std::to_string(bucket_entries) + " outside 1..INT_MAX");
  }
  if (values_ == Values::BFloat16) {
    check(MPI_Op_create(&sum_bfloat16, 1, &sum_bfloat16_), "MPI_Op_create");
    rounded_ = Kokkos::View<bfloat16*, Exec::memory_space>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "oktopk::train::overlap_bfloat16"), n);
    summed_ = Kokkos::View<bfloat16*, Exec::memory_space>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "oktopk::train::overlap_sums"), n);
  }
}

// Requests still in flight here (an exception mid-step) are left to MPI: the program then ends
// every rank through its failure settlement and MPI_Abort, before MPI touches the freed buffers.
OverlappedDenseAllreduce::~OverlappedDenseAllreduce() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && sum_bfloat16_ != MPI_OP_NULL) MPI_Op_free(&sum_bfloat16_);
}

void OverlappedDenseAllreduce::begin_step() {
  OKTOPK_ASSERT(requests_.empty());
  launched_from_ = n_;
  bytes_per_step_ = 0.0;
}

void OverlappedDenseAllreduce::ready(const Exec& exec, const Vector& grad, const Vector& out,
                                     std::int64_t from) {
  OKTOPK_ASSERT(from >= 0 && from <= launched_from_);
  if (from < launched_from_) {
    // Buckets of at most bucket_entries, the last of the range first, as DDP orders them.
    exec.fence();  // the backward pass's kernels that wrote [from, launched_from_)
    while (launched_from_ > from) {
      const std::int64_t first = std::max(from, launched_from_ - bucket_entries_);
      launch(exec, grad, out, first, launched_from_);
      launched_from_ = first;
    }
  }
  progress();
}

void OverlappedDenseAllreduce::launch(const Exec& exec, const Vector& grad, const Vector& out,
                                      std::int64_t first, std::int64_t end) {
  const int count = static_cast<int>(end - first);
  const int P = comm_.size();
  MPI_Request request = MPI_REQUEST_NULL;
  if (values_ == Values::Float32) {
    check(MPI_Iallreduce(grad.data() + first, out.data() + first, count, MPI_FLOAT, MPI_SUM,
                         comm_.mpi_comm(), &request),
          "MPI_Iallreduce");
    bytes_per_step_ += 2.0 * (P - 1) / P * count * 4.0;
  } else {
    const auto g = grad;
    const auto r = rounded_;
    const float scale = 1.0f / static_cast<float>(P);
    Kokkos::parallel_for(
        "oktopk::train::overlap_round", Kokkos::RangePolicy<Exec>(exec, first, end),
        KOKKOS_LAMBDA(std::int64_t i) { r(i) = round_to<bfloat16>(g(i) * scale); });
    exec.fence();  // MPI reads the rounded values next
    check(MPI_Iallreduce(rounded_.data() + first, summed_.data() + first, count, MPI_UINT16_T,
                         sum_bfloat16_, comm_.mpi_comm(), &request),
          "MPI_Iallreduce");
    bytes_per_step_ += 2.0 * (P - 1) / P * count * 2.0;
  }
  requests_.push_back(request);
}

void OverlappedDenseAllreduce::progress() {
  if (requests_.empty()) return;
  int done = 0;
  check(
      MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE),
      "MPI_Testall");
}

void OverlappedDenseAllreduce::finish(const Exec& exec, const Vector& grad, const Vector& out) {
  ready(exec, grad, out, 0);
  check(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE),
        "MPI_Waitall");
  requests_.clear();
  const auto o = out;
  std::int64_t non_finite = 0;
  if (values_ == Values::Float32) {
    const float scale = 1.0f / static_cast<float>(comm_.size());
    Kokkos::parallel_reduce(
        "oktopk::train::overlap_average", Kokkos::RangePolicy<Exec>(exec, 0, n_),
        KOKKOS_LAMBDA(std::int64_t i, std::int64_t & bad) {
          o(i) *= scale;
          if (!(o(i) - o(i) == 0.0f)) ++bad;  // false for NaN and +-Inf
        },
        non_finite);
  } else {
    const auto r = summed_;
    Kokkos::parallel_reduce(
        "oktopk::train::overlap_widen", Kokkos::RangePolicy<Exec>(exec, 0, n_),
        KOKKOS_LAMBDA(std::int64_t i, std::int64_t & bad) {
          o(i) = to_float(r(i));
          if (!(o(i) - o(i) == 0.0f)) ++bad;  // false for NaN and +-Inf
        },
        non_finite);
  }
  if (non_finite > 0) {
    throw std::runtime_error(std::string(where) + ": the average holds " +
                             std::to_string(non_finite) + " NaN or Inf entries");
  }
}

}  // namespace oktopk::train
