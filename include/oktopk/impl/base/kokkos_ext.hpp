// SPDX-License-Identifier: BSD-3-Clause
// Small helpers over Kokkos shared by the kernels: compile-time View checks, uninitialized
// allocation on an execution space, and the host/device trait used to pick kernel shapes.
#pragma once

#include <oktopk/impl/base/value_traits.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <type_traits>

namespace oktopk::impl {

/// The range policy of every flat kernel: 64-bit indices, so gradients of 2^31 entries and
/// more index without overflow.
template <class ExecSpace>
using RangeOf = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;

/// True when kernels of ExecSpace run on the host (Serial, OpenMP, Threads).
template <class ExecSpace>
inline constexpr bool runs_on_host_v =
    Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible;

/// Work items per kernel iteration. On the host a work item is a run of entries handled by one
/// thread in a tight loop the compiler vectorizes (Kokkos calls the functor once per index,
/// which it does not); on GPUs a work item is one entry, so neighbouring threads read
/// neighbouring entries.
template <class ExecSpace>
inline constexpr std::int64_t chunk_length_v = runs_on_host_v<ExecSpace> ? 4096 : 1;

/// The number of chunks covering n entries.
template <class ExecSpace>
constexpr std::int64_t chunk_count(std::int64_t n) {
  return (n + chunk_length_v<ExecSpace> - 1) / chunk_length_v<ExecSpace>;
}

template <class ExecSpace, class View>
inline constexpr bool accessible_from_v =
    Kokkos::SpaceAccessibility<ExecSpace, typename View::memory_space>::accessible;

/// A rank-1 View of T in ExecSpace's memory, not initialized, allocated in stream order.
template <class T, class ExecSpace>
Kokkos::View<T*, typename ExecSpace::memory_space> make_uninitialized(const ExecSpace& exec,
                                                                      const std::string& label,
                                                                      std::size_t n) {
  return Kokkos::View<T*, typename ExecSpace::memory_space>(
      Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, label), n);
}

/// First position in sorted[begin, end) whose value is not less than key (end if none).
template <class View, class Key>
KOKKOS_INLINE_FUNCTION std::int64_t lower_bound(const View& sorted, std::int64_t begin,
                                                std::int64_t end, Key key) {
  std::int64_t lo = begin;
  std::int64_t hi = end;
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (sorted(mid) < key) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

/// First position in sorted[0, size) whose value is not less than key.
template <class View, class Key>
KOKKOS_INLINE_FUNCTION std::int64_t lower_bound(const View& sorted, std::int64_t size, Key key) {
  return lower_bound(sorted, std::int64_t{0}, size, key);
}

/// First position in sorted[0, size) whose value is greater than key.
template <class View, class Key>
KOKKOS_INLINE_FUNCTION std::int64_t upper_bound(const View& sorted, std::int64_t size, Key key) {
  std::int64_t lo = 0;
  std::int64_t hi = size;
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (key < sorted(mid)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

}  // namespace oktopk::impl

/// Compile-time checks every kernel entry point makes on its View arguments.
#define OKTOPK_STATIC_CHECK_VIEW(ExecSpace, View, ValueType, what)                              \
  static_assert(Kokkos::is_view<View>::value, what " must be a Kokkos::View");                  \
  static_assert(View::rank == 1, what " must be a rank-1 View");                                \
  static_assert(std::is_same<std::remove_const_t<typename View::value_type>, ValueType>::value, \
                what " has the wrong value type");                                              \
  static_assert(::oktopk::impl::accessible_from_v<ExecSpace, View>,                             \
                what " must be accessible from the execution space")

/// OKTOPK_STATIC_CHECK_VIEW for a View of values: float, double, bfloat16 or float16.
#define OKTOPK_STATIC_CHECK_VALUES(ExecSpace, View, what)                                  \
  static_assert(Kokkos::is_view<View>::value, what " must be a Kokkos::View");             \
  static_assert(View::rank == 1, what " must be a rank-1 View");                           \
  static_assert(                                                                           \
      ::oktopk::impl::is_gradient_value_v<std::remove_const_t<typename View::value_type>>, \
      what " must hold float, double, oktopk::bfloat16 or oktopk::float16");               \
  static_assert(::oktopk::impl::accessible_from_v<ExecSpace, View>,                        \
                what " must be accessible from the execution space")

/// OKTOPK_STATIC_CHECK_VIEW for a View that sums are formed in: float or double (a 16-bit type
/// would round at every addition).
#define OKTOPK_STATIC_CHECK_SUMS(ExecSpace, View, what)                                          \
  static_assert(Kokkos::is_view<View>::value, what " must be a Kokkos::View");                   \
  static_assert(View::rank == 1, what " must be a rank-1 View");                                 \
  static_assert(std::is_same<std::remove_const_t<typename View::value_type>, float>::value ||    \
                    std::is_same<std::remove_const_t<typename View::value_type>, double>::value, \
                what " must hold float or double");                                              \
  static_assert(::oktopk::impl::accessible_from_v<ExecSpace, View>,                              \
                what " must be accessible from the execution space")

#define OKTOPK_STATIC_CHECK_WRITABLE(View, what) \
  static_assert(!std::is_const<typename View::value_type>::value, what " must be writable")
