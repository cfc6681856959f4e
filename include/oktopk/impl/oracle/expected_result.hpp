// SPDX-License-Identifier: BSD-3-Clause
// The bodies of impl::Oracle (include/oktopk/oracle.hpp): expected_result picks the family of
// the handle's method, count_mismatches compares. liboktopk instantiates them for the spaces
// and gradient types of include/oktopk/impl/base/explicit_instantiation.hpp (under nvcc the
// oracle's kernels are most of a test program's device code); oktopk/any_space.hpp brings
// them to a program for other spaces.
#pragma once

#include <oktopk/algorithm.hpp>
#include <oktopk/communicator.hpp>
#include <oktopk/error.hpp>
#include <oktopk/oracle.hpp>
#include <oktopk/sparse_allreduce.hpp>
#include <oktopk/impl/base/kokkos_compat.hpp>
#include <oktopk/impl/base/kokkos_ext.hpp>
#include <oktopk/impl/comm/mpi_mirror.hpp>
#include <oktopk/impl/oracle/common.hpp>
#include <oktopk/impl/oracle/dense_oracle.hpp>
#include <oktopk/impl/oracle/gtopk_tree.hpp>
#include <oktopk/impl/oracle/hierarchical_oracle.hpp>
#include <oktopk/impl/oracle/masked_sum.hpp>
#include <oktopk/impl/oracle/selection_count.hpp>
#include <oktopk/impl/oracle/sketch.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

namespace oktopk {

namespace impl {

template <class ExecSpace, class Value>
void Oracle<ExecSpace, Value>::expected_result(
    const ExecSpace& exec, const Handle& handle,
    const typename Handle::const_residual_vector_type& acc,
    const typename Handle::residual_vector_type& expected, double rel_tol,
    const typename Handle::residual_vector_type& slack) {
  using Real = impl::arithmetic_t<Value>;
  constexpr const char* where = "oktopk::expected_result";
  impl::ScopedRegion region("oktopk::expected_result");
  const Communicator& comm = handle.communicator();
  // Traffic lands in its own phase; handle.stats() keeps the reduce call's own numbers.
  auto scope = comm.phase("oracle");
  const bool slack_given = slack.extent(0) != 0;
  impl::oracle_check_lengths(
      where, comm, handle.size(),
      {acc.extent(0), expected.extent(0), slack_given ? slack.extent(0) : acc.extent(0)});
  const ReduceStats& stats = handle.stats();
  OKTOPK_REQUIRE(stats.iteration > 0, std::logic_error, where,
                 "the handle has not reduced anything yet");
  const auto tol = static_cast<float>(rel_tol);
  const auto n = static_cast<std::size_t>(handle.size());
  const impl::OracleVector<ExecSpace, Real> bound =
      slack_given ? slack
                  : impl::make_uninitialized<Real>(exec, "oktopk::expected_result::slack", n);

  if (const auto* hierarchical = dynamic_cast<const impl::HierarchicalAllreduce<ExecSpace, Value>*>(
          &handle.implementation())) {
    impl::expected_hierarchical(exec, *hierarchical, acc, expected, bound, tol);
  } else if (stats.dense || handle.algorithm() == Algorithm::Dense) {
    impl::expected_dense(exec, handle, acc, expected, bound);
  } else {
    switch (handle.algorithm()) {
      case Algorithm::TopkA:
      case Algorithm::TopkDSA:
      case Algorithm::GaussianK:
      case Algorithm::OkTopk:
        impl::expected_masked_sum(exec, handle, acc, expected, bound, tol);
        break;
      case Algorithm::GTopk:
        impl::expected_gtopk(exec, handle, acc, expected, tol);
        Kokkos::deep_copy(exec, bound, Real(0));
        break;
      case Algorithm::S2Reducer:
        impl::expected_s2(exec, handle, acc, expected, bound);
        break;
      default:
        throw std::invalid_argument(std::string(where) + ": not an Algorithm value (" +
                                    std::to_string(static_cast<int>(handle.algorithm())) + ")");
    }
  }
  // A rank whose selection fell short: as many entries of its expected output as it lacked
  // become +Inf, which no output matches, so count_mismatches counts the shortfall as wrong.
  if (!stats.dense && dynamic_cast<const impl::HierarchicalAllreduce<ExecSpace, Value>*>(
                          &handle.implementation()) == nullptr) {
    const std::int64_t missing = impl::selection_shortfall(exec, handle, acc);
    if (missing > 0) {
      Kokkos::deep_copy(exec,
                        Kokkos::subview(expected, Kokkos::make_pair(std::int64_t{0}, missing)),
                        std::numeric_limits<Real>::infinity());
    }
  }
  if (!slack_given) {
    // Nobody will allow for the summation order: skip the entries it can move beyond rel_tol.
    Kokkos::parallel_for(
        "oktopk::expected_result::order_sensitive", impl::RangeOf<ExecSpace>(exec, 0, n),
        KOKKOS_LAMBDA(std::int64_t i) {
          if (bound(i) > Real(0.5) * Real(tol) * impl::abs(expected(i))) {
            expected(i) = Real(impl::quiet_nan());
          }
        });
  }
  impl::fence(exec, "oktopk::expected_result");
}

template <class ExecSpace, class Value>
std::int64_t Oracle<ExecSpace, Value>::count_mismatches(
    const ExecSpace& exec, const Handle& handle,
    const typename Handle::const_residual_vector_type& expected,
    const typename Handle::const_vector_type& out, double rel_tol,
    const typename Handle::const_residual_vector_type& slack) {
  using Real = impl::arithmetic_t<Value>;
  constexpr const char* where = "oktopk::count_mismatches";
  impl::ScopedRegion region("oktopk::count_mismatches");
  const Communicator& comm = handle.communicator();
  auto scope = comm.phase("oracle");
  const bool slack_given = slack.extent(0) != 0;
  impl::oracle_check_lengths(
      where, comm, handle.size(),
      {expected.extent(0), out.extent(0), slack_given ? slack.extent(0) : out.extent(0)});
  const auto n = static_cast<std::size_t>(handle.size());

  // Rank 0's output, to hold every rank to the same answer.
  const auto reference =
      impl::make_uninitialized<Value>(exec, "oktopk::count_mismatches::rank0", n);
  Kokkos::deep_copy(exec, reference, out);
  {
    auto buffer = impl::mpi_send_view(exec, reference);
    comm.bcast(buffer.data(), static_cast<count_type>(n), 0);
    impl::mpi_received(exec, buffer, reference, 0, static_cast<std::int64_t>(n));
  }
  const auto tol = static_cast<Real>(rel_tol);
  // A 16-bit output is the method's average rounded once more: |o - average| <= u·|average|
  // + eta <= 2u·|o| + eta (u its unit roundoff, eta half its smallest subnormal).
  const auto rounding = static_cast<Real>(impl::OutputRounding<Value>::unit);
  const auto subnormal = static_cast<Real>(impl::OutputRounding<Value>::subnormal);
  std::int64_t wrong = 0;
  Kokkos::parallel_reduce(
      "oktopk::count_mismatches", impl::RangeOf<ExecSpace>(exec, 0, n),
      KOKKOS_LAMBDA(const std::int64_t i, std::int64_t& bad) {
        const Real o = impl::to_arithmetic(out(i));
        const Real e = expected(i);
        bool mismatch = !impl::is_finite(o) || o != impl::to_arithmetic(reference(i));
        // +Inf: a selection's shortfall (expected_result), which no output meets.
        if (!mismatch && e == e && !impl::is_finite(e)) mismatch = true;
        if (!mismatch && e == e && impl::is_finite(e)) {
          const Real allowed = impl::max_of(tol * impl::max_of(impl::abs(o), impl::abs(e)),
                                            slack_given ? slack(i) : Real(0)) +
                               Real(2) * rounding * impl::abs(o) + subnormal;
          mismatch = !(impl::abs(o - e) <= allowed + Real(1e-30));
        }
        if (mismatch) ++bad;
      },
      wrong);
  comm.allreduce_in_place(&wrong, 1, MPI_MAX);
  return wrong;
}
}  // namespace impl

}  // namespace oktopk
