// SPDX-License-Identifier: BSD-3-Clause
// Small helpers every MPI test uses: this process's place in MPI_COMM_WORLD, float bits, the
// message of an expected std::invalid_argument, the ranks that share this one's processor name.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace oktopk::test {

inline int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

inline int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

inline std::uint32_t bits_of(float x) {
  std::uint32_t b = 0;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

/// The message of the std::invalid_argument `body` throws ("" if it throws none).
template <class Body>
std::string invalid_argument_of(Body&& body) {
  try {
    body();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

/// The ranks of MPI_COMM_WORLD whose MPI_Get_processor_name is this rank's, in rank order:
/// the ranks of this node, when each node has one name (as under one mpiexec on one machine).
inline std::vector<int> ranks_named_like_this_one() {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  MPI_Get_processor_name(name, &length);
  const int P = world_size();
  std::vector<char> names(static_cast<std::size_t>(P) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME,
                MPI_CHAR, MPI_COMM_WORLD);
  std::vector<int> same;
  for (int r = 0; r < P; ++r) {
    if (std::string(&names[static_cast<std::size_t>(r) * MPI_MAX_PROCESSOR_NAME]) == name) {
      same.push_back(r);
    }
  }
  return same;
}

}  // namespace oktopk::test
