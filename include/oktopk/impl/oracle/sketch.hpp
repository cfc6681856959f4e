// SPDX-License-Identifier: BSD-3-Clause
// The oracle of S2 Reducer: the mean over ranks sketched once with the method's hash
// functions (by linearity the same as the sum of the ranks' sketches), decoded on the union of
// the rows some rank touches, with a slack per cell from its load and mass.
#pragma once

#include <oktopk/communicator.hpp>
#include <oktopk/error.hpp>
#include <oktopk/layout.hpp>
#include <oktopk/options.hpp>
#include <oktopk/sparse_allreduce.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/base/wire_rounding.hpp>
#include <oktopk/impl/comm/mpi_mirror.hpp>
#include <oktopk/impl/kernels/count_sketch.hpp>
#include <oktopk/impl/kernels/vector_ops.hpp>
#include <oktopk/impl/oracle/common.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace oktopk::impl {

/// \brief Collective. S2's result computed another way, for tests and benchmark checks: the
/// dense mean of every rank's `acc` (MPI allreduce, then /P) is sketched once with the same hash
/// functions, and decoded on the union of every rank's non-zero rows, without a further /P. By
/// linearity of the sketch this equals S2Reducer's output (same n and options, before error
/// feedback changes acc) up to the order of float additions. Throws std::invalid_argument on
/// every rank if any rank's Views do not have length n, or for options S2 cannot use. Acc and
/// Out: Views of float or double in ExecSpace's memory, computed in Out's type.
template <class ExecSpace, class Acc, class Out>
void s2_oracle(const ExecSpace& exec, const Communicator& comm, std::int64_t n,
               const Options& options, const Acc& acc, const Out& out) {
  using Real = typename Out::non_const_value_type;
  constexpr const char* where = "oktopk::impl::s2_oracle";
  const CountSketch sketch = CountSketch::make(where, n, options);
  ScopedRegion region("oktopk::expected_result::s2_oracle");
  int bad_rank =
      static_cast<std::int64_t>(acc.extent(0)) == n && static_cast<std::int64_t>(out.extent(0)) == n
          ? 0
          : comm.rank() + 1;
  comm.allreduce_in_place(&bad_rank, 1, MPI_MAX);
  OKTOPK_REQUIRE(bad_rank == 0, std::invalid_argument, where,
                 "acc and out must have length " << n << " on every rank; rank " << bad_rank - 1
                                                 << " passed other lengths");
  // sketch_nonzeros zeroes both before it adds.
  auto table = make_uninitialized<Real>(exec, "oktopk::expected_result::s2_oracle_table",
                                        static_cast<std::size_t>(sketch.cells()));
  const auto fixed = make_fixed_cells(exec, sketch, "oktopk::expected_result::s2_oracle_fixed");
  auto bitmap = make_uninitialized<unsigned char>(exec, "oktopk::expected_result::s2_oracle_bitmap",
                                                  static_cast<std::size_t>(sketch.rows));
  sketch_nonzeros(exec, sketch, acc, table, fixed, bitmap);  // for the rows it marks
  mpi_allreduce_in_place(exec, comm, bitmap, MPI_MAX);
  auto mean = make_uninitialized<Real>(exec, "oktopk::expected_result::s2_oracle_mean",
                                       static_cast<std::size_t>(n));
  Kokkos::deep_copy(exec, mean, acc);
  mpi_allreduce_in_place(exec, comm, mean, MPI_SUM);
  divide(exec, mean, mean, static_cast<float>(comm.size()));
  auto mean_rows = make_uninitialized<unsigned char>(
      exec, "oktopk::expected_result::s2_oracle_mean_rows", static_cast<std::size_t>(sketch.rows));
  sketch_nonzeros(exec, sketch, mean, table, fixed, mean_rows);
  decode_marked_rows(exec, sketch, table, bitmap, out, 1.0f);
  fence(exec, "oktopk::expected_result::s2_oracle");
}

/// What S2's ring on a narrower wire (value_wire()) may move an average of its table by
/// (ring_wire_bound, of the sum of the magnitudes of what the ranks put in a cell); nothing on
/// the native wire, whose MPI sum the oracle's slack for summation order covers. The median of
/// a cell's estimates moves by no more than its cells do.
template <class Value, class Real>
RingWireBound<Real> s2_ring_bound(const Options& options, int P) {
  const Wire wire = value_wire<Value>(options);
  return wire == Wire::Native ? RingWireBound<Real>{} : ring_wire_bound<Real>(wire, P);
}

/// How far the fixed-point sums of a sketch (sketch_entries) may move one of its cells, per
/// entry in it: a step of the coarsest grid any rank, or the oracle on the mean, may have
/// summed on (each rounds a value by at most half a step), for `keys` keys. `sum_abs` holds the
/// sum over ranks of |acc|, which bounds every rank's largest |value| and the mean's. 0 for an
/// exact sketch, which stores its entries as they are.
template <class ExecSpace, class SumAbs>
double fixed_point_slack_per_entry(const ExecSpace& exec, const CountSketch& sketch,
                                   std::int64_t keys, const SumAbs& sum_abs) {
  using Real = typename SumAbs::non_const_value_type;
  if (sketch.exact) return 0.0;
  Real largest = 0;
  Kokkos::parallel_reduce(
      "oktopk::expected_result::s2_largest", RangeOf<ExecSpace>(exec, 0, sum_abs.extent(0)),
      KOKKOS_LAMBDA(std::int64_t i, Real & most) {
        if (sum_abs(i) > most) most = sum_abs(i);
      },
      Kokkos::Max<Real>(largest));
  return largest > Real(0) ? FixedPointGrid::make(static_cast<double>(largest), keys).step : 0.0;
}

/// The median of e[0, count) (sorted in place): the middle value, or for even counts the mean
/// of the two middle ones. Written apart from CountSketch::estimate, so the oracle does not check
/// the decode against itself.
template <class Real>
KOKKOS_INLINE_FUNCTION Real oracle_median(Real (&e)[max_sketch_rows], int count) {
  for (int a = 1; a < count; ++a) {
    const Real v = e[a];
    int b = a;
    for (; b > 0 && e[b - 1] > v; --b) e[b] = e[b - 1];
    e[b] = v;
  }
  const int mid = count / 2;
  if (count % 2 == 1) return e[mid];
  // An even count is 2 or more (a sketch has a row): the guard only keeps GCC 11 from warning of
  // e[-1], a count of 0 it sees in the host copy of a device lambda.
  return Real(0.5) * (e[mid > 0 ? mid - 1 : 0] + e[mid]);
}

/// S2 with a layout, from the Layout itself rather than the method's segment map: Dense
/// segments get the exact mean; the SparseRows segments' entries, numbered consecutively over
/// them in layout order (the sketch's keys), are sketched once as the mean over ranks with the
/// method's hashes, and each row of them is decoded (median over sketch rows) where some rank
/// has a non-zero in it, 0 elsewhere.
template <class ExecSpace, class Value, class Real = arithmetic_t<Value>>
void expected_s2_layout(const ExecSpace& exec, const SparseAllreduce<ExecSpace, Value>& handle,
                        const OracleConstVector<ExecSpace, Real>& acc,
                        const OracleVector<ExecSpace, Real>& expected,
                        const OracleVector<ExecSpace, Real>& slack) {
  const Communicator& comm = handle.communicator();
  const int P = comm.size();
  const Layout& layout = handle.layout();
  const auto n = static_cast<std::size_t>(handle.size());
  const CountSketch s =
      CountSketch::make("oktopk::expected_result", layout.sparse_entries(), handle.options());

  // expected first holds the mean over ranks, slack the sum over ranks of |acc|.
  Kokkos::deep_copy(exec, expected, acc);
  mpi_allreduce_in_place(exec, comm, expected, MPI_SUM);
  divide(exec, expected, expected, static_cast<float>(P));
  Kokkos::parallel_for(
      "oktopk::expected_result::s2_layout_abs", RangeOf<ExecSpace>(exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i) { slack(i) = abs(acc(i)); });
  mpi_allreduce_in_place(exec, comm, slack, MPI_SUM);
  const auto per_entry =
      static_cast<Real>(fixed_point_slack_per_entry(exec, s, layout.sparse_entries(), slack));

  const auto cells = static_cast<std::size_t>(s.cells());
  const OracleVector<ExecSpace, Real> table("oktopk::expected_result::s2_layout_table", cells);
  const OracleVector<ExecSpace, Real> mass("oktopk::expected_result::s2_layout_mass", cells);
  const OracleVector<ExecSpace, Real> load("oktopk::expected_result::s2_layout_load", cells);
  std::int64_t first_key = 0;
  for (const Segment& segment : layout.segments()) {
    if (segment.kind != SegmentKind::SparseRows) continue;
    const std::int64_t offset = segment.offset;
    const std::int64_t key_base = first_key - offset;
    Kokkos::parallel_for(
        "oktopk::expected_result::s2_layout_sketch",
        RangeOf<ExecSpace>(exec, offset, offset + segment.length), KOKKOS_LAMBDA(std::int64_t i) {
          const Real v = expected(i);
          const Real a = slack(i);
          if (a == 0) return;  // zero on every rank
          s.for_each_cell(key_base + i, [&](int, std::int64_t c, float sign) {
            Kokkos::atomic_add(&table(c), sign * v);
            Kokkos::atomic_add(&mass(c), a);
            Kokkos::atomic_add(&load(c), Real(1));
          });
        });
    first_key += segment.length;
  }

  const auto ranks = static_cast<Real>(P);
  const Real u = roundoff_v<Real>;
  // The MPI sums of the method's fused buffer and of the oracle's whole one may add in
  // different orders once there are three terms or more.
  const Real dense_order = P > 2 ? Real(2) * static_cast<Real>(P - 1) * u / ranks : Real(0);
  // On a narrower wire, the ring's roundings of every average in the fused buffer.
  const RingWireBound<Real> ring = s2_ring_bound<Value, Real>(handle.options(), P);
  first_key = 0;
  for (const Segment& segment : layout.segments()) {
    const std::int64_t offset = segment.offset;
    const std::int64_t end = offset + segment.length;
    if (segment.kind == SegmentKind::Dense) {
      Kokkos::parallel_for(
          "oktopk::expected_result::s2_layout_dense", RangeOf<ExecSpace>(exec, offset, end),
          KOKKOS_LAMBDA(std::int64_t i) {
            slack(i) = slack(i) * (dense_order + ring.scale) + ring.floor;
          });
      continue;
    }
    // One work item per row: it alone reads and rewrites its entries, so the row's union
    // test needs no second pass.
    const std::int64_t width = segment.row_width;
    const std::int64_t key_base = first_key - offset;
    Kokkos::parallel_for(
        "oktopk::expected_result::s2_layout_decode", RangeOf<ExecSpace>(exec, 0, segment.rows()),
        KOKKOS_LAMBDA(std::int64_t row) {
          const std::int64_t begin = offset + row * width;
          const std::int64_t stop = begin + width < end ? begin + width : end;
          bool in_union = false;
          for (std::int64_t i = begin; i < stop; ++i) in_union = in_union || slack(i) != 0.0f;
          for (std::int64_t i = begin; i < stop; ++i) {
            if (!in_union) {
              expected(i) = 0.0f;
              slack(i) = 0.0f;
              continue;
            }
            Real e[max_sketch_rows] = {};
            Real worst = 0;
            Real heaviest = 0;
            Real loaded = 0;
            s.for_each_cell(key_base + i, [&](int q, std::int64_t c, float sign) {
              e[q] = sign * table(c);
              worst = max_of(worst, (load(c) + ranks) * mass(c));
              heaviest = max_of(heaviest, mass(c));
              loaded = max_of(loaded, load(c));
            });
            expected(i) = oracle_median(e, s.sketch_rows);
            slack(i) = Real(4) * u * worst / ranks + ring.scale * heaviest + ring.floor +
                       loaded * per_entry;
          }
        });
    first_key += segment.length;
  }
}

/// S2: its own oracle for the values; the slack from every sketch cell's load and mass.
template <class ExecSpace, class Value, class Real = arithmetic_t<Value>>
void expected_s2(const ExecSpace& exec, const SparseAllreduce<ExecSpace, Value>& handle,
                 const OracleConstVector<ExecSpace, Real>& acc,
                 const OracleVector<ExecSpace, Real>& expected,
                 const OracleVector<ExecSpace, Real>& slack) {
  if (!handle.layout().empty()) {
    expected_s2_layout(exec, handle, acc, expected, slack);
    return;
  }
  const Communicator& comm = handle.communicator();
  const std::int64_t n = handle.size();
  s2_oracle(exec, comm, n, handle.options(), acc, expected);

  const CountSketch s = CountSketch::make("oktopk::expected_result", n, handle.options());
  // slack first holds sum over ranks of |acc|.
  Kokkos::parallel_for(
      "oktopk::expected_result::s2_abs", RangeOf<ExecSpace>(exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i) { slack(i) = abs(acc(i)); });
  mpi_allreduce_in_place(exec, comm, slack, MPI_SUM);
  const auto per_entry = static_cast<Real>(fixed_point_slack_per_entry(exec, s, n, slack));
  const auto cells = static_cast<std::size_t>(s.cells());
  const OracleVector<ExecSpace, Real> mass("oktopk::expected_result::s2_mass", cells);
  const OracleVector<ExecSpace, Real> load("oktopk::expected_result::s2_load", cells);
  Kokkos::parallel_for(
      "oktopk::expected_result::s2_cells", RangeOf<ExecSpace>(exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i) {
        const Real a = slack(i);
        if (a == 0) return;
        s.for_each_cell(i, [&](int, std::int64_t c, float) {
          Kokkos::atomic_add(&mass(c), a);
          Kokkos::atomic_add(&load(c), Real(1));
        });
      });
  const auto ranks = static_cast<Real>(comm.size());
  const Real u = roundoff_v<Real>;
  const RingWireBound<Real> ring = s2_ring_bound<Value, Real>(handle.options(), comm.size());
  Kokkos::parallel_for(
      "oktopk::expected_result::s2_slack", RangeOf<ExecSpace>(exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i) {
        Real worst = 0;
        Real heaviest = 0;
        Real loaded = 0;
        s.for_each_cell(i, [&](int, std::int64_t c, float) {
          worst = max_of(worst, (load(c) + ranks) * mass(c));
          heaviest = max_of(heaviest, mass(c));
          loaded = max_of(loaded, load(c));
        });
        slack(i) =
            Real(4) * u * worst / ranks + ring.scale * heaviest + ring.floor + loaded * per_entry;
      });
}

}  // namespace oktopk::impl
