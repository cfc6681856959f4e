// SPDX-License-Identifier: BSD-3-Clause
// TopkDSA (SparCML's DSAR split-allgather): exact local top-k, reduced over P equal regions by
// split-and-reduce, then every region allgathered, sparse or dense, whichever moves fewer bytes.
#pragma once

#include <oktopk/pack.hpp>
#include <oktopk/residual.hpp>
#include <oktopk/impl/algorithms/method_base.hpp>
#include <oktopk/impl/collectives/sparse_allgatherv.hpp>
#include <oktopk/impl/collectives/split_and_reduce.hpp>
#include <oktopk/impl/comm/mpi_mirror.hpp>
#include <oktopk/impl/kernels/vector_ops.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <limits>
#include <vector>

namespace oktopk::impl {

/// Every locally selected entry reaches the result, so the residual keeps exactly what was not
/// selected (mass is conserved). No global selection: the result holds up to P·k entries.
template <class ExecSpace, class Value>
class TopkDSA final : public MethodBase<ExecSpace, Value> {
  using Base = MethodBase<ExecSpace, Value>;
  using real_vector_type = typename Base::real_vector_type;
  using Real = typename Base::arithmetic_type;
  using vector_type = typename Base::vector_type;
  using memory_space = typename Base::memory_space;

 public:
  TopkDSA(const ExecSpace& exec, const Communicator& comm, std::int64_t n, const Options& options,
          const Layout& layout = Layout())
      : Base(exec, Algorithm::TopkDSA, comm, n, options, layout) {
    // Equal regions of floor(n/P) entries; the last one also takes the remainder.
    const int P = this->comm_.size();
    const std::int64_t width = n / P;
    offsets_.assign(P + 1, 0);
    for (int r = 0; r < P; ++r) offsets_[r] = r * width;
    offsets_[P] = n;
    offsets_device_ = Kokkos::View<count_type*, memory_space>(
        Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::TopkDSA::offsets"), P + 1);
    auto host = Kokkos::create_mirror_view(offsets_device_);
    for (int r = 0; r <= P; ++r) host(r) = offsets_[r];
    Kokkos::deep_copy(exec, offsets_device_, host);
    fence(exec, "oktopk::TopkDSA: region offsets");  // `host` goes out of scope
  }

 protected:
  void reduce_step(const ExecSpace& exec, const real_vector_type& acc,
                   const vector_type& out) override {
    auto& stats = this->stats_;
    const Communicator& comm = this->comm_;
    const int P = comm.size();
    const int me = comm.rank();
    {
      auto timer = this->phase(exec, "select");
      stats.local_threshold = this->topk_threshold(exec, acc, this->k_);
      stats.local_threshold_exact = true;
    }
    stats.global_threshold = -std::numeric_limits<float>::infinity();
    split_and_reduce(exec, comm, acc, stats.local_threshold, {}, offsets_, offsets_device_,
                     this->options_.throttle, state_, this->timed(exec));
    stats.local_selected = state_.selected;
    {
      auto timer = this->phase(exec, "residual");
      ensure_capacity(exec, selected_indices_, state_.selected);
      selected_global_indices(exec, state_, offsets_device_, selected_indices_);
      clear_at_unchecked(
          exec, acc,
          Kokkos::subview(selected_indices_, Kokkos::make_pair(std::int64_t{0}, state_.selected)));
    }

    // My reduced region's non-zeros, with region-relative indices.
    std::int64_t nonzeros = 0;
    {
      auto timer = this->phase(exec, "select");
      nonzeros = this->select_into(exec, state_.region, 0.0f, region_indices_, region_values_);
    }
    // The counts decide sparse or dense, and the sparse gather reuses them.
    gather_.counts.assign(P, 0);
    {
      auto timer = this->phase(exec, "allgatherv");
      comm.allgather(&nonzeros, 1, gather_.counts.data());
    }
    std::int64_t total = 0;
    for (const auto c : gather_.counts) total += c;
    stats.global_selected = total;

    // Byte break-even: a sparse entry costs an index and a value, a dense one a value (for
    // float 8 bytes against 4, for double 12 against 8).
    constexpr auto value_bytes = static_cast<std::int64_t>(sizeof(Real));
    const bool sparse = (static_cast<std::int64_t>(sizeof(index_type)) + value_bytes) * total <
                        value_bytes * this->n_;
    stats.dense_switch = !sparse;
    if (sparse) {
      add_offset(exec, region_indices_, 0, nonzeros, offsets_[me]);
      sparse_allgatherv_counted(exec, comm, region_indices_, region_values_, Balancing::Off, 1.0,
                                gather_, this->timed(exec));
      auto timer = this->phase(exec, "reduce");
      Kokkos::deep_copy(exec, out, typename Base::gradient_type{});
      // Regions are disjoint, so the gathered global indices are distinct.
      scatter_divided(exec, gather_.indices, gather_.values, total, out, static_cast<float>(P));
    } else {
      const auto sums = this->sums_for(exec, out);
      {
        auto timer = this->phase(exec, "allgatherv");
        std::vector<std::int64_t> sizes(P);
        for (int r = 0; r < P; ++r) sizes[r] = offsets_[r + 1] - offsets_[r];
        const auto region_counts = to_int_counts("oktopk::TopkDSA::reduce", sizes);
        const auto displacements = displacements_of(region_counts);
        const auto send = mpi_send_view(exec, state_.region);
        auto receive = mpi_receive_view(exec, sums);
        comm.allgatherv(send.data(), sizes[me], receive.data(), region_counts.data(),
                        displacements.data());
        mpi_received(exec, receive, sums, 0, this->n_);
      }
      auto timer = this->phase(exec, "reduce");
      divide(exec, sums, out, static_cast<float>(P));
    }
  }

 private:
  std::vector<std::int64_t> offsets_;
  Kokkos::View<count_type*, memory_space> offsets_device_;
  SplitReduce<ExecSpace, Real> state_;
  /// This rank's selection with global indices: what the residual clears.
  typename Base::index_vector_type selected_indices_{"oktopk::TopkDSA::selected_indices", 0};
  typename Base::index_vector_type region_indices_{"oktopk::TopkDSA::region_indices", 0};
  real_vector_type region_values_{"oktopk::TopkDSA::region_values", 0};
  SparseGather<ExecSpace, Real> gather_;
};

}  // namespace oktopk::impl
