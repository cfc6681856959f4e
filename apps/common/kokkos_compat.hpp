// SPDX-License-Identifier: BSD-3-Clause
// The Kokkos version differences (3.4 up to 4.x) that the programs in apps/ meet, kept here:
// apps use OkTopk's public headers only, never the library's internal compatibility layer.
#pragma once

#include <Kokkos_Core.hpp>

#include <string>

namespace oktopk::apps {

/// Fences one execution space instance, with a label where Kokkos takes one (from 3.6).
template <class ExecSpace>
void fence(const ExecSpace& exec, const std::string& label) {
#if KOKKOS_VERSION >= 30600
  exec.fence(label);
#else
  (void)label;
  exec.fence();
#endif
}

}  // namespace oktopk::apps
