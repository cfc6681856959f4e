// SPDX-License-Identifier: BSD-3-Clause
// The sparse allreduce methods OkTopk implements, and their command-line names.
#pragma once

#include <array>
#include <ostream>
#include <string>
#include <string_view>

namespace oktopk {

/// \brief A sparse allreduce method (see docs/algorithms.md).
enum class Algorithm {
  Dense,      ///< MPI_Allreduce of the whole gradient, then /P: the reference
  TopkA,      ///< exact local top-k, allgather of (index, value), sum
  TopkDSA,    ///< SparCML: equal regions, split-and-reduce, allgatherv with a dense switch
  GTopk,      ///< tree reduction re-selecting the top-k at every level, then broadcast
  GaussianK,  ///< Gaussian-estimated threshold with correction loops, allgatherv
  OkTopk,     ///< Ok-Topk (Li & Hoefler, PPoPP'22)
  S2Reducer   ///< count-sketch of the non-zeros plus a bitmap of non-zero rows, allreduced
};

inline constexpr std::array<Algorithm, 7> all_algorithms = {
    Algorithm::Dense,     Algorithm::TopkA,  Algorithm::TopkDSA,  Algorithm::GTopk,
    Algorithm::GaussianK, Algorithm::OkTopk, Algorithm::S2Reducer};

/// The command-line name: dense topka topkdsa gtopk gaussiank oktopk s2.
std::string to_string(Algorithm algorithm);

/// The Algorithm with that name; std::invalid_argument (listing the valid names) otherwise.
Algorithm algorithm_from_string(std::string_view name);

std::ostream& operator<<(std::ostream& os, Algorithm algorithm);

}  // namespace oktopk
