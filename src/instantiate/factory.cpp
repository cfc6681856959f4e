// SPDX-License-Identifier: BSD-3-Clause
// make_sparse_allreduce's body, oktopk::impl::HandleFactory, for every execution space of this
// Kokkos build (include/oktopk/impl/base/explicit_instantiation.hpp).
#include <oktopk/impl/factory/handle_factory.hpp>

OKTOPK_IMPL_DEFINE_INSTANTIATIONS(oktopk::impl::HandleFactory)
