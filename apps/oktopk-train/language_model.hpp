// SPDX-License-Identifier: BSD-3-Clause
// oktopk-train's word-level language model: an embedding table, one LSTM layer and a dense
// softmax output over the vocabulary, trained with truncated backpropagation through time. Like
// the classifiers, every parameter lives in one flat View, so one SparseAllreduce call reduces
// the whole gradient; the embedding's part of it is non-zero only in the rows of the batch's
// words, the naturally sparse tensor of the model.
#pragma once

#include "model.hpp"

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace oktopk::train {

/// Told during a backward pass that the gradient's entries [from, n) are final. `from` falls as
/// the pass reaches earlier layers (the flat buffer holds the layers in forward order, so the
/// last layer's block, finished first, lies at its end), and a call with an unchanged `from`
/// between kernels is a chance to progress communication started on those entries.
using GradientReady = std::function<void(std::int64_t from)>;

/// \brief The sizes of a language model.
struct LanguageModelShape {
  std::int64_t vocabulary = 10000;  ///< V: words, <unk> and </s> included
  std::int64_t embedding = 64;      ///< E: the embedding's row width (the LSTM's input)
  std::int64_t hidden = 128;        ///< H: LSTM units
};

/// \brief Embedding V x E -> LSTM (H units, gates in the order input, forget, cell, output, one
/// bias) -> dense H -> V + bias -> softmax cross-entropy against the next word. The embedding
/// and the output layer are separate (untied) parameters. Parameters, in this order:
///   0.embedding.weight V x E (row w: word w), 1.lstm.weight_ih 4H x E, 1.lstm.weight_hh 4H x H,
///   1.lstm.bias 4H, 2.dense.weight V x H, 2.dense.bias V.
/// A batch is B windows of T + 1 consecutive word ids: the model reads words 0..T-1 of each and
/// predicts words 1..T. Every window starts from a zero state, so backpropagation through time
/// is truncated at the window's length.
/// Scalar is float in training; double exists for the finite-difference tests.
template <class Scalar>
class BasicLanguageModel {
 public:
  using Parameters = Kokkos::View<Scalar*, MemorySpace>;
  /// B x (T + 1) word ids, row-major: row b is one window.
  using Windows = Kokkos::View<const std::int32_t**, Kokkos::LayoutRight, MemorySpace>;

  /// Initialized from `seed` (see initialize). Throws std::invalid_argument for sizes < 1
  /// (vocabulary < 2).
  BasicLanguageModel(const LanguageModelShape& shape, std::uint64_t seed);
  BasicLanguageModel(const BasicLanguageModel&) = delete;
  BasicLanguageModel& operator=(const BasicLanguageModel&) = delete;

  const LanguageModelShape& shape() const { return shape_; }
  std::string summary() const;
  std::int64_t num_parameters() const { return num_parameters_; }
  /// The layout of parameters() and of every gradient, in order; the embedding's block has
  /// row_width E, the others 0.
  std::vector<ParameterBlock> parameter_blocks() const;
  /// The index in parameter_blocks() of the embedding table (0).
  static constexpr std::size_t embedding_block = 0;

  Parameters parameters() const { return parameters_; }
  Parameters gradient() const { return gradient_; }

  /// Every parameter from `seed` alone, from a counter-based hash of its index (the same on
  /// every rank and backend): embedding U(-0.1, 0.1), LSTM weights U(-1/sqrt(H), 1/sqrt(H)),
  /// LSTM biases 0 except the forget gate's, 1 (so the cell keeps its memory early in training),
  /// output weights Glorot-uniform, output biases 0.
  void initialize(const ExecutionSpace& exec, std::uint64_t seed);

  /// Forward and backward pass: overwrites `gradient` (num_parameters() entries) with the
  /// gradient of the loss and returns the loss, the mean cross-entropy per predicted word
  /// (B x T of them). Throws std::invalid_argument on shape mismatches or word ids outside
  /// 0..V-1.
  /// `ready`, when given, hears as the backward pass goes which entries are final
  /// (GradientReady).
  double forward_backward(const ExecutionSpace& exec, const Windows& windows,
                          const Parameters& gradient, const GradientReady& ready = {});
  /// The mean cross-entropy alone (no gradient).
  double loss(const ExecutionSpace& exec, const Windows& windows);

  // Public only because CUDA forbids extended lambdas in private member functions.
  void embed(const ExecutionSpace& exec, const Windows& windows);
  void lstm_cell_forward(const ExecutionSpace& exec, std::int64_t t);
  double cross_entropy(const ExecutionSpace& exec, const Windows& windows, bool with_gradient);
  void lstm_cell_backward(const ExecutionSpace& exec, std::int64_t t, std::int64_t steps);
  void embedding_backward(const ExecutionSpace& exec, const Windows& windows,
                          const Parameters& gradient);

 private:
  void check_windows(const ExecutionSpace& exec, const char* where, const Windows& windows) const;
  void ensure_capacity(const ExecutionSpace& exec, std::int64_t batch, std::int64_t steps);
  void forward(const ExecutionSpace& exec, const Windows& windows);

  LanguageModelShape shape_;
  std::int64_t num_parameters_ = 0;
  // Offsets of the blocks in the flat buffers.
  std::int64_t embedding_offset_ = 0;
  std::int64_t weight_ih_offset_ = 0;
  std::int64_t weight_hh_offset_ = 0;
  std::int64_t lstm_bias_offset_ = 0;
  std::int64_t output_weight_offset_ = 0;
  std::int64_t output_bias_offset_ = 0;
  Parameters parameters_;
  Parameters gradient_;

  // Activations of the last forward pass, time-major: row t * B + b is window b at time t.
  std::int64_t batch_ = 0;  // B and T of the last forward pass
  std::int64_t steps_ = 0;
  std::int64_t capacity_ = 0;                   // B x T that the buffers below hold
  Kokkos::View<Scalar*, MemorySpace> inputs_;   // (T B) x E: the embedded words
  Kokkos::View<Scalar*, MemorySpace> gates_;    // (T B) x 4H: i, f, g, o after their activations
  Kokkos::View<Scalar*, MemorySpace> cells_;    // ((T + 1) B) x H: c_0 = 0, then c_1..c_T
  Kokkos::View<Scalar*, MemorySpace> hiddens_;  // ((T + 1) B) x H: h_0 = 0, then h_1..h_T
  Kokkos::View<Scalar*, MemorySpace> logits_;   // (T B) x V, then d(loss)/d(logits) in place
  // Backward pass scratch.
  Kokkos::View<Scalar*, MemorySpace> dhiddens_;  // (T B) x H: d(loss)/d(h_t) from the output
  Kokkos::View<Scalar*, MemorySpace> dgates_;    // (T B) x 4H: before the activations
  Kokkos::View<Scalar*, MemorySpace> dinputs_;   // (T B) x E
  Kokkos::View<Scalar*, MemorySpace> dh_carry_;  // B x H: d(loss)/d(h_t) through h_{t+1}
  Kokkos::View<Scalar*, MemorySpace> dc_carry_;  // B x H: d(loss)/d(c_t) through c_{t+1}
  Kokkos::View<Scalar*, MemorySpace> ones_;
  // word * (T B) + position for every position t * B + b, sorted: the positions grouped by word
  // for the embedding's backward pass.
  Kokkos::View<std::int64_t*, MemorySpace> word_positions_;
};

using LanguageModel = BasicLanguageModel<float>;

/// \brief A part of the flat gradient for a layout-aware allreduce: `is_sparse_rows` marks an
/// embedding table whose rows of `row_width` entries a step touches only for the batch's words;
/// the rest is dense (row_width 0).
struct GradientSegment {
  std::int64_t offset = 0;
  std::int64_t length = 0;
  bool is_sparse_rows = false;
  std::int64_t row_width = 0;
  std::string name;
};

/// \brief One segment per parameter block, in order (they tile the gradient).
std::vector<GradientSegment> gradient_segments(const std::vector<ParameterBlock>& blocks);

/// \brief A token stream on the device, cut into windows of T + 1 words that overlap by one
/// word (window j holds words jT .. jT + T), so every word but the first is predicted once.
struct DeviceTokenWindows {
  Kokkos::View<std::int32_t*, MemorySpace> tokens;
  std::int64_t steps = 0;  ///< T

  /// Whole windows in the stream.
  std::int64_t size() const {
    const auto n = static_cast<std::int64_t>(tokens.extent(0));
    return n > steps ? (n - 1) / steps : 0;
  }
};

DeviceTokenWindows to_device(const ExecutionSpace& exec, const std::vector<std::int32_t>& tokens,
                             std::int64_t steps);

/// \brief Copies windows first + order(begin), ..., first + order(begin + count - 1) of `data`
/// into the first `count` rows of `windows` (count x (T + 1)); with an empty `order`, windows
/// first + begin .. first + begin + count - 1.
void gather_windows(const ExecutionSpace& exec, const DeviceTokenWindows& data,
                    const Kokkos::View<const std::int64_t*, MemorySpace>& order, std::int64_t first,
                    std::int64_t begin, std::int64_t count,
                    const Kokkos::View<std::int32_t**, Kokkos::LayoutRight, MemorySpace>& windows);

/// \brief The summed cross-entropy over windows first .. first + count - 1 of `data` and the
/// number of words predicted, in batches of at most `batch` windows.
struct TextLoss {
  double sum = 0;
  std::int64_t words = 0;
};
TextLoss evaluate_text(const ExecutionSpace& exec, LanguageModel& model,
                       const DeviceTokenWindows& data, std::int64_t first, std::int64_t count,
                       std::int64_t batch);

}  // namespace oktopk::train
