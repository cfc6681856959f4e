// SPDX-License-Identifier: BSD-3-Clause
// The handle and the methods' common bases, oktopk::SparseAllreduce, oktopk::impl::HandleCore
// and oktopk::impl::MethodBase, for every execution space of this Kokkos build
// (include/oktopk/impl/base/explicit_instantiation.hpp).
#include <oktopk/impl/algorithms/method_base.hpp>

OKTOPK_IMPL_DEFINE_INSTANTIATIONS(oktopk::SparseAllreduce)
OKTOPK_IMPL_DEFINE_INSTANTIATIONS(oktopk::impl::HandleCore)
OKTOPK_IMPL_DEFINE_INSTANTIATIONS(oktopk::impl::MethodBase)
