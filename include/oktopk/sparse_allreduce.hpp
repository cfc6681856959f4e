// SPDX-License-Identifier: BSD-3-Clause
// The interface every method implements: a persistent handle that turns each rank's dense
// gradient into the same averaged, sparsified gradient on every rank.
#pragma once

#include <oktopk/algorithm.hpp>
#include <oktopk/communicator.hpp>
#include <oktopk/error.hpp>
#include <oktopk/fwd.hpp>
#include <oktopk/layout.hpp>
#include <oktopk/options.hpp>
#include <oktopk/progress.hpp>
#include <oktopk/select.hpp>
#include <oktopk/stats.hpp>
#include <oktopk/topk.hpp>
#include <oktopk/impl/candidates.hpp>
#include <oktopk/impl/explicit_instantiation.hpp>
#include <oktopk/impl/failure.hpp>
#include <oktopk/impl/fault_injection.hpp>
#include <oktopk/impl/kokkos_compat.hpp>
#include <oktopk/impl/mpi_mirror.hpp>
#include <oktopk/impl/ring_allreduce.hpp>
#include <oktopk/impl/state_io.hpp>
#include <oktopk/impl/vector_ops.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <istream>
#include <limits>
#include <ostream>
#include <string>

namespace oktopk {

namespace impl {
template <class ExecSpace>
struct HandleSerial;
}  // namespace impl

/// \brief The last call's result in sparse form: `size` entries, indices ascending, values
/// averaged (equal to the dense output at those indices).
template <class MemorySpace>
struct SparseResult {
  Kokkos::View<index_type*, MemorySpace> indices;
  Kokkos::View<value_type*, MemorySpace> values;
  std::int64_t size = 0;
};

/// \brief A sparse allreduce handle for gradients of length n (made by make_sparse_allreduce).
///
/// Owns the residual (error feedback), thresholds, region boundaries and reusable buffers, so
/// one handle serves every iteration of a training run. Not copyable; not thread-safe.
template <class ExecSpace>
class SparseAllreduce {
 public:
  using execution_space = ExecSpace;
  using memory_space = typename ExecSpace::memory_space;
  using vector_type = Kokkos::View<value_type*, memory_space>;
  using const_vector_type = Kokkos::View<const value_type*, memory_space>;
  using index_vector_type = Kokkos::View<index_type*, memory_space>;

  SparseAllreduce(const SparseAllreduce&) = delete;
  SparseAllreduce& operator=(const SparseAllreduce&) = delete;
  virtual ~SparseAllreduce() = default;

  /// \brief Collective. Writes into `out` the average over ranks of the sparsified gradients
  /// (mostly zeros), bit-identical on every rank; `grad` is not modified. Every rank throws the
  /// same std::invalid_argument if any rank passes Views whose length is not size(), if any
  /// rank's gradient (plus residual) holds NaN or Inf, or (method dense, which checks the
  /// average rather than its input) if the sum over ranks overflows; the handle is then
  /// unchanged (`out` is not: it may hold a copy of the gradient or the average). Any other
  /// failure (an allocation, an MPI error, a broken invariant) may happen on some ranks only,
  /// while the others wait inside MPI: the failing rank then prints
  /// "oktopk: rank R: <cause> in phase <phase> of <method> call <t>" to stderr and ends the job
  /// with MPI_Abort (user guide, "Failures").
  ///
  /// A wait on reduce_async: it runs after every call launched before it in this process.
  void reduce(const ExecSpace& exec, const const_vector_type& grad, const vector_type& out);

  /// \brief Collective. Launches reduce(exec, grad, out) and returns at once. Calls run one at
  /// a time in launch order (over every handle of this process): on OkTopk's progress thread
  /// while the caller goes on, when one runs (initialize_kokkos_on_progress_thread), or else
  /// on the caller's thread inside the request's test() or wait(). `grad` and `out` must stay
  /// untouched, and the handle alive, until the request completes; the request reports the
  /// call's errors. Every
  /// rank must launch in the same order: a call whose handle is not the one its peers' call
  /// at the same position belongs to fails on every rank with std::invalid_argument (the
  /// handle unchanged) instead of mixing two handles' data, provided the handles were made
  /// from one Communicator (or its copies).
  ReduceRequest reduce_async(const ExecSpace& exec, const const_vector_type& grad,
                             const vector_type& out);

  Algorithm algorithm() const { return algorithm_; }
  std::int64_t size() const { return n_; }
  /// floor(density * n).
  std::int64_t k() const { return k_; }
  const Options& options() const { return options_; }
  /// The segments of the fused buffer the handle was made for (empty: none given).
  const Layout& layout() const { return layout_; }
  const Communicator& communicator() const { return comm_; }
  const ReduceStats& stats() const { return stats_; }
  /// What error feedback carries to the next call (all zeros for methods without it).
  const_vector_type residual() const { return residual_; }

  /// The non-zero entries of the last call's output View, as it is now (computed on demand).
  SparseResult<memory_space> result(const ExecSpace& exec) const;

  /// \brief Writes this rank's state to `os`: what the next calls depend on (the residual, the
  /// call counter, the method's thresholds and region boundaries), in the versioned binary
  /// format of the user guide ("Checkpoint and restart"), with the algorithm, n, P, rank,
  /// options digest and (for a handle with a layout) layout digest it belongs to. Not
  /// collective: every rank saves its own state (residuals differ). Fences `exec`. Throws
  /// std::runtime_error if the stream fails.
  void save_state(const ExecSpace& exec, std::ostream& os) const;

  /// \brief Collective. Replaces this handle's state by what save_state wrote on this rank, so
  /// that later calls return exactly what the saved handle's later calls would have. Each rank
  /// checks its stream (magic, version, lengths, checksums, and that algorithm, n, P, rank,
  /// options and layout are this handle's), then the ranks agree: if any rank's check fails,
  /// every rank throws the same exception naming the first such rank and the cause
  /// (std::invalid_argument for a checkpoint of another handle or call count,
  /// std::runtime_error for a truncated, damaged or unreadable one), and the handle is
  /// unchanged. Reads exactly the checkpoint's bytes from `is` (on failure, an unspecified
  /// number). Afterwards stats() are reset (but for iteration and k) and result() is empty,
  /// until the next reduce().
  void restore_state(const ExecSpace& exec, std::istream& is);

 protected:
  /// Allocates and zeroes the handle's buffers on `exec`, and fences it. `layout` must be
  /// valid for n (make_sparse_allreduce checks it).
  SparseAllreduce(const ExecSpace& exec, Algorithm algorithm, const Communicator& comm,
                  std::int64_t n, const Options& options, const Layout& layout = Layout());

  /// The method's body, for calls after the warm-up. `acc` holds residual + grad; on return
  /// `out` holds the averaged result and `acc` what stays in the residual (the method clears
  /// the entries it communicated). `stats_` is reset before the call, except `phases`,
  /// which the base fills from phase() scopes and the communicator.
  virtual void reduce_step(const ExecSpace& exec, const vector_type& acc,
                           const vector_type& out) = 0;

  /// Whether the method keeps a residual (the base then zeroes nothing it carries over).
  virtual bool uses_error_feedback() const { return true; }

  /// Thresholds the method wants the call's accumulate pass to count |acc| above, for free
  /// (the pass reads acc anyway): the results land in counted_levels_ and counted_above_, and
  /// on host execution spaces per chunk in counted_chunk_counts_ (on GPUs the first level
  /// only). None (the default): nothing counted. Asked before the call counter moves, so the
  /// call it is for is iteration_ + 1.
  virtual impl::CountLevels accumulate_count_levels() const { return {}; }

  /// Whether every call is a dense average of the gradient as it is (the Dense method): the
  /// base then reduces `grad` straight into `out`, without reduce_step and without a copy,
  /// and checks the average for NaN and Inf instead of the input, passes fewer.
  virtual bool averages_gradient_as_is() const { return false; }

  /// Appends the method's own state carried between calls (beyond the residual and the call
  /// counter, which the base saves) to `out`; methods with such state override both hooks.
  virtual void save_method_state(impl::StateBuffer& out) const { (void)out; }

  /// Parses what save_method_state wrote, throwing impl::StateError for content this handle
  /// cannot take, and returns what installs it (empty: nothing to install). restore_state calls
  /// the result only once every rank's checkpoint checked out, so it must not fail; until then
  /// the handle must stay unchanged.
  virtual std::function<void(const ExecSpace&)> load_method_state(impl::StateParser& in) {
    in.expect_end();
    return {};
  }

  /// \brief RAII: while alive, communication is charged to phase `name`; on destruction the
  /// execution space is fenced and the elapsed time added to that phase's stats.
  class PhaseTimer {
   public:
    PhaseTimer(SparseAllreduce& owner, const ExecSpace& exec, const char* name)
        : owner_(owner), exec_(exec), name_(name), scope_(owner.comm_.phase(name)) {
      try {
        OKTOPK_FAULT_POINT(owner_.comm_, "enter");
      } catch (...) {
        // No destructor runs for a constructor that throws: name the phase here.
        if (owner_.failed_phase_.empty()) owner_.failed_phase_ = name_;
        throw;
      }
    }
    ~PhaseTimer() {
      if (std::uncaught_exceptions() > uncaught_at_start_) {
        // A failure leaves this phase: the innermost phase it left is the one to report.
        if (owner_.failed_phase_.empty()) owner_.failed_phase_ = name_;
        return;
      }
      impl::fence(exec_, "OkTopk::SparseAllreduce::phase");
      owner_.stats_.phases[name_].seconds += timer_.seconds();
    }
    PhaseTimer(const PhaseTimer&) = delete;
    PhaseTimer& operator=(const PhaseTimer&) = delete;

   private:
    SparseAllreduce& owner_;
    ExecSpace exec_;
    std::string name_;
    Communicator::PhaseScope scope_;
    Kokkos::Timer timer_;
    int uncaught_at_start_ = std::uncaught_exceptions();
  };
  PhaseTimer phase(const ExecSpace& exec, const char* name) { return PhaseTimer(*this, exec, name); }

  /// Dense allreduce of `in` (SUM) into `out`, then out /= P, by options_.dense_allreduce.
  /// `in` and `out` may be the same. With `count_nonfinite`, returns how many averages this
  /// rank found not finite: all of them with MPI_Allreduce, those of the chunk it finished
  /// with the ring (0 otherwise: warm-up calls do not wait for a count they do not use).
  template <class In>
  std::int64_t dense_average(const ExecSpace& exec, const In& in, const vector_type& out,
                             bool count_nonfinite);

  /// acc_ = residual_ + grad with accumulate_counting()'s counts at `levels`, keeping the
  /// candidates above the lowest level too where that is done (host spaces).
  impl::AccumulateCounts accumulate_into_acc(const ExecSpace& exec, const const_vector_type& grad,
                                             const impl::CountLevels& levels);

  /// A whole dense call (warm-up calls, and the Dense method): dense_average plus its stats.
  template <class In>
  std::int64_t dense_step(const ExecSpace& exec, const In& in, const vector_type& out,
                          bool count_nonfinite);

  /// Stream-compacts {i : |x(i)| > threshold} into (indices, values), growing them if needed;
  /// returns the count. `known`: what the accumulate pass knows of x = acc at the threshold
  /// (known_above()), so that fewer passes read x.
  std::int64_t select_into(const ExecSpace& exec, const vector_type& x, float threshold,
                           index_vector_type& indices, vector_type& values,
                           const impl::KnownAbove<ExecSpace>& known = {});

  /// A phase factory for the shared collectives: timed(name) opens phase(exec, name).
  auto timed(const ExecSpace& exec) {
    return [this, exec](const char* name) { return phase(exec, name); };
  }

  /// The k-th largest |x| threshold for "exactly the k largest": selecting |x| > result keeps
  /// k entries when magnitudes are distinct (-Inf when k >= n keeps all, +Inf when k == 0).
  float topk_threshold(const ExecSpace& exec, const vector_type& x, std::int64_t k);

  /// What is known of this call's acc: thresholds (none: nothing counted yet), how many
  /// entries lie above each, and how many per chunk (host spaces: a row per level; empty on
  /// GPUs).
  impl::CountLevels counted_levels_;
  std::int64_t counted_above_[impl::max_count_levels] = {};
  Kokkos::View<count_type**, Kokkos::LayoutRight, memory_space> counted_chunk_counts_;
  /// acc's entries above the lowest counted level, when the accumulate pass kept them.
  impl::Candidates<ExecSpace> candidates_;

  /// The level of counted_levels_ at threshold t, or -1.
  int counted_level(float t) const {
    for (int j = 0; j < counted_levels_.count; ++j) {
      if (counted_levels_.threshold[j] == t) return j;
    }
    return -1;
  }

  /// A counted level's counts per chunk, for select_above_counted(); empty on GPUs.
  Kokkos::View<const count_type*, memory_space> counted_chunks_of(int level) const {
    if (counted_chunk_counts_.extent(0) == 0) return {};
    return Kokkos::subview(counted_chunk_counts_, level, Kokkos::ALL);
  }

  /// What is known of acc above t, for a selection there: the counts per chunk of a counted
  /// level at t, with the candidates when they cover it (host spaces).
  impl::KnownAbove<ExecSpace> known_above(float t) const {
    impl::KnownAbove<ExecSpace> known;
    const int level = counted_level(t);
    if (level < 0) return known;
    known.chunk_counts = counted_chunks_of(level);
    if (known.chunk_counts.extent(0) != 0 && candidates_.cover(t)) known.candidates = &candidates_;
    return known;
  }

  Algorithm algorithm_;
  Communicator comm_;
  std::int64_t n_;
  std::int64_t k_;
  Options options_;
  Layout layout_;
  vector_type residual_;
  vector_type acc_;
  ReduceStats stats_;
  std::int64_t iteration_ = 0;
  KthLargestWorkspace<ExecSpace> kth_workspace_;

 private:
  friend struct impl::HandleSerial<ExecSpace>;

  /// Runs `body`, part of a collective call; if it throws on this rank, the job ends through
  /// impl::abort_after_local_failure, since the other ranks may already wait inside MPI.
  template <class Body>
  void run_or_abort(std::int64_t call, Body&& body);

  /// The body of reduce(), on the thread that works the queue.
  void reduce_now(const ExecSpace& exec, const const_vector_type& grad, const vector_type& out);

  /// stats_.segments from `out`: one count of non-zeros per segment of the layout.
  void count_segment_nonzeros(const ExecSpace& exec, const vector_type& out);

  /// Communicator::next_serial() of the handle, the same on every rank (set by
  /// make_sparse_allreduce): calls check it to detect ranks that launch in different orders.
  std::int64_t serial_ = 0;
  vector_type last_out_;
  vector_type ring_received_{"OkTopk::SparseAllreduce::ring_received", 0};
  std::string failed_phase_;  // set by PhaseTimer when a failure leaves a phase
};

// ---- implementation ----------------------------------------------------------------------

template <class ExecSpace>
SparseAllreduce<ExecSpace>::SparseAllreduce(const ExecSpace& exec, Algorithm algorithm,
                                            const Communicator& comm, std::int64_t n,
                                            const Options& options, const Layout& layout)
    : algorithm_(algorithm),
      comm_(comm),
      n_(n),
      k_(static_cast<std::int64_t>(std::floor(options.density * static_cast<double>(n)))),
      options_(options),
      layout_(layout),
      residual_(Kokkos::view_alloc(exec, "OkTopk::SparseAllreduce::residual"),
                static_cast<std::size_t>(n)),
      acc_(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "OkTopk::SparseAllreduce::acc"),
           static_cast<std::size_t>(n)),
      kth_workspace_(exec) {
  if (k_ > n_) k_ = n_;
  impl::fence(exec, "OkTopk::SparseAllreduce: buffers ready");
}

template <class ExecSpace>
void SparseAllreduce<ExecSpace>::reduce(const ExecSpace& exec, const const_vector_type& grad,
                                        const vector_type& out) {
  // A queued call that reduces (the C interface's) is already where the queue is worked.
  if (impl::in_progress_task()) {
    reduce_now(exec, grad, out);
  } else {
    reduce_async(exec, grad, out).wait();
  }
}

template <class ExecSpace>
ReduceRequest SparseAllreduce<ExecSpace>::reduce_async(const ExecSpace& exec,
                                                       const const_vector_type& grad,
                                                       const vector_type& out) {
  return ReduceRequest(impl::enqueue([this, exec, grad, out] { reduce_now(exec, grad, out); }));
}

template <class ExecSpace>
impl::AccumulateCounts SparseAllreduce<ExecSpace>::accumulate_into_acc(
    const ExecSpace& exec, const const_vector_type& grad, const impl::CountLevels& levels) {
  if constexpr (impl::runs_on_host_v<ExecSpace>) {
    // Room for a whole chunk (k above about n/8) would keep as much as acc itself, twice its
    // memory, to save nothing: such handles read acc.
    const bool worth_keeping =
        impl::candidate_capacity<ExecSpace>(n_, k_) < impl::chunk_length_v<ExecSpace>;
    if (levels.count > 0 && worth_keeping) {
      const std::int64_t chunks = impl::chunk_count<ExecSpace>(n_);
      if (candidates_.capacity == 0) {
        candidates_.capacity = impl::candidate_capacity<ExecSpace>(n_, k_);
        const auto kept = static_cast<std::size_t>(chunks * candidates_.stride());
        candidates_.indices = decltype(candidates_.indices)(
            Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "OkTopk::Candidates::indices"),
            kept);
        candidates_.values = decltype(candidates_.values)(
            Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "OkTopk::Candidates::values"),
            kept);
        candidates_.counts = decltype(candidates_.counts)(
            Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "OkTopk::Candidates::counts"),
            static_cast<std::size_t>(chunks));
      }
      return impl::accumulate_keeping_candidates(exec, residual_, grad, acc_, levels,
                                                 counted_chunk_counts_, candidates_);
    }
  }
  return impl::accumulate_counting(exec, residual_, grad, acc_, levels, counted_chunk_counts_);
}

template <class ExecSpace>
void SparseAllreduce<ExecSpace>::reduce_now(const ExecSpace& exec, const const_vector_type& grad,
                                            const vector_type& out) {
  constexpr const char* where = "oktopk::SparseAllreduce::reduce";
  impl::ScopedRegion region("OkTopk::SparseAllreduce::reduce");
  const ReduceStats previous_stats = stats_;  // restored if the call is rejected
  counted_levels_ = impl::CountLevels{};
  candidates_.threshold = std::numeric_limits<float>::quiet_NaN();
  comm_.reset_traffic();
  stats_ = ReduceStats{};
  stats_.k = k_;

  // Local problems become collective ones: every rank learns of any rank's bad input, so all
  // throw together instead of some waiting forever in the next collective. Anything else that
  // fails on some ranks only ends the job (run_or_abort): see the user guide, "Failures".
  const bool length_ok = static_cast<std::int64_t>(grad.extent(0)) == n_ &&
                         static_cast<std::int64_t>(out.extent(0)) == n_;
  std::int64_t nonfinite = 0;
  // {rank + 1 of a bad length, of a non-finite gradient, this handle's serial, minus it}: one
  // MPI_MAX also gives the smallest serial, so a mismatch of handles shows on every rank.
  std::int64_t bad_rank[4] = {0, 0, serial_, -serial_};
  const std::int64_t call = iteration_ + 1;
  // The call's input (residual + gradient) goes into acc_, checked on the way, unless the
  // method averages the gradient as it is: then the average is checked instead (below).
  const bool as_is = averages_gradient_as_is();
  run_or_abort(call, [&] {
    if (length_ok && !as_is) {
      auto timer = phase(exec, "accumulate");
      if (uses_error_feedback()) {
        impl::CountLevels levels = accumulate_count_levels();
        if (!impl::runs_on_host_v<ExecSpace> && levels.count > 1) levels.count = 1;
        if (impl::runs_on_host_v<ExecSpace> && levels.count > 0 &&
            static_cast<int>(counted_chunk_counts_.extent(0)) < levels.count) {
          counted_chunk_counts_ = Kokkos::View<count_type**, Kokkos::LayoutRight, memory_space>(
              Kokkos::view_alloc(exec, Kokkos::WithoutInitializing,
                                 "OkTopk::SparseAllreduce::counted_chunk_counts"),
              static_cast<std::size_t>(impl::max_count_levels),
              static_cast<std::size_t>(impl::chunk_count<ExecSpace>(n_)));
        }
        const auto counts = accumulate_into_acc(exec, grad, levels);
        nonfinite = counts.nonfinite;
        counted_levels_ = levels;
        for (int j = 0; j < levels.count; ++j) counted_above_[j] = counts.above[j];
      } else {
        nonfinite = impl::copy_counting_nonfinite(exec, grad, acc_);
      }
    }
    bad_rank[0] = length_ok ? 0 : comm_.rank() + 1;
    bad_rank[1] = nonfinite == 0 ? 0 : comm_.rank() + 1;
    auto timer = phase(exec, "check");
    comm_.allreduce_in_place(bad_rank, 4, MPI_MAX);
  });
  const bool same_handle = bad_rank[2] == -bad_rank[3];
  if (bad_rank[0] != 0 || bad_rank[1] != 0 || !same_handle) stats_ = previous_stats;
  OKTOPK_REQUIRE(same_handle, std::invalid_argument, where,
                 "the ranks' calls at this position belong to different handles (numbers "
                     << -bad_rank[3] << " to " << bad_rank[2] << " of their communicator; this "
                     << "rank's is " << serial_ << ", " << algorithm_ << " on n = " << n_
                     << "): launch calls in the same order on every rank");
  OKTOPK_REQUIRE(bad_rank[0] == 0, std::invalid_argument, where,
                 "grad and out must have length " << n_ << " on every rank; rank "
                                                  << bad_rank[0] - 1 << " passed "
                                                  << (comm_.rank() + 1 == bad_rank[0]
                                                          ? std::to_string(grad.extent(0)) + " and " +
                                                                std::to_string(out.extent(0))
                                                          : std::string("other lengths")));
  OKTOPK_REQUIRE(bad_rank[1] == 0, std::invalid_argument, where,
                 "the gradient (plus residual) holds NaN or Inf on rank " << bad_rank[1] - 1
                     << (comm_.rank() + 1 == bad_rank[1]
                             ? " (" + std::to_string(nonfinite) + " entries)"
                             : std::string()));

  // Non-finite averages of an as-is call, counted over all ranks: NaN or Inf in some rank's
  // gradient, or a sum that overflows. The same on every rank, so all throw below.
  std::int64_t nonfinite_averages = 0;
  run_or_abort(call, [&] {
    ++iteration_;
    stats_.iteration = iteration_;
    if (as_is) {
      nonfinite_averages = dense_step(exec, grad, out, true);
      auto timer = phase(exec, "check");
      // MPI_Allreduce leaves every rank the whole average, the ring each rank its own chunk.
      comm_.allreduce_in_place(&nonfinite_averages, 1,
                               options_.dense_allreduce == DenseAlgorithm::Ring ? MPI_SUM : MPI_MAX);
    } else if (iteration_ <= options_.warmup_iterations) {
      dense_step(exec, acc_, out, false);
      Kokkos::deep_copy(exec, residual_, 0.0f);
    } else {
      reduce_step(exec, acc_, out);
      if (uses_error_feedback()) std::swap(residual_, acc_);
    }
    for (const auto& [name, traffic] : comm_.traffic()) stats_.phases[name].traffic = traffic;
    if (!layout_.empty()) count_segment_nonzeros(exec, out);
  });
  if (nonfinite_averages != 0) {
    // Rejected, as a non-finite input is: the handle stays as it was. Which rank's gradient is
    // to blame takes one more pass and allreduce, on this error path only.
    --iteration_;
    stats_ = previous_stats;
    std::int64_t bad_input = 0;
    run_or_abort(call, [&] {
      nonfinite = impl::count_nonfinite(exec, grad);
      bad_input = nonfinite == 0 ? 0 : comm_.rank() + 1;
      comm_.allreduce_in_place(&bad_input, 1, MPI_MAX);
    });
    OKTOPK_REQUIRE(bad_input == 0, std::invalid_argument, where,
                   "the gradient holds NaN or Inf on rank " << bad_input - 1
                       << (comm_.rank() + 1 == bad_input
                               ? " (" + std::to_string(nonfinite) + " entries)"
                               : std::string()));
    OKTOPK_REQUIRE(false, std::invalid_argument, where,
                   "the sum over ranks overflows to Inf at " << nonfinite_averages
                       << " entries (every gradient is finite)");
  }
  last_out_ = out;
}

template <class ExecSpace>
void SparseAllreduce<ExecSpace>::count_segment_nonzeros(const ExecSpace& exec,
                                                        const vector_type& out) {
  stats_.segments.clear();
  stats_.segments.reserve(layout_.segments().size());
  for (const Segment& segment : layout_.segments()) {
    const auto range = Kokkos::make_pair(static_cast<std::size_t>(segment.offset),
                                         static_cast<std::size_t>(segment.offset + segment.length));
    // |x| > 0: the non-zeros (the output is finite: reduce rejects non-finite input).
    stats_.segments.push_back(
        SegmentStats{segment.name, count_above(exec, Kokkos::subview(out, range), 0.0f)});
  }
}

namespace impl {
/// make_sparse_allreduce's access to a new handle's serial.
template <class ExecSpace>
struct HandleSerial {
  static void set(SparseAllreduce<ExecSpace>& handle, std::int64_t serial) {
    handle.serial_ = serial;
  }
};
}  // namespace impl

template <class ExecSpace>
template <class Body>
void SparseAllreduce<ExecSpace>::run_or_abort(std::int64_t call, Body&& body) {
  OKTOPK_FAULT_CALL(call);
  failed_phase_.clear();
  try {
    body();
  } catch (const std::exception& e) {
    impl::abort_after_local_failure(comm_, e.what(), failed_phase_.empty() ? "other" : failed_phase_,
                                    algorithm_, call);
  } catch (...) {
    impl::abort_after_local_failure(comm_, "an exception of unknown type",
                                    failed_phase_.empty() ? "other" : failed_phase_, algorithm_,
                                    call);
  }
}

template <class ExecSpace>
void SparseAllreduce<ExecSpace>::save_state(const ExecSpace& exec, std::ostream& os) const {
  impl::ScopedRegion region("OkTopk::SparseAllreduce::save_state");
  impl::StateWriter out(os, "oktopk::SparseAllreduce::save_state");
  // Handles without a layout write the first version, byte for byte as before layouts existed.
  const bool with_layout = !layout_.empty();
  out.header(with_layout ? impl::state_format_version : impl::state_format_version_without_layout);
  impl::StateBuffer head;
  head.put_u32(static_cast<std::uint32_t>(algorithm_));
  head.put_i64(n_);
  head.put_i32(comm_.size());
  head.put_i32(comm_.rank());
  head.put_i64(options_.digest());
  head.put_i64(iteration_);
  if (with_layout) head.put_i64(layout_.digest());
  out.section("HEAD", head.bytes());
  auto host = Kokkos::create_mirror_view(Kokkos::HostSpace(), residual_);
  Kokkos::deep_copy(exec, host, residual_);
  impl::fence(exec, "OkTopk::SparseAllreduce::save_state: residual to host");
  out.section_floats("RESD", host.data(), host.extent(0));
  impl::StateBuffer method;
  save_method_state(method);
  out.section("METH", method.bytes());
}

template <class ExecSpace>
void SparseAllreduce<ExecSpace>::restore_state(const ExecSpace& exec, std::istream& is) {
  constexpr const char* where = "oktopk::SparseAllreduce::restore_state";
  impl::ScopedRegion region("OkTopk::SparseAllreduce::restore_state");
  const int P = comm_.size();
  const int me = comm_.rank();

  // 1. Parse everything into temporaries; the handle is untouched until every rank agrees.
  Kokkos::View<value_type*, Kokkos::HostSpace> residual;
  std::int64_t iteration = 0;
  std::function<void(const ExecSpace&)> install_method;
  int failure = 0;  // 0: none, 1: mismatch (invalid_argument), 2: damaged (runtime_error)
  std::string message;
  try {
    impl::StateReader in(is);
    const std::uint32_t version = in.header();
    impl::StateParser head = in.section("HEAD", "header", 64);
    const std::uint32_t algorithm = head.u32();
    const std::int64_t n = head.i64();
    const std::int32_t size = head.i32();
    const std::int32_t rank = head.i32();
    const std::int64_t digest = head.i64();
    iteration = head.i64();
    // Version 1 predates layouts: it was written by a handle without one.
    const std::int64_t layout_digest =
        version == impl::state_format_version_without_layout ? Layout().digest() : head.i64();
    head.expect_end();
    if (algorithm >= all_algorithms.size()) {
      throw impl::StateError(false, "checkpoint is corrupt: unknown algorithm number " +
                                        std::to_string(algorithm));
    }
    const auto written_for = all_algorithms[algorithm];
    if (written_for != algorithm_) {
      throw impl::StateError(true, "checkpoint was written for algorithm " +
                                       to_string(written_for) + ", this handle runs " +
                                       to_string(algorithm_));
    }
    if (n != n_) {
      throw impl::StateError(true, "checkpoint was written for n = " + std::to_string(n) +
                                       ", this handle has n = " + std::to_string(n_));
    }
    if (size != P) {
      throw impl::StateError(true, "checkpoint was written on " + std::to_string(size) +
                                       " ranks, this handle's communicator has " +
                                       std::to_string(P));
    }
    if (rank != me) {
      throw impl::StateError(true, "checkpoint was written by rank " + std::to_string(rank));
    }
    if (digest != options_.digest()) {
      throw impl::StateError(true, "checkpoint was written with other options than this "
                                   "handle's (options digest " +
                                       std::to_string(digest) + ", this handle's " +
                                       std::to_string(options_.digest()) + ")");
    }
    if (layout_digest != layout_.digest()) {
      throw impl::StateError(true, "checkpoint was written by a handle with another layout than "
                                   "this handle's (layout digest " +
                                       std::to_string(layout_digest) + ", this handle's " +
                                       std::to_string(layout_.digest()) + ")");
    }
    if (iteration < 0) {
      throw impl::StateError(false, "checkpoint is corrupt: negative call counter " +
                                        std::to_string(iteration));
    }
    residual = Kokkos::View<value_type*, Kokkos::HostSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "OkTopk::SparseAllreduce::restored_residual"),
        static_cast<std::size_t>(n_));
    in.section_floats("RESD", "residual", residual.data(), residual.extent(0));
    // Method sections are small: thresholds and P + 1 region boundaries.
    impl::StateParser method =
        in.section("METH", "method state", 4096 + 16 * static_cast<std::uint64_t>(P + 1));
    install_method = load_method_state(method);
  } catch (const impl::StateError& e) {
    failure = e.mismatch() ? 1 : 2;
    message = e.what();
  } catch (const std::exception& e) {
    failure = 2;
    message = e.what();
  }

  // 2. Agree: the first failing rank's message, or unequal call counters, throw everywhere.
  std::int64_t agreed[3] = {failure != 0 ? P - me : 0, failure != 0 ? 0 : iteration,
                            failure != 0 ? ~std::int64_t{0} : ~iteration};
  comm_.allreduce_in_place(agreed, 3, MPI_MAX);
  if (agreed[0] != 0) {
    const int root = P - static_cast<int>(agreed[0]);
    std::int64_t kind_length[2] = {failure, static_cast<std::int64_t>(message.size())};
    comm_.bcast(kind_length, 2, root);
    message.resize(static_cast<std::size_t>(kind_length[1]));
    comm_.bcast(message.data(), kind_length[1], root);
    const std::string text = std::string(where) + ": rank " + std::to_string(root) + ": " + message;
    if (kind_length[0] == 1) throw std::invalid_argument(text);
    throw std::runtime_error(text);
  }
  const std::int64_t largest = agreed[1];
  const std::int64_t smallest = ~agreed[2];
  OKTOPK_REQUIRE(smallest == largest, std::invalid_argument, where,
                 "the ranks' checkpoints were written after different numbers of calls "
                 "(smallest "
                     << smallest << ", largest " << largest << ")");

  // 3. Install.
  Kokkos::deep_copy(exec, residual_, residual);
  iteration_ = iteration;
  stats_ = ReduceStats{};
  stats_.k = k_;
  stats_.iteration = iteration_;
  last_out_ = vector_type();
  if (install_method) install_method(exec);
  impl::fence(exec, "OkTopk::SparseAllreduce::restore_state: state installed");
}

template <class ExecSpace>
template <class In>
std::int64_t SparseAllreduce<ExecSpace>::dense_average(const ExecSpace& exec, const In& in,
                                                       const vector_type& out,
                                                       bool count_nonfinite) {
  if (options_.dense_allreduce == DenseAlgorithm::Ring) {
    // The ring's count rides on a pass it makes anyway.
    const std::int64_t nonfinite = impl::ring_allreduce_average(exec, comm_, in, out, ring_received_);
    return count_nonfinite ? nonfinite : 0;
  }
  if (in.data() == out.data()) {
    impl::mpi_allreduce_in_place(exec, comm_, out, MPI_SUM);
  } else {
    // Out of place: MPI reads `in` where it lies, no copy into `out` first.
    const auto send = impl::mpi_send_view(exec, in);
    auto receive = impl::mpi_receive_view(exec, out);
    comm_.allreduce(send.data(), receive.data(), n_, MPI_SUM);
    impl::mpi_received(exec, receive, out, 0, n_);
  }
  const auto P = static_cast<float>(comm_.size());
  if (count_nonfinite) return impl::divide_counting_nonfinite(exec, out, out, P);
  impl::divide(exec, out, out, P);
  return 0;
}

template <class ExecSpace>
template <class In>
std::int64_t SparseAllreduce<ExecSpace>::dense_step(const ExecSpace& exec, const In& in,
                                                    const vector_type& out,
                                                    bool count_nonfinite) {
  stats_.dense = true;
  stats_.local_threshold = stats_.global_threshold = -std::numeric_limits<float>::infinity();
  stats_.local_selected = stats_.global_selected = n_;
  auto timer = phase(exec, "dense_allreduce");
  return dense_average(exec, in, out, count_nonfinite);
}

template <class ExecSpace>
std::int64_t SparseAllreduce<ExecSpace>::select_into(const ExecSpace& exec, const vector_type& x,
                                                     float threshold, index_vector_type& indices,
                                                     vector_type& values,
                                                     const impl::KnownAbove<ExecSpace>& known) {
  std::int64_t count = impl::select_known(exec, known, x, threshold, indices, values);
  if (count > static_cast<std::int64_t>(std::min(indices.extent(0), values.extent(0)))) {
    impl::ensure_capacity(exec, indices, count);
    impl::ensure_capacity(exec, values, count);
    count = impl::select_known(exec, known, x, threshold, indices, values);
  }
  return count;
}

template <class ExecSpace>
float SparseAllreduce<ExecSpace>::topk_threshold(const ExecSpace& exec, const vector_type& x,
                                                 std::int64_t k) {
  const auto n = static_cast<std::int64_t>(x.extent(0));
  if (k <= 0) return std::numeric_limits<float>::infinity();
  if (k >= n) return -std::numeric_limits<float>::infinity();
  return kth_largest_abs(exec, x, k + 1, kth_workspace_);
}

template <class ExecSpace>
SparseResult<typename ExecSpace::memory_space> SparseAllreduce<ExecSpace>::result(
    const ExecSpace& exec) const {
  SparseResult<memory_space> r;
  const auto capacity = static_cast<std::size_t>(last_out_.extent(0) == 0 ? 0 : stats_.global_selected + 1);
  r.indices = index_vector_type(
      Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "OkTopk::SparseResult::indices"),
      capacity);
  r.values = vector_type(
      Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "OkTopk::SparseResult::values"),
      capacity);
  r.size = select_above(exec, last_out_, 0.0f, r.indices, r.values);
  if (r.size > static_cast<std::int64_t>(capacity)) {
    impl::ensure_capacity(exec, r.indices, r.size);
    impl::ensure_capacity(exec, r.values, r.size);
    r.size = select_above(exec, last_out_, 0.0f, r.indices, r.values);
  }
  return r;
}

}  // namespace oktopk

// Compiled once, in liboktopk (src/instantiate/).
OKTOPK_IMPL_DECLARE_INSTANTIATIONS(oktopk::SparseAllreduce)
