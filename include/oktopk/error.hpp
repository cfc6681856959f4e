// SPDX-License-Identifier: BSD-3-Clause
// Error reporting in three tiers:
//   OKTOPK_REQUIRE  a user mistake: throws ExceptionType("<qualified function>: <message>").
//   OKTOPK_ASSERT   an internal invariant: checked with assert() (debug builds only).
//   kernels         call Kokkos::abort; bad *data* is detected by reductions and reported
//                   from the host with OKTOPK_REQUIRE instead, so user input never aborts.
#pragma once

#include <cassert>
#include <sstream>
#include <stdexcept>
#include <string>

/// \brief Throw `ExceptionType` whose message is `where + ": " + message` unless `cond` holds.
/// `message` is a stream expression (`"n = " << n`), evaluated only on failure.
#define OKTOPK_REQUIRE(cond, ExceptionType, where, message) \
  do {                                                      \
    if (!(cond)) {                                          \
      std::ostringstream oktopk_require_os_;                \
      oktopk_require_os_ << (where) << ": " << message;     \
      throw ExceptionType(oktopk_require_os_.str());        \
    }                                                       \
  } while (false)

#define OKTOPK_ASSERT(cond) assert(cond)
