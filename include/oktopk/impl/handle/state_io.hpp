// SPDX-License-Identifier: BSD-3-Clause
// What makes a SparseAllreduce checkpoint one: its magic and format versions in the section
// format of include/oktopk/section_file.hpp, and the error for a checkpoint that cannot be
// restored (docs/reference.md, "Checkpoint and restart").
#pragma once

#include <oktopk/section_file.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace oktopk::impl {

/// The first bytes of every SparseAllreduce checkpoint.
inline constexpr char state_magic[8] = {'O', 'K', 'T', 'O', 'P', 'K', 'S', 'A'};
/// Raised whenever the format changes; a reader refuses versions it does not know.
/// Version 2 adds the handle's Layout digest to the header section; handles without a layout
/// write version 1, which readers older than layouts also read. Version 3 adds the gradient
/// type's code (ValueTraits) after the layout digest, and its residual section holds the
/// handle's arithmetic type: handles for float gradients write version 1 or 2 as before, so
/// readers older than gradient types read them, and versions 1 and 2 mean float.
inline constexpr std::uint32_t state_format_version = 3;
inline constexpr std::uint32_t state_format_version_with_layout = 2;
inline constexpr std::uint32_t state_format_version_without_layout = 1;

/// \brief A checkpoint that cannot be restored. `mismatch()`: intact, but written for another
/// handle (reported as std::invalid_argument); otherwise damaged or unreadable
/// (std::runtime_error).
class StateError : public std::runtime_error {
 public:
  StateError(bool mismatch, const std::string& what)
      : std::runtime_error(what), mismatch_(mismatch) {}
  bool mismatch() const { return mismatch_; }

 private:
  bool mismatch_;
};

}  // namespace oktopk::impl
