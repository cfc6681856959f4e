// SPDX-License-Identifier: BSD-3-Clause
// The agreement a collective call starts with: every rank learns whether any rank passed Views
// of the wrong length, a handle other than its peers' or another kind of call, and all throw
// the same error.
#pragma once

#include <oktopk/algorithm.hpp>
#include <oktopk/error.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace oktopk::impl {

/// \brief What a call's first MPI_MAX allreduce agrees on: {rank + 1 of a rank whose Views have
/// the wrong length (0: none), rank + 1 of a rank whose input is not finite (0: none), the
/// handle's serial, minus the serial, whether the call is reduce_sparse (1) or reduce (0), minus
/// that}. The maximum of a value and of its negation gives the largest and the smallest over the
/// ranks, so a mismatch of handles, or of reduce and reduce_sparse (which end in different
/// collectives), shows on every rank.
struct CallAgreement {
  static constexpr int count = 6;
  std::int64_t values[count] = {0, 0, 0, 0, 0, 0};

  CallAgreement(bool length_ok, int rank, std::int64_t serial, bool sparse)
      : values{length_ok ? 0 : rank + 1, 0, serial, -serial, sparse ? 1 : 0, sparse ? -1 : 0} {}

  std::int64_t bad_length_rank() const { return values[0] - 1; }
  std::int64_t nonfinite_rank() const { return values[1] - 1; }
  bool same_handle() const { return values[2] == -values[3]; }
  bool lengths_ok() const { return values[0] == 0; }
  bool same_call() const { return values[4] == -values[5]; }
};

/// Throws, on every rank alike, std::invalid_argument starting with `where` if the ranks' calls
/// belong to different handles, some rank's Views have the wrong length, or the calls are
/// reduce on some ranks and reduce_sparse on others.
inline void require_agreed_call(const char* where, const CallAgreement& agreed, int rank,
                                std::int64_t serial, Algorithm algorithm, std::int64_t n,
                                bool sparse, std::size_t grad_length, std::size_t out_length) {
  OKTOPK_REQUIRE(agreed.same_handle(), std::invalid_argument, where,
                 "the ranks' calls at this position belong to different handles (numbers "
                     << -agreed.values[3] << " to " << agreed.values[2]
                     << " of their communicator; this rank's is " << serial << ", " << algorithm
                     << " on n = " << n << "): launch calls in the same order on every rank");
  OKTOPK_REQUIRE(
      agreed.lengths_ok(), std::invalid_argument, where,
      (sparse ? "grad" : "grad and out")
          << " must have length " << n << " on every rank; rank " << agreed.bad_length_rank()
          << " passed "
          << (rank != agreed.bad_length_rank()
                  ? std::string(sparse ? "another length" : "other lengths")
              : sparse ? std::to_string(grad_length)
                       : std::to_string(grad_length) + " and " + std::to_string(out_length)));
  OKTOPK_REQUIRE(agreed.same_call(), std::invalid_argument, where,
                 "the ranks' calls at this position are reduce on some ranks and reduce_sparse "
                 "on others: make the same call on every rank");
}

}  // namespace oktopk::impl
