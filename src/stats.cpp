// SPDX-License-Identifier: BSD-3-Clause
#include <oktopk/stats.hpp>

namespace oktopk {

double ReduceStats::total_seconds() const {
  double total = 0.0;
  for (const auto& entry : phases) total += entry.second.seconds;
  return total;
}

PhaseTraffic ReduceStats::total_traffic() const {
  PhaseTraffic total;
  for (const auto& entry : phases) total += entry.second.traffic;
  return total;
}

}  // namespace oktopk
