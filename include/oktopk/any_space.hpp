// SPDX-License-Identifier: BSD-3-Clause
// The bodies of the templates liboktopk compiles (the handle, the factory with every method,
// the oracle), for a program that makes handles on an execution space the library is not
// compiled for: Kokkos::Serial beside OpenMP or Threads, a user-defined space. The spaces it
// is compiled for are those of include/oktopk/impl/base/explicit_instantiation.hpp; a program
// that uses only those needs oktopk/oktopk.hpp alone, which parses none of this. Without this
// header, a handle on another space fails to link (undefined oktopk::impl::HandleFactory).
#pragma once

#include <oktopk/oktopk.hpp>
#include <oktopk/impl/factory/handle_factory.hpp>
#include <oktopk/impl/handle/sparse_allreduce_members.hpp>
#include <oktopk/impl/oracle/expected_result.hpp>
