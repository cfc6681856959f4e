// SPDX-License-Identifier: BSD-3-Clause
#include "language_model.hpp"

#include "common/app_hash.hpp"
#include "common/app_kokkos_compat.hpp"
#include "layers.hpp"

#include <oktopk/error.hpp>

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace oktopk::train {

namespace {

using detail::Flat;
using detail::kexp;
using detail::klog;
using detail::ktanh;
using detail::matrix;
using detail::Matrix;

template <class Scalar>
KOKKOS_INLINE_FUNCTION Scalar sigmoid(Scalar x) {
  return Scalar(1) / (Scalar(1) + kexp(-x));
}

/// Word ids outside 0..vocabulary-1, counted so bad input is reported from the host.
std::int64_t count_bad_words(
    const ExecutionSpace& exec,
    const Kokkos::View<const std::int32_t**, Kokkos::LayoutRight, MemorySpace>& windows,
    std::int64_t vocabulary) {
  std::int64_t bad = 0;
  const std::int64_t columns = windows.extent(1);
  Kokkos::parallel_reduce(
      "oktopk::train::LanguageModel::count_bad_words",
      Kokkos::RangePolicy<ExecutionSpace>(exec, 0, windows.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t b, std::int64_t& count) {
        for (std::int64_t k = 0; k < columns; ++k) {
          if (windows(b, k) < 0 || windows(b, k) >= vocabulary) ++count;
        }
      },
      bad);
  return bad;
}

/// Every row of y (rows x cols) set to `bias`, before a gemm adds the product to it.
template <class Scalar>
void broadcast_rows(const ExecutionSpace& exec, const Matrix<Scalar>& y,
                    const Flat<const Scalar>& bias) {
  Kokkos::parallel_for(
      "oktopk::train::LanguageModel::broadcast_bias",
      Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(exec, {0, 0},
                                                             {y.extent(0), y.extent(1)}),
      KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t j) { y(i, j) = bias(j); });
}

/// Entries first .. first + count - 1 of `params` from U(-bound, bound) + shift, hashed from
/// (seed, index) as the classifiers do.
template <class Scalar>
void fill_uniform(const ExecutionSpace& exec, const Kokkos::View<Scalar*, MemorySpace>& params,
                  std::int64_t first, std::int64_t count, double bound, double shift,
                  std::uint64_t seed) {
  Kokkos::parallel_for(
      "oktopk::train::LanguageModel::initialize",
      Kokkos::RangePolicy<ExecutionSpace>(exec, first, first + count),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const std::uint64_t h = ::oktopk::apps::splitmix64(
            seed ^ ::oktopk::apps::splitmix64(static_cast<std::uint64_t>(i)));
        const double u = static_cast<double>(h >> 11) * 0x1.0p-53;  // [0, 1)
        params(i) = static_cast<Scalar>(bound * (2.0 * u - 1.0) + shift);
      });
}

}  // namespace

template <class Scalar>
BasicLanguageModel<Scalar>::BasicLanguageModel(const LanguageModelShape& shape, std::uint64_t seed)
    : shape_(shape) {
  OKTOPK_REQUIRE(shape.vocabulary >= 2 && shape.embedding >= 1 && shape.hidden >= 1,
                 std::invalid_argument, "oktopk::train::BasicLanguageModel",
                 "vocabulary " << shape.vocabulary << ", embedding " << shape.embedding
                               << ", hidden " << shape.hidden
                               << ": needs a vocabulary >= 2 and sizes >= 1");
  const std::int64_t V = shape.vocabulary;
  const std::int64_t E = shape.embedding;
  const std::int64_t H = shape.hidden;
  embedding_offset_ = 0;
  weight_ih_offset_ = embedding_offset_ + V * E;
  weight_hh_offset_ = weight_ih_offset_ + 4 * H * E;
  lstm_bias_offset_ = weight_hh_offset_ + 4 * H * H;
  output_weight_offset_ = lstm_bias_offset_ + 4 * H;
  output_bias_offset_ = output_weight_offset_ + V * H;
  num_parameters_ = output_bias_offset_ + V;
  const ExecutionSpace exec;
  parameters_ = Parameters(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing,
                                              "oktopk::train::LanguageModel::parameters"),
                           num_parameters_);
  gradient_ = Parameters(Kokkos::view_alloc(exec, "oktopk::train::LanguageModel::gradient"),
                         num_parameters_);
  initialize(exec, seed);
  ::oktopk::apps::fence(exec, "oktopk::train::BasicLanguageModel");
}

template <class Scalar>
std::string BasicLanguageModel<Scalar>::summary() const {
  std::ostringstream os;
  os << "lstm: " << num_parameters_ << " parameters\n";
  for (const auto& block : parameter_blocks()) {
    os << "  " << block.name << ": " << block.size << " at offset " << block.offset;
    if (block.row_width > 0) os << " (rows of " << block.row_width << ", sparse per step)";
    os << "\n";
  }
  return os.str();
}

template <class Scalar>
std::vector<ParameterBlock> BasicLanguageModel<Scalar>::parameter_blocks() const {
  const std::int64_t V = shape_.vocabulary;
  const std::int64_t E = shape_.embedding;
  const std::int64_t H = shape_.hidden;
  return {{"0.embedding.weight", embedding_offset_, V * E, E},
          {"1.lstm.weight_ih", weight_ih_offset_, 4 * H * E, 0},
          {"1.lstm.weight_hh", weight_hh_offset_, 4 * H * H, 0},
          {"1.lstm.bias", lstm_bias_offset_, 4 * H, 0},
          {"2.dense.weight", output_weight_offset_, V * H, 0},
          {"2.dense.bias", output_bias_offset_, V, 0}};
}

template <class Scalar>
void BasicLanguageModel<Scalar>::initialize(const ExecutionSpace& exec, std::uint64_t seed) {
  const std::int64_t V = shape_.vocabulary;
  const std::int64_t E = shape_.embedding;
  const std::int64_t H = shape_.hidden;
  const double lstm_bound = 1.0 / std::sqrt(static_cast<double>(H));
  fill_uniform(exec, parameters_, embedding_offset_, V * E, 0.1, 0.0, seed);
  fill_uniform(exec, parameters_, weight_ih_offset_, 4 * H * (E + H), lstm_bound, 0.0, seed);
  fill_uniform(exec, parameters_, lstm_bias_offset_, 4 * H, 0.0, 0.0, seed);
  fill_uniform(exec, parameters_, lstm_bias_offset_ + H, H, 0.0, 1.0, seed);  // forget gate
  fill_uniform(exec, parameters_, output_weight_offset_, V * H,
               std::sqrt(6.0 / static_cast<double>(V + H)), 0.0, seed);
  fill_uniform(exec, parameters_, output_bias_offset_, V, 0.0, 0.0, seed);
}

template <class Scalar>
void BasicLanguageModel<Scalar>::check_windows(const ExecutionSpace& exec, const char* where,
                                               const Windows& windows) const {
  OKTOPK_REQUIRE(windows.extent(0) > 0 && windows.extent(1) >= 2, std::invalid_argument, where,
                 "windows are " << windows.extent(0) << "x" << windows.extent(1)
                                << ", expected B x (T + 1) with B >= 1 and T >= 1");
  const std::int64_t bad = count_bad_words(exec, windows, shape_.vocabulary);
  OKTOPK_REQUIRE(bad == 0, std::invalid_argument, where,
                 bad << " word ids are outside 0.." << shape_.vocabulary - 1);
}

template <class Scalar>
void BasicLanguageModel<Scalar>::ensure_capacity(const ExecutionSpace& exec, std::int64_t batch,
                                                 std::int64_t steps) {
  batch_ = batch;
  steps_ = steps;
  // Sized for (T + 1) B rows, which covers the T B rows of the other buffers too.
  const std::int64_t rows = (steps + 1) * batch;
  if (rows <= capacity_ &&
      batch * shape_.hidden <= static_cast<std::int64_t>(dh_carry_.extent(0))) {
    return;
  }
  capacity_ = rows;
  auto alloc = [&](Kokkos::View<Scalar*, MemorySpace>& v, std::int64_t size, const char* label) {
    v = Kokkos::View<Scalar*, MemorySpace>(
        Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, std::string(label)), size);
  };
  const std::int64_t E = shape_.embedding;
  const std::int64_t H = shape_.hidden;
  alloc(inputs_, rows * E, "oktopk::train::LanguageModel::inputs");
  alloc(gates_, rows * 4 * H, "oktopk::train::LanguageModel::gates");
  alloc(cells_, rows * H, "oktopk::train::LanguageModel::cells");
  alloc(hiddens_, rows * H, "oktopk::train::LanguageModel::hiddens");
  alloc(logits_, rows * shape_.vocabulary, "oktopk::train::LanguageModel::logits");
  alloc(dhiddens_, rows * H, "oktopk::train::LanguageModel::dhiddens");
  alloc(dgates_, rows * 4 * H, "oktopk::train::LanguageModel::dgates");
  alloc(dinputs_, rows * E, "oktopk::train::LanguageModel::dinputs");
  alloc(dh_carry_, batch * H, "oktopk::train::LanguageModel::dh_carry");
  alloc(dc_carry_, batch * H, "oktopk::train::LanguageModel::dc_carry");
  word_positions_ = Kokkos::View<std::int64_t*, MemorySpace>(
      Kokkos::view_alloc(exec, Kokkos::WithoutInitializing,
                         std::string("oktopk::train::LanguageModel::word_positions")),
      rows);
}

template <class Scalar>
void BasicLanguageModel<Scalar>::embed(const ExecutionSpace& exec, const Windows& windows) {
  const std::int64_t B = batch_;
  const std::int64_t E = shape_.embedding;
  const Flat<const Scalar> table(parameters_.data() + embedding_offset_, shape_.vocabulary * E);
  const Flat<Scalar> inputs(inputs_.data(), steps_ * B * E);
  Kokkos::parallel_for(
      "oktopk::train::LanguageModel::embed",
      Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<3>>(exec, {0, 0, 0}, {steps_, B, E}),
      KOKKOS_LAMBDA(const std::int64_t t, const std::int64_t b, const std::int64_t e) {
        inputs((t * B + b) * E + e) = table(windows(b, t) * E + e);
      });
}

template <class Scalar>
void BasicLanguageModel<Scalar>::lstm_cell_forward(const ExecutionSpace& exec, std::int64_t t) {
  const std::int64_t B = batch_;
  const std::int64_t H = shape_.hidden;
  const Flat<Scalar> gates(gates_.data() + t * B * 4 * H, B * 4 * H);
  const Flat<const Scalar> c_prev(cells_.data() + t * B * H, B * H);
  const Flat<Scalar> c_next(cells_.data() + (t + 1) * B * H, B * H);
  const Flat<Scalar> h_next(hiddens_.data() + (t + 1) * B * H, B * H);
  Kokkos::parallel_for(
      "oktopk::train::LanguageModel::lstm_cell_forward",
      Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(exec, {0, 0}, {B, H}),
      KOKKOS_LAMBDA(const std::int64_t b, const std::int64_t j) {
        const std::int64_t row = b * 4 * H;
        const Scalar i = sigmoid(gates(row + j));
        const Scalar f = sigmoid(gates(row + H + j));
        const Scalar g = ktanh(gates(row + 2 * H + j));
        const Scalar o = sigmoid(gates(row + 3 * H + j));
        gates(row + j) = i;
        gates(row + H + j) = f;
        gates(row + 2 * H + j) = g;
        gates(row + 3 * H + j) = o;
        const Scalar c = f * c_prev(b * H + j) + i * g;
        c_next(b * H + j) = c;
        h_next(b * H + j) = o * ktanh(c);
      });
}

template <class Scalar>
void BasicLanguageModel<Scalar>::forward(const ExecutionSpace& exec, const Windows& windows) {
  const auto B = static_cast<std::int64_t>(windows.extent(0));
  const auto T = static_cast<std::int64_t>(windows.extent(1)) - 1;
  ensure_capacity(exec, B, T);
  const std::int64_t V = shape_.vocabulary;
  const std::int64_t E = shape_.embedding;
  const std::int64_t H = shape_.hidden;
  const Scalar* params = parameters_.data();

  embed(exec, windows);
  // The input half of every gate for all T steps at once: inputs W_ih^T + bias.
  const Matrix<Scalar> gates = matrix(gates_.data(), T * B, 4 * H);
  broadcast_rows(exec, gates, Flat<const Scalar>(params + lstm_bias_offset_, 4 * H));
  detail::gemm<Scalar>(exec, "N", "T", Scalar(1), matrix<const Scalar>(inputs_.data(), T * B, E),
                       matrix<const Scalar>(params + weight_ih_offset_, 4 * H, E), Scalar(1),
                       gates);
  Kokkos::deep_copy(exec, Kokkos::subview(cells_, Kokkos::make_pair(std::int64_t(0), B * H)),
                    Scalar(0));
  Kokkos::deep_copy(exec, Kokkos::subview(hiddens_, Kokkos::make_pair(std::int64_t(0), B * H)),
                    Scalar(0));
  for (std::int64_t t = 0; t < T; ++t) {
    if (t > 0) {  // h_0 = 0 adds nothing
      detail::gemm<Scalar>(exec, "N", "T", Scalar(1),
                           matrix<const Scalar>(hiddens_.data() + t * B * H, B, H),
                           matrix<const Scalar>(params + weight_hh_offset_, 4 * H, H), Scalar(1),
                           matrix(gates_.data() + t * B * 4 * H, B, 4 * H));
    }
    lstm_cell_forward(exec, t);
  }
  const Matrix<Scalar> logits = matrix(logits_.data(), T * B, V);
  broadcast_rows(exec, logits, Flat<const Scalar>(params + output_bias_offset_, V));
  detail::gemm<Scalar>(
      exec, "N", "T", Scalar(1), matrix<const Scalar>(hiddens_.data() + B * H, T * B, H),
      matrix<const Scalar>(params + output_weight_offset_, V, H), Scalar(1), logits);
}

template <class Scalar>
double BasicLanguageModel<Scalar>::cross_entropy(const ExecutionSpace& exec, const Windows& windows,
                                                 bool with_gradient) {
  const std::int64_t B = batch_;
  const std::int64_t rows = steps_ * B;
  const std::int64_t V = shape_.vocabulary;
  const Flat<Scalar> logits(logits_.data(), rows * V);
  const Scalar inv_rows = Scalar(1) / static_cast<Scalar>(rows);
  double total = 0;
  // A team per row, its threads over the vocabulary (one thread per row would leave a GPU
  // idle at a few hundred rows of thousands of logits). Each row's max and sum are team
  // reductions, whose order follows the team size: a fixed one, 128 threads on GPUs and one
  // on the host (the order of the former loop), so that the bits, and a resumed run, do not
  // depend on what Kokkos would choose for the device.
  using Team = Kokkos::TeamPolicy<ExecutionSpace>;
  constexpr bool host = Kokkos::SpaceAccessibility<ExecutionSpace, Kokkos::HostSpace>::accessible;
  Kokkos::parallel_reduce(
      "oktopk::train::LanguageModel::cross_entropy", Team(exec, rows, host ? 1 : 128),
      KOKKOS_LAMBDA(const typename Team::member_type& team, double& sum) {
        const std::int64_t r = team.league_rank();
        const std::int64_t t = r / B;
        const std::int64_t target = windows(r - t * B, t + 1);
        Scalar* row = &logits(r * V);
        // log-sum-exp shifted by the largest logit, so exp cannot overflow.
        Scalar top = row[0];
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, V),
            [&](const std::int64_t j, Scalar& most) { most = row[j] > most ? row[j] : most; },
            Kokkos::Max<Scalar>(top));
        const Scalar target_logit = row[target];
        Scalar s = 0;
        if (with_gradient) {
          team.team_barrier();  // every thread has read row[target] before it is overwritten
          // The exponentials are kept in the row, so the softmax needs one exp per entry.
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(team, V),
              [&](const std::int64_t j, Scalar& part) {
                row[j] = kexp(row[j] - top);
                part += row[j];
              },
              s);
          const Scalar scale = inv_rows / s;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, V),
                               [&](const std::int64_t j) { row[j] *= scale; });
          team.team_barrier();
          Kokkos::single(Kokkos::PerTeam(team), [&]() { row[target] -= inv_rows; });
        } else {
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(team, V),
              [&](const std::int64_t j, Scalar& part) { part += kexp(row[j] - top); }, s);
        }
        Kokkos::single(Kokkos::PerTeam(team),
                       [&]() { sum += static_cast<double>(top + klog(s) - target_logit); });
      },
      total);
  return total / static_cast<double>(rows);
}

template <class Scalar>
void BasicLanguageModel<Scalar>::lstm_cell_backward(const ExecutionSpace& exec, std::int64_t t,
                                                    std::int64_t steps) {
  const std::int64_t B = batch_;
  const std::int64_t H = shape_.hidden;
  const bool last = t == steps - 1;  // nothing flows back from a later step
  const Flat<const Scalar> gates(gates_.data() + t * B * 4 * H, B * 4 * H);
  const Flat<const Scalar> c_prev(cells_.data() + t * B * H, B * H);
  const Flat<const Scalar> c_now(cells_.data() + (t + 1) * B * H, B * H);
  const Flat<const Scalar> dh_out(dhiddens_.data() + t * B * H, B * H);
  const Flat<Scalar> dgates(dgates_.data() + t * B * 4 * H, B * 4 * H);
  const Flat<const Scalar> dh_carry(dh_carry_.data(), B * H);
  const Flat<Scalar> dc_carry(dc_carry_.data(), B * H);
  Kokkos::parallel_for(
      "oktopk::train::LanguageModel::lstm_cell_backward",
      Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(exec, {0, 0}, {B, H}),
      KOKKOS_LAMBDA(const std::int64_t b, const std::int64_t j) {
        const std::int64_t row = b * 4 * H;
        const std::int64_t k = b * H + j;
        const Scalar i = gates(row + j);
        const Scalar f = gates(row + H + j);
        const Scalar g = gates(row + 2 * H + j);
        const Scalar o = gates(row + 3 * H + j);
        const Scalar tanh_c = ktanh(c_now(k));
        const Scalar dh = dh_out(k) + (last ? Scalar(0) : dh_carry(k));
        const Scalar dc = dh * o * (Scalar(1) - tanh_c * tanh_c) + (last ? Scalar(0) : dc_carry(k));
        // Through each gate's activation: sigmoid' = s (1 - s), tanh' = 1 - tanh^2.
        dgates(row + j) = dc * g * i * (Scalar(1) - i);
        dgates(row + H + j) = dc * c_prev(k) * f * (Scalar(1) - f);
        dgates(row + 2 * H + j) = dc * i * (Scalar(1) - g * g);
        dgates(row + 3 * H + j) = dh * tanh_c * o * (Scalar(1) - o);
        dc_carry(k) = dc * f;
      });
}

template <class Scalar>
void BasicLanguageModel<Scalar>::embedding_backward(const ExecutionSpace& exec,
                                                    const Windows& windows,
                                                    const Parameters& gradient) {
  const std::int64_t B = batch_;
  const std::int64_t T = steps_;
  const std::int64_t E = shape_.embedding;
  const Flat<Scalar> table(gradient.data() + embedding_offset_, shape_.vocabulary * E);
  const Flat<const Scalar> dinputs(dinputs_.data(), T * B * E);
  Kokkos::deep_copy(exec, table, Scalar(0));
  // A row of the table sums the positions of its word, in position order: no two work items
  // write the same entry, so no atomics, and the sums are the same bit for bit on every run (a
  // checkpointed run resumes exactly). The positions are sorted by word first (key: word, then
  // position), so that a work item (a word's first position, a column) adds only its word's
  // positions instead of scanning all T B of them.
  const std::int64_t positions = T * B;
  const auto keys = Kokkos::subview(word_positions_, Kokkos::make_pair(std::int64_t{0}, positions));
  Kokkos::parallel_for(
      "oktopk::train::LanguageModel::word_positions",
      Kokkos::RangePolicy<ExecutionSpace>(exec, 0, positions), KOKKOS_LAMBDA(const std::int64_t p) {
        const std::int64_t t = p / B;
        keys(p) = static_cast<std::int64_t>(windows(p - t * B, t)) * positions + p;
      });
  ::oktopk::apps::sort_ascending(exec, keys);
  Kokkos::parallel_for(
      "oktopk::train::LanguageModel::embedding_backward",
      Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(exec, {0, 0}, {positions, E}),
      KOKKOS_LAMBDA(const std::int64_t first, const std::int64_t e) {
        const std::int64_t word = keys(first) / positions;
        if (first > 0 && keys(first - 1) / positions == word) return;  // not the word's first
        Scalar sum = 0;
        for (std::int64_t q = first; q < positions && keys(q) / positions == word; ++q) {
          sum += dinputs((keys(q) - word * positions) * E + e);
        }
        table(word * E + e) = sum;
      });
}

template <class Scalar>
double BasicLanguageModel<Scalar>::forward_backward(const ExecutionSpace& exec,
                                                    const Windows& windows,
                                                    const Parameters& gradient,
                                                    const GradientReady& ready) {
  constexpr const char* where = "oktopk::train::BasicLanguageModel::forward_backward";
  check_windows(exec, where, windows);
  OKTOPK_REQUIRE(static_cast<std::int64_t>(gradient.extent(0)) == num_parameters_,
                 std::invalid_argument, where,
                 "the gradient has " << gradient.extent(0) << " entries, the model "
                                     << num_parameters_ << " parameters");
  forward(exec, windows);
  const double mean_loss = cross_entropy(exec, windows, true);
  const std::int64_t B = batch_;
  const std::int64_t T = steps_;
  const std::int64_t V = shape_.vocabulary;
  const std::int64_t E = shape_.embedding;
  const std::int64_t H = shape_.hidden;
  const Scalar* params = parameters_.data();
  Scalar* grad = gradient.data();
  detail::ensure_ones(exec, ones_, T * B, "oktopk::train::LanguageModel::ones");
  const Matrix<const Scalar> ones = matrix<const Scalar>(ones_.data(), T * B, 1);

  // Output layer: dW = dlogits^T h, db = dlogits^T 1, dh = dlogits W.
  const Matrix<const Scalar> dlogits = matrix<const Scalar>(logits_.data(), T * B, V);
  detail::gemm<Scalar>(exec, "T", "N", Scalar(1), dlogits,
                       matrix<const Scalar>(hiddens_.data() + B * H, T * B, H), Scalar(0),
                       matrix(grad + output_weight_offset_, V, H));
  detail::gemm<Scalar>(exec, "T", "N", Scalar(1), dlogits, ones, Scalar(0),
                       matrix(grad + output_bias_offset_, V, 1));
  auto tell = [&](std::int64_t from) {
    if (ready) ready(from);
  };
  tell(output_weight_offset_);  // the output layer's block, the last, is final
  detail::gemm<Scalar>(exec, "N", "N", Scalar(1), dlogits,
                       matrix<const Scalar>(params + output_weight_offset_, V, H), Scalar(0),
                       matrix(dhiddens_.data(), T * B, H));

  // Back through time; dh_carry_ = dgates_t W_hh is what h_{t-1} receives from step t.
  for (std::int64_t t = T; t-- > 0;) {
    tell(output_weight_offset_);
    lstm_cell_backward(exec, t, T);
    if (t > 0) {
      detail::gemm<Scalar>(exec, "N", "N", Scalar(1),
                           matrix<const Scalar>(dgates_.data() + t * B * 4 * H, B, 4 * H),
                           matrix<const Scalar>(params + weight_hh_offset_, 4 * H, H), Scalar(0),
                           matrix(dh_carry_.data(), B, H));
    }
  }

  // LSTM weights over all steps at once: dW_hh = dgates^T h_{t-1}, dW_ih = dgates^T inputs.
  const Matrix<const Scalar> dgates = matrix<const Scalar>(dgates_.data(), T * B, 4 * H);
  detail::gemm<Scalar>(exec, "T", "N", Scalar(1), dgates,
                       matrix<const Scalar>(hiddens_.data(), T * B, H), Scalar(0),
                       matrix(grad + weight_hh_offset_, 4 * H, H));
  detail::gemm<Scalar>(exec, "T", "N", Scalar(1), dgates,
                       matrix<const Scalar>(inputs_.data(), T * B, E), Scalar(0),
                       matrix(grad + weight_ih_offset_, 4 * H, E));
  detail::gemm<Scalar>(exec, "T", "N", Scalar(1), dgates, ones, Scalar(0),
                       matrix(grad + lstm_bias_offset_, 4 * H, 1));
  tell(weight_ih_offset_);  // the LSTM's blocks too
  detail::gemm<Scalar>(exec, "N", "N", Scalar(1), dgates,
                       matrix<const Scalar>(params + weight_ih_offset_, 4 * H, E), Scalar(0),
                       matrix(dinputs_.data(), T * B, E));
  embedding_backward(exec, windows, gradient);
  tell(embedding_offset_);
  return mean_loss;
}

template <class Scalar>
double BasicLanguageModel<Scalar>::loss(const ExecutionSpace& exec, const Windows& windows) {
  check_windows(exec, "oktopk::train::BasicLanguageModel::loss", windows);
  forward(exec, windows);
  return cross_entropy(exec, windows, false);
}

std::vector<GradientSegment> gradient_segments(const std::vector<ParameterBlock>& blocks) {
  std::vector<GradientSegment> segments;
  for (const auto& block : blocks) {
    segments.push_back(
        {block.offset, block.size, block.row_width > 0, block.row_width, block.name});
  }
  return segments;
}

DeviceTokenWindows to_device(const ExecutionSpace& exec, const std::vector<std::int32_t>& tokens,
                             std::int64_t steps) {
  OKTOPK_REQUIRE(steps >= 1, std::invalid_argument, "oktopk::train::to_device",
                 "windows need T >= 1, got " << steps);
  DeviceTokenWindows data;
  data.steps = steps;
  data.tokens = Kokkos::View<std::int32_t*, MemorySpace>(
      Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::train::tokens"),
      tokens.size());
  Kokkos::deep_copy(
      exec, data.tokens,
      Kokkos::View<const std::int32_t*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
          tokens.data(), tokens.size()));
  ::oktopk::apps::fence(exec, "oktopk::train::to_device: tokens");  // `tokens` is the caller's
  return data;
}

void gather_windows(const ExecutionSpace& exec, const DeviceTokenWindows& data,
                    const Kokkos::View<const std::int64_t*, MemorySpace>& order, std::int64_t first,
                    std::int64_t begin, std::int64_t count,
                    const Kokkos::View<std::int32_t**, Kokkos::LayoutRight, MemorySpace>& windows) {
  const std::int64_t T = data.steps;
  OKTOPK_REQUIRE(count <= static_cast<std::int64_t>(windows.extent(0)) &&
                     static_cast<std::int64_t>(windows.extent(1)) == T + 1,
                 std::invalid_argument, "oktopk::train::gather_windows",
                 count << " windows of " << T + 1 << " words into a " << windows.extent(0) << "x"
                       << windows.extent(1) << " buffer");
  const bool ordered = order.extent(0) > 0;
  const auto tokens = data.tokens;
  Kokkos::parallel_for(
      "oktopk::train::gather_windows",
      Kokkos::MDRangePolicy<ExecutionSpace, Kokkos::Rank<2>>(exec, {0, 0}, {count, T + 1}),
      KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t k) {
        const std::int64_t window = first + (ordered ? order(begin + i) : begin + i);
        windows(i, k) = tokens(window * T + k);
      });
}

TextLoss evaluate_text(const ExecutionSpace& exec, LanguageModel& model,
                       const DeviceTokenWindows& data, std::int64_t first, std::int64_t count,
                       std::int64_t batch) {
  OKTOPK_REQUIRE(batch > 0 && first >= 0 && first + count <= data.size(), std::invalid_argument,
                 "oktopk::train::evaluate_text",
                 "windows " << first << ".." << first + count - 1 << " of " << data.size()
                            << ", batch " << batch);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, MemorySpace> windows(
      Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::train::evaluate_text"),
      std::min(batch, std::max<std::int64_t>(count, 1)), data.steps + 1);
  TextLoss result;
  for (std::int64_t begin = 0; begin < count; begin += batch) {
    const std::int64_t size = std::min(batch, count - begin);
    gather_windows(exec, data, {}, first, begin, size, windows);
    const auto part =
        Kokkos::subview(windows, Kokkos::make_pair(std::int64_t(0), size), Kokkos::ALL);
    result.sum += model.loss(exec, part) * static_cast<double>(size * data.steps);
    result.words += size * data.steps;
  }
  return result;
}

// Explicit instantiations: float trains, double checks gradients in the tests.
template class BasicLanguageModel<float>;
template class BasicLanguageModel<double>;

}  // namespace oktopk::train
