// SPDX-License-Identifier: BSD-3-Clause
#include "model.hpp"

#include "common/app_hash.hpp"
#include "common/app_kokkos_compat.hpp"
#include "fashion_mnist.hpp"
#include "layers.hpp"

#include <oktopk/error.hpp>

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace oktopk::train {

namespace {

using detail::kexp;
using detail::klog;

template <class Scalar>
using Flat = detail::Flat<Scalar>;

}  // namespace

// The kernels of the private members live here: CUDA forbids extended lambdas in private
// member functions.
namespace detail {

/// Labels outside 0..classes-1, counted so bad data is reported from the host instead of
/// aborting a kernel.
std::int64_t count_bad_labels(const ExecutionSpace& exec,
                              const Kokkos::View<const int*, MemorySpace>& labels,
                              std::int64_t classes) {
  std::int64_t bad = 0;
  Kokkos::parallel_reduce(
      "oktopk::train::count_bad_labels",
      Kokkos::RangePolicy<ExecutionSpace>(exec, 0, labels.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t i, std::int64_t& count) {
        if (labels(i) < 0 || labels(i) >= classes) ++count;
      },
      bad);
  return bad;
}

/// The mean cross-entropy of softmax(logits) against labels; writes
/// d(mean)/d(logits) into dlogits unless it is empty.
template <class Scalar>
double cross_entropy(const ExecutionSpace& exec, const Flat<const Scalar>& logits,
                     const Flat<Scalar>& dlogits,
                     const Kokkos::View<const int*, MemorySpace>& labels, std::int64_t classes) {
  const auto batch = static_cast<std::int64_t>(labels.extent(0));
  const bool with_gradient = dlogits.data() != nullptr;
  const Scalar inv_batch = Scalar(1) / static_cast<Scalar>(batch);
  double total = 0;
  Kokkos::parallel_reduce(
      "oktopk::train::cross_entropy", Kokkos::RangePolicy<ExecutionSpace>(exec, 0, batch),
      KOKKOS_LAMBDA(const std::int64_t i, double& sum) {
        const std::int64_t row = i * classes;
        // log-sum-exp shifted by the largest logit, so exp cannot overflow.
        Scalar top = logits(row);
        for (std::int64_t j = 1; j < classes; ++j)
          top = logits(row + j) > top ? logits(row + j) : top;
        Scalar s = 0;
        for (std::int64_t j = 0; j < classes; ++j) s += kexp(logits(row + j) - top);
        const Scalar log_sum = top + klog(s);
        const int label = labels(i);
        sum += static_cast<double>(log_sum - logits(row + label));
        if (with_gradient) {
          for (std::int64_t j = 0; j < classes; ++j) {
            const Scalar p = kexp(logits(row + j) - log_sum);
            dlogits(row + j) = (p - (j == label ? Scalar(1) : Scalar(0))) * inv_batch;
          }
        }
      },
      total);
  return total / static_cast<double>(batch);
}

/// Rows of logits whose first largest entry is at the label.
template <class Scalar>
std::int64_t count_correct(const ExecutionSpace& exec, const Flat<const Scalar>& logits,
                           const Kokkos::View<const int*, MemorySpace>& labels,
                           std::int64_t classes) {
  std::int64_t correct = 0;
  Kokkos::parallel_reduce(
      "oktopk::train::count_correct",
      Kokkos::RangePolicy<ExecutionSpace>(exec, 0, labels.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t i, std::int64_t& count) {
        int best = 0;
        for (int j = 1; j < classes; ++j) {
          if (logits(i * classes + j) > logits(i * classes + best)) best = j;
        }
        if (best == labels(i)) ++count;
      },
      correct);
  return correct;
}

}  // namespace detail

template <class Scalar>
BasicModel<Scalar>::BasicModel(std::string name,
                               std::vector<std::unique_ptr<detail::Layer<Scalar>>> layers)
    : name_(std::move(name)), layers_(std::move(layers)) {
  OKTOPK_REQUIRE(!layers_.empty(), std::invalid_argument, "oktopk::train::BasicModel",
                 "a model needs at least one layer");
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    OKTOPK_REQUIRE(i == 0 || layers_[i]->in_features() == layers_[i - 1]->out_features(),
                   std::invalid_argument, "oktopk::train::BasicModel",
                   "layer " << i << " (" << layers_[i]->describe() << ") takes "
                            << layers_[i]->in_features() << " features, layer " << i - 1
                            << " gives " << layers_[i - 1]->out_features());
    offsets_.push_back(num_parameters_);
    num_parameters_ += layers_[i]->num_parameters();
  }
  const ExecutionSpace exec;
  parameters_ =
      Parameters(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::train::parameters"),
                 num_parameters_);
  // Zeroed, so a caller that reads it before the first forward_backward sees no garbage.
  gradient_ = Parameters(Kokkos::view_alloc(exec, "oktopk::train::gradient"), num_parameters_);
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->bind(Flat<Scalar>(parameters_.data() + offsets_[i], layers_[i]->num_parameters()));
  }
  initialize(exec, 0);
}

template <class Scalar>
BasicModel<Scalar>::~BasicModel() = default;

template <class Scalar>
std::string BasicModel<Scalar>::summary() const {
  std::ostringstream os;
  os << name_ << ": " << num_parameters_ << " parameters\n";
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    os << "  " << layers_[i]->describe();
    if (layers_[i]->num_parameters() > 0) {
      os << " (" << layers_[i]->num_parameters() << " parameters at offset " << offsets_[i] << ")";
    }
    os << "\n";
  }
  return os.str();
}

template <class Scalar>
std::vector<ParameterBlock> BasicModel<Scalar>::parameter_blocks() const {
  std::vector<ParameterBlock> result;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    std::int64_t offset = offsets_[i];
    for (const auto& block : layers_[i]->blocks()) {
      result.push_back(
          {std::to_string(i) + "." + layers_[i]->kind() + "." + block.kind, offset, block.size});
      offset += block.size;
    }
  }
  return result;
}

template <class Scalar>
std::int64_t BasicModel<Scalar>::num_inputs() const {
  return layers_.front()->in_features();
}

template <class Scalar>
std::int64_t BasicModel<Scalar>::num_classes() const {
  return layers_.back()->out_features();
}

template <class Scalar>
void BasicModel<Scalar>::initialize(const ExecutionSpace& exec, std::uint64_t seed) {
  const Parameters params = parameters_;
  std::int64_t offset = 0;
  for (const auto& layer : layers_) {
    for (const auto& block : layer->blocks()) {
      const double bound = block.bound;
      const std::int64_t first = offset;
      Kokkos::parallel_for(
          "oktopk::train::initialize",
          Kokkos::RangePolicy<ExecutionSpace>(exec, first, first + block.size),
          KOKKOS_LAMBDA(const std::int64_t i) {
            const std::uint64_t h = ::oktopk::apps::splitmix64(
                seed ^ ::oktopk::apps::splitmix64(static_cast<std::uint64_t>(i)));
            const double u = static_cast<double>(h >> 11) * 0x1.0p-53;  // [0, 1)
            params(i) = static_cast<Scalar>(bound * (2.0 * u - 1.0));
          });
      offset += block.size;
    }
  }
}

template <class Scalar>
void BasicModel<Scalar>::check_batch(const char* where, const Images& images,
                                     const Labels* labels) const {
  OKTOPK_REQUIRE(images.extent(0) > 0 &&
                     static_cast<std::int64_t>(images.extent(1)) == num_inputs() &&
                     images.span_is_contiguous(),
                 std::invalid_argument, where,
                 "images are " << images.extent(0) << "x" << images.extent(1) << ", expected B x "
                               << num_inputs() << " with B > 0, contiguous");
  OKTOPK_REQUIRE(labels == nullptr || labels->extent(0) == images.extent(0), std::invalid_argument,
                 where, labels->extent(0) << " labels for " << images.extent(0) << " images");
}

template <class Scalar>
void BasicModel<Scalar>::ensure_batch(const ExecutionSpace& exec, std::int64_t batch) {
  if (batch <= capacity_) return;
  activations_.resize(layers_.size());
  deltas_.resize(layers_.size());
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const std::int64_t size = batch * layers_[i]->out_features();
    activations_[i] = Kokkos::View<Scalar*, MemorySpace>(
        Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::train::activations"), size);
    deltas_[i] = Kokkos::View<Scalar*, MemorySpace>(
        Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::train::deltas"), size);
  }
  capacity_ = batch;
}

template <class Scalar>
void BasicModel<Scalar>::forward(const ExecutionSpace& exec, const Images& images) {
  const auto batch = static_cast<std::int64_t>(images.extent(0));
  ensure_batch(exec, batch);
  Flat<const Scalar> in(images.data(), batch * num_inputs());
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const Flat<Scalar> out(activations_[i].data(), batch * layers_[i]->out_features());
    layers_[i]->forward(exec, batch, in, out);
    in = out;
  }
}

template <class Scalar>
double BasicModel<Scalar>::cross_entropy(const ExecutionSpace& exec, const Labels& labels,
                                         bool with_gradient) {
  const auto batch = static_cast<std::int64_t>(labels.extent(0));
  const std::int64_t classes = num_classes();
  const std::int64_t bad = detail::count_bad_labels(exec, labels, classes);
  OKTOPK_REQUIRE(bad == 0, std::invalid_argument, "oktopk::train::BasicModel::cross_entropy",
                 bad << " of " << batch << " labels are outside 0.." << classes - 1);
  return detail::cross_entropy(
      exec, Flat<const Scalar>(activations_.back().data(), batch * classes),
      with_gradient ? Flat<Scalar>(deltas_.back().data(), batch * classes) : Flat<Scalar>(), labels,
      classes);
}

template <class Scalar>
double BasicModel<Scalar>::forward_backward(const ExecutionSpace& exec, const Images& images,
                                            const Labels& labels, const Parameters& gradient) {
  constexpr const char* where = "oktopk::train::BasicModel::forward_backward";
  check_batch(where, images, &labels);
  OKTOPK_REQUIRE(static_cast<std::int64_t>(gradient.extent(0)) == num_parameters_,
                 std::invalid_argument, where,
                 "the gradient has " << gradient.extent(0) << " entries, the model "
                                     << num_parameters_ << " parameters");
  const auto batch = static_cast<std::int64_t>(images.extent(0));
  forward(exec, images);
  const double mean_loss = cross_entropy(exec, labels, true);
  for (std::size_t i = layers_.size(); i-- > 0;) {
    const Flat<const Scalar> in =
        i == 0 ? Flat<const Scalar>(images.data(), batch * num_inputs())
               : Flat<const Scalar>(activations_[i - 1].data(), batch * layers_[i]->in_features());
    const Flat<const Scalar> out(activations_[i].data(), batch * layers_[i]->out_features());
    const Flat<const Scalar> dout(deltas_[i].data(), batch * layers_[i]->out_features());
    // Nothing needs d(loss)/d(images).
    const Flat<Scalar> din =
        i == 0 ? Flat<Scalar>()
               : Flat<Scalar>(deltas_[i - 1].data(), batch * layers_[i]->in_features());
    const Flat<Scalar> grad(gradient.data() + offsets_[i], layers_[i]->num_parameters());
    layers_[i]->backward(exec, batch, in, out, dout, din, grad);
  }
  return mean_loss;
}

template <class Scalar>
double BasicModel<Scalar>::loss(const ExecutionSpace& exec, const Images& images,
                                const Labels& labels) {
  check_batch("oktopk::train::BasicModel::loss", images, &labels);
  forward(exec, images);
  return cross_entropy(exec, labels, false);
}

template <class Scalar>
void BasicModel<Scalar>::predict(const ExecutionSpace& exec, const Images& images,
                                 const Predictions& predictions) {
  check_batch("oktopk::train::BasicModel::predict", images, nullptr);
  OKTOPK_REQUIRE(predictions.extent(0) == images.extent(0), std::invalid_argument,
                 "oktopk::train::BasicModel::predict",
                 predictions.extent(0) << " predictions for " << images.extent(0) << " images");
  forward(exec, images);
  const std::int64_t classes = num_classes();
  const Flat<const Scalar> logits(activations_.back().data(), images.extent(0) * classes);
  Kokkos::parallel_for(
      "oktopk::train::predict", Kokkos::RangePolicy<ExecutionSpace>(exec, 0, images.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t i) {
        int best = 0;
        for (int j = 1; j < classes; ++j) {
          if (logits(i * classes + j) > logits(i * classes + best)) best = j;
        }
        predictions(i) = best;
      });
}

template <class Scalar>
std::int64_t BasicModel<Scalar>::count_correct(const ExecutionSpace& exec, const Labels& labels) {
  const std::int64_t classes = num_classes();
  return detail::count_correct(
      exec, Flat<const Scalar>(activations_.back().data(), labels.extent(0) * classes), labels,
      classes);
}

template <class Scalar>
Evaluation BasicModel<Scalar>::evaluate(const ExecutionSpace& exec, const Images& images,
                                        const Labels& labels) {
  check_batch("oktopk::train::BasicModel::evaluate", images, &labels);
  forward(exec, images);
  Evaluation result;
  result.loss = cross_entropy(exec, labels, false);
  result.accuracy =
      static_cast<double>(count_correct(exec, labels)) / static_cast<double>(labels.extent(0));
  return result;
}

std::vector<std::string> model_names() { return {"mlp", "cnn"}; }

template <class Scalar>
std::unique_ptr<BasicModel<Scalar>> make_model(const std::string& name, std::uint64_t seed) {
  using detail::Conv2d;
  using detail::Dense;
  using detail::MaxPool2;
  using detail::Relu;
  using detail::Shape;
  std::vector<std::unique_ptr<detail::Layer<Scalar>>> layers;
  if (name == "mlp") {
    layers.push_back(std::make_unique<Dense<Scalar>>(Dataset::pixels, 256, true));
    layers.push_back(std::make_unique<Relu<Scalar>>(256));
    layers.push_back(std::make_unique<Dense<Scalar>>(256, 128, true));
    layers.push_back(std::make_unique<Relu<Scalar>>(128));
    layers.push_back(std::make_unique<Dense<Scalar>>(128, Dataset::classes, false));
  } else if (name == "cnn") {
    const Shape image{Dataset::rows, Dataset::cols, 1};
    auto conv1 = std::make_unique<Conv2d<Scalar>>(image, 16, 5, 2);
    auto pool1 = std::make_unique<MaxPool2<Scalar>>(conv1->output_shape());
    auto conv2 = std::make_unique<Conv2d<Scalar>>(pool1->output_shape(), 32, 5, 2);
    auto pool2 = std::make_unique<MaxPool2<Scalar>>(conv2->output_shape());
    const std::int64_t c1 = conv1->out_features();
    const std::int64_t c2 = conv2->out_features();
    const std::int64_t flat = pool2->out_features();
    layers.push_back(std::move(conv1));
    layers.push_back(std::make_unique<Relu<Scalar>>(c1));
    layers.push_back(std::move(pool1));
    layers.push_back(std::move(conv2));
    layers.push_back(std::make_unique<Relu<Scalar>>(c2));
    layers.push_back(std::move(pool2));
    layers.push_back(std::make_unique<Dense<Scalar>>(flat, 128, true));
    layers.push_back(std::make_unique<Relu<Scalar>>(128));
    layers.push_back(std::make_unique<Dense<Scalar>>(128, Dataset::classes, false));
  } else {
    OKTOPK_REQUIRE(false, std::invalid_argument, "oktopk::train::make_model",
                   "unknown model '" << name << "' (known: mlp, cnn)");
  }
  auto model = std::make_unique<BasicModel<Scalar>>(name, std::move(layers));
  const ExecutionSpace exec;
  model->initialize(exec, seed);
  ::oktopk::apps::fence(exec, "oktopk::train::make_model");
  return model;
}

template <class Scalar>
void sgd_momentum_step(const ExecutionSpace& exec, const Kokkos::View<Scalar*, MemorySpace>& params,
                       const typename BasicModel<Scalar>::ConstParameters& gradient,
                       const typename BasicModel<Scalar>::Parameters& velocity, double lr,
                       double momentum, double weight_decay) {
  OKTOPK_REQUIRE(gradient.extent(0) == params.extent(0) && velocity.extent(0) == params.extent(0),
                 std::invalid_argument, "oktopk::train::sgd_momentum_step",
                 "params, gradient and velocity have " << params.extent(0) << ", "
                                                       << gradient.extent(0) << " and "
                                                       << velocity.extent(0) << " entries");
  const auto step = static_cast<Scalar>(lr);
  const auto mu = static_cast<Scalar>(momentum);
  const auto decay = static_cast<Scalar>(weight_decay);
  Kokkos::parallel_for(
      "oktopk::train::sgd_momentum_step",
      Kokkos::RangePolicy<ExecutionSpace>(exec, 0, params.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const Scalar v = mu * velocity(i) + gradient(i) + decay * params(i);
        velocity(i) = v;
        params(i) -= step * v;
      });
}

template <class Scalar>
void accumulate_velocity(const ExecutionSpace& exec,
                         const typename BasicModel<Scalar>::ConstParameters& params,
                         const typename BasicModel<Scalar>::ConstParameters& gradient,
                         const typename BasicModel<Scalar>::Parameters& velocity, double momentum,
                         double weight_decay) {
  OKTOPK_REQUIRE(gradient.extent(0) == params.extent(0) && velocity.extent(0) == params.extent(0),
                 std::invalid_argument, "oktopk::train::accumulate_velocity",
                 "params, gradient and velocity have " << params.extent(0) << ", "
                                                       << gradient.extent(0) << " and "
                                                       << velocity.extent(0) << " entries");
  const auto mu = static_cast<Scalar>(momentum);
  const auto decay = static_cast<Scalar>(weight_decay);
  Kokkos::parallel_for(
      "oktopk::train::accumulate_velocity",
      Kokkos::RangePolicy<ExecutionSpace>(exec, 0, params.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t i) {
        velocity(i) = mu * velocity(i) + gradient(i) + decay * params(i);
      });
}

template <class Scalar>
void sgd_apply(const ExecutionSpace& exec, const Kokkos::View<Scalar*, MemorySpace>& params,
               const typename BasicModel<Scalar>::ConstParameters& update, double lr) {
  OKTOPK_REQUIRE(
      update.extent(0) == params.extent(0), std::invalid_argument, "oktopk::train::sgd_apply",
      "params and update have " << params.extent(0) << " and " << update.extent(0) << " entries");
  const auto step = static_cast<Scalar>(lr);
  Kokkos::parallel_for(
      "oktopk::train::sgd_apply", Kokkos::RangePolicy<ExecutionSpace>(exec, 0, params.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t i) { params(i) -= step * update(i); });
}

void sgd_apply_sparse(const ExecutionSpace& exec, const Kokkos::View<float*, MemorySpace>& params,
                      const Kokkos::View<const std::int32_t*, MemorySpace>& indices,
                      const Kokkos::View<const float*, MemorySpace>& values, std::int64_t count,
                      double lr) {
  OKTOPK_REQUIRE(count >= 0 && count <= static_cast<std::int64_t>(indices.extent(0)) &&
                     count <= static_cast<std::int64_t>(values.extent(0)),
                 std::invalid_argument, "oktopk::train::sgd_apply_sparse",
                 count << " entries, indices and values hold " << indices.extent(0) << " and "
                       << values.extent(0));
  const auto step = static_cast<float>(lr);
  Kokkos::parallel_for(
      "oktopk::train::sgd_apply_sparse", Kokkos::RangePolicy<ExecutionSpace>(exec, 0, count),
      KOKKOS_LAMBDA(const std::int64_t j) { params(indices(j)) -= step * values(j); });
}

Evaluation evaluate(const ExecutionSpace& exec, Model& model, const DeviceDataset& data,
                    std::int64_t batch) {
  OKTOPK_REQUIRE(batch > 0 && data.size() > 0, std::invalid_argument, "oktopk::train::evaluate",
                 "batch = " << batch << ", " << data.size() << " samples");
  double loss_sum = 0;
  double correct = 0;
  for (std::int64_t begin = 0; begin < data.size(); begin += batch) {
    const std::int64_t end = std::min(begin + batch, data.size());
    const auto range = Kokkos::make_pair(begin, end);
    const Evaluation part = model.evaluate(exec, Kokkos::subview(data.images, range, Kokkos::ALL),
                                           Kokkos::subview(data.labels, range));
    loss_sum += part.loss * static_cast<double>(end - begin);
    correct += part.accuracy * static_cast<double>(end - begin);
  }
  const auto n = static_cast<double>(data.size());
  return {loss_sum / n, correct / n};
}

// Explicit instantiations: float trains, double checks gradients in the tests.
template class BasicModel<float>;
template class BasicModel<double>;
template std::unique_ptr<BasicModel<float>> make_model<float>(const std::string&, std::uint64_t);
template std::unique_ptr<BasicModel<double>> make_model<double>(const std::string&, std::uint64_t);
template void sgd_momentum_step<float>(const ExecutionSpace&,
                                       const Kokkos::View<float*, MemorySpace>&,
                                       const BasicModel<float>::ConstParameters&,
                                       const BasicModel<float>::Parameters&, double, double,
                                       double);
template void sgd_momentum_step<double>(const ExecutionSpace&,
                                        const Kokkos::View<double*, MemorySpace>&,
                                        const BasicModel<double>::ConstParameters&,
                                        const BasicModel<double>::Parameters&, double, double,
                                        double);

template void accumulate_velocity<float>(const ExecutionSpace&,
                                         const BasicModel<float>::ConstParameters&,
                                         const BasicModel<float>::ConstParameters&,
                                         const BasicModel<float>::Parameters&, double, double);
template void accumulate_velocity<double>(const ExecutionSpace&,
                                          const BasicModel<double>::ConstParameters&,
                                          const BasicModel<double>::ConstParameters&,
                                          const BasicModel<double>::Parameters&, double, double);
template void sgd_apply<float>(const ExecutionSpace&, const Kokkos::View<float*, MemorySpace>&,
                               const BasicModel<float>::ConstParameters&, double);
template void sgd_apply<double>(const ExecutionSpace&, const Kokkos::View<double*, MemorySpace>&,
                                const BasicModel<double>::ConstParameters&, double);

}  // namespace oktopk::train
