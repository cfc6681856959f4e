// SPDX-License-Identifier: BSD-3-Clause
// TopkDSA, gTopk and Gaussian-k against oracles built here from plain MPI on MPI_COMM_WORLD and
// host code. Gradients are multiples of 2^-8 below 2^4 in magnitude, so every sum is exact in
// any order and outputs must match bit for bit; the residual is modelled on the host over
// several calls.
#include "mpi/mpi_test_utils.hpp"
#include <oktopk/any_space.hpp>
#include <oktopk/topk.hpp>

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

using oktopk::Algorithm;
using Exec = Kokkos::DefaultExecutionSpace;
using DeviceVector = Kokkos::View<float*, Exec::memory_space>;

constexpr float inf = std::numeric_limits<float>::infinity();

using oktopk::test::bits_of;
using oktopk::test::world_rank;
using oktopk::test::world_size;

std::int64_t sum_over_ranks(std::int64_t value) {
  std::int64_t sum = 0;
  MPI_Allreduce(&value, &sum, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return sum;
}

// ---- gradients ---------------------------------------------------------------------------------

enum class Pattern {
  uniform,     // independent m/256 per rank, |m| < 2^12
  correlated,  // a component shared by all ranks plus small per-rank noise: the local top-k
               // sets overlap, so sums meet at common indices
  cancel,      // on half the entries, even and odd ranks hold opposite values: sums of 0
  zero         // all zero
};

std::vector<float> gradient(Pattern pattern, std::int64_t n, int rank, int iteration,
                            std::uint64_t seed) {
  std::seed_seq own_seq{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(rank),
                        static_cast<std::uint32_t>(iteration), 1u};
  std::seed_seq shared_seq{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(iteration),
                           2u};
  std::mt19937 own(own_seq);
  std::mt19937 shared(shared_seq);
  std::vector<float> g(static_cast<std::size_t>(n), 0.0f);
  const auto scaled = [](int m) { return static_cast<float>(m) / 256.0f; };  // exact
  for (std::int64_t i = 0; i < n; ++i) {
    auto& v = g[static_cast<std::size_t>(i)];
    switch (pattern) {
      case Pattern::uniform:
        v = scaled(std::uniform_int_distribution<int>(-4095, 4095)(own));
        break;
      case Pattern::correlated: {
        const int common = std::uniform_int_distribution<int>(-3000, 3000)(shared);
        v = scaled(common + std::uniform_int_distribution<int>(-500, 500)(own));
        break;
      }
      case Pattern::cancel: {
        const int common = std::uniform_int_distribution<int>(-4095, 4095)(shared);
        const int noise = std::uniform_int_distribution<int>(-4095, 4095)(own);
        v = scaled(i % 2 == 0 ? (rank % 2 == 0 ? common : -common) : noise);
        break;
      }
      case Pattern::zero:
        break;
    }
  }
  return g;
}

// ---- host references ---------------------------------------------------------------------------

// The threshold whose strict selection keeps the k largest |x|: the (k+1)-th largest |x|,
// counting repeats; -Inf when k >= n, +Inf when k == 0.
float exact_threshold(const std::vector<float>& x, std::int64_t k) {
  const auto n = static_cast<std::int64_t>(x.size());
  if (k <= 0) return inf;
  if (k >= n) return -inf;
  std::vector<float> magnitudes(x.size());
  std::transform(x.begin(), x.end(), magnitudes.begin(), [](float v) { return std::fabs(v); });
  std::sort(magnitudes.begin(), magnitudes.end(), std::greater<float>());
  return magnitudes[static_cast<std::size_t>(k)];
}

using SparseList = std::vector<std::pair<std::int32_t, float>>;

SparseList select_host(const std::vector<float>& x, float threshold) {
  SparseList selected;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::fabs(x[i]) > threshold) selected.emplace_back(static_cast<std::int32_t>(i), x[i]);
  }
  return selected;
}

// The k largest of `list` (ascending indices) given the (k+1)-th largest magnitude: those
// above it, then, when fewer than k and it is above 0, those equal to it in index order.
SparseList top_k_host(const SparseList& list, float threshold, std::int64_t k) {
  std::int64_t ties = 0;
  if (std::isfinite(threshold) && threshold > 0.0f) {
    ties = k;
    for (const auto& entry : list) ties -= std::fabs(entry.second) > threshold ? 1 : 0;
  }
  SparseList kept;
  for (const auto& entry : list) {
    const float m = std::fabs(entry.second);
    if (m > threshold) {
      kept.push_back(entry);
    } else if (m == threshold && ties > 0) {
      kept.push_back(entry);
      --ties;
    }
  }
  return kept;
}

// The Gaussian-k threshold the method should end with: the library's normal fit (a kernel with
// its own unit tests), then the correction loops of the specification, replayed on the host;
// where the count at the last threshold is still outside [low·k, high·k], the exact top-k
// threshold instead (*exact set).
float gaussian_threshold_model(const Exec& exec, const std::vector<float>& acc, std::int64_t k,
                               const oktopk::Options& options, float* estimate, bool* exact) {
  DeviceVector acc_d("test::acc", acc.size());
  auto host = Kokkos::create_mirror_view(acc_d);
  for (std::size_t i = 0; i < acc.size(); ++i) host(i) = acc[i];
  Kokkos::deep_copy(acc_d, host);
  float threshold = oktopk::estimate_threshold_gaussian(exec, acc_d, k);
  *estimate = threshold;
  if (std::isfinite(threshold) && threshold > 0.0f) {
    for (int loop = 0; loop < options.gaussian_loops; ++loop) {
      const auto count = static_cast<double>(select_host(acc, threshold).size());
      if (count < options.gaussian_low * static_cast<double>(k)) {
        threshold = static_cast<float>(threshold / options.gaussian_step);
      } else if (count > options.gaussian_high * static_cast<double>(k)) {
        threshold = static_cast<float>(threshold * options.gaussian_step);
      } else {
        break;
      }
    }
  }
  const auto count = static_cast<double>(select_host(acc, threshold).size());
  const auto n = static_cast<std::int64_t>(acc.size());
  *exact = k > 0 && k < n &&
           (count < options.gaussian_low * static_cast<double>(k) ||
            count > options.gaussian_high * static_cast<double>(k));
  return *exact ? exact_threshold(acc, k) : threshold;
}

// Every rank's list on every rank, in rank order.
std::vector<SparseList> allgather_lists(const SparseList& mine) {
  const int P = world_size();
  const auto count = static_cast<int>(mine.size());
  std::vector<int> counts(P, 0);
  MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD);
  std::vector<int> displacements(P, 0);
  for (int r = 1; r < P; ++r) displacements[r] = displacements[r - 1] + counts[r - 1];
  const int total = displacements[P - 1] + counts[P - 1];
  std::vector<std::int32_t> idx(mine.size()), all_idx(static_cast<std::size_t>(total));
  std::vector<float> val(mine.size()), all_val(static_cast<std::size_t>(total));
  for (std::size_t j = 0; j < mine.size(); ++j) {
    idx[j] = mine[j].first;
    val[j] = mine[j].second;
  }
  MPI_Allgatherv(idx.data(), count, MPI_INT32_T, all_idx.data(), counts.data(),
                 displacements.data(), MPI_INT32_T, MPI_COMM_WORLD);
  MPI_Allgatherv(val.data(), count, MPI_FLOAT, all_val.data(), counts.data(), displacements.data(),
                 MPI_FLOAT, MPI_COMM_WORLD);
  std::vector<SparseList> lists(P);
  for (int r = 0; r < P; ++r) {
    for (int j = displacements[r]; j < displacements[r] + counts[r]; ++j) {
      lists[r].emplace_back(all_idx[j], all_val[j]);
    }
  }
  return lists;
}

// gTopk's tree, simulated: in round s, rank r (r mod 2s == 0, r + s < P) adds the list of
// r + s to its own (own + received), then keeps the k largest |sum| (top_k_host).
SparseList simulate_gtopk_tree(std::vector<SparseList> lists, std::int64_t k,
                               float* last_threshold) {
  const int P = static_cast<int>(lists.size());
  *last_threshold = -inf;
  for (int s = 1; s < P; s *= 2) {
    for (int r = 0; r + s < P; r += 2 * s) {
      std::map<std::int32_t, float> sum;
      for (const auto& [i, v] : lists[r]) sum[i] = v;
      for (const auto& [i, v] : lists[r + s]) {
        auto it = sum.find(i);
        if (it == sum.end()) {
          sum[i] = v;
        } else {
          it->second = it->second + v;
        }
      }
      std::vector<float> merged_values;
      for (const auto& entry : sum) merged_values.push_back(entry.second);
      const float t = exact_threshold(merged_values, k);
      if (r == 0) *last_threshold = t;
      lists[r] = top_k_host(SparseList(sum.begin(), sum.end()), t, k);
    }
  }
  return lists[0];
}

// ---- the check ---------------------------------------------------------------------------------

std::vector<float> to_host(const Exec& exec,
                           const Kokkos::View<const float*, Exec::memory_space>& v) {
  auto mirror = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  exec.fence();
  return std::vector<float>(mirror.data(), mirror.data() + mirror.extent(0));
}

// Positions where two vectors differ bitwise, and a description of the first one.
std::pair<std::int64_t, std::string> compare_bits(const std::vector<float>& got,
                                                  const std::vector<float>& want) {
  std::int64_t wrong = 0;
  std::string first;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (bits_of(got[i]) != bits_of(want[i])) {
      if (wrong == 0) {
        std::ostringstream os;
        os << "first at " << i << ": got " << got[i] << ", want " << want[i];
        first = os.str();
      }
      ++wrong;
    }
  }
  return {wrong, first};
}

struct Observed {
  int dense_switch_calls = 0;  // TopkDSA calls that allgathered dense regions
  int corrected_calls = 0;     // Gaussian-k calls whose loops moved the threshold
  std::int64_t max_global_selected = 0;
};

// Runs `iterations` calls of `algorithm` and checks each against the oracle: output (bitwise,
// and the same on every rank), residual, thresholds and counts. EXPECTs only (no early return),
// so every rank takes part in every collective whatever fails.
Observed run_and_check(Algorithm algorithm, std::int64_t n, double density, Pattern pattern,
                       int iterations, std::uint64_t seed = 7) {
  const int P = world_size();
  const int me = world_rank();
  Exec exec;
  oktopk::Communicator comm(MPI_COMM_WORLD);
  oktopk::Options options;
  options.density = density;
  auto handle = oktopk::make_sparse_allreduce<Exec>(algorithm, comm, n, options);
  const std::int64_t k = handle->k();
  EXPECT_EQ(k, static_cast<std::int64_t>(std::floor(density * static_cast<double>(n))));

  Observed observed;
  std::vector<float> residual(static_cast<std::size_t>(n), 0.0f);
  DeviceVector grad_d("test::grad", static_cast<std::size_t>(n));
  DeviceVector out_d("test::out", static_cast<std::size_t>(n));
  for (int t = 0; t < iterations; ++t) {
    std::ostringstream where;
    where << oktopk::to_string(algorithm) << " n=" << n << " density=" << density
          << " iteration=" << t << " rank=" << me;
    SCOPED_TRACE(where.str());
    const auto g = gradient(pattern, n, me, t, seed);
    std::vector<float> acc(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) acc[i] = residual[i] + g[i];

    {
      auto host = Kokkos::create_mirror_view(grad_d);
      for (std::size_t i = 0; i < g.size(); ++i) host(i) = g[i];
      Kokkos::deep_copy(grad_d, host);
      Kokkos::deep_copy(out_d, -1.0f);  // stale contents must be overwritten
    }
    handle->reduce(exec, grad_d, out_d);
    const auto out = to_host(exec, out_d);
    const oktopk::ReduceStats& stats = handle->stats();
    EXPECT_FALSE(stats.dense);

    std::vector<float> expected(g.size(), 0.0f);
    std::vector<float> next_residual = acc;
    if (algorithm == Algorithm::GTopk) {
      EXPECT_EQ(bits_of(stats.local_threshold), bits_of(exact_threshold(acc, k)));
      SparseList all_entries;
      for (std::size_t i = 0; i < acc.size(); ++i) {
        all_entries.emplace_back(static_cast<std::int32_t>(i), acc[i]);
      }
      const auto local = top_k_host(all_entries, stats.local_threshold, k);
      EXPECT_EQ(stats.local_selected, static_cast<std::int64_t>(local.size()));
      float last_threshold = 0.0f;
      const auto final_set = simulate_gtopk_tree(allgather_lists(local), k, &last_threshold);
      EXPECT_EQ(bits_of(stats.global_threshold), bits_of(last_threshold));
      EXPECT_EQ(stats.global_selected, static_cast<std::int64_t>(final_set.size()));
      EXPECT_LE(static_cast<std::int64_t>(final_set.size()), k);
      std::vector<char> in_final(g.size(), 0);
      for (const auto& [i, v] : final_set) {
        expected[static_cast<std::size_t>(i)] = v / static_cast<float>(P);
        in_final[static_cast<std::size_t>(i)] = 1;
      }
      for (const auto& entry : local) {
        if (in_final[static_cast<std::size_t>(entry.first)]) next_residual[entry.first] = 0.0f;
      }
    } else {
      const float threshold = stats.local_threshold;
      bool exact = true;
      if (algorithm == Algorithm::TopkDSA) {
        EXPECT_TRUE(stats.local_threshold_exact);
        EXPECT_EQ(bits_of(threshold), bits_of(exact_threshold(acc, k)));
      } else {
        float estimate = 0.0f;
        const float model =
            gaussian_threshold_model(exec, acc, k, handle->options(), &estimate, &exact);
        EXPECT_EQ(bits_of(threshold), bits_of(model));
        EXPECT_EQ(stats.local_threshold_exact, exact);
        if (bits_of(model) != bits_of(estimate)) ++observed.corrected_calls;
      }
      EXPECT_EQ(bits_of(stats.global_threshold), bits_of(-inf));
      // An exact threshold's ties complete the k, in index order.
      SparseList candidates;
      for (std::size_t i = 0; i < acc.size(); ++i) {
        candidates.emplace_back(static_cast<std::int32_t>(i), acc[i]);
      }
      const SparseList taken =
          exact ? top_k_host(candidates, threshold, k) : select_host(acc, threshold);
      std::vector<float> masked(g.size(), 0.0f);
      std::vector<char> chosen(g.size(), 0);
      const auto selected = static_cast<std::int64_t>(taken.size());
      for (const auto& [i, v] : taken) {
        const auto j = static_cast<std::size_t>(i);
        masked[j] = v;
        chosen[j] = 1;
        next_residual[j] = 0.0f;
      }
      EXPECT_EQ(stats.local_selected, selected);
      std::vector<float> sum(g.size(), 0.0f);
      MPI_Allreduce(masked.data(), sum.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
      std::int64_t nonzeros = 0;
      for (std::size_t i = 0; i < g.size(); ++i) {
        expected[i] = sum[i] / static_cast<float>(P);
        if (sum[i] != 0.0f) ++nonzeros;
      }
      if (algorithm == Algorithm::TopkDSA) {
        // Equal regions of floor(n/P), the last one taking the remainder: the split phase sends
        // each selected entry outside my region once (int32 index + float value), after the
        // exchange of one int64 count with every other rank.
        const std::int64_t width = n / P;
        const std::int64_t begin = me * width;
        const std::int64_t end = me == P - 1 ? n : begin + width;
        std::int64_t outside = 0;
        for (std::int64_t i = 0; i < n; ++i) {
          if (chosen[static_cast<std::size_t>(i)] && (i < begin || i >= end)) ++outside;
        }
        const auto split = stats.phases.find("split_reduce");
        const std::int64_t sent =
            split == stats.phases.end() ? 0 : split->second.traffic.bytes_sent;
        EXPECT_EQ(sent, 8 * outside + 8 * (P - 1));
        EXPECT_EQ(stats.global_selected, nonzeros);
        EXPECT_EQ(stats.dense_switch, !(2 * nonzeros < n));
        if (stats.dense_switch) ++observed.dense_switch_calls;
      } else {
        EXPECT_EQ(stats.global_selected, sum_over_ranks(selected));
      }
    }
    observed.max_global_selected = std::max(observed.max_global_selected, stats.global_selected);

    const auto [wrong, first] = compare_bits(out, expected);
    EXPECT_EQ(wrong, 0) << "output elements differ from the oracle; " << first;

    // The same bits on every rank: rank 0's output, broadcast, against mine.
    std::vector<float> root_out = out;
    MPI_Bcast(root_out.data(), static_cast<int>(n), MPI_FLOAT, 0, MPI_COMM_WORLD);
    const auto [differ, first_differ] = compare_bits(out, root_out);
    EXPECT_EQ(differ, 0) << "output differs from rank 0's; " << first_differ;

    const auto [wrong_residual, first_residual] =
        compare_bits(to_host(exec, handle->residual()), next_residual);
    EXPECT_EQ(wrong_residual, 0) << "residual differs from the model; " << first_residual;
    residual = next_residual;
  }
  return observed;
}

constexpr Algorithm baselines[] = {Algorithm::TopkDSA, Algorithm::GTopk, Algorithm::GaussianK};

// ---- tests -------------------------------------------------------------------------------------

TEST(Baselines, MatchOracleOverSeveralCalls) {
  for (const Algorithm algorithm : baselines) {
    for (const Pattern pattern : {Pattern::uniform, Pattern::correlated, Pattern::cancel}) {
      // 1003: the last TopkDSA region takes a remainder at every P > 1.
      const auto seen = run_and_check(algorithm, 1003, 0.02, pattern, 4);
      EXPECT_GT(seen.max_global_selected, 0);
    }
  }
}

TEST(Baselines, TopkDSASparseAndDenseSwitch) {
  const auto sparse = run_and_check(Algorithm::TopkDSA, 1000, 0.02, Pattern::uniform, 3);
  EXPECT_EQ(sparse.dense_switch_calls, 0);
  const auto dense = run_and_check(Algorithm::TopkDSA, 1000, 0.9, Pattern::uniform, 3);
  EXPECT_EQ(dense.dense_switch_calls, 3);
  // In between: at density 0.3 the union of the ranks' selections crosses n/2 only for P > 1.
  run_and_check(Algorithm::TopkDSA, 999, 0.3, Pattern::uniform, 3);
}

TEST(Baselines, GTopkMergesCommonIndicesAndReselects) {
  // Larger k, heavily overlapping supports: merges meet at common indices and cut back to k.
  const auto seen = run_and_check(Algorithm::GTopk, 2000, 0.1, Pattern::correlated, 3);
  EXPECT_LE(seen.max_global_selected, 200);
  EXPECT_GE(seen.max_global_selected, 190);
}

TEST(Baselines, GaussianKCorrectionLoopsRun) {
  // A uniform gradient is lighter-tailed than the normal fit assumes: at density 0.02 the fit's
  // threshold lies above every |x|, and the loops must lower it (here they overshoot the band
  // and then step both ways, so both branches run).
  const auto seen = run_and_check(Algorithm::GaussianK, 4000, 0.02, Pattern::uniform, 2);
  EXPECT_GT(seen.corrected_calls, 0);
}

TEST(Baselines, KZeroSelectsNothing) {
  for (const Algorithm algorithm : baselines) {
    const auto seen = run_and_check(algorithm, 500, 0.0, Pattern::uniform, 2);
    EXPECT_EQ(seen.max_global_selected, 0);
  }
}

TEST(Baselines, KEqualsNIsTheDenseAverage) {
  for (const Algorithm algorithm : baselines) {
    run_and_check(algorithm, 501, 1.0, Pattern::uniform, 2);
    run_and_check(algorithm, 501, 1.0, Pattern::cancel, 2);
  }
}

TEST(Baselines, FewerEntriesThanRanks) {
  for (const Algorithm algorithm : baselines) {
    for (const double density : {0.0, 0.34, 0.67, 1.0}) {
      run_and_check(algorithm, 3, density, Pattern::uniform, 3);
    }
    run_and_check(algorithm, 1, 1.0, Pattern::correlated, 2);
  }
}

TEST(Baselines, AllZeroGradient) {
  for (const Algorithm algorithm : baselines) {
    const auto seen = run_and_check(algorithm, 300, 0.1, Pattern::zero, 2);
    EXPECT_EQ(seen.max_global_selected, 0);
  }
}

TEST(Baselines, EmptyGradient) {
  for (const Algorithm algorithm : baselines) run_and_check(algorithm, 0, 0.5, Pattern::uniform, 2);
}

}  // namespace
