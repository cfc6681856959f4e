// SPDX-License-Identifier: BSD-3-Clause
// The agreement a collective call starts with: every rank learns whether any rank passed Views
// of the wrong length, a handle other than its peers', another kind of call or other shard
// offsets, and all throw the same error.
#pragma once

#include <oktopk/algorithm.hpp>
#include <oktopk/error.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace oktopk::impl {

/// Which of the handle's collectives a call is: the ranks must all make the same one, since
/// each ends in collectives of its own.
enum class CallKind : std::int64_t { Reduce = 0, ReduceSparse = 1, ReduceScatter = 2 };

inline const char* call_name(CallKind kind) {
  switch (kind) {
    case CallKind::ReduceSparse:
      return "reduce_sparse";
    case CallKind::ReduceScatter:
      return "reduce_scatter";
    default:
      return "reduce";
  }
}

/// \brief What a call's first MPI_MAX allreduce agrees on: {rank + 1 of a rank whose arguments
/// are wrong (a View's length, or reduce_scatter's shard offsets; 0: none), rank + 1 of a rank
/// whose input is not finite (0: none), the handle's serial, minus the serial, the kind of call,
/// minus that, the digest of the shard offsets (reduce_scatter; 0 otherwise), minus that}. The
/// maximum of a value and of its negation gives the largest and the smallest over the ranks, so
/// a mismatch of handles, of calls or of shard offsets shows on every rank.
struct CallAgreement {
  static constexpr int count = 8;
  std::int64_t values[count] = {0, 0, 0, 0, 0, 0, 0, 0};

  CallAgreement(bool arguments_ok, int rank, std::int64_t serial, CallKind kind,
                std::int64_t shard_digest = 0)
      : values{arguments_ok ? 0 : rank + 1,
               0,
               serial,
               -serial,
               static_cast<std::int64_t>(kind),
               -static_cast<std::int64_t>(kind),
               shard_digest,
               -shard_digest} {}

  std::int64_t bad_length_rank() const { return values[0] - 1; }
  std::int64_t nonfinite_rank() const { return values[1] - 1; }
  bool same_handle() const { return values[2] == -values[3]; }
  bool lengths_ok() const { return values[0] == 0; }
  bool same_call() const { return values[4] == -values[5]; }
  bool same_shards() const { return values[6] == -values[7]; }
  bool accepted() const {
    return lengths_ok() && nonfinite_rank() < 0 && same_handle() && same_call() && same_shards();
  }
};

/// Throws, on every rank alike, std::invalid_argument starting with `where` if the ranks' calls
/// belong to different handles, are different calls (reduce, reduce_sparse, reduce_scatter),
/// some rank's Views have the wrong length, or (reduce_scatter) the ranks' shard offsets
/// differ. `shard_length` is the length this rank's shard must have (reduce_scatter), and
/// `offsets_problem` what is wrong with this rank's shard offsets (empty: nothing).
inline void require_agreed_call(const char* where, const CallAgreement& agreed, int rank,
                                std::int64_t serial, Algorithm algorithm, std::int64_t n,
                                CallKind kind, std::size_t grad_length, std::size_t out_length,
                                std::int64_t shard_length = 0,
                                const std::string& offsets_problem = std::string()) {
  OKTOPK_REQUIRE(agreed.same_handle(), std::invalid_argument, where,
                 "the ranks' calls at this position belong to different handles (numbers "
                     << -agreed.values[3] << " to " << agreed.values[2]
                     << " of their communicator; this rank's is " << serial << ", " << algorithm
                     << " on n = " << n << "): launch calls in the same order on every rank");
  OKTOPK_REQUIRE(agreed.same_call(), std::invalid_argument, where,
                 "the ranks' calls at this position are "
                     << call_name(static_cast<CallKind>(-agreed.values[5])) << " on some ranks and "
                     << call_name(static_cast<CallKind>(agreed.values[4]))
                     << " on others: make the same call on every rank");
  OKTOPK_REQUIRE(agreed.same_shards(), std::invalid_argument, where,
                 "the ranks passed different shard offsets: every rank must pass the same P + 1 "
                 "boundaries");
  const bool sparse = kind == CallKind::ReduceSparse;
  if (kind == CallKind::ReduceScatter) {
    const bool mine = rank == agreed.bad_length_rank();
    OKTOPK_REQUIRE(
        agreed.lengths_ok(), std::invalid_argument, where,
        "rank " << agreed.bad_length_rank() << " passed "
                << (!mine ? std::string("a wrong length or shard offsets")
                    : !offsets_problem.empty()
                        ? offsets_problem
                        : "grad of length " + std::to_string(grad_length) +
                              " and shard of length " + std::to_string(out_length) +
                              " (grad must have length " + std::to_string(n) +
                              ", this rank's shard " + std::to_string(shard_length) + ")"));
    return;
  }
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
