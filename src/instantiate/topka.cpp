// SPDX-License-Identifier: BSD-3-Clause
// oktopk::impl::TopkAllgather for every execution space of this Kokkos build
// (include/oktopk/impl/base/explicit_instantiation.hpp).
#include <oktopk/impl/algorithms/topka.hpp>

OKTOPK_IMPL_DEFINE_INSTANTIATIONS(oktopk::impl::TopkAllgather)
