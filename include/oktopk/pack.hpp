// SPDX-License-Identifier: BSD-3-Clause
// Operations on sparse (index, value) vectors: scatter-add into a dense View, merge of two
// sorted sparse vectors summing common indices, and intersection of two sorted index lists.
#pragma once

#include <oktopk/error.hpp>
#include <oktopk/fwd.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/kernels/scatter_in_range.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace oktopk {

namespace impl {

// The kernels are named functors, not lambdas: a user's program and the library instantiate
// them with the same types, and nvcc's host-side lambda wrappers do not survive that
// (scripts/check-lambda-odr.py).

/// Counts the i where list(i) < list(i + 1) fails.
template <class IdxView>
struct CountOrderViolations {
  IdxView list;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i, std::int64_t& bad) const {
    if (!(list(i) < list(i + 1))) ++bad;
  }
};

/// Number of positions where a sorted list fails to rise strictly (0 for a valid list).
template <class ExecSpace, class IdxView>
std::int64_t count_order_violations(const ExecSpace& exec, const IdxView& list) {
  const auto size = static_cast<std::int64_t>(list.extent(0));
  std::int64_t violations = 0;
  if (size < 2) return 0;
  Kokkos::parallel_reduce("oktopk::check_sorted", impl::RangeOf<ExecSpace>(exec, 0, size - 1),
                          CountOrderViolations<IdxView>{list}, violations);
  return violations;
}

/// dense(i) += values(j) atomically, for scatter_in_range.
template <class DenseView, class ValView>
struct AtomicAddAt {
  DenseView dense;
  ValView values;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i, const std::int64_t j) const {
    Kokkos::atomic_add(&dense(i), values(j));
  }
};

/// dense(indices(j) + offset) += values(j), for distinct indices.
template <class IdxView, class ValView, class DenseView>
struct AddDistinct {
  IdxView indices;
  ValView values;
  DenseView dense;
  count_type offset = 0;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t j) const {
    dense(indices(j) + offset) += values(j);
  }
};

/// shared_before(i) = how many of a(0..i) also occur in b (an exclusive scan), and
/// shared_before(na) = all of them.
template <class AIdx, class BIdx, class Shared>
struct CountShared {
  AIdx a_indices;
  BIdx b_indices;
  Shared shared_before;
  std::int64_t na = 0;
  std::int64_t nb = 0;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i, std::int64_t& prefix,
                                         const bool final) const {
    if (final) shared_before(i) = prefix;
    const auto j = lower_bound(b_indices, nb, a_indices(i));
    if (j < nb && b_indices(j) == a_indices(i)) ++prefix;
    if (final && i == na - 1) shared_before(na) = prefix;
  }
};

/// Places a's entry i in the merged output, summed with b's entry of the same index if any.
template <class AIdx, class AVal, class BIdx, class BVal, class Shared, class OutIdx, class OutVal>
struct PlaceFromA {
  AIdx a_indices;
  AVal a_values;
  BIdx b_indices;
  BVal b_values;
  Shared shared_before;
  OutIdx out_indices;
  OutVal out_values;
  std::int64_t nb = 0;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    const index_type key = a_indices(i);
    const auto j = lower_bound(b_indices, nb, key);
    const bool common = j < nb && b_indices(j) == key;
    const std::int64_t slot = i + j - shared_before(i);
    out_indices(slot) = key;
    out_values(slot) = common ? a_values(i) + b_values(j) : a_values(i);
  }
};

/// Places b's entry j in the merged output unless a has its index (placed by PlaceFromA).
template <class AIdx, class BIdx, class BVal, class Shared, class OutIdx, class OutVal>
struct PlaceFromB {
  AIdx a_indices;
  BIdx b_indices;
  BVal b_values;
  Shared shared_before;
  OutIdx out_indices;
  OutVal out_values;
  std::int64_t na = 0;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t j) const {
    const index_type key = b_indices(j);
    const auto i = lower_bound(a_indices, na, key);
    if (i < na && a_indices(i) == key) return;  // placed with a
    const std::int64_t slot = j + i - shared_before(i);
    out_indices(slot) = key;
    out_values(slot) = b_values(j);
  }
};

/// Writes the entries of the shorter list that the longer one also holds, in order (a scan).
template <class AIdx, class BIdx, class OutIdx>
struct IntersectEntries {
  AIdx a;
  BIdx b;
  OutIdx out;
  std::int64_t na = 0;
  std::int64_t nb = 0;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i, std::int64_t& slot,
                                         const bool final) const {
    const bool a_shorter = na <= nb;
    const index_type key = a_shorter ? a(i) : b(i);
    const auto j = a_shorter ? lower_bound(b, nb, key) : lower_bound(a, na, key);
    const bool found = a_shorter ? (j < nb && b(j) == key) : (j < na && a(j) == key);
    if (found) {
      if (final) out(slot) = key;
      ++slot;
    }
  }
};

}  // namespace impl

/// \brief dense(indices(j) + offset) += values(j) for every j.
///
/// Atomic, so repeated indices are all added; their summation order is then unspecified, and
/// the float result may differ in the last bits from run to run (merge_sorted sums in a fixed
/// order). Indices that fall outside `dense` are skipped and reported by std::invalid_argument
/// after the others are added.
template <class ExecSpace, class IdxView, class ValView, class DenseView>
void scatter_add(const ExecSpace& exec, const IdxView& indices, const ValView& values,
                 const DenseView& dense, count_type offset = 0) {
  constexpr const char* where = "oktopk::scatter_add";
  OKTOPK_STATIC_CHECK_VIEW(ExecSpace, IdxView, index_type, "oktopk::scatter_add: indices");
  OKTOPK_STATIC_CHECK_SUMS(ExecSpace, ValView, "oktopk::scatter_add: values");
  OKTOPK_STATIC_CHECK_SUMS(ExecSpace, DenseView, "oktopk::scatter_add: dense");
  OKTOPK_STATIC_CHECK_WRITABLE(DenseView, "oktopk::scatter_add: dense");
  OKTOPK_REQUIRE(indices.extent(0) == values.extent(0), std::invalid_argument, where,
                 indices.extent(0) << " indices but " << values.extent(0) << " values");
  impl::ScopedRegion region("oktopk::scatter_add");
  const auto n = static_cast<std::int64_t>(dense.extent(0));
  const std::int64_t outside =
      impl::scatter_in_range(exec, "oktopk::scatter_add", indices, offset, n,
                             impl::AtomicAddAt<DenseView, ValView>{dense, values});
  OKTOPK_REQUIRE(outside == 0, std::invalid_argument, where,
                 outside << " indices (after adding offset " << offset
                         << ") fall outside the dense vector of length " << n);
}

namespace impl {

/// dense(indices(j) + offset) += values(j) for callers whose indices are distinct and in range
/// by construction (one rank's selected entries): plain adds, since distinct indices cannot
/// race. A float atomic would cost more, and built with HIP's -munsafe-fp-atomics it does not
/// add at all on fine-grained memory (hipMallocManaged, hipHostMalloc). No check either, so no
/// reduction into a host scalar and no wait for the kernel: Ok-Topk's split-and-reduce calls
/// it once per source rank, in a fixed order on one instance, so every run adds alike.
template <class ExecSpace, class IdxView, class ValView, class DenseView>
void scatter_add_distinct(const ExecSpace& exec, const IdxView& indices, const ValView& values,
                          const DenseView& dense, count_type offset = 0) {
  Kokkos::parallel_for("oktopk::scatter_add_distinct",
                       impl::RangeOf<ExecSpace>(exec, 0, indices.extent(0)),
                       AddDistinct<IdxView, ValView, DenseView>{indices, values, dense, offset});
}

}  // namespace impl

namespace impl {

/// merge_sorted without its input checks (each a reduction into a host scalar), for callers
/// whose lists are sorted by construction.
template <class ExecSpace, class AIdx, class AVal, class BIdx, class BVal, class OutIdx,
          class OutVal>
std::int64_t merge_sorted_unchecked(const ExecSpace& exec, const AIdx& a_indices,
                                    const AVal& a_values, const BIdx& b_indices,
                                    const BVal& b_values, const OutIdx& out_indices,
                                    const OutVal& out_values) {
  ScopedRegion region("oktopk::merge_sorted");
  const auto na = static_cast<std::int64_t>(a_indices.extent(0));
  const auto nb = static_cast<std::int64_t>(b_indices.extent(0));

  // shared_before(i) = how many of a(0..i) also occur in b. An entry's output slot is its rank
  // in a, plus the entries of b below it, minus the common indices below it (merged into one).
  auto shared_before =
      make_uninitialized<std::int64_t>(exec, "oktopk::merge_sorted::shared_before", na + 1);
  std::int64_t shared = 0;
  using Shared = decltype(shared_before);
  Kokkos::parallel_scan(
      "oktopk::merge_sorted::count_shared", impl::RangeOf<ExecSpace>(exec, 0, na),
      CountShared<AIdx, BIdx, Shared>{a_indices, b_indices, shared_before, na, nb}, shared);
  if (na == 0) Kokkos::deep_copy(exec, shared_before, 0);

  Kokkos::parallel_for(
      "oktopk::merge_sorted::place_a", impl::RangeOf<ExecSpace>(exec, 0, na),
      PlaceFromA<AIdx, AVal, BIdx, BVal, Shared, OutIdx, OutVal>{
          a_indices, a_values, b_indices, b_values, shared_before, out_indices, out_values, nb});
  Kokkos::parallel_for(
      "oktopk::merge_sorted::place_b", impl::RangeOf<ExecSpace>(exec, 0, nb),
      PlaceFromB<AIdx, BIdx, BVal, Shared, OutIdx, OutVal>{
          a_indices, b_indices, b_values, shared_before, out_indices, out_values, na});
  return na + nb - shared;
}

/// intersect_sorted without its input checks, for callers whose lists are sorted by
/// construction.
template <class ExecSpace, class AIdx, class BIdx, class OutIdx>
std::int64_t intersect_sorted_unchecked(const ExecSpace& exec, const AIdx& a, const BIdx& b,
                                        const OutIdx& out) {
  ScopedRegion region("oktopk::intersect_sorted");
  const auto na = static_cast<std::int64_t>(a.extent(0));
  const auto nb = static_cast<std::int64_t>(b.extent(0));
  const std::int64_t shorter = na < nb ? na : nb;
  // Scan the shorter list and binary-search the longer: O(min log max).
  std::int64_t count = 0;
  Kokkos::parallel_scan("oktopk::intersect_sorted", impl::RangeOf<ExecSpace>(exec, 0, shorter),
                        IntersectEntries<AIdx, BIdx, OutIdx>{a, b, out, na, nb}, count);
  return count;
}

}  // namespace impl

/// \brief Merges two sparse vectors whose indices rise strictly into their sum, also sorted:
/// an index present in both appears once with value a + b (always added in that order, so the
/// result is deterministic). The output needs room for |a| + |b| entries. Returns the number
/// of output entries. Throws std::invalid_argument for unsorted input or too small output.
template <class ExecSpace, class AIdx, class AVal, class BIdx, class BVal, class OutIdx,
          class OutVal>
std::int64_t merge_sorted(const ExecSpace& exec, const AIdx& a_indices, const AVal& a_values,
                          const BIdx& b_indices, const BVal& b_values, const OutIdx& out_indices,
                          const OutVal& out_values) {
  constexpr const char* where = "oktopk::merge_sorted";
  OKTOPK_STATIC_CHECK_VIEW(ExecSpace, AIdx, index_type, "oktopk::merge_sorted: a_indices");
  OKTOPK_STATIC_CHECK_SUMS(ExecSpace, AVal, "oktopk::merge_sorted: a_values");
  OKTOPK_STATIC_CHECK_VIEW(ExecSpace, BIdx, index_type, "oktopk::merge_sorted: b_indices");
  OKTOPK_STATIC_CHECK_SUMS(ExecSpace, BVal, "oktopk::merge_sorted: b_values");
  OKTOPK_STATIC_CHECK_VIEW(ExecSpace, OutIdx, index_type, "oktopk::merge_sorted: out_indices");
  OKTOPK_STATIC_CHECK_SUMS(ExecSpace, OutVal, "oktopk::merge_sorted: out_values");
  OKTOPK_STATIC_CHECK_WRITABLE(OutIdx, "oktopk::merge_sorted: out_indices");
  OKTOPK_STATIC_CHECK_WRITABLE(OutVal, "oktopk::merge_sorted: out_values");
  const auto na = static_cast<std::int64_t>(a_indices.extent(0));
  const auto nb = static_cast<std::int64_t>(b_indices.extent(0));
  OKTOPK_REQUIRE(
      a_values.extent(0) == a_indices.extent(0) && b_values.extent(0) == b_indices.extent(0),
      std::invalid_argument, where, "index and value counts differ");
  OKTOPK_REQUIRE(static_cast<std::int64_t>(out_indices.extent(0)) >= na + nb &&
                     static_cast<std::int64_t>(out_values.extent(0)) >= na + nb,
                 std::invalid_argument, where,
                 "output holds " << out_indices.extent(0) << " indices and " << out_values.extent(0)
                                 << " values, needs " << na + nb);
  OKTOPK_REQUIRE(impl::count_order_violations(exec, a_indices) == 0 &&
                     impl::count_order_violations(exec, b_indices) == 0,
                 std::invalid_argument, where, "indices must rise strictly in both inputs");
  return impl::merge_sorted_unchecked(exec, a_indices, a_values, b_indices, b_values, out_indices,
                                      out_values);
}

/// \brief The indices present in both strictly rising lists, in rising order. The output needs
/// room for min(|a|, |b|) entries. Returns how many were written. Throws std::invalid_argument
/// for unsorted input or too small output.
template <class ExecSpace, class AIdx, class BIdx, class OutIdx>
std::int64_t intersect_sorted(const ExecSpace& exec, const AIdx& a, const BIdx& b,
                              const OutIdx& out) {
  constexpr const char* where = "oktopk::intersect_sorted";
  OKTOPK_STATIC_CHECK_VIEW(ExecSpace, AIdx, index_type, "oktopk::intersect_sorted: a");
  OKTOPK_STATIC_CHECK_VIEW(ExecSpace, BIdx, index_type, "oktopk::intersect_sorted: b");
  OKTOPK_STATIC_CHECK_VIEW(ExecSpace, OutIdx, index_type, "oktopk::intersect_sorted: out");
  OKTOPK_STATIC_CHECK_WRITABLE(OutIdx, "oktopk::intersect_sorted: out");
  const auto na = static_cast<std::int64_t>(a.extent(0));
  const auto nb = static_cast<std::int64_t>(b.extent(0));
  const std::int64_t shorter = na < nb ? na : nb;
  OKTOPK_REQUIRE(static_cast<std::int64_t>(out.extent(0)) >= shorter, std::invalid_argument, where,
                 "output holds " << out.extent(0) << " indices, needs " << shorter);
  OKTOPK_REQUIRE(
      impl::count_order_violations(exec, a) == 0 && impl::count_order_violations(exec, b) == 0,
      std::invalid_argument, where, "indices must rise strictly in both inputs");
  return impl::intersect_sorted_unchecked(exec, a, b, out);
}

}  // namespace oktopk
