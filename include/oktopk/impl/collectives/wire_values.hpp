// SPDX-License-Identifier: BSD-3-Clause
// The values of a sparse method on the wire (Options::wire): the type they travel in, and the
// kernels that write them as 16-bit words, read them back and keep their rounding errors in
// the residual (wire_rounding.hpp rounds one value). A value sent in a type narrower than the
// arithmetic type arrives rounded; the methods keep what the rounding lost in the residual
// (error feedback), so it is sent in a later call instead of lost.
#pragma once

#include <oktopk/algorithm.hpp>
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

/// The type a handle for gradients of type Value sends its sparse values in, for a method that
/// takes a narrower wire (takes_narrow_wire(); Native for the others): a 16-bit gradient's own
/// type; for float gradients Native (the arithmetic type) or bf16 or fp16; for double ones
/// Native or fp32. make_sparse_allreduce refuses the other pairs.
template <class Value>
Wire sparse_wire(Algorithm algorithm, const Options& options) {
  if (!takes_narrow_wire(algorithm)) return Wire::Native;
  if constexpr (std::is_same_v<Value, bfloat16>) {
    return Wire::BFloat16;
  } else if constexpr (std::is_same_v<Value, float16>) {
    return Wire::Float16;
  } else if constexpr (std::is_same_v<Value, float>) {
    return options.wire == Wire::Float32 ? Wire::Native : options.wire;
  } else {
    return options.wire;
  }
}

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
