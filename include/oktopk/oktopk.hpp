// SPDX-License-Identifier: BSD-3-Clause
// Everything public in OkTopk.
#pragma once

#include <oktopk/communicator.hpp>
#include <oktopk/config.hpp>
#include <oktopk/error.hpp>
#include <oktopk/fwd.hpp>
#include <oktopk/pack.hpp>
#include <oktopk/residual.hpp>
#include <oktopk/select.hpp>
#include <oktopk/topk.hpp>
