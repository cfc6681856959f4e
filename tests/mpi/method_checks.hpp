// SPDX-License-Identifier: BSD-3-Clause
// What the SparseAllreduce tests share: one reduce call observed on the host (Runner, Call), the
// checks every method's output must pass, and each method's oracle rebuilt on the host from
// dense data with plain MPI (spec §6), using the thresholds the method reports. Gradients are
// multiples of 2^-8 small enough that every sum is exact (oracle_host.hpp), so "bit for bit"
// holds whatever order a method adds in. Functions that say so are collective over
// MPI_COMM_WORLD.
#pragma once

#include "api_checks.hpp"
#include "mpi/oracle_host.hpp"

#include <oktopk/any_space.hpp>

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <limits>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace oktopk::test {

using Exec = Kokkos::DefaultExecutionSpace;
using Handle = oktopk::SparseAllreduce<Exec>;
using Vector = Handle::vector_type;

inline constexpr float kInf = std::numeric_limits<float>::infinity();

inline bool same_text_on_all_ranks(const std::string& text) {
  return same_on_all_ranks(oktopk::agreement_digest(std::string_view(text)) & 0x3fffffffffffffff);
}

inline Vector to_device(const std::vector<float>& host, const char* label = "test::vector") {
  Vector device(std::string(label), host.size());
  Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> view(
      host.data(), host.size());
  Kokkos::deep_copy(device, view);
  return device;
}

template <class T, class V>
std::vector<T> to_host(const V& device, std::size_t count) {
  std::vector<T> host(count);
  if (count == 0) return host;
  Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> view(host.data(),
                                                                                    count);
  Kokkos::deep_copy(view, Kokkos::subview(device, Kokkos::make_pair(std::size_t{0}, count)));
  return host;
}

template <class V>
std::vector<float> to_host(const V& device) {
  return to_host<float>(device, device.extent(0));
}

inline std::int64_t count_nonzero(const std::vector<float>& x) {
  return std::count_if(x.begin(), x.end(), [](float v) { return v != 0.0f; });
}

/// The threshold keeping exactly the k largest magnitudes when they are distinct: the
/// (k+1)-th largest |x| (+Inf for k <= 0, -Inf for k >= n), as the spec defines "exact top-k".
inline float kth_abs(const std::vector<float>& x, std::int64_t k) {
  const auto n = static_cast<std::int64_t>(x.size());
  if (k <= 0) return kInf;
  if (k >= n) return -kInf;
  std::vector<float> a(x.size());
  std::transform(x.begin(), x.end(), a.begin(), [](float v) { return std::fabs(v); });
  std::nth_element(a.begin(), a.begin() + k, a.end(), std::greater<float>());
  return a[static_cast<std::size_t>(k)];
}

inline std::string describe(float x) {
  std::ostringstream os;
  os << std::setprecision(9) << x << " (0x" << std::hex << bits_of(x) << ")";
  return os.str();
}

/// Counts differing entries and remembers the first.
struct Diff {
  std::int64_t count = 0;
  std::int64_t first = -1;
  float expected = 0.0f;
  float actual = 0.0f;
  void note(std::size_t j, float e, float a) {
    if (count++ == 0) {
      first = static_cast<std::int64_t>(j);
      expected = e;
      actual = a;
    }
  }
};

inline std::ostream& operator<<(std::ostream& os, const Diff& d) {
  if (d.count == 0) return os << "no difference";
  return os << d.count << " entries differ on rank " << world_rank() << "; first at " << d.first
            << ": expected " << describe(d.expected) << ", got " << describe(d.actual);
}

/// Methods whose output is R·[|R| > global_threshold]/P with R = Σ_i acc_i·[|acc_i| > local_i].
inline bool has_threshold_oracle(Algorithm a) {
  return a == Algorithm::Dense || a == Algorithm::TopkA || a == Algorithm::TopkDSA ||
         a == Algorithm::GaussianK || a == Algorithm::OkTopk;
}

/// Methods whose local threshold is the exact top-k one on every call.
inline bool exact_local_topk_every_call(Algorithm a) {
  return a == Algorithm::TopkA || a == Algorithm::TopkDSA || a == Algorithm::GTopk;
}

// ---- one call, observed --------------------------------------------------------------------

/// Everything a check needs about one reduce call, on the host.
struct Call {
  std::vector<float> grad;
  std::vector<float> acc;  // residual before the call + grad
  std::vector<float> out;
  std::vector<float> residual_after;
  oktopk::ReduceStats stats;
};

/// How a Runner's calls return their output: reduce() into a dense View, or reduce_sparse().
enum class Output { Dense, Sparse };

/// A handle and the number of calls made on it.
class Runner {
 public:
  Runner(Algorithm algorithm, std::int64_t n, const Options& options, Output output = Output::Dense)
      : handle_(oktopk::make_sparse_allreduce<Exec>(algorithm, oktopk::Communicator(), n, options)),
        output_(output) {}

  Handle& handle() { return *handle_; }
  std::int64_t calls() const { return calls_; }

  /// One reduce call: `out` starts as NaN everywhere, so an entry the method forgets to write
  /// shows. Also checks that `grad` was left alone. With Output::Sparse, the call is
  /// reduce_sparse (into one SparseResult reused over the calls) and c.out its entries
  /// scattered into zeros, once they are checked to ascend inside [0, n).
  Call reduce(const std::vector<float>& grad) {
    Exec exec;
    Call c;
    c.grad = grad;
    const std::vector<float> residual_before = to_host(handle_->residual());
    const Vector g = to_device(grad, "test::grad");
    if (output_ == Output::Sparse) {
      handle_->reduce_sparse(exec, g, sparse_);
      exec.fence();
      c.out = scattered(grad.size());
    } else {
      Vector out(Kokkos::view_alloc(Kokkos::WithoutInitializing, "test::out"), grad.size());
      Kokkos::deep_copy(out, std::numeric_limits<float>::quiet_NaN());
      handle_->reduce(exec, g, out);
      exec.fence();
      c.out = to_host(out);
    }
    ++calls_;
    c.residual_after = to_host(handle_->residual());
    c.stats = handle_->stats();
    c.acc.resize(grad.size());
    for (std::size_t j = 0; j < grad.size(); ++j) c.acc[j] = residual_before[j] + grad[j];
    const std::vector<float> grad_after = to_host(g);
    Diff changed;
    for (std::size_t j = 0; j < grad.size(); ++j) {
      if (bits_of(grad_after[j]) != bits_of(grad[j])) changed.note(j, grad[j], grad_after[j]);
    }
    EXPECT_EQ(changed.count, 0) << "reduce modified grad: " << changed;
    return c;
  }

  /// The last reduce_sparse's result (Output::Sparse).
  const oktopk::SparseResult<Handle::memory_space>& sparse() const { return sparse_; }

 private:
  /// sparse_ as a dense vector of n; entries out of order or outside [0, n) fail the test
  /// (and are left out), so that the checks on the dense vector see only what was valid.
  std::vector<float> scattered(std::size_t n) const {
    std::vector<float> out(n, 0.0f);
    const auto size = static_cast<std::size_t>(std::max<std::int64_t>(sparse_.size, 0));
    if (size > sparse_.indices.extent(0) || size > sparse_.values.extent(0)) {
      ADD_FAILURE() << "reduce_sparse's size " << sparse_.size << " exceeds its views";
      return out;
    }
    const auto idx = to_host<oktopk::index_type>(sparse_.indices, size);
    const auto val = to_host<float>(sparse_.values, size);
    std::int64_t bad = 0;
    for (std::size_t e = 0; e < size; ++e) {
      const bool ascending = e == 0 || idx[e] > idx[e - 1];
      const bool inside = idx[e] >= 0 && static_cast<std::size_t>(idx[e]) < n;
      if (!ascending || !inside) {
        ++bad;
        continue;
      }
      out[static_cast<std::size_t>(idx[e])] = val[e];
    }
    EXPECT_EQ(bad, 0) << "reduce_sparse's indices must ascend strictly inside [0, " << n << ")";
    return out;
  }

  std::unique_ptr<Handle> handle_;
  Output output_;
  oktopk::SparseResult<Handle::memory_space> sparse_;
  std::int64_t calls_ = 0;
};

/// Checks every method's output must pass: written everywhere, the same bits on every rank,
/// result() = its non-zeros, stats counting the calls, traffic conserved over ranks.
inline void check_common(Runner& runner, const Call& c) {
  Handle& h = runner.handle();
  const auto& s = c.stats;
  EXPECT_EQ(s.iteration, runner.calls());
  EXPECT_EQ(s.k, h.k());
  EXPECT_EQ(h.k(), static_cast<std::int64_t>(
                       std::floor(h.options().density * static_cast<double>(h.size()))));
  EXPECT_TRUE(same_on_all_ranks(s.iteration));
  EXPECT_TRUE(same_on_all_ranks(s.dense ? 1 : 0)) << "stats().dense differs across ranks";
  if (h.algorithm() == Algorithm::Dense) {
    EXPECT_TRUE(s.dense);
  }

  const auto nonfinite =
      std::count_if(c.out.begin(), c.out.end(), [](float v) { return !std::isfinite(v); });
  EXPECT_EQ(nonfinite, 0) << "output entries left unwritten or not finite";
  EXPECT_EQ(bits_differing_from_rank0(c.out), 0) << "output bits differ from rank 0's";

  Exec exec;
  const auto r = h.result(exec);
  exec.fence();
  EXPECT_EQ(r.size, count_nonzero(c.out)) << "result() must hold exactly the non-zeros of out";
  const auto size = static_cast<std::size_t>(std::max<std::int64_t>(r.size, 0));
  if (size <= r.indices.extent(0) && size <= r.values.extent(0)) {
    const auto idx = to_host<oktopk::index_type>(r.indices, size);
    const auto val = to_host<float>(r.values, size);
    std::int64_t bad = 0;
    for (std::size_t e = 0; e < size; ++e) {
      const bool ascending = e == 0 || idx[e] > idx[e - 1];
      const bool inside = idx[e] >= 0 && static_cast<std::size_t>(idx[e]) < c.out.size();
      if (!ascending || !inside ||
          bits_of(c.out[static_cast<std::size_t>(idx[e])]) != bits_of(val[e])) {
        ++bad;
      }
    }
    EXPECT_EQ(bad, 0) << "result() entries not ascending or not equal to out";
  } else {
    ADD_FAILURE() << "result() size " << r.size << " exceeds its views";
  }

  const oktopk::PhaseTraffic t = s.total_traffic();
  EXPECT_EQ(sum_over_ranks(t.bytes_sent), sum_over_ranks(t.bytes_received));
  EXPECT_EQ(sum_over_ranks(t.messages_sent), sum_over_ranks(t.messages_received));
  EXPECT_EQ(sum_over_ranks(t.bytes_sent_between_nodes),
            sum_over_ranks(t.bytes_received_between_nodes));
  EXPECT_LE(t.bytes_sent_between_nodes, t.bytes_sent);
  EXPECT_FALSE(s.phases.empty());
}

// ---- the threshold oracle (spec §6.1-6.3) ---------------------------------------------------

struct Oracle {
  std::vector<char> mask;  // this rank's selection: |acc| > local_threshold, and ties (below)
  std::vector<float> R;    // Σ_i acc_i·mask_i (exact)
  std::vector<char> G;     // |R| > global_threshold, and the ties that complete k (below)
  std::int64_t local_count = 0;
  std::int64_t global_count = 0;  // entries of G
};

/// Collective. An exact local threshold (stats().local_threshold_exact, the (k+1)-th largest
/// |acc|) also takes the first entries with |acc| == local_threshold in index order, up to k in
/// all, when that threshold is finite and above 0. With `ties_complete_k` (Ok-Topk's exact
/// global threshold, the (k+1)-th largest |R|), G likewise holds the first entries with |R| ==
/// global_threshold, up to k in all.
inline Oracle build_oracle(const Call& c, std::int64_t k, bool ties_complete_k = false) {
  Oracle o;
  const std::size_t n = c.acc.size();
  const float lt = c.stats.local_threshold;
  const float gt = c.stats.global_threshold;
  o.mask.assign(n, 0);
  o.G.assign(n, 0);
  std::vector<float> masked(n, 0.0f);
  for (std::size_t j = 0; j < n; ++j) {
    if (std::fabs(c.acc[j]) > lt) {
      o.mask[j] = 1;
      masked[j] = c.acc[j];
      ++o.local_count;
    }
  }
  if (c.stats.local_threshold_exact && std::isfinite(lt) && lt > 0.0f) {
    for (std::size_t j = 0; j < n && o.local_count < k; ++j) {
      if (std::fabs(c.acc[j]) == lt) {
        o.mask[j] = 1;
        masked[j] = c.acc[j];
        ++o.local_count;
      }
    }
  }
  o.R = sum_over_ranks(masked);
  for (std::size_t j = 0; j < n; ++j) {
    if (std::fabs(o.R[j]) > gt) {
      o.G[j] = 1;
      ++o.global_count;
    }
  }
  if (ties_complete_k && gt > 0.0f) {
    for (std::size_t j = 0; j < n && o.global_count < k; ++j) {
      if (std::fabs(o.R[j]) == gt) {
        o.G[j] = 1;
        ++o.global_count;
      }
    }
  }
  return o;
}

/// Collective. out == R·G/P bitwise; residual = acc with mask ∩ G cleared; Σ_i (acc_i −
/// residual_i) == R·G exactly; the global threshold is the same on all ranks.
inline void expect_threshold_oracle(const Call& c, const Oracle& o) {
  const std::size_t n = c.acc.size();
  const auto P = static_cast<float>(world_size());
  const float gt = c.stats.global_threshold;
  EXPECT_TRUE(same_bits_on_all_ranks(gt)) << "global_threshold differs across ranks";

  Diff out_diff;
  for (std::size_t j = 0; j < n; ++j) {
    const float expected = o.G[j] ? o.R[j] / P : 0.0f;
    if (!same_value_bits(expected, c.out[j])) out_diff.note(j, expected, c.out[j]);
  }
  EXPECT_EQ(out_diff.count, 0) << "out vs R·[|R| > " << gt << "]/P with local_threshold "
                               << c.stats.local_threshold << ": " << out_diff;

  Diff residual_diff;
  std::vector<float> removed(n, 0.0f);
  for (std::size_t j = 0; j < n; ++j) {
    const bool cleared = o.mask[j] && o.G[j];
    const float expected = cleared ? 0.0f : c.acc[j];
    const float actual = c.residual_after[j];
    // A selected entry whose sum cancelled to exactly 0 is "globally selected" only because the
    // global threshold is negative; a method may treat it either way (the mass check below
    // still requires all ranks to agree).
    const bool either = cleared && o.R[j] == 0.0f && !(gt >= 0.0f) &&
                        (actual == 0.0f || same_value_bits(actual, c.acc[j]));
    if (!either && !same_value_bits(expected, actual)) residual_diff.note(j, expected, actual);
    removed[j] = c.acc[j] - actual;
  }
  EXPECT_EQ(residual_diff.count, 0)
      << "residual vs acc with (local ∩ global) cleared: " << residual_diff;

  const std::vector<float> moved = sum_over_ranks(removed);
  Diff mass_diff;
  for (std::size_t j = 0; j < n; ++j) {
    const float expected = o.G[j] ? o.R[j] : 0.0f;
    if (!same_value_bits(expected, moved[j])) mass_diff.note(j, expected, moved[j]);
  }
  EXPECT_EQ(mass_diff.count, 0) << "mass: Σ_i (acc_i - residual_i) vs R·G: " << mass_diff;
  EXPECT_EQ(c.stats.local_selected, o.local_count);
}

/// Collective. A dense call: out == (Σ_i acc_i)/P bitwise and nothing stays in the residual.
inline void expect_dense_average(const Call& c) {
  const std::vector<float> sum = sum_over_ranks(c.acc);
  const auto P = static_cast<float>(world_size());
  Diff out_diff;
  Diff residual_diff;
  for (std::size_t j = 0; j < c.acc.size(); ++j) {
    if (!same_value_bits(sum[j] / P, c.out[j])) out_diff.note(j, sum[j] / P, c.out[j]);
    if (c.residual_after[j] != 0.0f) residual_diff.note(j, 0.0f, c.residual_after[j]);
  }
  EXPECT_EQ(out_diff.count, 0) << "out vs dense average: " << out_diff;
  EXPECT_EQ(residual_diff.count, 0) << "residual after a dense call: " << residual_diff;
}

// ---- gTopk: the tree simulated on the host ------------------------------------------------

using SparseSet = std::vector<std::pair<std::size_t, float>>;  // ascending indices

/// Collective. Replays the documented tree from every rank's acc and local threshold: leaves
/// and merges keep the k largest magnitudes, those equal to the (k+1)-th largest in index
/// order, none equal to 0 (round s: rank r with r mod 2s == 0 merges r + s; common indices
/// add). Checks out and the residual bit for bit against it.
inline void check_gtopk_tree(const Call& c, std::int64_t k) {
  const int P = world_size();
  const std::size_t n = c.acc.size();
  const std::vector<float> all = gather_all(c.acc);
  const std::vector<float> thresholds = gather_all({c.stats.local_threshold});
  const auto ku = static_cast<std::size_t>(std::max<std::int64_t>(k, 0));
  // The k largest of `set` (ascending indices), ties in index order: a stable sort by
  // magnitude keeps equal ones in index order; a cut at 0 drops the zeros kept.
  const auto keep_k_largest = [ku](SparseSet& set) {
    if (set.size() <= ku) return;
    std::stable_sort(set.begin(), set.end(), [](const auto& u, const auto& v) {
      return std::fabs(u.second) > std::fabs(v.second);
    });
    const bool cut_at_zero = std::fabs(set[ku].second) == 0.0f;
    set.resize(ku);
    if (cut_at_zero) {
      set.erase(std::remove_if(set.begin(), set.end(),
                               [](const auto& e) { return std::fabs(e.second) == 0.0f; }),
                set.end());
    }
    std::sort(set.begin(), set.end());
  };
  std::vector<SparseSet> sets(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r) {
    SparseSet& leaf = sets[static_cast<std::size_t>(r)];
    const float t = thresholds[static_cast<std::size_t>(r)];
    for (std::size_t j = 0; j < n; ++j) {
      const float a = all[static_cast<std::size_t>(r) * n + j];
      // The entries above t, and those equal to it (the k largest are among them).
      if (std::fabs(a) > t || (t > 0.0f && std::fabs(a) == t)) leaf.emplace_back(j, a);
    }
    keep_k_largest(leaf);
  }
  std::vector<char> selected_here(n, 0);
  for (const auto& [j, v] : sets[static_cast<std::size_t>(world_rank())]) selected_here[j] = 1;
  std::vector<char> zero_sum(n, 0);
  for (int s = 1; s < P; s *= 2) {
    for (int r = 0; r + s < P; r += 2 * s) {
      const SparseSet& a = sets[static_cast<std::size_t>(r)];
      const SparseSet& b = sets[static_cast<std::size_t>(r + s)];
      SparseSet merged;
      std::size_t x = 0, y = 0;
      while (x < a.size() || y < b.size()) {
        if (y == b.size() || (x < a.size() && a[x].first < b[y].first)) {
          merged.push_back(a[x++]);
        } else if (x == a.size() || b[y].first < a[x].first) {
          merged.push_back(b[y++]);
        } else {
          const float sum = a[x].second + b[y].second;
          if (sum == 0.0f) zero_sum[a[x].first] = 1;
          merged.emplace_back(a[x].first, sum);
          ++x;
          ++y;
        }
      }
      keep_k_largest(merged);
      sets[static_cast<std::size_t>(r)] = std::move(merged);
      sets[static_cast<std::size_t>(r + s)].clear();
    }
  }
  EXPECT_LE(count_nonzero(c.out), k) << "gTopk returned more than k entries";

  const SparseSet& final_set = sets[0];
  const auto Pf = static_cast<float>(P);
  std::vector<float> expected_out(n, 0.0f);
  std::vector<char> in_final(n, 0);
  for (const auto& [j, v] : final_set) {
    expected_out[j] = v / Pf;
    in_final[j] = 1;
  }
  Diff out_diff, residual_diff;
  for (std::size_t j = 0; j < n; ++j) {
    if (!same_value_bits(expected_out[j], c.out[j])) out_diff.note(j, expected_out[j], c.out[j]);
    const bool cleared = selected_here[j] && in_final[j];
    const float expected = cleared ? 0.0f : c.acc[j];
    const float actual = c.residual_after[j];
    const bool either = zero_sum[j] && (actual == 0.0f || same_value_bits(actual, c.acc[j]));
    if (!either && !same_value_bits(expected, actual)) residual_diff.note(j, expected, actual);
  }
  EXPECT_EQ(out_diff.count, 0) << "gTopk out vs the simulated tree: " << out_diff;
  EXPECT_EQ(residual_diff.count, 0)
      << "gTopk residual vs acc with (local ∩ final) cleared: " << residual_diff;
}

// ---- S2 ------------------------------------------------------------------------------------

/// Collective. Rows (of `row_width` entries) that are zero on every rank decode to zero; without
/// error feedback nothing is kept.
inline void check_s2(const Call& c, const Options& options) {
  const std::size_t n = c.acc.size();
  const auto width = static_cast<std::size_t>(options.s2_row_width);
  const std::size_t rows = (n + width - 1) / width;
  std::vector<int> nonzero_row(rows + 1, 0), union_row(rows + 1, 0);
  for (std::size_t j = 0; j < n; ++j) {
    if (c.acc[j] != 0.0f) nonzero_row[j / width] = 1;
  }
  MPI_Allreduce(nonzero_row.data(), union_row.data(), static_cast<int>(rows), MPI_INT, MPI_MAX,
                MPI_COMM_WORLD);
  Diff outside;
  for (std::size_t j = 0; j < n; ++j) {
    if (!union_row[j / width] && c.out[j] != 0.0f) outside.note(j, 0.0f, c.out[j]);
  }
  EXPECT_EQ(outside.count, 0) << "S2: rows with no non-zero on any rank must decode to 0: "
                              << outside;
  if (!options.s2_error_feedback) {
    EXPECT_EQ(count_nonzero(c.residual_after), 0) << "S2 without error feedback keeps nothing";
  }
}

/// The ring's bandwidth optimum: 2(P-1) chunks of about n/P values of `value_bytes` bytes
/// leave every rank in phase dense_allreduce (checked where every chunk is non-empty).
inline void expect_ring_bytes(const Call& c, std::int64_t value_bytes) {
  const int P = world_size();
  const auto n = static_cast<std::int64_t>(c.out.size());
  if (P == 1 || n < P) return;
  const auto sent = c.stats.phases.at("dense_allreduce").traffic.bytes_sent;
  const std::int64_t chunks = 2 * (P - 1);
  EXPECT_GE(sent, chunks * (n / P) * value_bytes);
  EXPECT_LE(sent, chunks * (n / P + 1) * value_bytes);
}

/// Collective. A top-k method's rank contributes min(k, its non-zeros) entries at an exact
/// local threshold, and at a reused or estimated one at least `fraction` of that (Ok-Topk:
/// guard_low with guard_exact; Gaussian-k: gaussian_low) and one entry when there are any:
/// ties at a threshold never leave it with nothing to send. `fraction` comes from the options,
/// the counts from the host copy of acc, independently of the library's oracle.
inline void expect_selection_count(Runner& runner, const Call& c) {
  Handle& h = runner.handle();
  const Algorithm a = h.algorithm();
  const Options& o = h.options();
  const std::int64_t wanted = std::min(h.k(), count_nonzero(c.acc));
  double fraction = 1.0;
  if (!c.stats.local_threshold_exact) {
    if (a == Algorithm::GaussianK) fraction = o.gaussian_low;
    if (a == Algorithm::OkTopk) fraction = o.guard_exact ? o.guard_low : 0.0;
  }
  const double needed = wanted > 0 ? std::max(fraction * static_cast<double>(wanted), 1.0) : 0.0;
  EXPECT_GE(static_cast<double>(c.stats.local_selected), needed)
      << "rank " << world_rank() << " selected " << c.stats.local_selected << " of " << wanted
      << " eligible (k " << h.k() << ", local threshold " << describe(c.stats.local_threshold)
      << (c.stats.local_threshold_exact ? ", exact)" : ", reused or estimated)");
  EXPECT_FALSE(c.stats.selected_nothing);
  if (a == Algorithm::TopkA || a == Algorithm::TopkDSA || a == Algorithm::GTopk ||
      (c.stats.local_threshold_exact && a != Algorithm::S2Reducer)) {
    // k >= n: the threshold is -Inf, and every entry, zeros too, is taken.
    const auto n = static_cast<std::int64_t>(c.acc.size());
    EXPECT_EQ(c.stats.local_selected, h.k() >= n ? n : wanted)
        << "an exact local top-k takes min(k, non-zeros)";
  }
}

/// What check_call found, for tests that look further.
struct Checked {
  bool dense = false;
  Oracle oracle;  // filled for dense calls and threshold-oracle methods
};

/// Collective. The common checks plus the method's oracle.
inline Checked check_call(Runner& runner, const Call& c) {
  check_common(runner, c);
  Handle& h = runner.handle();
  const Algorithm a = h.algorithm();
  Checked result;
  // Branch on rank 0's view, so a disagreement cannot send ranks down different collectives.
  result.dense = from_rank0(c.stats.dense ? 1 : 0) != 0;
  if (result.dense) {
    EXPECT_EQ(c.stats.local_threshold, -kInf);
    EXPECT_EQ(c.stats.global_threshold, -kInf);
    expect_dense_average(c);
  }
  if (result.dense || has_threshold_oracle(a)) {
    result.oracle = build_oracle(c, h.k(),
                                 !result.dense && a == Algorithm::OkTopk &&
                                     from_rank0(c.stats.global_threshold_exact ? 1 : 0) != 0);
    expect_threshold_oracle(c, result.oracle);
  } else if (a == Algorithm::GTopk) {
    check_gtopk_tree(c, h.k());
  } else if (a == Algorithm::S2Reducer) {
    check_s2(c, h.options());
  }
  const bool top_k = a == Algorithm::TopkA || a == Algorithm::TopkDSA ||
                     a == Algorithm::GaussianK || a == Algorithm::OkTopk || a == Algorithm::GTopk;
  if (!result.dense && top_k) expect_selection_count(runner, c);
  if (!result.dense && exact_local_topk_every_call(a)) {
    EXPECT_TRUE(c.stats.local_threshold_exact);
    EXPECT_EQ(bits_of(c.stats.local_threshold), bits_of(kth_abs(c.acc, h.k())))
        << "local threshold " << c.stats.local_threshold << " is not the (k+1)-th largest |acc|";
  }
  return result;
}

}  // namespace oktopk::test
