// SPDX-License-Identifier: BSD-3-Clause
// The layers of oktopk-train's models. Activations are batch-major and, for images, NHWC
// (sample, row, column, channel): then a convolution is one gemm of the im2col matrix, whose rows
// are the (sample, output pixel) pairs, with the filters, and its output is NHWC again.
// Each layer sees its parameters and its slice of the gradient as unmanaged Views into the
// model's flat buffers.
#pragma once

#include "common/app_kokkos_compat.hpp"
#include "spaces.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace oktopk::train::detail {

template <class T>
KOKKOS_INLINE_FUNCTION T kexp(T x) {
  return apps::kmath::exp(x);
}

template <class T>
KOKKOS_INLINE_FUNCTION T klog(T x) {
  return apps::kmath::log(x);
}

template <class T>
KOKKOS_INLINE_FUNCTION T ktanh(T x) {
  return apps::kmath::tanh(x);
}

template <class Scalar>
using Flat = Kokkos::View<Scalar*, MemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
template <class Scalar>
using Matrix = Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace,
                            Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// A rows x cols row-major matrix over `data` (LayoutRight, so BLAS sees it as is).
template <class Scalar>
Matrix<Scalar> matrix(Scalar* data, std::int64_t rows, std::int64_t cols) {
  return Matrix<Scalar>(data, rows, cols);
}

/// C = alpha op(A) op(B) + beta C, ordered on `exec` (apps::gemm_on: on the instance with Kokkos
/// Kernels 4, between fences with 3.x).
template <class Scalar>
void gemm(const ExecutionSpace& exec, const char* trans_a, const char* trans_b, Scalar alpha,
          const Matrix<const Scalar>& a, const Matrix<const Scalar>& b, Scalar beta,
          const Matrix<Scalar>& c) {
  ::oktopk::apps::gemm_on(exec, trans_a, trans_b, alpha, a, b, beta, c);
}

/// A buffer that only grows, allocated uninitialized. The label is a std::string because
/// view_alloc takes a const char* for a pointer to wrap.
template <class Scalar>
void ensure_size(const ExecutionSpace& exec, Kokkos::View<Scalar*, MemorySpace>& buffer,
                 std::int64_t size, const std::string& label) {
  if (static_cast<std::int64_t>(buffer.extent(0)) >= size) return;
  buffer = Kokkos::View<Scalar*, MemorySpace>(
      Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, label), size);
}

/// A vector of ones: column sums (bias gradients) are a gemm with it, which is as fast as BLAS
/// and needs no atomics.
template <class Scalar>
void ensure_ones(const ExecutionSpace& exec, Kokkos::View<Scalar*, MemorySpace>& ones,
                 std::int64_t size, const std::string& label) {
  if (static_cast<std::int64_t>(ones.extent(0)) >= size) return;
  ones = Kokkos::View<Scalar*, MemorySpace>(
      Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, label), size);
  Kokkos::deep_copy(exec, ones, Scalar(1));
}

template <class Scalar>
class Layer {
 public:
  /// A run of parameters drawn from U(-bound, bound) (bound 0: zeros).
  struct Block {
    const char* kind;  // "weight" or "bias"
    std::int64_t size;
    double bound;
  };

  virtual ~Layer() = default;
  virtual std::string describe() const = 0;
  /// A short name for parameter block names: "dense", "conv", ...
  virtual const char* kind() const = 0;
  /// Per sample.
  virtual std::int64_t in_features() const = 0;
  virtual std::int64_t out_features() const = 0;
  /// This layer's parameters, in the order they lie in the flat buffer.
  virtual std::vector<Block> blocks() const { return {}; }
  std::int64_t num_parameters() const {
    std::int64_t n = 0;
    for (const Block& b : blocks()) n += b.size;
    return n;
  }
  /// `params` is this layer's slice of the model's parameters.
  virtual void bind(const Flat<Scalar>& /*params*/) {}
  virtual void forward(const ExecutionSpace& exec, std::int64_t batch, const Flat<const Scalar>& in,
                       const Flat<Scalar>& out) = 0;
  /// Writes d(loss)/d(in) into `din` unless it is empty, and overwrites `grad`, this layer's slice
  /// of the gradient. `in` and `out` are what forward() last saw and wrote.
  virtual void backward(const ExecutionSpace& exec, std::int64_t batch,
                        const Flat<const Scalar>& in, const Flat<const Scalar>& out,
                        const Flat<const Scalar>& dout, const Flat<Scalar>& din,
                        const Flat<Scalar>& grad) = 0;
};

/// out = in W^T + b, W: outputs x inputs.
template <class Scalar>
class Dense final : public Layer<Scalar> {
 public:
  /// `relu_follows` picks He initialization (for a ReLU next) or Glorot (for the logits).
  Dense(std::int64_t inputs, std::int64_t outputs, bool relu_follows)
      : inputs_(inputs), outputs_(outputs), relu_follows_(relu_follows) {}

  std::string describe() const override {
    std::ostringstream os;
    os << "dense " << inputs_ << " -> " << outputs_;
    return os.str();
  }
  const char* kind() const override { return "dense"; }
  std::int64_t in_features() const override { return inputs_; }
  std::int64_t out_features() const override { return outputs_; }
  std::vector<typename Layer<Scalar>::Block> blocks() const override {
    const double fan_in = static_cast<double>(inputs_);
    const double bound = relu_follows_ ? std::sqrt(6.0 / fan_in)
                                       : std::sqrt(6.0 / (fan_in + static_cast<double>(outputs_)));
    return {{"weight", outputs_ * inputs_, bound}, {"bias", outputs_, 0.0}};
  }
  void bind(const Flat<Scalar>& params) override {
    weights_ = params.data();
    bias_ = params.data() + outputs_ * inputs_;
  }

  void forward(const ExecutionSpace& exec, std::int64_t batch, const Flat<const Scalar>& in,
               const Flat<Scalar>& out) override {
    const Matrix<Scalar> y = matrix(out.data(), batch, outputs_);
    const Flat<const Scalar> bias(bias_, outputs_);
    Kokkos::parallel_for(
        "oktopk::train::Dense::broadcast_bias",
        Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(exec, {0, 0}, {batch, outputs_}),
        KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t j) { y(i, j) = bias(j); });
    gemm<Scalar>(exec, "N", "T", Scalar(1), matrix(in.data(), batch, inputs_),
                 matrix<const Scalar>(weights_, outputs_, inputs_), Scalar(1), y);
  }

  void backward(const ExecutionSpace& exec, std::int64_t batch, const Flat<const Scalar>& in,
                const Flat<const Scalar>& /*out*/, const Flat<const Scalar>& dout,
                const Flat<Scalar>& din, const Flat<Scalar>& grad) override {
    const Matrix<const Scalar> dy = matrix(dout.data(), batch, outputs_);
    // dW = dY^T X, db = dY^T 1, dX = dY W.
    gemm<Scalar>(exec, "T", "N", Scalar(1), dy, matrix(in.data(), batch, inputs_), Scalar(0),
                 matrix(grad.data(), outputs_, inputs_));
    ensure_ones(exec, ones_, batch, "oktopk::train::Dense::ones");
    gemm<Scalar>(exec, "T", "N", Scalar(1), dy, matrix<const Scalar>(ones_.data(), batch, 1),
                 Scalar(0), matrix(grad.data() + outputs_ * inputs_, outputs_, 1));
    if (din.data() != nullptr) {
      gemm<Scalar>(exec, "N", "N", Scalar(1), dy, matrix<const Scalar>(weights_, outputs_, inputs_),
                   Scalar(0), matrix(din.data(), batch, inputs_));
    }
  }

 private:
  std::int64_t inputs_;
  std::int64_t outputs_;
  bool relu_follows_;
  const Scalar* weights_ = nullptr;
  const Scalar* bias_ = nullptr;
  Kokkos::View<Scalar*, MemorySpace> ones_;
};

template <class Scalar>
class Relu final : public Layer<Scalar> {
 public:
  explicit Relu(std::int64_t features) : features_(features) {}
  std::string describe() const override { return "relu"; }
  const char* kind() const override { return "relu"; }
  std::int64_t in_features() const override { return features_; }
  std::int64_t out_features() const override { return features_; }

  void forward(const ExecutionSpace& exec, std::int64_t batch, const Flat<const Scalar>& in,
               const Flat<Scalar>& out) override {
    Kokkos::parallel_for(
        "oktopk::train::Relu::forward",
        Kokkos::RangePolicy<ExecutionSpace>(exec, 0, batch * features_),
        KOKKOS_LAMBDA(const std::int64_t i) { out(i) = in(i) > Scalar(0) ? in(i) : Scalar(0); });
  }

  void backward(const ExecutionSpace& exec, std::int64_t batch, const Flat<const Scalar>& /*in*/,
                const Flat<const Scalar>& out, const Flat<const Scalar>& dout,
                const Flat<Scalar>& din, const Flat<Scalar>& /*grad*/) override {
    if (din.data() == nullptr) return;
    Kokkos::parallel_for(
        "oktopk::train::Relu::backward",
        Kokkos::RangePolicy<ExecutionSpace>(exec, 0, batch * features_),
        KOKKOS_LAMBDA(const std::int64_t i) { din(i) = out(i) > Scalar(0) ? dout(i) : Scalar(0); });
  }

 private:
  std::int64_t features_;
};

/// Image geometry of an NHWC activation.
struct Shape {
  std::int64_t height;
  std::int64_t width;
  std::int64_t channels;
  KOKKOS_INLINE_FUNCTION std::int64_t size() const { return height * width * channels; }
};

/// Square k x k convolution, stride 1, zero padding `pad`, via im2col + gemm.
template <class Scalar>
class Conv2d final : public Layer<Scalar> {
 public:
  Conv2d(Shape in, std::int64_t filters, std::int64_t kernel, std::int64_t pad)
      : in_(in),
        out_{in.height + 2 * pad - kernel + 1, in.width + 2 * pad - kernel + 1, filters},
        kernel_(kernel),
        pad_(pad),
        patch_(kernel * kernel * in.channels) {}

  Shape output_shape() const { return out_; }
  std::string describe() const override {
    std::ostringstream os;
    os << "conv " << kernel_ << "x" << kernel_ << " pad " << pad_ << ": " << in_.height << "x"
       << in_.width << "x" << in_.channels << " -> " << out_.height << "x" << out_.width << "x"
       << out_.channels;
    return os.str();
  }
  const char* kind() const override { return "conv"; }
  std::int64_t in_features() const override { return in_.size(); }
  std::int64_t out_features() const override { return out_.size(); }
  std::vector<typename Layer<Scalar>::Block> blocks() const override {
    // Every convolution here is followed by a ReLU: He initialization over the patch.
    return {{"weight", out_.channels * patch_, std::sqrt(6.0 / static_cast<double>(patch_))},
            {"bias", out_.channels, 0.0}};
  }
  void bind(const Flat<Scalar>& params) override {
    weights_ = params.data();
    bias_ = params.data() + out_.channels * patch_;
  }

  void forward(const ExecutionSpace& exec, std::int64_t batch, const Flat<const Scalar>& in,
               const Flat<Scalar>& out) override {
    const std::int64_t pixels = batch * out_.height * out_.width;
    ensure_size(exec, columns_, pixels * patch_, "oktopk::train::Conv2d::columns");
    im2col(exec, batch, in);
    const Matrix<Scalar> y = matrix(out.data(), pixels, out_.channels);
    const Flat<const Scalar> bias(bias_, out_.channels);
    Kokkos::parallel_for(
        "oktopk::train::Conv2d::broadcast_bias",
        Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(exec, {0, 0},
                                                               {pixels, out_.channels}),
        KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t j) { y(i, j) = bias(j); });
    gemm<Scalar>(exec, "N", "T", Scalar(1), matrix<const Scalar>(columns_.data(), pixels, patch_),
                 matrix<const Scalar>(weights_, out_.channels, patch_), Scalar(1), y);
  }

  /// Needs the im2col matrix of the forward pass just before it, which it then overwrites.
  void backward(const ExecutionSpace& exec, std::int64_t batch, const Flat<const Scalar>& /*in*/,
                const Flat<const Scalar>& /*out*/, const Flat<const Scalar>& dout,
                const Flat<Scalar>& din, const Flat<Scalar>& grad) override {
    const std::int64_t pixels = batch * out_.height * out_.width;
    const Matrix<const Scalar> dy = matrix(dout.data(), pixels, out_.channels);
    const Matrix<Scalar> columns = matrix(columns_.data(), pixels, patch_);
    // dW = dY^T columns, db = dY^T 1, d(columns) = dY W, then col2im sums the patches back.
    gemm<Scalar>(exec, "T", "N", Scalar(1), dy, Matrix<const Scalar>(columns), Scalar(0),
                 matrix(grad.data(), out_.channels, patch_));
    ensure_ones(exec, ones_, pixels, "oktopk::train::Conv2d::ones");
    gemm<Scalar>(exec, "T", "N", Scalar(1), dy, matrix<const Scalar>(ones_.data(), pixels, 1),
                 Scalar(0), matrix(grad.data() + out_.channels * patch_, out_.channels, 1));
    if (din.data() == nullptr) return;
    gemm<Scalar>(exec, "N", "N", Scalar(1), dy,
                 matrix<const Scalar>(weights_, out_.channels, patch_), Scalar(0), columns);
    col2im(exec, batch, din);
  }

  // Public only because CUDA forbids extended lambdas in private member functions.
  // The kernels below iterate over multi-dimensional ranges: decoding a flat index costs a
  // 64-bit division per coordinate and made im2col two thirds of a CNN step on the host.
  void im2col(const ExecutionSpace& exec, std::int64_t batch, const Flat<const Scalar>& in) {
    const Shape is = in_;
    const Shape os = out_;
    const std::int64_t k = kernel_;
    const std::int64_t pad = pad_;
    const std::int64_t patch = patch_;
    const Flat<Scalar> columns(columns_.data(), batch * os.height * os.width * patch);
    // One work item per (output pixel, kernel row): it writes k x channels consecutive entries
    // of that pixel's row of the columns matrix.
    Kokkos::parallel_for(
        "oktopk::train::Conv2d::im2col",
        Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<4>>(exec, {0, 0, 0, 0},
                                                               {batch, os.height, os.width, k}),
        KOKKOS_LAMBDA(const std::int64_t n, const std::int64_t oy, const std::int64_t ox,
                      const std::int64_t ky) {
          const std::int64_t row = (n * os.height + oy) * os.width + ox;
          Scalar* out = &columns(row * patch + ky * k * is.channels);
          const std::int64_t iy = oy + ky - pad;
          for (std::int64_t kx = 0; kx < k; ++kx) {
            const std::int64_t ix = ox + kx - pad;
            const bool inside = iy >= 0 && iy < is.height && ix >= 0 && ix < is.width;
            const std::int64_t base = ((n * is.height + iy) * is.width + ix) * is.channels;
            for (std::int64_t c = 0; c < is.channels; ++c) {
              out[kx * is.channels + c] = inside ? in(base + c) : Scalar(0);
            }
          }
        });
  }

  /// The adjoint of im2col as a gather: each input entry sums the patch entries it was copied
  /// to, so no two work items write the same place (no atomics).
  void col2im(const ExecutionSpace& exec, std::int64_t batch, const Flat<Scalar>& din) {
    const Shape is = in_;
    const Shape os = out_;
    const std::int64_t k = kernel_;
    const std::int64_t pad = pad_;
    const std::int64_t patch = patch_;
    const Flat<const Scalar> columns(columns_.data(), batch * os.height * os.width * patch);
    Kokkos::parallel_for(
        "oktopk::train::Conv2d::col2im",
        Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<4>>(
            exec, {0, 0, 0, 0}, {batch, is.height, is.width, is.channels}),
        KOKKOS_LAMBDA(const std::int64_t n, const std::int64_t iy, const std::int64_t ix,
                      const std::int64_t c) {
          Scalar sum = 0;
          for (std::int64_t ky = 0; ky < k; ++ky) {
            const std::int64_t oy = iy + pad - ky;
            if (oy < 0 || oy >= os.height) continue;
            for (std::int64_t kx = 0; kx < k; ++kx) {
              const std::int64_t ox = ix + pad - kx;
              if (ox < 0 || ox >= os.width) continue;
              const std::int64_t row = (n * os.height + oy) * os.width + ox;
              sum += columns(row * patch + (ky * k + kx) * is.channels + c);
            }
          }
          din(((n * is.height + iy) * is.width + ix) * is.channels + c) = sum;
        });
  }

 private:
  Shape in_;
  Shape out_;
  std::int64_t kernel_;
  std::int64_t pad_;
  std::int64_t patch_;  // entries per im2col row: kernel x kernel x input channels
  const Scalar* weights_ = nullptr;
  const Scalar* bias_ = nullptr;
  Kokkos::View<Scalar*, MemorySpace> columns_;
  Kokkos::View<Scalar*, MemorySpace> ones_;
};

/// 2 x 2 max pooling, stride 2 (odd trailing rows and columns are dropped).
template <class Scalar>
class MaxPool2 final : public Layer<Scalar> {
 public:
  explicit MaxPool2(Shape in) : in_(in), out_{in.height / 2, in.width / 2, in.channels} {}

  Shape output_shape() const { return out_; }
  std::string describe() const override { return "maxpool 2x2"; }
  const char* kind() const override { return "maxpool"; }
  std::int64_t in_features() const override { return in_.size(); }
  std::int64_t out_features() const override { return out_.size(); }

  void forward(const ExecutionSpace& exec, std::int64_t batch, const Flat<const Scalar>& in,
               const Flat<Scalar>& out) override {
    const Shape is = in_;
    const Shape os = out_;
    Kokkos::parallel_for(
        "oktopk::train::MaxPool2::forward",
        Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<4>>(
            exec, {0, 0, 0, 0}, {batch, os.height, os.width, os.channels}),
        KOKKOS_LAMBDA(const std::int64_t n, const std::int64_t oy, const std::int64_t ox,
                      const std::int64_t c) {
          const std::int64_t o = ((n * os.height + oy) * os.width + ox) * os.channels + c;
          out(o) = in(first_max(is, n, oy, ox, c, in));
        });
  }

  /// The gradient goes to the first maximum of each window (the one forward() picked); the
  /// windows do not overlap, so each work item writes its own four inputs.
  void backward(const ExecutionSpace& exec, std::int64_t batch, const Flat<const Scalar>& in,
                const Flat<const Scalar>& /*out*/, const Flat<const Scalar>& dout,
                const Flat<Scalar>& din, const Flat<Scalar>& /*grad*/) override {
    if (din.data() == nullptr) return;
    const Shape is = in_;
    const Shape os = out_;
    // Odd trailing rows or columns belong to no window and get no gradient.
    if (is.height % 2 != 0 || is.width % 2 != 0) Kokkos::deep_copy(exec, din, Scalar(0));
    Kokkos::parallel_for(
        "oktopk::train::MaxPool2::backward",
        Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<4>>(
            exec, {0, 0, 0, 0}, {batch, os.height, os.width, os.channels}),
        KOKKOS_LAMBDA(const std::int64_t n, const std::int64_t oy, const std::int64_t ox,
                      const std::int64_t c) {
          const std::int64_t o = ((n * os.height + oy) * os.width + ox) * os.channels + c;
          const std::int64_t best = first_max(is, n, oy, ox, c, in);
          for (std::int64_t dy = 0; dy < 2; ++dy) {
            for (std::int64_t dx = 0; dx < 2; ++dx) {
              const std::int64_t i =
                  ((n * is.height + 2 * oy + dy) * is.width + 2 * ox + dx) * is.channels + c;
              din(i) = i == best ? dout(o) : Scalar(0);
            }
          }
        });
  }

  /// The input index of the first largest entry in output (n, oy, ox, c)'s window.
  KOKKOS_INLINE_FUNCTION static std::int64_t first_max(const Shape& is, std::int64_t n,
                                                       std::int64_t oy, std::int64_t ox,
                                                       std::int64_t c,
                                                       const Flat<const Scalar>& in) {
    std::int64_t best = ((n * is.height + 2 * oy) * is.width + 2 * ox) * is.channels + c;
    for (std::int64_t dy = 0; dy < 2; ++dy) {
      for (std::int64_t dx = 0; dx < 2; ++dx) {
        const std::int64_t i =
            ((n * is.height + 2 * oy + dy) * is.width + 2 * ox + dx) * is.channels + c;
        if (in(i) > in(best)) best = i;
      }
    }
    return best;
  }

 private:
  Shape in_;
  Shape out_;
};

}  // namespace oktopk::train::detail
