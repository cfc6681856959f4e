// SPDX-License-Identifier: BSD-3-Clause
// Small helpers every MPI test uses: this process's place in MPI_COMM_WORLD, float bits, the
// message of an expected std::invalid_argument.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

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

}  // namespace oktopk::test
