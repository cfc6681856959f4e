// SPDX-License-Identifier: BSD-3-Clause
// The methods' common base, oktopk::SparseAllreduce, for every execution space of this Kokkos
// build (include/oktopk/impl/explicit_instantiation.hpp).
#include <oktopk/sparse_allreduce.hpp>

OKTOPK_IMPL_DEFINE_INSTANTIATIONS(oktopk::SparseAllreduce)
