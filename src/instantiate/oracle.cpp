// SPDX-License-Identifier: BSD-3-Clause
// The result oracle, oktopk::impl::Oracle, for every execution space of this Kokkos build
// (include/oktopk/impl/base/explicit_instantiation.hpp).
#include <oktopk/impl/oracle/expected_result.hpp>

OKTOPK_IMPL_DEFINE_INSTANTIATIONS(oktopk::impl::Oracle)
