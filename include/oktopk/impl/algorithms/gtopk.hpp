// SPDX-License-Identifier: BSD-3-Clause
// gTopk (Shi et al., ICDCS'19): exact local top-k, summed up a binary tree towards rank 0 with
// the top-k re-selected after every merge, then the final k entries broadcast from rank 0.
#pragma once

#include <oktopk/pack.hpp>
#include <oktopk/residual.hpp>
#include <oktopk/topk.hpp>
#include <oktopk/impl/algorithms/method_base.hpp>
#include <oktopk/impl/collectives/wire_values.hpp>
#include <oktopk/impl/comm/fault_injection.hpp>
#include <oktopk/impl/comm/mpi_mirror.hpp>
#include <oktopk/impl/kernels/vector_ops.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace oktopk::impl {

/// Tree: in round s = 1, 2, 4, ... (s < P) rank r with r mod 2s == s sends its set to r - s and
/// leaves the tree; rank r with r mod 2s == 0 and r + s < P receives, merges (own + received)
/// and keeps the k largest |sum|. Any P works: a rank without a partner skips the round.
///
/// Residual (the reference behaviour, spec §4): an entry is cleared where it was locally
/// selected and is in the final set. An entry a merge dropped on the way, but whose index comes
/// back into the final set through another subtree, is cleared although its value never reached
/// the result; so mass is NOT exactly conserved: sum_i (acc_i - residual_i) may differ from
/// P·out.
///
/// Wire (value_wire()): a rank sends its set, in the tree or as the root's broadcast, as the
/// wire's type, so what its parent merges, and what every rank averages, is rounded. A sender
/// keeps the rounding error of each value it sent whose index is in the final set: the value
/// reached the result less that error. Along a path from a leaf to the root every rounding is
/// kept by the rank that made it, so for an entry no merge dropped on the way, the result and
/// the residuals add up to the inputs, as they do with the native wire.
template <class ExecSpace, class Value>
class GTopk final : public MethodBase<ExecSpace, Value> {
  using Base = MethodBase<ExecSpace, Value>;
  using real_vector_type = typename Base::real_vector_type;
  using Real = typename Base::arithmetic_type;
  using vector_type = typename Base::vector_type;
  using index_vector_type = typename Base::index_vector_type;
  // What MPI reads and writes (a host copy without GPU-aware MPI): values, or 16-bit words.
  using MpiValues = MpiBuffer<Real>;
  using MpiWords = MpiBuffer<std::uint16_t>;

 public:
  GTopk(const ExecSpace& exec, const Communicator& comm, std::int64_t n, const Options& options,
        const Layout& layout = Layout())
      : Base(exec, Algorithm::GTopk, comm, n, options, layout) {}

 protected:
  const char* reduce_scatter_refusal() const override {
    return "its error feedback needs the whole final selection on every rank, which the "
           "broadcast delivers, so a reduce-scatter would move the same bytes: use reduce";
  }

  void reduce_step(const ExecSpace& exec, const real_vector_type& acc,
                   const vector_type& out) override {
    auto& stats = this->stats_;
    const Communicator& comm = this->comm_;
    const int P = comm.size();
    const int me = comm.rank();
    const std::int64_t k = this->k_;
    auto range = [](std::int64_t b, std::int64_t e) { return Kokkos::make_pair(b, e); };

    const bool narrow = wire_ != Wire::Native;
    const std::int64_t width = wire_words<Real>(wire_);
    overflowed_ = 0;
    sent_ = 0;
    std::int64_t local = 0;
    {
      auto timer = this->phase(exec, "select");
      stats.local_threshold = this->topk_threshold(exec, acc, k);
      stats.local_threshold_exact = true;
      // The local top-k starts the tree set; its indices are kept for the residual.
      local =
          this->select_top_k_into(exec, acc, stats.local_threshold, k, set_indices_, set_values_);
      ensure_capacity(exec, local_indices_, local);
      Kokkos::deep_copy(exec, Kokkos::subview(local_indices_, range(0, local)),
                        Kokkos::subview(set_indices_, range(0, local)));
    }
    stats.local_selected = local;

    std::int64_t size = local;                                  // of my current set
    float threshold = -std::numeric_limits<float>::infinity();  // of my last re-selection
    {
      auto timer = this->phase(exec, "tree");
      int round = 0;
      for (std::int64_t s = 1; s < P; s *= 2, ++round) {
        const int tag = 100 + 3 * round;  // count, indices, values
        if (me % (2 * s) == s) {
          const int parent = static_cast<int>(me - s);
          const std::int64_t count = size;
          // Only the live entries (a host copy of them without GPU-aware MPI); on a narrower
          // wire the values as words.
          const auto send_idx = mpi_send_view(exec, Kokkos::subview(set_indices_, range(0, count)));
          MpiValues send_val;
          MpiWords send_words;
          if (narrow) {
            encode_sent(exec, count);
            send_words = mpi_send_view(exec, Kokkos::subview(words_, range(0, width * count)));
          } else {
            send_val = mpi_send_view(exec, Kokkos::subview(set_values_, range(0, count)));
          }
          Communicator::Requests requests;
          comm.isend(&count, 1, parent, tag, requests);
          if (count > 0) {
            comm.isend(send_idx.data(), count, parent, tag + 1, requests);
            if (narrow) {
              comm.isend(send_words.data(), width * count, parent, tag + 2, requests);
            } else {
              comm.isend(send_val.data(), count, parent, tag + 2, requests);
            }
          }
          requests.wait_all();
          break;  // out of the tree; waits for the broadcast
        }
        if (me % (2 * s) != 0 || me + s >= P) continue;
        const int child = static_cast<int>(me + s);
        std::int64_t count = 0;
        {
          Communicator::Requests requests;
          comm.irecv(&count, 1, child, tag, requests);
          requests.wait_all();
        }
        ensure_capacity(exec, recv_indices_, count);
        ensure_capacity(exec, recv_values_, count);
        if (narrow) ensure_capacity(exec, words_, width * count);
        if (count > 0) {
          const auto idx_part = Kokkos::subview(recv_indices_, range(0, count));
          auto recv_idx = mpi_receive_view(exec, idx_part);
          MpiValues recv_val;
          MpiWords recv_words;
          if (narrow) {
            recv_words = mpi_receive_view(exec, Kokkos::subview(words_, range(0, width * count)));
          } else {
            recv_val = mpi_receive_view(exec, Kokkos::subview(recv_values_, range(0, count)));
          }
          Communicator::Requests requests;
          comm.irecv(recv_idx.data(), count, child, tag + 1, requests);
          if (narrow) {
            comm.irecv(recv_words.data(), width * count, child, tag + 2, requests);
          } else {
            comm.irecv(recv_val.data(), count, child, tag + 2, requests);
          }
          OKTOPK_FAULT_POINT(comm, "posted");
          requests.wait_all();
          mpi_received(exec, recv_idx, idx_part, 0, count);
          if (narrow) {
            mpi_received(exec, recv_words, words_, 0, width * count);
            decode_values(exec, words_, 0, count, recv_values_, wire_);
          } else {
            mpi_received(exec, recv_val, recv_values_, 0, count);
          }
        }

        ensure_capacity(exec, merged_indices_, size + count);
        ensure_capacity(exec, merged_values_, size + count);
        const std::int64_t merged = merge_sorted_unchecked(
            exec, Kokkos::subview(set_indices_, range(0, size)),
            Kokkos::subview(set_values_, range(0, size)),
            Kokkos::subview(recv_indices_, range(0, count)),
            Kokkos::subview(recv_values_, range(0, count)), merged_indices_, merged_values_);
        // Keep the k largest |sum|: those above the (k+1)-th largest, and as many of those
        // equal to it, in index order, as complete the k (none at a threshold of 0).
        if (k <= 0) {
          threshold = std::numeric_limits<float>::infinity();
        } else if (k >= merged) {
          threshold = -std::numeric_limits<float>::infinity();
        } else {
          threshold = kth_largest_abs(exec, Kokkos::subview(merged_values_, range(0, merged)),
                                      k + 1, this->kth_workspace_);
        }
        // The set's old contents are in the merged buffers now; regrowing it may drop them.
        ensure_capacity(exec, set_indices_, merged);
        ensure_capacity(exec, set_values_, merged);
        std::int64_t ties = 0;
        if (std::isfinite(threshold) && threshold > 0.0f) {
          ties =
              k - count_above(exec, Kokkos::subview(merged_values_, range(0, merged)), threshold);
        }
        size = select_pairs_above(exec, merged_indices_, merged_values_, merged, threshold, ties,
                                  set_indices_, set_values_);
      }
    }

    {
      auto timer = this->phase(exec, "bcast");
      // The count and rank 0's last threshold (as its bit pattern), then the entries.
      std::int64_t header[2] = {size, 0};
      std::uint32_t bits = 0;
      std::memcpy(&bits, &threshold, sizeof bits);
      header[1] = bits;
      comm.bcast(header, 2, 0);
      size = header[0];
      bits = static_cast<std::uint32_t>(header[1]);
      std::memcpy(&threshold, &bits, sizeof threshold);
      if (me != 0) {
        ensure_capacity(exec, set_indices_, size);
        ensure_capacity(exec, set_values_, size);
        if (narrow) ensure_capacity(exec, words_, width * size);
      } else if (narrow) {
        // The root's set is the result: every rank, the root too, averages it as sent.
        encode_sent(exec, size);
      }
      if (size > 0) {
        const auto idx_part = Kokkos::subview(set_indices_, range(0, size));
        auto idx = me == 0 ? mpi_send_view(exec, idx_part) : mpi_receive_view(exec, idx_part);
        MpiValues val;
        MpiWords words;
        if (narrow) {
          const auto part = Kokkos::subview(words_, range(0, width * size));
          words = me == 0 ? mpi_send_view(exec, part) : mpi_receive_view(exec, part);
        } else {
          const auto part = Kokkos::subview(set_values_, range(0, size));
          val = me == 0 ? mpi_send_view(exec, part) : mpi_receive_view(exec, part);
        }
        comm.bcast(idx.data(), size, 0);
        if (narrow) {
          comm.bcast(words.data(), width * size, 0);
        } else {
          comm.bcast(val.data(), size, 0);
        }
        if (me != 0) {
          mpi_received(exec, idx, idx_part, 0, size);
          if (narrow) {
            mpi_received(exec, words, words_, 0, width * size);
            decode_values(exec, words_, 0, size, set_values_, wire_);
          } else {
            mpi_received(exec, val, set_values_, 0, size);
          }
        }
      }
    }
    stats.global_threshold = threshold;
    stats.global_threshold_exact = true;
    stats.global_selected = size;

    {
      auto timer = this->phase(exec, "reduce");
      Kokkos::deep_copy(exec, out, typename Base::gradient_type{});
      scatter_divided(exec, set_indices_, set_values_, size, out, static_cast<float>(P));
    }
    {
      auto timer = this->phase(exec, "residual");
      const auto final_indices = Kokkos::subview(set_indices_, range(0, size));
      const auto mine = Kokkos::subview(local_indices_, range(0, local));
      ensure_capacity(exec, common_, std::min(local, size));
      const std::int64_t common = intersect_sorted_unchecked(exec, mine, final_indices, common_);
      clear_at_unchecked(exec, acc, Kokkos::subview(common_, range(0, common)));
      if (sent_ > 0) {
        add_kept_wire_errors(exec, acc, sent_indices_, sent_errors_, sent_, set_indices_, size);
      }
    }
  }

  std::int64_t wire_overflows() const override { return overflowed_; }

 private:
  /// Before this rank sends set(0 .. count - 1) on a narrower wire: keeps each value's rounding
  /// error with its index (the residual takes those the result keeps), and writes the values
  /// as words_, leaving set_values_ as sent.
  void encode_sent(const ExecSpace& exec, std::int64_t count) {
    ensure_capacity(exec, sent_indices_, count);
    ensure_capacity(exec, sent_errors_, count);
    ensure_capacity(exec, words_, wire_words<Real>(wire_) * count);
    auto range = Kokkos::make_pair(std::int64_t{0}, count);
    Kokkos::deep_copy(exec, Kokkos::subview(sent_indices_, range),
                      Kokkos::subview(set_indices_, range));
    wire_errors(exec, set_values_, count, sent_errors_, wire_);
    overflowed_ += encode_values(exec, set_values_, count, words_, wire_);
    sent_ = count;
  }

  /// The type the values travel in (value_wire()).
  const Wire wire_ = value_wire<Value>(this->options_);
  /// Values this rank sent in this call that rounded to Inf or NaN on the wire.
  std::int64_t overflowed_ = 0;
  /// The set this rank sent in this call on a narrower wire (at most one: its tree send or,
  /// on the root, the broadcast): indices and rounding errors.
  std::int64_t sent_ = 0;
  index_vector_type sent_indices_{"oktopk::GTopk::sent_indices", 0};
  real_vector_type sent_errors_{"oktopk::GTopk::sent_errors", 0};
  /// Values as the wire carries them, sent or received.
  Kokkos::View<std::uint16_t*, typename Base::memory_space> words_{"oktopk::GTopk::words", 0};
  // The indices of this rank's local top-k (for the residual), its current tree set, what it
  // received from a child, the merge of the two, and the indices cleared from the residual.
  index_vector_type local_indices_{"oktopk::GTopk::local_indices", 0};
  index_vector_type set_indices_{"oktopk::GTopk::set_indices", 0};
  real_vector_type set_values_{"oktopk::GTopk::set_values", 0};
  index_vector_type recv_indices_{"oktopk::GTopk::recv_indices", 0};
  real_vector_type recv_values_{"oktopk::GTopk::recv_values", 0};
  index_vector_type merged_indices_{"oktopk::GTopk::merged_indices", 0};
  real_vector_type merged_values_{"oktopk::GTopk::merged_values", 0};
  index_vector_type common_{"oktopk::GTopk::common", 0};
};

}  // namespace oktopk::impl

// Compiled once, in liboktopk (src/instantiate/).
OKTOPK_IMPL_DECLARE_INSTANTIATIONS(oktopk::impl::GTopk)
