// SPDX-License-Identifier: BSD-3-Clause
// Ok-Topk (Li & Hoefler, PPoPP'22): a sparse allreduce moving at most about 6k words per rank.
//
// One call (spec §2.2): local threshold (exact every tau' calls, reused and adjusted between),
// region boundaries from the local selections (every tau calls), split-and-reduce of the local
// selection into P regions, global threshold over the reduced regions (exact every tau' calls),
// global selection, optional balancing, allgatherv; the residual keeps everything except the
// entries selected both locally and globally.
#pragma once

#include <oktopk/pack.hpp>
#include <oktopk/shards.hpp>
#include <oktopk/impl/algorithms/method_base.hpp>
#include <oktopk/impl/collectives/distributed_kth.hpp>
#include <oktopk/impl/collectives/shard_exchange.hpp>
#include <oktopk/impl/collectives/sparse_allgatherv.hpp>
#include <oktopk/impl/collectives/split_and_reduce.hpp>
#include <oktopk/impl/kernels/threshold_ladder.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace oktopk::impl {

/// quantiles[i] = indices(⌊(i + 1) · size / (count + 1)⌋) for i < count, the count + 1
/// quantiles of the first `size` sorted indices, on the host. Rounding each position on its own
/// spreads the remainder size mod (count + 1) over the parts; a fixed stride ⌊size / (count + 1)⌋
/// would leave all of it to the last part, up to count more entries than each other part holds,
/// which at P² ≈ k doubles what the last region's owner receives. A free function: CUDA forbids
/// device lambdas in private member functions.
template <class ExecSpace, class Indices>
void pick_quantiles(const ExecSpace& exec, const Indices& indices, std::int64_t size, int count,
                    std::vector<std::int64_t>& quantiles) {
  quantiles.assign(count, 0);
  if (count <= 0) return;
  auto picked = make_uninitialized<std::int64_t>(exec, "oktopk::oktopk::quantiles", count);
  const std::int64_t parts = count + 1;
  Kokkos::parallel_for(
      "oktopk::oktopk::quantiles", RangeOf<ExecSpace>(exec, 0, count),
      KOKKOS_LAMBDA(int i) { picked(i) = indices((i + 1) * size / parts); });
  auto host = Kokkos::create_mirror_view(picked);
  Kokkos::deep_copy(exec, host, picked);
  fence(exec, "oktopk::oktopk::quantiles to host");
  for (int i = 0; i < count; ++i) quantiles[i] = host(i);
}

/// Ok-Topk's guard on a reused threshold t (spec §2.3, made two-sided): while more than
/// guard_factor·k entries pass, multiply t by guard_step; while fewer than guard_low·k pass,
/// divide it, but never to where more than guard_factor·k pass (one step back then): the
/// traffic bound comes first. At most guard_loops steps, in one direction. `passing(t)` counts
/// the entries above t. The same on every rank when the counts are (the global guard).
template <class Passing>
float guard_walk(float t, const Options& o, std::int64_t k, Passing&& passing) {
  const double high = o.guard_factor * static_cast<double>(k);
  const double low = o.guard_low * static_cast<double>(k);
  int direction = 0;  // +1 raising, -1 lowering
  float previous = t;
  for (int step = 0; step < o.guard_loops; ++step) {
    const auto count = static_cast<double>(passing(t));
    if (count > high) {
      if (direction < 0) return previous;  // lowered one step too far
      direction = 1;
    } else if (count < low) {
      if (direction > 0) return t;  // raised past the range: below the bound is what counts
      direction = -1;
    } else {
      return t;
    }
    previous = t;
    t = static_cast<float>(direction > 0 ? t * o.guard_step : t / o.guard_step);
  }
  // A last lowering step is counted too, so that it never lets more than guard_factor·k pass.
  if (direction < 0 && static_cast<double>(passing(t)) > high) return previous;
  return t;
}

template <class ExecSpace, class Value>
class OkTopkAllreduce final : public MethodBase<ExecSpace, Value> {
  using Base = MethodBase<ExecSpace, Value>;
  using real_vector_type = typename Base::real_vector_type;
  using Real = typename Base::arithmetic_type;
  using vector_type = typename Base::vector_type;
  using index_vector_type = typename Base::index_vector_type;
  using Memory = typename ExecSpace::memory_space;

 public:
  OkTopkAllreduce(const ExecSpace& exec, const Communicator& comm, std::int64_t n,
                  const Options& options, const Layout& layout = Layout())
      : Base(exec, Algorithm::OkTopk, comm, n, options, layout),
        offsets_(comm.size() + 1, 0),
        offsets_device_(Kokkos::view_alloc(exec, "oktopk::oktopk::region_offsets"),
                        comm.size() + 1) {
    split_.wire = gather_.wire = shards_.wire = wire_;
  }

 protected:
  // State between calls: both thresholds (reused and nudged between exact recomputations),
  // the region boundaries (recomputed every tau calls) and, with guard_ladder, both ladders;
  // offsets_device_ mirrors offsets_. split_, gather_, shards_ and the index buffers are rebuilt by
  // every call. The options' digest says whether the ladders are there.
  void save_method_state(SectionPayload& out) const override {
    out.put_f32(local_threshold_);
    out.put_f32(global_threshold_);
    out.put_u32(static_cast<std::uint32_t>(offsets_.size()));
    for (const std::int64_t o : offsets_) out.put_i64(o);
    if (this->options_.guard_ladder) {
      for (const ThresholdLadder* ladder : {&local_ladder_, &global_ladder_}) {
        out.put_f64(ladder->predicted());
        out.put_f64(ladder->step());
        out.put_f64(ladder->previous_target());
      }
    }
  }

  std::function<void(const ExecSpace&)> load_method_state(SectionParser& in) override {
    const float local = in.f32();
    const float global = in.f32();
    const std::uint32_t count = in.u32();
    const int P = this->comm_.size();
    if (count != static_cast<std::uint32_t>(P + 1)) {
      throw StateError(false, "checkpoint is corrupt: " + std::to_string(count) +
                                  " Ok-Topk region boundaries, expected " + std::to_string(P + 1));
    }
    std::vector<std::int64_t> offsets(count);
    for (auto& o : offsets) o = in.i64();
    double ladders[2][3] = {};
    if (this->options_.guard_ladder) {
      for (auto& ladder : ladders) {
        for (double& v : ladder) v = in.f64();
        if (!(std::isfinite(ladder[0]) && ladder[0] >= 0.0 && std::isfinite(ladder[1]) &&
              ladder[1] >= 0.0 && std::isfinite(ladder[2]) && ladder[2] >= 0.0)) {
          throw StateError(false,
                           "checkpoint is corrupt: an Ok-Topk threshold ladder is not finite");
        }
      }
    }
    in.expect_end();
    // Before the first repartition (warm-up calls) every boundary is still 0.
    const bool initial =
        std::all_of(offsets.begin(), offsets.end(), [](std::int64_t o) { return o == 0; });
    const bool valid = offsets.front() == 0 && offsets.back() == this->n_ &&
                       std::is_sorted(offsets.begin(), offsets.end());
    if (!initial && !valid) {
      throw StateError(false,
                       "checkpoint is corrupt: Ok-Topk region boundaries are not a "
                       "partition of [0, n)");
    }
    return [this, local, global, offsets, ladders](const ExecSpace& exec) {
      local_threshold_ = local;
      global_threshold_ = global;
      local_ladder_.restore(ladders[0][0], ladders[0][1], ladders[0][2]);
      global_ladder_.restore(ladders[1][0], ladders[1][1], ladders[1][2]);
      offsets_ = offsets;
      auto host = Kokkos::create_mirror_view(offsets_device_);
      for (std::size_t r = 0; r < offsets_.size(); ++r) host(r) = offsets_[r];
      Kokkos::deep_copy(exec, offsets_device_, host);
      fence(exec, "oktopk::oktopk: restored region offsets");  // `host` goes out of scope
    };
  }

  // A call that reuses the local threshold counts at it, and at every threshold its guard may
  // move it to, while accumulating: the guard then needs no pass of its own, and the split's
  // selection, whichever threshold the guard keeps, filters the candidates the pass kept
  // above the lowest of them (host spaces) or reads acc once instead of twice.
  impl::CountLevels accumulate_count_levels() const override {
    const Options& o = this->options_;
    const std::int64_t call = this->iteration_ + 1;
    const bool reused =
        call > o.warmup_iterations && (call - o.warmup_iterations - 1) % o.threshold_period != 0;
    if (!reused) return {};
    if (o.guard_ladder) return local_ladder_.levels(o.guard_step);
    if (!(std::isfinite(local_threshold_) && local_threshold_ > 0.0f)) return {};
    return guard_levels(local_threshold_, o.guard_step, o.guard_low > 0.0 ? o.guard_loops : 0,
                        o.guard_loops + 1);
  }

  void reduce_step(const ExecSpace& exec, const real_vector_type& acc,
                   const vector_type& out) override {
    const LocalSelection selected = select_and_gather(exec, acc);
    // The dense average and the error feedback together: out is written once, and acc is
    // cleared where the result carries an entry this rank selected (§2.8).
    auto timer = this->phase(exec, "output");
    write_average_clearing(exec, gather_.indices, gather_.values, gather_.total, out,
                           static_cast<float>(this->comm_.size()), acc, selected, wire_);
    add_wire_error(exec, acc, global_indices_, global_values_, global_selected_, wire_);
  }

  /// The gathered entries are the result already: regions ascend with the rank and each
  /// rank's entries with the index, so they are copied (and averaged) as they are, and no pass
  /// touches the other n - k entries.
  void reduce_step_sparse(const ExecSpace& exec, const real_vector_type& acc,
                          typename Base::sparse_result_type& result) override {
    const LocalSelection selected = select_and_gather(exec, acc);
    auto timer = this->phase(exec, "output");
    this->size_result(exec, result, gather_.total);
    copy_average_clearing(exec, gather_.indices, gather_.values, gather_.total, result.indices,
                          result.values, static_cast<float>(this->comm_.size()), acc, selected,
                          wire_);
    add_wire_error(exec, acc, global_indices_, global_values_, global_selected_, wire_);
  }

  const char* reduce_scatter_refusal() const override { return nullptr; }

  /// The regions are reduced and selected as reduce() does, in the balanced regions; then each
  /// selected entry goes to the owner of its shard, and each region's owner tells every rank
  /// which of the entries it sent were selected, for the error feedback. The values travel on
  /// the wire as the allgather sends them and are averaged as reduce()'s output phase does, so
  /// the shard is reduce()'s output bit for bit, and the residual is reduce()'s.
  void reduce_step_scatter(const ExecSpace& exec, const real_vector_type& acc,
                           const typename Base::ShardTarget& target) override {
    const GlobalSelection selection = select_globally(exec, acc);
    std::int64_t total = 0;
    {
      auto timer = this->phase(exec, "shard_exchange");
      if (selection.counted) {
        for (const std::int64_t c : gather_.counts) total += c;
      } else {
        total = global_selected_;
        this->comm_.allreduce_in_place(&total, 1, MPI_SUM);
      }
      send_to_shards(exec, this->comm_, global_indices_, global_values_, global_selected_,
                     target.offsets, shards_);
    }
    count_global_selection(selection, total);
    {
      auto timer = this->phase(exec, "feedback");
      return_selection(exec, this->comm_, split_, offsets_, offsets_device_, global_indices_,
                       global_selected_, acc, wire_, shards_);
    }
    auto timer = this->phase(exec, "output");
    const std::int64_t begin = target.offsets[static_cast<std::size_t>(this->comm_.rank())];
    Kokkos::deep_copy(exec, target.shard, Value{});
    scatter_divided(exec, shards_.indices, shards_.values, shards_.received, target.shard,
                    static_cast<float>(this->comm_.size()), -begin);
    add_wire_error(exec, acc, global_indices_, global_values_, global_selected_, wire_);
  }

  std::int64_t wire_overflows() const override {
    return split_.overflowed + gather_.overflowed + shards_.overflowed;
  }

 private:
  /// Everything of a call up to the output: select_globally(), then the gather of every rank's
  /// selected entries into gather_ (indices ascending). Returns what this call's local
  /// selection took, which the output phase clears in acc. On a narrower wire, the output phase
  /// then adds to acc the rounding errors of the sums this rank sent (global_values_, which
  /// stay unrounded).
  LocalSelection select_and_gather(const ExecSpace& exec, const real_vector_type& acc) {
    const GlobalSelection selection = select_globally(exec, acc);
    const Options& o = this->options_;
    if (selection.counted) {
      sparse_allgatherv_counted(exec, this->comm_, global_indices_, global_values_, o.balancing,
                                o.balance_threshold, gather_, this->timed(exec));
    } else {
      sparse_allgatherv(exec, this->comm_, global_indices_, global_values_, global_selected_,
                        o.balancing, o.balance_threshold, gather_, this->timed(exec));
    }
    this->stats_.balanced = gather_.balanced;
    count_global_selection(selection, gather_.total);
    return selection.local;
  }

  /// What select_globally() found: the local selection, whether the global threshold came
  /// from the ladder's counts (gather_.counts then holds every rank's count at it), and
  /// whether it is exact.
  struct GlobalSelection {
    LocalSelection local;
    bool counted = false;
    bool global_exact = false;
  };

  /// The global selection's size over all ranks, into the stats and the nudge of a reused
  /// global threshold.
  void count_global_selection(const GlobalSelection& selection, std::int64_t total) {
    this->stats_.global_selected = total;
    if (!selection.global_exact && !this->options_.guard_ladder) {
      const Options& o = this->options_;
      nudge(global_threshold_, total, o.global_low, o.global_high, o.global_step);
    }
  }

  /// A call up to its global selection: the thresholds, the split and reduce of the regions,
  /// and this rank's part of the global selection, in global_indices_ and global_values_
  /// (global_selected_ entries, indices ascending).
  GlobalSelection select_globally(const ExecSpace& exec, const real_vector_type& acc) {
    const Options& o = this->options_;
    split_.overflowed = gather_.overflowed = shards_.overflowed = 0;
    auto& stats = this->stats_;
    const std::int64_t k = this->k_;
    // Calls since the warm-up ended, from 0: the schedules of tau' and tau count from there.
    const std::int64_t t = this->iteration_ - o.warmup_iterations - 1;
    const bool exact = t % o.threshold_period == 0;
    // Exact on schedule, or because the guard could not bring the count into range.
    bool local_exact = exact;
    bool global_exact = exact;

    {
      auto timer = this->phase(exec, "threshold");
      const bool guarded = !exact && (o.guard_ladder ? ladder_local_threshold(exec, acc)
                                                     : guard_local_threshold(exec, acc));
      if (!guarded) {
        local_threshold_ = this->topk_threshold(exec, acc, k);
        local_exact = true;
        local_ladder_.anchor(local_threshold_);
      }
    }
    stats.local_threshold = local_threshold_;
    stats.local_threshold_exact = local_exact;

    if (t % o.repartition_period == 0) {
      auto timer = this->phase(exec, "repartition");
      repartition(exec, acc);
      stats.repartitioned = true;
    }

    // The threshold of this call's local selection: the nudge below moves local_threshold_ for
    // the next call, and the output phase clears what was selected at this one.
    const float selected_above = local_threshold_;
    // Chunk counts at this threshold, and the candidates above it, when the accumulate pass
    // or the guard counted it (host spaces). An exact threshold is the (k+1)-th largest |acc|:
    // where magnitudes tie with it, the first ties in index order complete the k.
    split_and_reduce(exec, this->comm_, acc, local_threshold_, local_exact ? k : 0,
                     this->accumulated_.known_above(local_threshold_), offsets_, offsets_device_,
                     o.throttle, split_, this->timed(exec));
    stats.local_selected = split_.selected;
    if (!o.guard_ladder) {
      nudge(local_threshold_, split_.selected, o.local_low, o.local_high, o.local_step);
    }

    const int me = this->comm_.rank();
    // With the ladder, every rank's counts at the global levels came with the allgather of
    // counts, and gather_.counts holds them at the level chosen.
    const bool counted = !exact && o.guard_ladder && ladder_global_threshold(exec);
    std::int64_t selected = 0;
    {
      auto timer = this->phase(exec, "global_select");
      const bool guarded = counted || (!exact && !o.guard_ladder && guard_global_threshold(exec));
      // An exact threshold is the (k+1)-th largest region sum; where sums tie with it (sums of
      // 16-bit values often do), the first of the ties in index order complete the k.
      std::int64_t ties = 0;
      if (!guarded) {
        const DistributedThreshold found =
            distributed_topk_threshold(exec, this->comm_, split_.region, k, this->kth_workspace_);
        global_threshold_ = found.value;
        ties = ties_to_select(this->comm_, found);
        global_exact = true;
        global_ladder_.anchor(global_threshold_);
      }
      if (ties > 0) {
        selected = this->select_with_ties_into(exec, split_.region, global_threshold_, ties,
                                               global_indices_, global_values_);
      } else {
        // At a ladder level, the region's counts per chunk are known (host spaces): one pass.
        KnownAbove<ExecSpace, Real> known;
        if (counted && region_level_counts_.extent(0) != 0) {
          known.chunk_counts = Kokkos::subview(region_level_counts_, global_level_, Kokkos::ALL);
        }
        selected = this->select_into(exec, split_.region, global_threshold_, global_indices_,
                                     global_values_, known);
      }
      OKTOPK_ASSERT(!counted || selected == gather_.counts[me]);
      add_offset(exec, global_indices_, 0, selected, offsets_[me]);
    }
    global_selected_ = selected;
    stats.global_threshold = global_threshold_;
    stats.global_threshold_exact = global_exact;

    return GlobalSelection{LocalSelection{selected_above, split_.tied_end}, counted, global_exact};
  }

  /// Reused thresholds drift with the gradient: keep the count passing in range (guard_walk).
  /// False when the threshold is to be recomputed exactly instead (guard_exact).
  bool guard_local_threshold(const ExecSpace& exec, const real_vector_type& acc) {
    const Options& o = this->options_;
    if (!(std::isfinite(local_threshold_) && local_threshold_ > 0.0f)) return true;
    // The accumulate pass counted the thresholds of the first steps; one past them is counted
    // here, per chunk too, so the split's selection still reads acc once.
    auto passing = [&](float t) { return this->accumulated_.count_above(exec, acc, t); };
    local_threshold_ = guard_walk(local_threshold_, o, this->k_, passing);
    const std::int64_t count = passing(local_threshold_);
    return count > 0 && (!o.guard_exact || in_guard_range(count));
  }

  /// The ladder guard on the local threshold: its levels' counts come from the accumulate
  /// pass (host spaces), or else from one counting pass. False when the threshold is to be
  /// recomputed exactly instead: no prediction yet, or no level in range with guard_exact.
  bool ladder_local_threshold(const ExecSpace& exec, const real_vector_type& acc) {
    const Options& o = this->options_;
    const CountLevels levels = local_ladder_.levels(o.guard_step);
    if (levels.count == 0) return false;
    std::int64_t counts[max_count_levels];
    bool known = true;
    for (int j = 0; j < levels.count; ++j)
      known = known && this->accumulated_.level(levels.threshold[j]) >= 0;
    if (known) {
      for (int j = 0; j < levels.count; ++j) {
        counts[j] = this->accumulated_.count_above(exec, acc, levels.threshold[j]);
      }
    } else {
      count_above_levels(exec, acc, levels, counts);
    }
    const auto pick = ThresholdLadder::pick(levels, counts, this->k_, o.guard_low, o.guard_factor);
    local_ladder_.learn(levels, counts, this->k_);
    // A level that passes nothing (magnitudes tied between levels) is never kept.
    if ((o.guard_exact && !pick.in_range) || counts[pick.level] == 0) return false;
    local_threshold_ = levels.threshold[pick.level];
    return true;
  }

  /// The ladder guard on the global threshold: each rank counts its reduced region at the
  /// levels, and the counts travel in the allgather of counts that the allgatherv needs
  /// anyway (int32: a region holds fewer than 2^31 entries), so every rank sums the same
  /// totals without a round of its own. On success gather_.counts holds every rank's count at
  /// the chosen level, for sparse_allgatherv_counted. False (the same on every rank) when the
  /// threshold is to be recomputed exactly instead.
  bool ladder_global_threshold(const ExecSpace& exec) {
    const Options& o = this->options_;
    const int P = this->comm_.size();
    const CountLevels levels = global_ladder_.levels(o.guard_step);
    if (levels.count == 0) return false;
    std::int64_t mine[max_count_levels];
    {
      auto timer = this->phase(exec, "global_select");
      if constexpr (runs_on_host_v<ExecSpace>) {
        const auto chunks = static_cast<std::size_t>(
            chunk_count<ExecSpace>(static_cast<std::int64_t>(split_.region.extent(0))));
        if (region_level_counts_.extent(1) != chunks) {
          region_level_counts_ = decltype(region_level_counts_)(
              Kokkos::view_alloc(exec, Kokkos::WithoutInitializing,
                                 "oktopk::oktopk::region_level_counts"),
              static_cast<std::size_t>(max_count_levels), chunks);
        }
      }
      count_above_levels(exec, split_.region, levels, mine, region_level_counts_);
    }
    std::vector<std::int32_t> all(static_cast<std::size_t>(P) * levels.count);
    {
      auto timer = this->phase(exec, "allgatherv");
      std::int32_t send[max_count_levels];
      for (int j = 0; j < levels.count; ++j) send[j] = static_cast<std::int32_t>(mine[j]);
      this->comm_.allgather(send, levels.count, all.data());
    }
    std::int64_t totals[max_count_levels] = {};
    for (int r = 0; r < P; ++r) {
      for (int j = 0; j < levels.count; ++j)
        totals[j] += all[static_cast<std::size_t>(r) * levels.count + j];
    }
    const auto pick = ThresholdLadder::pick(levels, totals, this->k_, o.guard_low, o.guard_factor);
    global_ladder_.learn(levels, totals, this->k_);
    if ((o.guard_exact && !pick.in_range) || totals[pick.level] == 0) return false;
    global_threshold_ = levels.threshold[pick.level];
    global_level_ = pick.level;
    gather_.counts.assign(P, 0);
    for (int r = 0; r < P; ++r)
      gather_.counts[r] = all[static_cast<std::size_t>(r) * levels.count + pick.level];
    return true;
  }

  /// Whether `count` entries passing lie in [guard_low·k, guard_factor·k].
  bool in_guard_range(std::int64_t count) const {
    const Options& o = this->options_;
    const auto c = static_cast<double>(count);
    const auto k = static_cast<double>(this->k_);
    return c <= o.guard_factor * k && c >= o.guard_low * k;
  }

  /// The same guard on the reused global threshold, counted over all ranks' regions: the nudges
  /// alone follow a sum whose magnitude changes (correlated gradients, growing residuals, a
  /// falling loss) too slowly, and every extra entry is allgathered to all. All the thresholds
  /// the walk may visit are counted in one pass and summed by one allreduce. False when the
  /// threshold is to be recomputed exactly instead (guard_exact; the same on every rank).
  bool guard_global_threshold(const ExecSpace& exec) {
    const Options& o = this->options_;
    if (!(std::isfinite(global_threshold_) && global_threshold_ > 0.0f)) return true;
    CountLevels levels;
    std::int64_t counts[max_count_levels];
    auto passing = [&](float t) {
      for (int j = 0; j < levels.count; ++j) {
        if (levels.threshold[j] == t) return counts[j];
      }
      levels =
          guard_levels(t, o.guard_step, o.guard_low > 0.0 ? o.guard_loops : 0, o.guard_loops + 1);
      count_above_levels(exec, split_.region, levels, counts);
      this->comm_.allreduce_in_place(counts, levels.count, MPI_SUM);
      for (int j = 0; j < levels.count; ++j) {
        if (levels.threshold[j] == t) return counts[j];
      }
      OKTOPK_ASSERT(false && "guard_levels counts the threshold it starts from");
      return std::int64_t{0};
    };
    global_threshold_ = guard_walk(global_threshold_, o, this->k_, passing);
    const std::int64_t count = passing(global_threshold_);
    return count > 0 && (!o.guard_exact || in_guard_range(count));
  }

  /// Moves a reused threshold so that the next count comes closer to [low·k, high·k].
  void nudge(float& threshold, std::int64_t count, double low, double high, double step) const {
    if (!(std::isfinite(threshold) && threshold > 0.0f)) return;
    const double k = static_cast<double>(this->k_);
    if (static_cast<double>(count) < low * k) {
      threshold = static_cast<float>(threshold / step);
    } else if (static_cast<double>(count) > high * k) {
      threshold = static_cast<float>(threshold * step);
    }
  }

  /// Region boundaries from where the local selections lie (spec §2.4): each rank proposes the
  /// P-quantiles of its selected positions, and the boundaries are their average, so every
  /// region holds about k/P of every rank's entries. A rank with fewer than P selected entries
  /// proposes equal regions. With equal_regions every region is its equal part, nothing sent.
  void repartition(const ExecSpace& exec, const real_vector_type& acc) {
    const int P = this->comm_.size();
    const std::int64_t n = this->n_;
    if (this->options_.equal_regions) {
      offsets_ = equal_shard_offsets(n, P);
    } else {
      // What the accumulate pass kept makes this selection cheap, also when it runs often.
      const std::int64_t selected =
          this->select_into(exec, acc, local_threshold_, repartition_indices_, repartition_values_,
                            this->accumulated_.known_above(local_threshold_));
      std::vector<std::int64_t> boundaries;
      if (selected >= P && P > 1) {
        pick_quantiles(exec, repartition_indices_, selected, P - 1, boundaries);
      } else {
        boundaries.assign(P > 1 ? P - 1 : 0, 0);
        for (int i = 0; i < P - 1; ++i) boundaries[i] = (i + 1) * n / P;
      }
      if (P > 1) this->comm_.allreduce_in_place(boundaries.data(), P - 1, MPI_SUM);
      offsets_[0] = 0;
      for (int i = 0; i < P - 1; ++i) offsets_[i + 1] = boundaries[i] / P;
      offsets_[P] = n;
    }
    auto host = Kokkos::create_mirror_view(offsets_device_);
    for (int r = 0; r <= P; ++r) host(r) = offsets_[r];
    Kokkos::deep_copy(exec, offsets_device_, host);
    fence(exec, "oktopk::oktopk: region offsets");  // `host` goes out of scope
  }

  /// The type the values travel in (value_wire()).
  const Wire wire_ = value_wire<Value>(this->options_);
  float local_threshold_ = 0.0f;
  float global_threshold_ = 0.0f;
  ThresholdLadder local_ladder_;
  ThresholdLadder global_ladder_;
  /// The region's counts per chunk at the global ladder's levels (host spaces), and the level
  /// the last call chose.
  Kokkos::View<count_type**, Kokkos::LayoutRight, Memory> region_level_counts_{
      "oktopk::oktopk::region_level_counts", 0, 0};
  int global_level_ = 0;
  std::vector<std::int64_t> offsets_;
  Kokkos::View<count_type*, Memory> offsets_device_;
  SplitReduce<ExecSpace, Real> split_;
  SparseGather<ExecSpace, Real> gather_;
  ShardExchange<ExecSpace, Real> shards_;
  index_vector_type repartition_indices_{"oktopk::oktopk::repartition_indices", 0};
  real_vector_type repartition_values_{"oktopk::oktopk::repartition_values", 0};
  index_vector_type global_indices_{"oktopk::oktopk::global_indices", 0};
  real_vector_type global_values_{"oktopk::oktopk::global_values", 0};
  /// This rank's entries of the last global selection (in global_indices_ and global_values_).
  std::int64_t global_selected_ = 0;
};

}  // namespace oktopk::impl

// Compiled once, in liboktopk (src/instantiate/).
OKTOPK_IMPL_DECLARE_INSTANTIATIONS(oktopk::impl::OkTopkAllreduce)
