// SPDX-License-Identifier: BSD-3-Clause
// oktopk-bench's gradients: the --dist generators (on the device, from the seed, the rank and
// the call alone), the replay of a gradient file (--dist file:PATH), and --dump-gradients.
#pragma once

#include "command_line.hpp"
#include "common/gradient_file.hpp"
#include "types.hpp"

#include <oktopk/oktopk.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace oktopk::bench {

using oktopk::apps::GradientFileHeader;

/// Collective: rank 0 reads the header, every rank gets the outcome. Throws UsageError when
/// `path` is not a well-formed gradient file.
GradientFileHeader check_gradient_file(const oktopk::Communicator& world, const std::string& path);

/// The gradient of every (rank, call): generated on the device, or read from a file.
class GradientSource {
 public:
  GradientSource(const Args& args, const oktopk::Communicator& world, GradientFileHeader file)
      : args_(args), world_(world), file_(file) {}

  /// Collective (file replay: every rank learns whether any rank failed to read).
  void fill(const Exec& exec, std::int64_t call, const Vector& grad);

  /// Collective: gradient (call * P + rank) mod count of the file.
  void read(const Exec& exec, std::int64_t call, const Vector& grad);

  // The three below are public only because CUDA does not allow device lambdas in private
  // member functions.

  /// --shifted-draws: the draws of call -1, the own and shared parts of correlated apart.
  void draw_once(const Exec& exec, std::size_t n);
  /// grad(i) = ±draws((i + offset) mod n) with the call's offset and signs (the shared part's
  /// the same on every rank), one hash per entry and part.
  void shift(const Exec& exec, std::int64_t call, const Vector& grad) const;
  /// The draws of --dist for this rank and call.
  void generate(const Exec& exec, std::int64_t call, const Vector& grad) const;

 private:
  const Args& args_;
  oktopk::Communicator world_;
  GradientFileHeader file_;
  Kokkos::View<float*, Kokkos::HostSpace> host_;
  Vector own_draws_;     // --shifted-draws
  Vector shared_draws_;  // --shifted-draws, correlated
};

/// Collective: writes the gradients of calls [0, calls) of every rank to `path`, in the
/// replay order (call t of rank r is gradient t * P + r).
void dump_gradients(const Exec& exec, const oktopk::Communicator& world, const Args& args,
                    GradientSource& source);

}  // namespace oktopk::bench
