// SPDX-License-Identifier: BSD-3-Clause
// The values of a sparse method on the wire (Options::wire): the kernels that write them as
// 16-bit words, read them back and keep their rounding errors in the residual
// (wire_rounding.hpp says which type they travel in, and rounds one value). A value sent in a type
// narrower than the arithmetic type arrives rounded; the methods keep what the rounding lost in the
// residual (error feedback), so it is sent in a later call instead of lost.
#pragma once

#include <oktopk/fwd.hpp>
#include <oktopk/options.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/base/value_traits.hpp>
#include <oktopk/impl/base/wire_rounding.hpp>
#include <oktopk/impl/kernels/vector_ops.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>

namespace oktopk::impl {

/// words = values(0 .. count - 1) for `wire`, and values(j) = what the receivers get (its
/// own contribution then adds what the others add). Returns how many rounded to Inf or NaN:
/// values beyond the wire type's range.
template <class ExecSpace, class Values, class Words>
std::int64_t encode_values(const ExecSpace& exec, const Values& values, std::int64_t count,
                           const Words& words, Wire wire) {
  using Real = typename Values::non_const_value_type;
  const std::int64_t width = wire_words<Real>(wire);
  std::int64_t overflowed = 0;
  Kokkos::parallel_reduce(
      "oktopk::wire::encode", RangeOf<ExecSpace>(exec, 0, count),
      KOKKOS_LAMBDA(std::int64_t j, std::int64_t & bad) {
        const Real sent = put_wire_value(words, width * j, values(j), wire);
        values(j) = sent;
        if (!is_finite(sent)) ++bad;
      },
      overflowed);
  return overflowed;
}

/// values(begin .. end - 1) = the values words hold from value `begin` on (encode_values'
/// inverse).
template <class ExecSpace, class Words, class Values>
void decode_values(const ExecSpace& exec, const Words& words, std::int64_t begin, std::int64_t end,
                   const Values& values, Wire wire) {
  using Real = typename Values::non_const_value_type;
  const std::int64_t width = wire_words<Real>(wire);
  Kokkos::parallel_for(
      "oktopk::wire::decode", RangeOf<ExecSpace>(exec, begin, end), KOKKOS_LAMBDA(std::int64_t j) {
        Real v;
        get_wire_value(words, width * j, wire, v);
        values(j) = v;
      });
}

/// values(i) = what `wire` delivers of values(i), for every i: a table rounded before it is
/// sent, when its sender needs to know what the others get.
template <class ExecSpace, class Values>
void round_for_wire(const ExecSpace& exec, const Values& values, Wire wire) {
  if (wire == Wire::Native) return;
  Kokkos::parallel_for(
      "oktopk::wire::round",
      RangeOf<ExecSpace>(exec, 0, static_cast<std::int64_t>(values.extent(0))),
      KOKKOS_LAMBDA(std::int64_t i) { values(i) = wire_rounded(values(i), wire); });
}

/// errors(j) = values(j) - what `wire` delivers of it, for j < count: the rounding error of a
/// value about to be sent (0 for the Native wire).
template <class ExecSpace, class Values, class Errors>
void wire_errors(const ExecSpace& exec, const Values& values, std::int64_t count,
                 const Errors& errors, Wire wire) {
  Kokkos::parallel_for(
      "oktopk::wire::errors", RangeOf<ExecSpace>(exec, 0, count), KOKKOS_LAMBDA(std::int64_t j) {
        const auto v = values(j);
        errors(j) = v - wire_rounded(v, wire);
      });
}

/// The error feedback of values this rank sent that the result kept: acc(indices(j)) +=
/// errors(j) for j < count where indices(j) is among kept(0 .. kept_count - 1), which rise
/// strictly. Indices must be distinct.
template <class ExecSpace, class Acc, class Idx, class Errors, class Kept>
void add_kept_wire_errors(const ExecSpace& exec, const Acc& acc, const Idx& indices,
                          const Errors& errors, std::int64_t count, const Kept& kept,
                          std::int64_t kept_count) {
  Kokkos::parallel_for(
      "oktopk::wire::add_kept_errors", RangeOf<ExecSpace>(exec, 0, count),
      KOKKOS_LAMBDA(std::int64_t j) {
        const auto key = indices(j);
        const std::int64_t at = lower_bound(kept, kept_count, key);
        if (at < kept_count && kept(at) == key) acc(key) += errors(j);
      });
}

/// The error feedback of values this rank sent: acc(indices(j) + offset) -= wire_rounded(acc)
/// for j < count, i.e. what the receivers got leaves the residual and the rounding error stays
/// (0 for the Native wire, as clearing does). Indices must be distinct.
template <class ExecSpace, class Acc, class Idx>
void keep_wire_error_at(const ExecSpace& exec, const Acc& acc, const Idx& indices,
                        std::int64_t count, Wire wire, std::int64_t offset = 0) {
  Kokkos::parallel_for(
      "oktopk::wire::keep_error", RangeOf<ExecSpace>(exec, 0, count),
      KOKKOS_LAMBDA(std::int64_t j) {
        const std::int64_t i = indices(j) + offset;
        acc(i) -= wire_rounded(acc(i), wire);
      });
}

/// The error feedback of sums this rank sent for all ranks: acc(indices(j) + offset) +=
/// sums(j) - wire_rounded(sums(j)) for j < count. Indices must be distinct; a no-op for the
/// Native wire.
template <class ExecSpace, class Acc, class Idx, class Sums>
void add_wire_error(const ExecSpace& exec, const Acc& acc, const Idx& indices, const Sums& sums,
                    std::int64_t count, Wire wire, std::int64_t offset = 0) {
  if (wire == Wire::Native) return;
  Kokkos::parallel_for(
      "oktopk::wire::add_error", RangeOf<ExecSpace>(exec, 0, count), KOKKOS_LAMBDA(std::int64_t j) {
        const auto s = sums(j);
        acc(indices(j) + offset) += s - wire_rounded(s, wire);
      });
}

/// The same for a dense block of sums: acc(offset + i) += sums(i) - wire_rounded(sums(i)).
template <class ExecSpace, class Acc, class Sums>
void add_wire_error_dense(const ExecSpace& exec, const Acc& acc, const Sums& sums,
                          std::int64_t offset, Wire wire) {
  if (wire == Wire::Native) return;
  Kokkos::parallel_for(
      "oktopk::wire::add_error_dense",
      RangeOf<ExecSpace>(exec, 0, static_cast<std::int64_t>(sums.extent(0))),
      KOKKOS_LAMBDA(std::int64_t i) {
        const auto s = sums(i);
        acc(offset + i) += s - wire_rounded(s, wire);
      });
}

}  // namespace oktopk::impl
