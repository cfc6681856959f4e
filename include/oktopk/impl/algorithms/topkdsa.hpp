// SPDX-License-Identifier: BSD-3-Clause
// TopkDSA (SparCML's DSAR split-allgather): exact local top-k, reduced over P equal regions by
// split-and-reduce, then every region allgathered, sparse or dense, whichever moves fewer bytes;
// for reduce_scatter, each region's non-zeros sent only to the owners of their shards.
#pragma once

#include <oktopk/pack.hpp>
#include <oktopk/residual.hpp>
#include <oktopk/impl/algorithms/method_base.hpp>
#include <oktopk/impl/collectives/shard_exchange.hpp>
#include <oktopk/impl/collectives/sparse_allgatherv.hpp>
#include <oktopk/impl/collectives/split_and_reduce.hpp>
#include <oktopk/impl/collectives/wire_values.hpp>
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
    state_.wire = gather_.wire = shards_.wire = wire_;
  }

 protected:
  const char* reduce_scatter_refusal() const override { return nullptr; }

  void reduce_step(const ExecSpace& exec, const real_vector_type& acc,
                   const vector_type& out) override {
    auto& stats = this->stats_;
    const Communicator& comm = this->comm_;
    const int P = comm.size();
    const int me = comm.rank();
    const std::int64_t nonzeros = reduce_regions(exec, acc);
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
    // float 8 bytes against 4, for double 12 against 8, for a 16-bit wire 6 against 2).
    const std::int64_t value_bytes = 2 * wire_words<Real>(wire_);
    const bool sparse = (static_cast<std::int64_t>(sizeof(index_type)) + value_bytes) * total <
                        value_bytes * this->n_;
    stats.dense_switch = !sparse;
    if (sparse) {
      add_offset(exec, region_indices_, 0, nonzeros, offsets_[me]);
      sparse_allgatherv_counted(exec, comm, region_indices_, region_values_, Balancing::Off, 1.0,
                                gather_, this->timed(exec));
      auto timer = this->phase(exec, "reduce");
      // The sums this rank sent for all: their rounding errors stay in its residual.
      add_wire_error(exec, acc, region_indices_, region_values_, nonzeros, wire_);
      Kokkos::deep_copy(exec, out, typename Base::gradient_type{});
      // Regions are disjoint, so the gathered global indices are distinct.
      scatter_divided(exec, gather_.indices, gather_.values, total, out, static_cast<float>(P));
    } else {
      const auto sums = this->sums_for(exec, out);
      {
        auto timer = this->phase(exec, "allgatherv");
        std::vector<std::int64_t> sizes(P);
        for (int r = 0; r < P; ++r) sizes[r] = offsets_[r + 1] - offsets_[r];
        if (wire_ == Wire::Native) {
          const auto region_counts = to_int_counts("oktopk::TopkDSA::reduce", sizes);
          const auto displacements = displacements_of(region_counts);
          const auto send = mpi_send_view(exec, state_.region);
          auto receive = mpi_receive_view(exec, sums);
          comm.allgatherv(send.data(), sizes[me], receive.data(), region_counts.data(),
                          displacements.data());
          mpi_received(exec, receive, sums, 0, this->n_);
        } else {
          allgather_region_words(exec, acc, sizes, sums);
        }
      }
      auto timer = this->phase(exec, "reduce");
      divide(exec, sums, out, static_cast<float>(P));
    }
  }

  /// Each region's non-zeros go to their shards' owners, as the sparse allgather carries them
  /// in reduce(): the same values on the wire, and, on either of reduce()'s paths, the same
  /// average, since the dense one's zeros average to zeros.
  void reduce_step_scatter(const ExecSpace& exec, const real_vector_type& acc,
                           const typename Base::ShardTarget& target) override {
    const Communicator& comm = this->comm_;
    const int me = comm.rank();
    const std::int64_t nonzeros = reduce_regions(exec, acc);
    std::int64_t total = nonzeros;
    {
      auto timer = this->phase(exec, "shard_exchange");
      comm.allreduce_in_place(&total, 1, MPI_SUM);
      add_offset(exec, region_indices_, 0, nonzeros, offsets_[me]);
      send_to_shards(exec, comm, region_indices_, region_values_, nonzeros, target.offsets,
                     shards_);
    }
    this->stats_.global_selected = total;
    auto timer = this->phase(exec, "reduce");
    add_wire_error(exec, acc, region_indices_, region_values_, nonzeros, wire_);
    Kokkos::deep_copy(exec, target.shard, typename Base::gradient_type{});
    scatter_divided(exec, shards_.indices, shards_.values, shards_.received, target.shard,
                    static_cast<float>(comm.size()), -target.offsets[static_cast<std::size_t>(me)]);
  }

  std::int64_t wire_overflows() const override {
    return state_.overflowed + gather_.overflowed + dense_overflowed_ + shards_.overflowed;
  }

 private:
  /// Both calls up to the output: the exact local top-k reduced over the regions by
  /// split-and-reduce, the residual cleared where it was sent, and this rank's region's
  /// non-zeros, region-relative, into region_indices_ and region_values_. Returns how many.
  std::int64_t reduce_regions(const ExecSpace& exec, const real_vector_type& acc) {
    auto& stats = this->stats_;
    const Communicator& comm = this->comm_;
    state_.overflowed = gather_.overflowed = dense_overflowed_ = shards_.overflowed = 0;
    {
      auto timer = this->phase(exec, "select");
      stats.local_threshold = this->topk_threshold(exec, acc, this->k_);
      stats.local_threshold_exact = true;
    }
    stats.global_threshold = -std::numeric_limits<float>::infinity();
    // An exact top-k: where magnitudes tie at the threshold, the first ties complete the k.
    split_and_reduce(exec, comm, acc, stats.local_threshold, this->k_, {}, offsets_,
                     offsets_device_, this->options_.throttle, state_, this->timed(exec));
    stats.local_selected = state_.selected;
    {
      auto timer = this->phase(exec, "residual");
      ensure_capacity(exec, selected_indices_, state_.selected);
      selected_global_indices(exec, state_, offsets_device_, selected_indices_);
      // What the others received leaves the residual; a narrower wire's rounding error stays.
      keep_wire_error_at(exec, acc, selected_indices_, state_.selected, wire_);
    }

    // My reduced region's non-zeros, with region-relative indices.
    std::int64_t nonzeros = 0;
    {
      auto timer = this->phase(exec, "select");
      nonzeros = this->select_into(exec, state_.region, 0.0f, region_indices_, region_values_);
    }
    return nonzeros;
  }

  /// The dense switch on a narrower wire: every rank's region as words, decoded into `sums`;
  /// the rounding errors of this rank's region stay in acc.
  template <class Sums>
  void allgather_region_words(const ExecSpace& exec, const real_vector_type& acc,
                              const std::vector<std::int64_t>& sizes, const Sums& sums) {
    const int P = this->comm_.size();
    const int me = this->comm_.rank();
    const std::int64_t width = wire_words<Real>(wire_);
    const auto range = [](std::int64_t b, std::int64_t e) { return Kokkos::make_pair(b, e); };
    std::vector<std::int64_t> word_sizes(P);
    for (int r = 0; r < P; ++r) word_sizes[r] = width * sizes[r];
    const auto word_counts = to_int_counts("oktopk::TopkDSA::reduce", word_sizes);
    const auto displacements = displacements_of(word_counts);
    const std::int64_t mine = sizes[me];
    // Before encode_values rounds the region in place.
    add_wire_error_dense(exec, acc, state_.region, offsets_[me], wire_);
    ensure_capacity(exec, send_words_, width * mine);
    ensure_capacity(exec, words_, width * this->n_);
    dense_overflowed_ += encode_values(exec, state_.region, mine, send_words_, wire_);
    const auto send = mpi_send_view(exec, Kokkos::subview(send_words_, range(0, width * mine)));
    auto receive = mpi_receive_view(exec, Kokkos::subview(words_, range(0, width * this->n_)));
    this->comm_.allgatherv(send.data(), width * mine, receive.data(), word_counts.data(),
                           displacements.data());
    mpi_received(exec, receive, words_, 0, width * this->n_);
    decode_values(exec, words_, 0, this->n_, sums, wire_);
  }

  /// The type the values travel in (value_wire()).
  const Wire wire_ = value_wire<Value>(this->options_);
  Kokkos::View<std::uint16_t*, memory_space> send_words_{"oktopk::TopkDSA::send_words", 0};
  Kokkos::View<std::uint16_t*, memory_space> words_{"oktopk::TopkDSA::words", 0};
  std::int64_t dense_overflowed_ = 0;
  std::vector<std::int64_t> offsets_;
  Kokkos::View<count_type*, memory_space> offsets_device_;
  SplitReduce<ExecSpace, Real> state_;
  /// This rank's selection with global indices: what the residual clears.
  typename Base::index_vector_type selected_indices_{"oktopk::TopkDSA::selected_indices", 0};
  typename Base::index_vector_type region_indices_{"oktopk::TopkDSA::region_indices", 0};
  real_vector_type region_values_{"oktopk::TopkDSA::region_values", 0};
  SparseGather<ExecSpace, Real> gather_;
  ShardExchange<ExecSpace, Real> shards_;
};

}  // namespace oktopk::impl

// Compiled once, in liboktopk (src/instantiate/).
OKTOPK_IMPL_DECLARE_INSTANTIATIONS(oktopk::impl::TopkDSA)
