// SPDX-License-Identifier: BSD-3-Clause
// Host-only helpers of the API tests, with and without MPI: an expected std::invalid_argument
// and one change of each Options field.
#pragma once

#include <oktopk/options.hpp>

#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace oktopk::test {

inline bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

/// Runs `f`, which must throw std::invalid_argument whose message starts with `prefix`;
/// returns the message.
template <class F>
std::string expect_invalid_argument(F&& f, const std::string& prefix) {
  try {
    f();
    ADD_FAILURE() << "no exception, expected one starting with " << prefix;
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(starts_with(e.what(), prefix)) << e.what();
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
  return {};
}

/// One mutation of a default Options per field.
inline std::vector<std::pair<std::string, std::function<void(Options&)>>> field_changes() {
  return {
      {"density", [](Options& o) { o.density = 0.375; }},
      {"warmup_iterations", [](Options& o) { o.warmup_iterations = 7; }},
      {"seed", [](Options& o) { o.seed = 123456789; }},
      {"dense_allreduce", [](Options& o) { o.dense_allreduce = DenseAlgorithm::Ring; }},
      {"wire", [](Options& o) { o.wire = oktopk::Wire::BFloat16; }},
      {"node_size", [](Options& o) { o.node_size = 6; }},
      {"hierarchical", [](Options& o) { o.hierarchical = true; }},
      {"threshold_period", [](Options& o) { o.threshold_period = 11; }},
      {"repartition_period", [](Options& o) { o.repartition_period = 13; }},
      {"equal_regions", [](Options& o) { o.equal_regions = true; }},
      {"throttle", [](Options& o) { o.throttle = 3; }},
      {"balancing", [](Options& o) { o.balancing = Balancing::On; }},
      {"balance_threshold", [](Options& o) { o.balance_threshold = 1.5; }},
      {"guard_low", [](Options& o) { o.guard_low = 0.5; }},
      {"guard_factor", [](Options& o) { o.guard_factor = 1.75; }},
      {"guard_step", [](Options& o) { o.guard_step = 1.0625; }},
      {"guard_loops", [](Options& o) { o.guard_loops = 9; }},
      {"guard_exact", [](Options& o) { o.guard_exact = false; }},
      {"guard_ladder", [](Options& o) { o.guard_ladder = false; }},
      {"local_low", [](Options& o) { o.local_low = 0.5; }},
      {"local_high", [](Options& o) { o.local_high = 1.5; }},
      {"local_step", [](Options& o) { o.local_step = 1.125; }},
      {"global_low", [](Options& o) { o.global_low = 0.25; }},
      {"global_high", [](Options& o) { o.global_high = 2.5; }},
      {"global_step", [](Options& o) { o.global_step = 1.25; }},
      {"gaussian_low", [](Options& o) { o.gaussian_low = 0.625; }},
      {"gaussian_high", [](Options& o) { o.gaussian_high = 1.375; }},
      {"gaussian_step", [](Options& o) { o.gaussian_step = 1.03125; }},
      {"gaussian_loops", [](Options& o) { o.gaussian_loops = 17; }},
      {"s2_row_width", [](Options& o) { o.s2_row_width = 33; }},
      {"s2_sketch_rows", [](Options& o) { o.s2_sketch_rows = 5; }},
      {"s2_sketch_columns", [](Options& o) { o.s2_sketch_columns = 77; }},
      {"s2_error_feedback", [](Options& o) { o.s2_error_feedback = true; }},
  };
}

/// The changes of field_changes(), made through each field's setter instead, in the same order.
inline std::vector<std::pair<std::string, std::function<void(Options&)>>> setter_changes() {
  return {
      {"density", [](Options& o) { o.set_density(0.375); }},
      {"warmup_iterations", [](Options& o) { o.set_warmup_iterations(7); }},
      {"seed", [](Options& o) { o.set_seed(123456789); }},
      {"dense_allreduce", [](Options& o) { o.set_dense_allreduce(DenseAlgorithm::Ring); }},
      {"wire", [](Options& o) { o.set_wire(oktopk::Wire::BFloat16); }},
      {"node_size", [](Options& o) { o.set_node_size(6); }},
      {"hierarchical", [](Options& o) { o.set_hierarchical(true); }},
      {"threshold_period", [](Options& o) { o.set_threshold_period(11); }},
      {"repartition_period", [](Options& o) { o.set_repartition_period(13); }},
      {"equal_regions", [](Options& o) { o.set_equal_regions(true); }},
      {"throttle", [](Options& o) { o.set_throttle(3); }},
      {"balancing", [](Options& o) { o.set_balancing(Balancing::On); }},
      {"balance_threshold", [](Options& o) { o.set_balance_threshold(1.5); }},
      {"guard_low", [](Options& o) { o.set_guard_low(0.5); }},
      {"guard_factor", [](Options& o) { o.set_guard_factor(1.75); }},
      {"guard_step", [](Options& o) { o.set_guard_step(1.0625); }},
      {"guard_loops", [](Options& o) { o.set_guard_loops(9); }},
      {"guard_exact", [](Options& o) { o.set_guard_exact(false); }},
      {"guard_ladder", [](Options& o) { o.set_guard_ladder(false); }},
      {"local_low", [](Options& o) { o.set_local_low(0.5); }},
      {"local_high", [](Options& o) { o.set_local_high(1.5); }},
      {"local_step", [](Options& o) { o.set_local_step(1.125); }},
      {"global_low", [](Options& o) { o.set_global_low(0.25); }},
      {"global_high", [](Options& o) { o.set_global_high(2.5); }},
      {"global_step", [](Options& o) { o.set_global_step(1.25); }},
      {"gaussian_low", [](Options& o) { o.set_gaussian_low(0.625); }},
      {"gaussian_high", [](Options& o) { o.set_gaussian_high(1.375); }},
      {"gaussian_step", [](Options& o) { o.set_gaussian_step(1.03125); }},
      {"gaussian_loops", [](Options& o) { o.set_gaussian_loops(17); }},
      {"s2_row_width", [](Options& o) { o.set_s2_row_width(33); }},
      {"s2_sketch_rows", [](Options& o) { o.set_s2_sketch_rows(5); }},
      {"s2_sketch_columns", [](Options& o) { o.set_s2_sketch_columns(77); }},
      {"s2_error_feedback", [](Options& o) { o.set_s2_error_feedback(true); }},
  };
}

}  // namespace oktopk::test
