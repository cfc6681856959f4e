// SPDX-License-Identifier: BSD-3-Clause
// The agreement a collective call starts with: every rank learns whether any rank passed Views
// of the wrong length, or a handle other than its peers', and all throw the same error.
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
/// handle's serial, minus the serial}. The maximum of both serials gives the largest and the
/// smallest serial, so a mismatch of handles shows on every rank.
struct CallAgreement {
  std::int64_t values[4] = {0, 0, 0, 0};

  CallAgreement(bool length_ok, int rank, std::int64_t serial)
      : values{length_ok ? 0 : rank + 1, 0, serial, -serial} {}

  std::int64_t bad_length_rank() const { return values[0] - 1; }
  std::int64_t nonfinite_rank() const { return values[1] - 1; }
  bool same_handle() const { return values[2] == -values[3]; }
  bool lengths_ok() const { return values[0] == 0; }
};

/// Throws, on every rank alike, std::invalid_argument starting with `where` if the ranks' calls
/// belong to different handles, or some rank's Views have the wrong length.
inline void require_same_handle_and_lengths(const char* where, const CallAgreement& agreed,
                                            int rank, std::int64_t serial, Algorithm algorithm,
                                            std::int64_t n, bool sparse, std::size_t grad_length,
                                            std::size_t out_length) {
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
}

}  // namespace oktopk::impl
