// SPDX-License-Identifier: BSD-3-Clause
// The small networks oktopk-train trains: a sequence of layers whose parameters all live in one
// flat View, so one call hands the whole gradient to SparseAllreduce.
#pragma once

#include "spaces.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace oktopk::train {

struct DeviceDataset;

namespace detail {
template <class Scalar>
class Layer;
}  // namespace detail

/// \brief Where one layer's weights or biases lie in the flat parameter buffer.
struct ParameterBlock {
  std::string name;  ///< "<layer index>.<kind>.weight" or ".bias", e.g. "0.conv.weight"
  std::int64_t offset;
  std::int64_t size;
  /// 0 for a dense block. For an embedding table: its row width; a step's gradient is then
  /// non-zero only in the rows of the words in the batch.
  std::int64_t row_width = 0;
};

/// \brief Mean cross-entropy and fraction classified correctly.
struct Evaluation {
  double loss = 0;
  double accuracy = 0;
};

/// \brief A feed-forward classifier with softmax cross-entropy loss. Every parameter is an
/// entry of parameters(); the layers see unmanaged slices of it. Scalar is float in training;
/// double exists so the tests can check gradients against finite differences without float
/// rounding swamping the differences.
template <class Scalar>
class BasicModel {
 public:
  using Parameters = Kokkos::View<Scalar*, MemorySpace>;
  using ConstParameters = Kokkos::View<const Scalar*, MemorySpace>;
  /// One sample per row, 28 x 28 = 784 pixels row by row.
  using Images = Kokkos::View<const Scalar**, Kokkos::LayoutRight, MemorySpace>;
  using Labels = Kokkos::View<const int*, MemorySpace>;
  using Predictions = Kokkos::View<int*, MemorySpace>;

  BasicModel(std::string name, std::vector<std::unique_ptr<detail::Layer<Scalar>>> layers);
  ~BasicModel();
  BasicModel(const BasicModel&) = delete;
  BasicModel& operator=(const BasicModel&) = delete;

  const std::string& name() const { return name_; }
  /// One line per layer, with its shapes and parameter count.
  std::string summary() const;
  std::int64_t num_parameters() const { return num_parameters_; }
  /// The layout of parameters() (and of every gradient), in order.
  std::vector<ParameterBlock> parameter_blocks() const;
  std::int64_t num_inputs() const;
  std::int64_t num_classes() const;

  /// All parameters; the optimizer updates them in place.
  Parameters parameters() const { return parameters_; }
  /// A gradient buffer of num_parameters() entries owned by the model, for callers that do not
  /// keep their own.
  Parameters gradient() const { return gradient_; }

  /// Sets every parameter from `seed` alone (He-uniform weights for layers followed by ReLU,
  /// Glorot-uniform for the output layer, zero biases), drawn from a counter-based hash of the
  /// parameter's index: the same values on every rank, backend and thread count.
  void initialize(const ExecutionSpace& exec, std::uint64_t seed);

  /// Forward and backward pass over a mini-batch: writes d(loss)/d(parameters) into `gradient`
  /// (num_parameters() entries, every one overwritten) and returns the loss, the mean
  /// cross-entropy over the batch. Throws std::invalid_argument on shape mismatches or labels
  /// outside 0..num_classes()-1.
  double forward_backward(const ExecutionSpace& exec, const Images& images, const Labels& labels,
                          const Parameters& gradient);
  /// The mean cross-entropy alone (no gradient).
  double loss(const ExecutionSpace& exec, const Images& images, const Labels& labels);
  /// The most likely class of each image.
  void predict(const ExecutionSpace& exec, const Images& images, const Predictions& predictions);
  /// Mean loss and accuracy over a batch, from one forward pass.
  Evaluation evaluate(const ExecutionSpace& exec, const Images& images, const Labels& labels);

 private:
  void ensure_batch(const ExecutionSpace& exec, std::int64_t batch);
  void forward(const ExecutionSpace& exec, const Images& images);
  double cross_entropy(const ExecutionSpace& exec, const Labels& labels, bool with_gradient);
  std::int64_t count_correct(const ExecutionSpace& exec, const Labels& labels);
  void check_batch(const char* where, const Images& images, const Labels* labels) const;

  std::string name_;
  std::vector<std::unique_ptr<detail::Layer<Scalar>>> layers_;
  std::vector<std::int64_t> offsets_;  // layer i's parameters start at offsets_[i]
  std::int64_t num_parameters_ = 0;
  Parameters parameters_;
  Parameters gradient_;
  std::int64_t capacity_ = 0;  // the batch size the activation buffers hold
  std::vector<Kokkos::View<Scalar*, MemorySpace>> activations_;  // output of layer i, batch-major
  std::vector<Kokkos::View<Scalar*, MemorySpace>> deltas_;       // d(loss)/d(output of layer i)
};

using Model = BasicModel<float>;

/// \brief The model called `name`, initialized from `seed`:
///   "mlp": 784 -> 256 -> ReLU -> 128 -> ReLU -> 10 (235,146 parameters).
///   "cnn": conv 5x5 1->16 (pad 2) -> ReLU -> maxpool 2 -> conv 5x5 16->32 (pad 2) -> ReLU ->
///          maxpool 2 -> dense 1568 -> 128 -> ReLU -> 10 (215,370 parameters). The hidden dense
///          layer costs little time (the convolutions dominate) and is what lifts test accuracy
///          past 0.90 within four epochs of SGD; without it the same schedule levels off near 0.89.
/// Throws std::invalid_argument for any other name.
template <class Scalar = float>
std::unique_ptr<BasicModel<Scalar>> make_model(const std::string& name, std::uint64_t seed);

/// \brief The model names make_model accepts.
std::vector<std::string> model_names();

/// \brief SGD with momentum, as PyTorch does it: v = momentum v + g + weight_decay p, p -= lr v.
/// `velocity` starts at zero and is the caller's, one entry per parameter.
/// Scalar is deduced from `params` alone, so a non-const gradient View converts.
template <class Scalar>
void sgd_momentum_step(const ExecutionSpace& exec, const Kokkos::View<Scalar*, MemorySpace>& params,
                       const typename BasicModel<Scalar>::ConstParameters& gradient,
                       const typename BasicModel<Scalar>::Parameters& velocity, double lr,
                       double momentum, double weight_decay = 0.0);

/// \brief The velocity half of SGD with momentum, kept per rank before the allreduce
/// (momentum correction, Lin et al., "Deep Gradient Compression", ICLR'18):
/// velocity = momentum velocity + gradient + weight_decay params. The caller averages
/// `velocity` over the ranks and applies the average with sgd_apply. Through a sparse
/// allreduce's error feedback, the residual then accumulates velocity, so an entry held back for
/// several steps arrives with the momentum it would have had, rather than as a gradient sum that
/// momentum applied after the allreduce scales by 1/(1 - momentum) only from its arrival on. For
/// an exact (dense) average the two orders give the same update.
template <class Scalar>
void accumulate_velocity(const ExecutionSpace& exec,
                         const typename BasicModel<Scalar>::ConstParameters& params,
                         const typename BasicModel<Scalar>::ConstParameters& gradient,
                         const typename BasicModel<Scalar>::Parameters& velocity, double momentum,
                         double weight_decay);

/// \brief params -= lr update.
template <class Scalar>
void sgd_apply(const ExecutionSpace& exec, const Kokkos::View<Scalar*, MemorySpace>& params,
               const typename BasicModel<Scalar>::ConstParameters& update, double lr);

/// \brief params(indices(j)) -= lr values(j) for j < count: sgd_apply of an update that is zero
/// but at `count` distinct indices (a sparse allreduce's reduce_sparse), touching only those.
void sgd_apply_sparse(const ExecutionSpace& exec, const Kokkos::View<float*, MemorySpace>& params,
                      const Kokkos::View<const std::int32_t*, MemorySpace>& indices,
                      const Kokkos::View<const float*, MemorySpace>& values, std::int64_t count,
                      double lr);

/// \brief Mean loss and accuracy of `model` over all of `data`, in batches of at most `batch`.
Evaluation evaluate(const ExecutionSpace& exec, Model& model, const DeviceDataset& data,
                    std::int64_t batch);

}  // namespace oktopk::train
