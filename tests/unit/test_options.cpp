// SPDX-License-Identifier: BSD-3-Clause
// Algorithm, dense allreduce and balancing names, and Options validation, setters and printing.
#include "api_checks.hpp"

#include <oktopk/algorithm.hpp>
#include <oktopk/options.hpp>

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace oktopk::test;  // NOLINT(google-build-using-namespace)
using oktopk::Algorithm;
using oktopk::Balancing;
using oktopk::Options;

TEST(AlgorithmNames, RoundTripAllSeven) {
  const std::vector<std::string> names = {"dense",     "topka",  "topkdsa", "gtopk",
                                          "gaussiank", "oktopk", "s2"};
  ASSERT_EQ(oktopk::all_algorithms.size(), names.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    const Algorithm a = oktopk::all_algorithms[i];
    EXPECT_EQ(oktopk::to_string(a), names[i]);
    EXPECT_EQ(oktopk::algorithm_from_string(names[i]), a);
    std::ostringstream os;
    os << a;
    EXPECT_EQ(os.str(), names[i]);
  }
  EXPECT_EQ(oktopk::algorithm_from_string("oktopk"), Algorithm::OkTopk);
  EXPECT_EQ(oktopk::algorithm_from_string("s2"), Algorithm::S2Reducer);
}

TEST(AlgorithmNames, UnknownNameThrowsListingTheValidOnes) {
  for (const char* bad : {"", "OkTopk", "topk", "dense ", "s2reducer", "gtopk\n"}) {
    const std::string message = expect_invalid_argument([&] { oktopk::algorithm_from_string(bad); },
                                                        "oktopk::algorithm_from_string");
    for (const Algorithm a : oktopk::all_algorithms) {
      EXPECT_NE(message.find(oktopk::to_string(a)), std::string::npos)
          << "'" << message << "' does not list " << oktopk::to_string(a);
    }
  }
}

std::string printed(const Options& o) {
  std::ostringstream os;
  os << o;
  return os.str();
}

TEST(DenseAllreduceNames, RoundTrip) {
  for (const auto d :
       {oktopk::DenseAlgorithm::Mpi, oktopk::DenseAlgorithm::Ring, oktopk::DenseAlgorithm::Auto}) {
    std::ostringstream os;
    os << d;
    EXPECT_EQ(oktopk::dense_allreduce_from_string(os.str().c_str()), d);
    EXPECT_EQ(Options{}.set("dense_allreduce", os.str()).dense_allreduce, d);
  }
  expect_invalid_argument([] { oktopk::dense_allreduce_from_string("tree"); },
                          "oktopk::dense_allreduce_from_string");
  expect_invalid_argument([] { Options{}.set("dense_allreduce", "tree"); }, "oktopk::Options::set");
}

TEST(WireNames, RoundTrip) {
  const std::pair<oktopk::Wire, const char*> names[] = {{oktopk::Wire::Native, "native"},
                                                        {oktopk::Wire::Float32, "fp32"},
                                                        {oktopk::Wire::BFloat16, "bf16"},
                                                        {oktopk::Wire::Float16, "fp16"}};
  for (const auto& [wire, name] : names) {
    std::ostringstream os;
    os << wire;
    EXPECT_EQ(os.str(), name);
    EXPECT_EQ(oktopk::wire_from_string(name), wire);
    EXPECT_EQ(Options{}.set("wire", name).wire, wire);
  }
  const std::string message =
      expect_invalid_argument([] { oktopk::wire_from_string("fp8"); }, "oktopk::wire_from_string");
  EXPECT_NE(message.find("native fp32 bf16 fp16"), std::string::npos) << message;
  expect_invalid_argument([] { Options{}.set("wire", "half"); }, "oktopk::Options::set");
  // Unset, it leaves the printed options (and so old checkpoints' digests) as they were.
  EXPECT_EQ(printed(Options{}).find("wire"), std::string::npos);
}

TEST(BalancingNames, RoundTrip) {
  for (const Balancing b : {Balancing::Off, Balancing::On, Balancing::Adaptive}) {
    std::ostringstream os;
    os << b;
    EXPECT_EQ(oktopk::balancing_from_string(os.str().c_str()), b);
  }
  expect_invalid_argument([] { oktopk::balancing_from_string("sometimes"); },
                          "oktopk::balancing_from_string");
  expect_invalid_argument([] { oktopk::balancing_from_string(nullptr); },
                          "oktopk::balancing_from_string");
}

TEST(OptionsTest, DefaultsBoundariesAndEveryChangedFieldAreValid) {
  EXPECT_NO_THROW(Options{}.validate());
  for (const auto& [name, change] : field_changes()) {
    Options o;
    change(o);
    EXPECT_NO_THROW(o.validate()) << name;
  }
  EXPECT_NO_THROW(Options{}.set_density(0.0).validate());
  EXPECT_NO_THROW(Options{}.set_density(1.0).validate());
  EXPECT_NO_THROW(Options{}.set_balance_threshold(1.0).validate());
  EXPECT_NO_THROW(Options{}
                      .set_throttle(1)
                      .set_threshold_period(1)
                      .set_repartition_period(1)
                      .set_warmup_iterations(0)
                      .set_s2_sketch_columns(0)
                      .validate());
  // The chained setters set what they name.
  const Options o = Options{}
                        .set_density(0.25)
                        .set_warmup_iterations(2)
                        .set_seed(9)
                        .set_threshold_period(3)
                        .set_repartition_period(4)
                        .set_throttle(5)
                        .set_balancing(Balancing::Off)
                        .set_balance_threshold(2.0)
                        .set_s2_row_width(6)
                        .set_s2_sketch_rows(7)
                        .set_s2_sketch_columns(8)
                        .set_s2_error_feedback(true)
                        .set_node_size(10)
                        .set_hierarchical(true);
  EXPECT_EQ(o.density, 0.25);
  EXPECT_EQ(o.warmup_iterations, 2);
  EXPECT_EQ(o.seed, 9u);
  EXPECT_EQ(o.threshold_period, 3);
  EXPECT_EQ(o.repartition_period, 4);
  EXPECT_EQ(o.throttle, 5);
  EXPECT_EQ(o.balancing, Balancing::Off);
  EXPECT_EQ(o.balance_threshold, 2.0);
  EXPECT_EQ(o.s2_row_width, 6);
  EXPECT_EQ(o.s2_sketch_rows, 7);
  EXPECT_EQ(o.s2_sketch_columns, 8);
  EXPECT_TRUE(o.s2_error_feedback);
  EXPECT_EQ(o.node_size, 10);
  EXPECT_TRUE(o.hierarchical);
  EXPECT_EQ(printed(Options{}).find("hierarchical"), std::string::npos);
  // Left at its default (the shared-memory nodes), node_size is not printed, so the digest of
  // options that never set it, and every checkpoint made before it existed, stays the same.
  EXPECT_EQ(printed(Options{}).find("node_size"), std::string::npos);
  EXPECT_EQ(Options{}.set("node_size", "4").node_size, 4);
  expect_invalid_argument([] { Options{}.set("node_size", "two"); }, "oktopk::Options::set");
}

TEST(OptionsTest, EveryFieldHasASetterThatSetsIt) {
  const auto fields = field_changes();
  const auto setters = setter_changes();
  ASSERT_EQ(setters.size(), fields.size());
  for (std::size_t i = 0; i < fields.size(); ++i) {
    SCOPED_TRACE(fields[i].first);
    EXPECT_EQ(setters[i].first, fields[i].first);
    Options by_field;
    Options by_setter;
    fields[i].second(by_field);
    setters[i].second(by_setter);
    EXPECT_EQ(printed(by_setter), printed(by_field));
    EXPECT_NE(printed(by_setter), printed(Options{}));
  }
}

TEST(OptionsTest, ValidateRejectsEachOutOfRangeField) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<std::pair<std::string, std::function<void(Options&)>>> bad = {
      {"density -0.1", [](Options& o) { o.density = -0.1; }},
      {"density 1.1", [](Options& o) { o.density = 1.1; }},
      {"density NaN", [&](Options& o) { o.density = nan; }},
      {"warmup_iterations -1", [](Options& o) { o.warmup_iterations = -1; }},
      {"threshold_period 0", [](Options& o) { o.threshold_period = 0; }},
      {"repartition_period 0", [](Options& o) { o.repartition_period = 0; }},
      {"repartition_period -4", [](Options& o) { o.repartition_period = -4; }},
      {"throttle 0", [](Options& o) { o.throttle = 0; }},
      {"balancing 7", [](Options& o) { o.balancing = static_cast<Balancing>(7); }},
      {"dense_allreduce 5",
       [](Options& o) { o.dense_allreduce = static_cast<oktopk::DenseAlgorithm>(5); }},
      {"wire 9", [](Options& o) { o.wire = static_cast<oktopk::Wire>(9); }},
      {"node_size -1", [](Options& o) { o.node_size = -1; }},
      {"node_size 2^31", [](Options& o) { o.node_size = std::int64_t{1} << 31; }},
      {"balance_threshold 0.5", [](Options& o) { o.balance_threshold = 0.5; }},
      {"balance_threshold Inf", [&](Options& o) { o.balance_threshold = inf; }},
      {"guard_factor 0", [](Options& o) { o.guard_factor = 0.0; }},
      {"guard_low -1", [](Options& o) { o.guard_low = -1.0; }},
      {"guard_low above guard_factor", [](Options& o) { o.guard_low = 1.5; }},
      {"guard_factor NaN", [&](Options& o) { o.guard_factor = nan; }},
      {"guard_step 1", [](Options& o) { o.guard_step = 1.0; }},
      {"guard_loops -1", [](Options& o) { o.guard_loops = -1; }},
      {"local_low 0", [](Options& o) { o.local_low = 0.0; }},
      {"local_high < local_low", [](Options& o) { o.local_high = 0.5 * o.local_low; }},
      {"local_step 0.9", [](Options& o) { o.local_step = 0.9; }},
      {"global_low -1", [](Options& o) { o.global_low = -1.0; }},
      {"global_high < global_low", [](Options& o) { o.global_high = 0.5 * o.global_low; }},
      {"global_step 0.5", [](Options& o) { o.global_step = 0.5; }},
      {"gaussian_low 0", [](Options& o) { o.gaussian_low = 0.0; }},
      {"gaussian_high < gaussian_low", [](Options& o) { o.gaussian_high = 0.1; }},
      {"gaussian_step 1", [](Options& o) { o.gaussian_step = 1.0; }},
      {"gaussian_loops -1", [](Options& o) { o.gaussian_loops = -1; }},
      {"s2_row_width 0", [](Options& o) { o.s2_row_width = 0; }},
      {"s2_sketch_rows 0", [](Options& o) { o.s2_sketch_rows = 0; }},
      {"s2_sketch_columns -1", [](Options& o) { o.s2_sketch_columns = -1; }},
  };
  for (const auto& [name, change] : bad) {
    SCOPED_TRACE(name);
    Options o;
    change(o);
    expect_invalid_argument([&] { o.validate(); }, "oktopk::Options::validate");
  }
}

TEST(OptionsTest, PrintsEveryFieldOnOneLine) {
  const std::string defaults = printed(Options{});
  EXPECT_EQ(defaults.find('\n'), std::string::npos) << defaults;
  EXPECT_NE(defaults.find("density="), std::string::npos) << defaults;
  // A field the text (or the digest the factory compares) missed would let ranks disagree
  // unnoticed: every single change must show.
  for (const auto& [name, change] : field_changes()) {
    Options o;
    change(o);
    EXPECT_NE(printed(o), defaults) << name << " is not printed";
    EXPECT_NE(o.digest(), Options{}.digest()) << name << " is not in the digest";
  }
  Options all;
  for (const auto& field : field_changes()) field.second(all);
  const std::string text = printed(all);
  for (const char* expected : {"density=0.375",
                               "warmup_iterations=7",
                               "seed=123456789",
                               "dense_allreduce=ring",
                               "wire=bf16",
                               "node_size=6",
                               "hierarchical=on",
                               "threshold_period=11",
                               "repartition_period=13",
                               "equal_regions=on",
                               "throttle=3",
                               "balancing=on",
                               "balance_threshold=1.5",
                               "1.75",
                               "1.0625",
                               "9",
                               "1.125",
                               "0.25",
                               "2.5",
                               "1.25",
                               "0.625",
                               "1.375",
                               "1.03125",
                               "17",
                               "s2_row_width=33",
                               "77"}) {
    EXPECT_NE(text.find(expected), std::string::npos) << "'" << expected << "' not in " << text;
  }
  EXPECT_EQ(Options{}.digest(), Options{}.digest());
}

}  // namespace
