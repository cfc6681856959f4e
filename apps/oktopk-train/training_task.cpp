// SPDX-License-Identifier: BSD-3-Clause
#include "training_task.hpp"

#include "fashion_mnist.hpp"
#include "text_corpus.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>

namespace oktopk::train {

namespace {

using HostOrder =
    Kokkos::View<const std::int64_t*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

class ClassifierTask final : public TrainingTask {
 public:
  ClassifierTask(const ExecutionSpace& exec, const std::string& model, std::uint64_t seed,
                 const std::string& data_dir, std::int64_t batch, int rank, int ranks)
      : seed_(seed), batch_(batch), rank_(rank) {
    const Dataset train_all = load_fashion_mnist(data_dir, true);
    const Dataset test_all = load_fashion_mnist(data_dir, false);
    train_ = to_device(exec, shard(train_all, rank, ranks));
    test_ = to_device(exec, shard(test_all, rank, ranks));
    samples_ = train_all.size();
    steps_ = common_steps_per_epoch(train_all.size(), ranks, batch);
    model_ = make_model<float>(model, seed);
    images_ = decltype(images_)("oktopk::train::images", batch, Dataset::pixels);
    labels_ = decltype(labels_)("oktopk::train::labels", batch);
    order_ = decltype(order_)("oktopk::train::order", train_.size());
  }

  std::string describe() const override {
    return model_->name() + " (" + std::to_string(model_->num_parameters()) + " parameters)";
  }
  Kokkos::View<float*, MemorySpace> parameters() const override { return model_->parameters(); }
  Kokkos::View<float*, MemorySpace> gradient() const override { return model_->gradient(); }
  std::vector<ParameterBlock> parameter_blocks() const override {
    return model_->parameter_blocks();
  }
  std::int64_t training_samples() const override { return samples_; }
  std::int64_t steps_per_epoch() const override { return steps_; }

  void begin_epoch(const ExecutionSpace& exec, std::int64_t epoch) override {
    // Each rank shuffles its own shard; the seed mixes in the rank so shards are not in step.
    permutation_ = epoch_permutation(train_.size(), seed_ * 1000003u + rank_, epoch);
    Kokkos::deep_copy(exec, order_, HostOrder(permutation_.data(), permutation_.size()));
  }

  double train_step(const ExecutionSpace& exec, std::int64_t step,
                    const GradientReady& /*ready: not told*/) override {
    gather_batch(exec, train_, order_, step * batch_, batch_, images_, labels_);
    return model_->forward_backward(exec, images_, labels_, model_->gradient());
  }

  double test_metric(const ExecutionSpace& exec, const Communicator& comm) override {
    // Each rank evaluates its shard of the test set; weighted by shard size. (Batches of 256
    // keep the CNN's im2col scratch near 80 MB.)
    const Evaluation local = evaluate(exec, *model_, test_, 256);
    double sums[2] = {local.accuracy * static_cast<double>(test_.size()),
                      static_cast<double>(test_.size())};
    comm.allreduce_in_place(sums, 2, MPI_SUM);
    return sums[0] / sums[1];
  }
  std::string metric_name() const override { return "test_acc"; }
  std::string format_metric(double metric) const override {
    char text[32];
    std::snprintf(text, sizeof text, "%.4f", metric);
    return text;
  }

 private:
  std::uint64_t seed_;
  std::int64_t batch_;
  int rank_;
  std::int64_t samples_ = 0;
  std::int64_t steps_ = 0;
  DeviceDataset train_;
  DeviceDataset test_;
  std::unique_ptr<Model> model_;
  Kokkos::View<float**, Kokkos::LayoutRight, MemorySpace> images_;
  Kokkos::View<int*, MemorySpace> labels_;
  Kokkos::View<std::int64_t*, MemorySpace> order_;
  std::vector<std::int64_t> permutation_;  // the host copy order_ was made from
};

class LanguageTask final : public TrainingTask {
 public:
  LanguageTask(const ExecutionSpace& exec, const LanguageTaskSettings& s, int rank, int ranks)
      : settings_(s), rank_(rank) {
    const TokenCorpus corpus = make_token_corpus(read_verses(s.text), s.shape.vocabulary);
    settings_.shape.vocabulary = corpus.vocabulary.size();
    train_words_ = static_cast<std::int64_t>(corpus.train.size());
    test_words_ = static_cast<std::int64_t>(corpus.test.size());
    train_ = to_device(exec, corpus.train, s.steps);
    test_ = to_device(exec, corpus.test, s.steps);
    if (test_.size() < 1) {
      throw std::runtime_error(s.text + ": the test verses hold fewer than " +
                               std::to_string(s.steps + 1) + " words (--bptt + 1)");
    }
    first_window_ = shard_begin(train_.size(), rank, ranks);
    windows_ = shard_size(train_.size(), rank, ranks);
    first_test_window_ = shard_begin(test_.size(), rank, ranks);
    test_windows_ = shard_size(test_.size(), rank, ranks);
    steps_ = common_steps_per_epoch(train_.size(), ranks, s.batch);
    if (steps_ < 1) throw std::runtime_error("--batch is larger than a rank's shard of the text");
    if (s.tokens_per_epoch > 0) {
      const std::int64_t per_step = static_cast<std::int64_t>(ranks) * s.batch * s.steps;
      steps_ = std::min(steps_, std::max<std::int64_t>(1, s.tokens_per_epoch / per_step));
    }
    model_ = std::make_unique<LanguageModel>(settings_.shape, s.seed);
    batch_windows_ = decltype(batch_windows_)("oktopk::train::windows", s.batch, s.steps + 1);
    order_ = decltype(order_)("oktopk::train::order", windows_);
  }

  std::string describe() const override {
    std::ostringstream os;
    os << "lstm (" << model_->num_parameters() << " parameters: vocabulary "
       << settings_.shape.vocabulary << ", embedding " << settings_.shape.embedding << ", hidden "
       << settings_.shape.hidden << ", T " << settings_.steps << ") text=" << settings_.text << " ("
       << train_words_ << " training words, " << test_words_ << " test words)";
    return os.str();
  }
  Kokkos::View<float*, MemorySpace> parameters() const override { return model_->parameters(); }
  Kokkos::View<float*, MemorySpace> gradient() const override { return model_->gradient(); }
  std::vector<ParameterBlock> parameter_blocks() const override {
    return model_->parameter_blocks();
  }
  std::int64_t training_samples() const override { return train_.size(); }
  std::int64_t steps_per_epoch() const override { return steps_; }

  void begin_epoch(const ExecutionSpace& exec, std::int64_t epoch) override {
    permutation_ = epoch_permutation(windows_, settings_.seed * 1000003u + rank_, epoch);
    Kokkos::deep_copy(exec, order_, HostOrder(permutation_.data(), permutation_.size()));
  }

  double train_step(const ExecutionSpace& exec, std::int64_t step,
                    const GradientReady& ready) override {
    gather_windows(exec, train_, order_, first_window_, step * settings_.batch, settings_.batch,
                   batch_windows_);
    return model_->forward_backward(exec, batch_windows_, model_->gradient(), ready);
  }

  double test_metric(const ExecutionSpace& exec, const Communicator& comm) override {
    // 64 windows of 20 words keep the logits (words x vocabulary) near 50 MB.
    const TextLoss local =
        evaluate_text(exec, *model_, test_, first_test_window_, test_windows_, 64);
    double sums[2] = {local.sum, static_cast<double>(local.words)};
    comm.allreduce_in_place(sums, 2, MPI_SUM);
    return std::exp(sums[0] / sums[1]);
  }
  std::string metric_name() const override { return "test_ppl"; }
  std::string format_metric(double metric) const override {
    char text[32];
    std::snprintf(text, sizeof text, "%.2f", metric);
    return text;
  }
  std::vector<std::pair<std::string, std::string>> checkpoint_settings() const override {
    return {{"--vocab", std::to_string(settings_.shape.vocabulary)},
            {"--embed", std::to_string(settings_.shape.embedding)},
            {"--hidden", std::to_string(settings_.shape.hidden)},
            {"--bptt", std::to_string(settings_.steps)},
            {"--tokens-per-epoch", std::to_string(settings_.tokens_per_epoch)}};
  }

 private:
  LanguageTaskSettings settings_;
  int rank_;
  std::int64_t train_words_ = 0;
  std::int64_t test_words_ = 0;
  DeviceTokenWindows train_;
  DeviceTokenWindows test_;
  std::int64_t first_window_ = 0;  // this rank's shard of the training windows
  std::int64_t windows_ = 0;
  std::int64_t first_test_window_ = 0;
  std::int64_t test_windows_ = 0;
  std::int64_t steps_ = 0;
  std::unique_ptr<LanguageModel> model_;
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, MemorySpace> batch_windows_;
  Kokkos::View<std::int64_t*, MemorySpace> order_;
  std::vector<std::int64_t> permutation_;
};

}  // namespace

std::unique_ptr<TrainingTask> make_classifier_task(const ExecutionSpace& exec,
                                                   const std::string& model, std::uint64_t seed,
                                                   const std::string& data_dir, std::int64_t batch,
                                                   int rank, int ranks) {
  return std::make_unique<ClassifierTask>(exec, model, seed, data_dir, batch, rank, ranks);
}

std::unique_ptr<TrainingTask> make_language_task(const ExecutionSpace& exec,
                                                 const LanguageTaskSettings& settings, int rank,
                                                 int ranks) {
  return std::make_unique<LanguageTask>(exec, settings, rank, ranks);
}

}  // namespace oktopk::train
