// SPDX-License-Identifier: BSD-3-Clause
// The methods' common bases, oktopk::SparseAllreduce and oktopk::impl::MethodBase, for every
// execution space of this Kokkos build (include/oktopk/impl/base/explicit_instantiation.hpp).
#include <oktopk/impl/algorithms/method_base.hpp>

OKTOPK_IMPL_DEFINE_INSTANTIATIONS(oktopk::SparseAllreduce)
OKTOPK_IMPL_DEFINE_INSTANTIATIONS(oktopk::impl::MethodBase)
