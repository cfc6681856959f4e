// SPDX-License-Identifier: BSD-3-Clause
// What oktopk-train's epoch loop needs from a model and its data, so that one loop (allreduce,
// optimizer, checkpoints, gradient dumps) trains both the Fashion-MNIST classifiers and the
// language model.
#pragma once

#include "language_model.hpp"
#include "model.hpp"

#include <oktopk/communicator.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace oktopk::train {

class TrainingTask {
 public:
  virtual ~TrainingTask() = default;
  /// "<model> (<n> parameters)" and the data, for the run's header line.
  virtual std::string describe() const = 0;
  virtual Kokkos::View<float*, MemorySpace> parameters() const = 0;
  /// The buffer train_step writes.
  virtual Kokkos::View<float*, MemorySpace> gradient() const = 0;
  virtual std::vector<ParameterBlock> parameter_blocks() const = 0;
  /// Samples (images, or windows of words) in the whole training set: a checkpoint setting.
  virtual std::int64_t training_samples() const = 0;
  /// Steps every rank can take per epoch before its shard runs out.
  virtual std::int64_t steps_per_epoch() const = 0;
  /// Before the first step of every epoch, a resumed one too: shuffles this rank's shard as a
  /// function of (seed, rank, epoch) alone.
  virtual void begin_epoch(const ExecutionSpace& exec, std::int64_t epoch) = 0;
  /// Forward and backward pass over this rank's mini-batch number `step` of the epoch: writes
  /// gradient() and returns the mini-batch's mean loss. `ready` (may be empty) hears which
  /// entries are final as the backward pass goes (GradientReady); only the language model's
  /// pass tells it.
  virtual double train_step(const ExecutionSpace& exec, std::int64_t step,
                            const GradientReady& ready) = 0;
  /// Collective: the test metric over every rank's shard of the test set.
  virtual double test_metric(const ExecutionSpace& exec, const Communicator& comm) = 0;
  /// The metric's column name, "test_acc" or "test_ppl".
  virtual std::string metric_name() const = 0;
  /// The metric as the epoch line and the final line print it.
  virtual std::string format_metric(double metric) const = 0;
  /// Settings, beyond the shared ones, that a resumed run must repeat.
  virtual std::vector<std::pair<std::string, std::string>> checkpoint_settings() const {
    return {};
  }
};

/// \brief "mlp" or "cnn" on Fashion-MNIST from `data_dir`: this rank's shard of both sets,
/// batches of `batch` images; the metric is the test accuracy.
std::unique_ptr<TrainingTask> make_classifier_task(const ExecutionSpace& exec,
                                                   const std::string& model, std::uint64_t seed,
                                                   const std::string& data_dir, std::int64_t batch,
                                                   int rank, int ranks);

/// \brief What shapes the language model's training.
struct LanguageTaskSettings {
  std::string text;                   ///< verses file (scripts/kjv-corpus.sh)
  LanguageModelShape shape;           ///< shape.vocabulary is the largest vocabulary allowed
  std::int64_t steps = 20;            ///< T: words per window (truncated BPTT length)
  std::int64_t batch = 32;            ///< windows per rank per step
  std::int64_t tokens_per_epoch = 0;  ///< words predicted per epoch, all ranks; 0: all
  std::uint64_t seed = 1;
};

/// \brief The LSTM language model on the King James Bible: the training verses' word stream cut
/// into windows (LanguageModel), each rank a contiguous shard of them, and the held-out verses
/// (every 20th) for the test perplexity, exp(mean cross-entropy per word).
std::unique_ptr<TrainingTask> make_language_task(const ExecutionSpace& exec,
                                                 const LanguageTaskSettings& settings, int rank,
                                                 int ranks);

}  // namespace oktopk::train
