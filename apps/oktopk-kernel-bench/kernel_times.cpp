// SPDX-License-Identifier: BSD-3-Clause
#include "kernel_times.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <utility>

namespace oktopk::apps {
namespace {

using Clock = std::chrono::steady_clock;

/// What the callbacks record. Kokkos keeps one set of callbacks, plain function pointers, so
/// the state they write is this one object; the bench calls them from its one host thread.
struct Recording {
  bool on = false;
  int depth = 0;      // launches begun and not yet ended
  std::string label;  // of the top-level launch in progress
  Clock::time_point start;
  std::vector<std::pair<std::string, double>> this_call;  // label and seconds, in launch order
};

Recording recording;

constexpr std::uint64_t top_level_id = 1;
constexpr std::uint64_t nested_id = 0;

bool begin_launch(const std::string& label) {
  if (!recording.on) return false;
  if (recording.depth++ > 0) return false;
  Kokkos::fence();  // what was launched before is not this launch's time
  recording.label = label;
  recording.start = Clock::now();
  return true;
}

void end_launch(bool top_level) {
  if (!recording.on) return;
  assert(recording.depth > 0);
  --recording.depth;
  if (!top_level) return;
  Kokkos::fence();
  const double seconds = std::chrono::duration<double>(Clock::now() - recording.start).count();
  recording.this_call.emplace_back(recording.label, seconds);
}

void begin_kernel(const char* name, std::uint32_t, std::uint64_t* id) {
  *id = begin_launch(name) ? top_level_id : nested_id;
}

void end_kernel(std::uint64_t id) { end_launch(id == top_level_id); }

// A deep copy's end carries no id: the copy was top level when it leaves the depth at 1.
void begin_copy(Kokkos::Tools::SpaceHandle, const char* destination, const void*,
                Kokkos::Tools::SpaceHandle, const char* source, const void*, std::uint64_t) {
  begin_launch(std::string("deep_copy ") + destination + " <- " + source);
}

void end_copy() { end_launch(recording.on && recording.depth == 1); }

void set_callbacks(bool install) {
  namespace tools = Kokkos::Tools::Experimental;
  tools::set_begin_parallel_for_callback(install ? begin_kernel : nullptr);
  tools::set_end_parallel_for_callback(install ? end_kernel : nullptr);
  tools::set_begin_parallel_reduce_callback(install ? begin_kernel : nullptr);
  tools::set_end_parallel_reduce_callback(install ? end_kernel : nullptr);
  tools::set_begin_parallel_scan_callback(install ? begin_kernel : nullptr);
  tools::set_end_parallel_scan_callback(install ? end_kernel : nullptr);
  tools::set_begin_deep_copy_callback(install ? begin_copy : nullptr);
  tools::set_end_deep_copy_callback(install ? end_copy : nullptr);
}

}  // namespace

double median_of(std::vector<double> values) {
  assert(!values.empty());
  std::sort(values.begin(), values.end());
  const std::size_t m = values.size();
  return m % 2 == 1 ? values[m / 2] : 0.5 * (values[m / 2 - 1] + values[m / 2]);
}

void require_no_kokkos_tool() {
  if (Kokkos::Tools::profileLibraryLoaded()) {
    throw std::runtime_error(
        "oktopk::apps::require_no_kokkos_tool: a Kokkos tool library is loaded "
        "(KOKKOS_TOOLS_LIBS, KOKKOS_PROFILE_LIBRARY or a --kokkos-tools-* flag), whose "
        "callbacks the kernel timings would replace");
  }
}

std::vector<KernelTime> time_kernels(int reps, const std::function<void()>& body,
                                     const std::function<void()>& setup) {
  assert(reps >= 1);
  require_no_kokkos_tool();
  recording = Recording{};
  // A launch is known by its label and how many launches of that label came before it in the
  // call, so that the passes of one kernel (a radix select's histograms) stay apart.
  using Key = std::pair<std::string, int>;
  std::vector<Key> order;
  std::vector<std::map<Key, double>> calls;
  std::map<std::string, int> launches_per_call;  // label -> the most in one call
  set_callbacks(true);
  for (int r = 0; r <= reps; ++r) {
    setup();
    Kokkos::fence();
    recording.this_call.clear();
    recording.on = r > 0;  // the first call warms up, unrecorded
    body();
    Kokkos::fence();
    recording.on = false;
    if (r == 0) continue;
    std::map<Key, double> call;
    std::map<std::string, int> seen;
    for (const auto& [label, seconds] : recording.this_call) {
      const Key key{label, seen[label]++};
      if (std::find(order.begin(), order.end(), key) == order.end()) order.push_back(key);
      call[key] = seconds;
    }
    for (const auto& [label, count] : seen) {
      launches_per_call[label] = std::max(launches_per_call[label], count);
    }
    calls.push_back(std::move(call));
  }
  set_callbacks(false);
  std::vector<KernelTime> result;
  for (const auto& key : order) {
    std::vector<double> seconds;
    for (const auto& call : calls) {
      const auto found = call.find(key);
      seconds.push_back(found == call.end() ? 0.0 : found->second);
    }
    result.push_back({key.first, key.second + 1, launches_per_call[key.first], median_of(seconds)});
  }
  return result;
}

}  // namespace oktopk::apps
