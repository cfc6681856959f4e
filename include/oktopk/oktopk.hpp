// SPDX-License-Identifier: BSD-3-Clause
// Everything public in OkTopk.
#pragma once

#include <oktopk/algorithm.hpp>
#include <oktopk/communicator.hpp>
#include <oktopk/config.hpp>
#include <oktopk/error.hpp>
#include <oktopk/fwd.hpp>
#include <oktopk/gpu_aware_mpi.hpp>
#include <oktopk/layout.hpp>
#include <oktopk/make_sparse_allreduce.hpp>
#include <oktopk/node_topology.hpp>
#include <oktopk/options.hpp>
#include <oktopk/oracle.hpp>
#include <oktopk/pack.hpp>
#include <oktopk/progress.hpp>
#include <oktopk/residual.hpp>
#include <oktopk/select.hpp>
#include <oktopk/shards.hpp>
#include <oktopk/simulated_mpi.hpp>
#include <oktopk/sparse_allreduce.hpp>
#include <oktopk/stats.hpp>
#include <oktopk/topk.hpp>
