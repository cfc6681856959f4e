// SPDX-License-Identifier: BSD-3-Clause
// S2 Reducer (Ge et al., arXiv 2110.02140): each rank puts the non-zeros of its gradient into a
// count sketch of fixed size and marks the rows that hold them in a bitmap; both are allreduced,
// so the volume depends on neither P nor the number of non-zeros, and every rank decodes the
// summed sketch (median over sketch rows) on the union of the marked rows. With a Layout,
// only its SparseRows segments are sketched, and its Dense segments ride along in the same
// allreduce, averaged exactly (on the native wire). The sketch's kernels are
// impl/kernels/count_sketch.hpp and impl/kernels/sketch_segments.hpp; this file is S2's schedule
// and buffers.
#pragma once

#include <oktopk/layout.hpp>
#include <oktopk/impl/algorithms/method_base.hpp>
#include <oktopk/impl/collectives/wire_values.hpp>
#include <oktopk/impl/comm/mpi_mirror.hpp>
#include <oktopk/impl/kernels/count_sketch.hpp>
#include <oktopk/impl/kernels/segment_map.hpp>
#include <oktopk/impl/kernels/sketch_segments.hpp>

#include <Kokkos_Core.hpp>

#include <climits>
#include <cstdint>
#include <stdexcept>

namespace oktopk::impl {

/// Per-handle sketch state (the reference shared one sketch object between all layers); the
/// table sums values of the handle's arithmetic type, Real.
template <class ExecSpace, class Real>
struct S2Buffers {
  using memory_space = typename ExecSpace::memory_space;
  Kokkos::View<Real*, memory_space> table;
  /// The cells as the sketch sums them (sketch_entries), before they become the table.
  Kokkos::View<std::int64_t*, memory_space> fixed;
  Kokkos::View<unsigned char*, memory_space> bitmap;

  S2Buffers(const ExecSpace& exec, const CountSketch& sketch)
      : table(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::s2::table"),
              static_cast<std::size_t>(sketch.cells())),
        fixed(make_fixed_cells(exec, sketch, "oktopk::s2::fixed")),
        bitmap(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::s2::bitmap"),
               static_cast<std::size_t>(sketch.rows)) {}
};

/// \brief S2's buffers for a fused buffer with a Layout: everything one allreduce carries,
/// [sketch table | bitmap over the sparse rows (as floats, so one SUM adds it too: a row is in
/// the union where the sum is non-zero) | the Dense segments' entries], plus the compacted
/// union rows the decode works from. Values of the handle's arithmetic type, Real.
template <class ExecSpace, class Real>
struct S2SegmentBuffers {
  using memory_space = typename ExecSpace::memory_space;
  Kokkos::View<Real*, memory_space> fused;
  Kokkos::View<Real*, memory_space> table;
  Kokkos::View<Real*, memory_space> bitmap;
  Kokkos::View<Real*, memory_space> dense;
  /// The cells as the sketch sums them (sketch_entries), before they become the table.
  Kokkos::View<std::int64_t*, memory_space> fixed;
  /// Union rows in ascending order, and the first decoded entry of each.
  Kokkos::View<std::int64_t*, memory_space> union_rows;
  Kokkos::View<std::int64_t*, memory_space> union_entry_begin;

  S2SegmentBuffers() = default;
  S2SegmentBuffers(const ExecSpace& exec, const CountSketch& sketch,
                   const SegmentMap<memory_space>& map)
      : fused(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::s2::fused"),
              fused_length(sketch, map)),
        fixed(make_fixed_cells(exec, sketch, "oktopk::s2::fixed")),
        union_rows(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::s2::union_rows"),
                   static_cast<std::size_t>(map.sparse_rows)),
        union_entry_begin(
            Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::s2::union_entry_begin"),
            static_cast<std::size_t>(map.sparse_rows)) {
    const auto cells = static_cast<std::size_t>(sketch.cells());
    const auto rows = static_cast<std::size_t>(map.sparse_rows);
    table = Kokkos::subview(fused, Kokkos::make_pair(std::size_t{0}, cells));
    bitmap = Kokkos::subview(fused, Kokkos::make_pair(cells, cells + rows));
    dense = Kokkos::subview(fused, Kokkos::make_pair(cells + rows, fused.extent(0)));
  }

 private:
  static std::size_t fused_length(const CountSketch& sketch, const SegmentMap<memory_space>& map) {
    const std::int64_t length = sketch.cells() + map.sparse_rows + map.dense_entries;
    // One allreduce carries it all, and MPI counts are ints.
    OKTOPK_REQUIRE(length <= INT_MAX, std::invalid_argument, "oktopk::make_sparse_allreduce",
                   "S2 with a layout allreduces sketch cells + sparse rows + dense entries = "
                       << sketch.cells() << " + " << map.sparse_rows << " + " << map.dense_entries
                       << " floats in one call, more than 2^31 - 1");
    return static_cast<std::size_t>(length);
  }
};

/// \brief S2 Reducer: count sketch + row bitmap, both allreduced.
///
/// Per call: bitmap of this rank's non-zero rows and a count sketch of its non-zeros ("sketch");
/// allreduce of the table (SUM, 4·r·c bytes for float; on a narrower wire the ring's average,
/// below) and of the bitmap (MAX, i.e. OR, one byte per row) ("allreduce"); every rank decodes
/// the median estimate / P on the union rows, 0 elsewhere ("decode"). Differences from the
/// reference code: the decoded result is written to the output, the table is cleared every call,
/// and each handle owns its sketch state.
///
/// Each rank's table is the same bits on every run, whatever the thread count or device
/// (sketch_entries sums on an integer grid), so S2 resumes from a checkpoint bit for bit as the
/// other methods do.
///
/// Error feedback (s2_error_feedback, off by default as in the reference): before the
/// allreduce, each non-zero entry of acc loses the estimate this rank's own sketch gives it, so
/// the residual keeps what this rank's sketch got wrong about its own entries ("residual" phase);
/// the global estimate's errors from other ranks' entries are not attributed to anyone.
///
/// Stats: local_selected = this rank's non-zeros (every non-zero is sketched, so the thresholds
/// are 0: |x| > 0 selects); global_selected = entries in union rows, the decoded entries.
///
/// With a Layout (docs/reference.md, "Fused buffers: layouts"): only the SparseRows segments are
/// sketched, keyed by their entries numbered consecutively over those segments, with a bitmap
/// over their rows (each segment its own row width; s2_row_width is not used); the Dense
/// segments' entries are packed behind table and bitmap, and one allreduce (SUM, floats) of
/// [table | bitmap | dense] replaces the two; the decode computes estimates on the union rows
/// only, and the dense average goes straight to out. Default columns: ceil(2 * density * the
/// SparseRows entries). Error feedback keeps nothing of the Dense entries (they are sent
/// exactly). local_selected and global_selected then also count the Dense entries.
///
/// Wire (value_wire()): on a wire narrower than the arithmetic type, the table (or the fused
/// buffer) is averaged by OkTopk's ring on the wire's type, which rounds what every rank sends
/// and sums in the arithmetic type, and the decode divides by 1 (the bitmap keeps its bytes and
/// MPI_MAX; the fused one's averages stay non-zero where a rank marked the row). Error feedback
/// then estimates this rank's entries from its table as sent (rounded), and a Dense entry keeps
/// this rank's rounding error; the roundings of the partial sums, like the sketch's collisions
/// with other ranks' entries, are nobody's.
template <class ExecSpace, class Value>
class S2Reducer final : public MethodBase<ExecSpace, Value> {
  using Base = MethodBase<ExecSpace, Value>;
  using real_vector_type = typename Base::real_vector_type;
  using Real = typename Base::arithmetic_type;
  using vector_type = typename Base::vector_type;

 public:
  S2Reducer(const ExecSpace& exec, const Communicator& comm, std::int64_t n, const Options& options,
            const Layout& layout = Layout())
      : S2Reducer(exec, comm, n, options, layout,
                  CountSketch::make("oktopk::make_sparse_allreduce",
                                    layout.empty() ? n : layout.sparse_entries(), options)) {}

  const CountSketch& sketch() const { return sketch_; }

 protected:
  const char* reduce_scatter_refusal() const override {
    return "any entry is decoded from the whole summed count-sketch table, so every rank needs "
           "all of it: use reduce";
  }

  bool uses_error_feedback() const override { return this->options_.s2_error_feedback; }
  std::int64_t wire_overflows() const override { return overflowed_; }

  void reduce_step(const ExecSpace& exec, const real_vector_type& acc,
                   const vector_type& out) override {
    if (!this->layout_.empty()) {
      reduce_segments(exec, acc, out);
      return;
    }
    auto& stats = this->stats_;
    overflowed_ = 0;
    {
      auto timer = this->phase(exec, "sketch");
      stats.local_selected =
          sketch_nonzeros(exec, sketch_, acc, buffers_.table, buffers_.fixed, buffers_.bitmap);
    }
    if (uses_error_feedback()) {
      // Before the allreduce, while the table is still this rank's own sketch.
      auto timer = this->phase(exec, "residual");
      round_for_wire(exec, buffers_.table, wire_);
      subtract_own_estimate(exec, sketch_, buffers_.table, acc);
    }
    {
      auto timer = this->phase(exec, "allreduce");
      sum_table(exec, buffers_.table);
      mpi_allreduce_in_place(exec, this->comm_, buffers_.bitmap, MPI_MAX);
    }
    {
      auto timer = this->phase(exec, "decode");
      stats.global_selected =
          decode_marked_rows(exec, sketch_, buffers_.table, buffers_.bitmap, out, table_divisor());
    }
    stats.local_threshold = stats.global_threshold = 0.0f;
  }

 private:
  // Validates (in make) before the base allocates n-long buffers. Without a layout the
  // segment buffers stay empty, with one the whole-buffer ones hold a single cell.
  S2Reducer(const ExecSpace& exec, const Communicator& comm, std::int64_t n, const Options& options,
            const Layout& layout, const CountSketch& sketch)
      : Base(exec, Algorithm::S2Reducer, comm, n, options, layout),
        sketch_(sketch),
        buffers_(exec, layout.empty() ? sketch : CountSketch{}),
        map_(exec, layout),
        segment_buffers_(layout.empty() ? S2SegmentBuffers<ExecSpace, Real>()
                                        : S2SegmentBuffers<ExecSpace, Real>(exec, sketch, map_)) {}

  /// reduce_step for a handle with a layout: one allreduce of [table | bitmap | dense].
  void reduce_segments(const ExecSpace& exec, const real_vector_type& acc, const vector_type& out) {
    auto& stats = this->stats_;
    auto& b = segment_buffers_;
    const bool feedback = uses_error_feedback();
    {
      auto timer = this->phase(exec, "sketch");
      stats.local_selected = sketch_segments(exec, sketch_, map_, acc, b.table, b.fixed, b.bitmap) +
                             map_.dense_entries;
    }
    overflowed_ = 0;
    if (feedback) {
      // Before the allreduce, while the table is still this rank's own sketch.
      auto timer = this->phase(exec, "residual");
      round_for_wire(exec, b.table, wire_);
      subtract_own_estimate_segments(exec, sketch_, map_, b.table, acc);
    }
    {
      auto timer = this->phase(exec, "pack");
      pack_dense_segments(exec, map_, acc, b.dense, feedback, wire_);
    }
    const float P = table_divisor();
    {
      auto timer = this->phase(exec, "allreduce");
      sum_table(exec, b.fused);
    }
    {
      auto timer = this->phase(exec, "decode");
      unpack_dense_segments(exec, map_, b.dense, out, P);
      stats.global_selected = decode_segments(exec, sketch_, map_, b.table, b.bitmap, out, P,
                                              b.union_rows, b.union_entry_begin) +
                              map_.dense_entries;
    }
    stats.local_threshold = stats.global_threshold = 0.0f;
  }

  /// Sums `table` over the ranks in place: MPI_Allreduce (SUM) on the native wire; on a
  /// narrower one the ring's average, counting the entries of the chunk this rank finished that
  /// lie beyond the wire type's range.
  template <class Table>
  void sum_table(const ExecSpace& exec, const Table& table) {
    if (wire_ == Wire::Native) {
      mpi_allreduce_in_place(exec, this->comm_, table, MPI_SUM);
    } else {
      overflowed_ = this->dense_average(exec, table, table, true);
    }
  }

  /// What the decode divides the summed table by: P, or 1 after the ring's average.
  float table_divisor() const {
    return wire_ == Wire::Native ? static_cast<float>(this->comm_.size()) : 1.0f;
  }

  /// The type the table travels in (value_wire()).
  const Wire wire_ = value_wire<Value>(this->options_);
  /// Table entries this rank finished that lie beyond the wire type's range.
  std::int64_t overflowed_ = 0;
  CountSketch sketch_;
  S2Buffers<ExecSpace, Real> buffers_;
  SegmentMap<typename ExecSpace::memory_space> map_;
  S2SegmentBuffers<ExecSpace, Real> segment_buffers_;
};

}  // namespace oktopk::impl

// Compiled once, in liboktopk (src/instantiate/).
OKTOPK_IMPL_DECLARE_INSTANTIATIONS(oktopk::impl::S2Reducer)
