// SPDX-License-Identifier: BSD-3-Clause
// Checked MPI calls. OkTopk's communicators use MPI_ERRORS_RETURN, so a failing call returns its
// code instead of aborting; OKTOPK_MPI_CHECK turns that code into an exception that says who
// called which MPI function and what MPI thinks went wrong.
#pragma once

#include <mpi.h>

#include <stdexcept>
#include <string>

namespace oktopk::impl {

/// MPI's own text for an error code (MPI_Error_string), or the bare code if even that fails.
inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    return "MPI error code " + std::to_string(code);
  }
  return std::string(text, static_cast<std::size_t>(length));
}

/// Throws std::runtime_error("<where>: <MPI function> failed: <MPI's error string>").
/// `call` is the call's source text (or just the function name); only the part before the first
/// '(' is kept, so the message names the function without its arguments.
[[noreturn]] inline void throw_mpi_error(const char* where, const char* call, int code) {
  std::string function(call);
  function = function.substr(0, function.find('('));
  while (!function.empty() && function.back() == ' ') {
    function.pop_back();
  }
  throw std::runtime_error(std::string(where) + ": " + function +
                           " failed: " + mpi_error_string(code));
}

}  // namespace oktopk::impl

/// \brief Evaluate the MPI call `call` once; unless it returns MPI_SUCCESS, throw
/// std::runtime_error("<where>: MPI_Xxx failed: <MPI_Error_string text>").
/// Only meaningful on communicators whose error handler is MPI_ERRORS_RETURN: under the default
/// MPI_ERRORS_ARE_FATAL a failing call never returns.
#define OKTOPK_MPI_CHECK(where, call)                                          \
  do {                                                                         \
    const int oktopk_mpi_check_code_ = (call);                                 \
    if (oktopk_mpi_check_code_ != MPI_SUCCESS) {                               \
      ::oktopk::impl::throw_mpi_error((where), #call, oktopk_mpi_check_code_); \
    }                                                                          \
  } while (false)
