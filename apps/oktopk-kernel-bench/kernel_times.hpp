// SPDX-License-Identifier: BSD-3-Clause
// The time of each Kokkos kernel and deep copy inside one benchmark row, through Kokkos Tools'
// in-process callbacks. A row's own time says how long a call takes; this says which of its
// launches take it (on a GPU, which pass of a selection runs below the bandwidth of a copy).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace oktopk::apps {

/// One launch of a call: a kernel (Kokkos's label) or a deep copy ("deep_copy DST <- SRC", with
/// the Views' labels; a fill on an execution space instance has the source "(none)"), the nth
/// of its label in the call.
struct KernelTime {
  std::string label;
  int nth = 1;         // 1 for the first launch of this label in a call
  int of = 1;          // launches of this label in one call (the most in any call)
  double seconds = 0;  // median over the calls (0 in a call that did not launch it)
};

/// Runs `body` once untimed, then `reps` times with every top-level kernel and deep copy it
/// launches timed between two global fences (`setup` runs before each call, unrecorded), and
/// returns one entry per launch, in the order of the calls' launches. A launch inside a deep
/// copy (the kernel of a fill) counts as part of the copy. Installs Kokkos's tool callbacks for the
/// duration of the call and removes them after; first calls require_no_kokkos_tool().
std::vector<KernelTime> time_kernels(int reps, const std::function<void()>& body,
                                     const std::function<void()>& setup);

/// Throws std::runtime_error when a Kokkos tool library is loaded: time_kernels would replace
/// its callbacks. A program calls it before its work, so that it fails before spending any.
void require_no_kokkos_tool();

/// The median of a non-empty list (the mean of the middle two for an even count).
double median_of(std::vector<double> values);

}  // namespace oktopk::apps
