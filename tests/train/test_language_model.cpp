// SPDX-License-Identifier: BSD-3-Clause
// oktopk-train's language model: the tokenizer and vocabulary, the verse file, windows, the
// gradient against central finite differences, the embedding gradient's row sparsity, and the
// gradient segments a layout-aware allreduce would take.
#include <language_model.hpp>
#include <text_corpus.hpp>

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

using oktopk::train::BasicLanguageModel;
using oktopk::train::ExecutionSpace;
using oktopk::train::LanguageModelShape;
using oktopk::train::MemorySpace;
using oktopk::train::Vocabulary;
using Strings = std::vector<std::string>;
using HostWindows = Kokkos::View<std::int32_t**, Kokkos::LayoutRight, Kokkos::HostSpace>;
using DeviceWindows = Kokkos::View<std::int32_t**, Kokkos::LayoutRight, MemorySpace>;

template <class Scalar>
std::vector<Scalar> to_host(const Kokkos::View<Scalar*, MemorySpace>& v) {
  std::vector<Scalar> out(v.extent(0));
  Kokkos::deep_copy(
      Kokkos::View<Scalar*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(out.data(),
                                                                                        out.size()),
      v);
  return out;
}

template <class Scalar>
void from_host(const Kokkos::View<Scalar*, MemorySpace>& v, const std::vector<Scalar>& values) {
  Kokkos::deep_copy(
      v, Kokkos::View<const Scalar*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
             values.data(), values.size()));
}

DeviceWindows device_windows(const std::vector<std::vector<std::int32_t>>& rows) {
  HostWindows host("windows", rows.size(), rows.front().size());
  for (std::size_t b = 0; b < rows.size(); ++b) {
    for (std::size_t k = 0; k < rows[b].size(); ++k) host(b, k) = rows[b][k];
  }
  DeviceWindows device("windows", host.extent(0), host.extent(1));
  Kokkos::deep_copy(device, host);
  return device;
}

// ---------------------------------------------------------------------------------------------
// Text

TEST(Tokenizer, LowercaseWordsWithoutPunctuation) {
  EXPECT_EQ(oktopk::train::tokenize("In the beginning God created the heaven and the earth."),
            (Strings{"in", "the", "beginning", "god", "created", "the", "heaven", "and", "the",
                     "earth"}));
  // Apostrophes stay between letters only; hyphens, digits and other marks separate words.
  EXPECT_EQ(oktopk::train::tokenize("The LORD's well-beloved, (brethren') 'saith' 12:3 ye?!"),
            (Strings{"the", "lord's", "well", "beloved", "brethren", "saith", "ye"}));
  EXPECT_TRUE(oktopk::train::tokenize("  ,.; 42 ").empty());
  EXPECT_TRUE(oktopk::train::tokenize("").empty());
}

TEST(Vocabulary, MostFrequentFirstTiesAlphabeticalRestUnknown) {
  const Strings texts = {"b a c a", "c a d", "e"};  // a:3, c:2, b:1 d:1 e:1
  const Vocabulary all = Vocabulary::from_texts(texts, 100);
  ASSERT_EQ(all.size(), 2 + 5);
  EXPECT_EQ(all.word(Vocabulary::unknown_id), "<unk>");
  EXPECT_EQ(all.word(Vocabulary::end_of_verse_id), "</s>");
  EXPECT_EQ(all.word(2), "a");
  EXPECT_EQ(all.word(3), "c");
  EXPECT_EQ(all.word(4), "b");
  EXPECT_EQ(all.word(5), "d");
  EXPECT_EQ(all.word(6), "e");

  const Vocabulary small = Vocabulary::from_texts(texts, 5);  // <unk> </s> a c b
  ASSERT_EQ(small.size(), 5);
  EXPECT_EQ(small.id("a"), 2);
  EXPECT_EQ(small.id("b"), 4);
  EXPECT_EQ(small.id("d"), Vocabulary::unknown_id);
  EXPECT_EQ(small.id("never seen"), Vocabulary::unknown_id);
  // Each text's ids, then </s>.
  EXPECT_EQ(small.encode({"A c, D!", "b"}), (std::vector<std::int32_t>{2, 3, 0, 1, 4, 1}));
  EXPECT_THROW(Vocabulary::from_texts(texts, 2), std::invalid_argument);
}

TEST(TextSplit, EveryNthVerseIsATestVerse) {
  const Strings texts = {"0", "1", "2", "3", "4", "5", "6"};
  const auto split = oktopk::train::split_texts(texts, 3);
  EXPECT_EQ(split.train, (Strings{"0", "1", "3", "4", "6"}));
  EXPECT_EQ(split.test, (Strings{"2", "5"}));
  EXPECT_THROW(oktopk::train::split_texts(texts, 1), std::invalid_argument);

  // The vocabulary comes from the training verses alone.
  const auto corpus = oktopk::train::make_token_corpus({"a a", "b", "a c"}, 10, 2);
  EXPECT_EQ(corpus.vocabulary.size(), 2 + 2);  // a, c
  EXPECT_EQ(corpus.vocabulary.id("b"), Vocabulary::unknown_id);
  EXPECT_EQ(corpus.train, (std::vector<std::int32_t>{2, 2, 1, 2, 3, 1}));
  EXPECT_EQ(corpus.test, (std::vector<std::int32_t>{0, 1}));
}

TEST(Verses, ReadsReferencedLinesAndReportsAMissingFile) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("oktopk_verses_" + std::to_string(::getpid()) + ".txt");
  {
    std::ofstream out(path);
    out << "Ge1:1 In the beginning God created the heaven and the earth.\n\nGe1:2 And the earth\n";
  }
  EXPECT_EQ(oktopk::train::read_verses(path.string()),
            (Strings{"In the beginning God created the heaven and the earth.", "And the earth"}));
  std::filesystem::remove(path);
  try {
    oktopk::train::read_verses(path.string());
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("oktopk::train::read_verses: " + path.string() + ": missing file", 0),
              0u)
        << message;
    EXPECT_NE(message.find("bible-kjv"), std::string::npos) << message;
  }
}

/// The build's copy of the King James Bible (scripts/kjv-corpus.sh); skipped without it.
TEST(Verses, KingJamesBible) {
  const std::string path = OKTOPK_TRAIN_KJV_TEXT;
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << path << " is missing (Debian packages bible-kjv and bible-kjv-text)";
  }
  const auto texts = oktopk::train::read_verses(path);
  EXPECT_EQ(texts.size(), 31102u);
  const auto corpus = oktopk::train::make_token_corpus(texts, 10000);
  EXPECT_EQ(corpus.vocabulary.size(), 10000);
  EXPECT_EQ(corpus.vocabulary.word(2), "the");
  EXPECT_GT(corpus.train.size(), 700000u);
  // Every 20th verse: about 5 % of the words.
  const double test_share = static_cast<double>(corpus.test.size()) /
                            static_cast<double>(corpus.train.size() + corpus.test.size());
  EXPECT_NEAR(test_share, 0.05, 0.01);
  const auto unknown = std::count(corpus.train.begin(), corpus.train.end(), Vocabulary::unknown_id);
  EXPECT_LT(static_cast<double>(unknown) / static_cast<double>(corpus.train.size()), 0.01);
}

TEST(Windows, OverlapByOneWordAndFollowTheOrder) {
  const ExecutionSpace exec;
  std::vector<std::int32_t> tokens(11);
  for (int i = 0; i < 11; ++i) tokens[i] = 100 + i;
  const auto data = oktopk::train::to_device(exec, tokens, 3);
  EXPECT_EQ(data.size(), 3);  // words 0-3, 3-6, 6-9; word 10 belongs to no whole window
  Kokkos::View<std::int64_t*, MemorySpace> order("order", 2);
  Kokkos::deep_copy(Kokkos::subview(order, 0), 1);  // rank-local window 1, then 0
  DeviceWindows windows("windows", 2, 4);
  oktopk::train::gather_windows(exec, data, order, 1, 0, 2, windows);
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), windows);
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(host(0, k), 100 + 6 + k);  // window 1 + 1
    EXPECT_EQ(host(1, k), 100 + 3 + k);  // window 1 + 0
  }
}

// ---------------------------------------------------------------------------------------------
// Model

constexpr LanguageModelShape tiny{13, 3, 4};

/// 2 windows of T = 3 words: the model reads words 0..2 and predicts 1..3 of each.
DeviceWindows tiny_batch() { return device_windows({{3, 7, 7, 12}, {0, 5, 3, 9}}); }

TEST(LanguageModel, ParameterBlocksAndSegments) {
  const BasicLanguageModel<float> model({10000, 64, 128}, 1);
  const std::int64_t V = 10000, E = 64, H = 128;
  EXPECT_EQ(model.num_parameters(), V * E + 4 * H * (E + H + 1) + V * H + V);
  const auto blocks = model.parameter_blocks();
  ASSERT_EQ(blocks.size(), 6u);
  const auto& embedding = blocks[BasicLanguageModel<float>::embedding_block];
  EXPECT_EQ(embedding.name, "0.embedding.weight");
  EXPECT_EQ(embedding.offset, 0);
  EXPECT_EQ(embedding.size, V * E);
  EXPECT_EQ(embedding.row_width, E);

  const auto segments = oktopk::train::gradient_segments(blocks);
  ASSERT_EQ(segments.size(), blocks.size());
  std::int64_t next = 0;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    EXPECT_EQ(segments[i].name, blocks[i].name);
    EXPECT_EQ(segments[i].offset, next) << segments[i].name;  // they tile the gradient
    EXPECT_EQ(segments[i].length, blocks[i].size);
    EXPECT_EQ(segments[i].is_sparse_rows, i == 0) << segments[i].name;
    EXPECT_EQ(segments[i].row_width, i == 0 ? E : 0) << segments[i].name;
    next += segments[i].length;
  }
  EXPECT_EQ(next, model.num_parameters());
  EXPECT_EQ(segments.back().name, "2.dense.bias");
  EXPECT_NE(model.summary().find("sparse per step"), std::string::npos);

  // The classifiers' blocks are all dense.
  for (const auto& segment :
       oktopk::train::gradient_segments(oktopk::train::make_model("mlp", 1)->parameter_blocks())) {
    EXPECT_FALSE(segment.is_sparse_rows) << segment.name;
  }
}

TEST(LanguageModel, DoubleBackwardMatchesCentralDifferences) {
  const ExecutionSpace exec;
  BasicLanguageModel<double> model(tiny, 3);
  const auto windows = tiny_batch();
  const double loss = model.forward_backward(exec, windows, model.gradient());
  ASSERT_TRUE(std::isfinite(loss));
  // Near log V at initialization: the outputs start close to uniform.
  EXPECT_NEAR(loss, std::log(13.0), 0.5);
  const auto analytic = to_host(model.gradient());
  auto params = to_host(model.parameters());
  auto central = [&](std::size_t i, double h) {
    const double saved = params[i];
    params[i] = saved + h;
    from_host(model.parameters(), params);
    const double plus = model.loss(exec, windows);
    params[i] = saved - h;
    from_host(model.parameters(), params);
    const double minus = model.loss(exec, windows);
    params[i] = saved;
    from_host(model.parameters(), params);
    return (plus - minus) / (2 * h);
  };
  auto agrees = [](double fd, double g) {
    return std::abs(fd - g) <= 1e-8 + 1e-6 * std::max(std::abs(fd), std::abs(g));
  };
  // Every parameter: the embedding, the LSTM's weights and biases, the output layer.
  for (std::size_t i = 0; i < params.size(); ++i) {
    double fd = central(i, 1e-6);
    if (!agrees(fd, analytic[i])) fd = central(i, 1e-7);
    EXPECT_TRUE(agrees(fd, analytic[i]))
        << "parameter " << i << ": analytic " << analytic[i] << ", central " << fd;
  }
  // Each block gets a nonzero gradient somewhere: none of them was checked zeros against zeros.
  for (const auto& block : model.parameter_blocks()) {
    double largest = 0;
    for (std::int64_t i = block.offset; i < block.offset + block.size; ++i) {
      largest = std::max(largest, std::abs(analytic[i]));
    }
    EXPECT_GT(largest, 1e-4) << block.name;
  }
}

TEST(LanguageModel, EmbeddingGradientOnlyInTheRowsOfTheBatchsWords) {
  const ExecutionSpace exec;
  BasicLanguageModel<double> model(tiny, 5);
  // Fill the gradient with garbage first: forward_backward must overwrite every entry.
  Kokkos::deep_copy(model.gradient(), 7.0);
  model.forward_backward(exec, tiny_batch(), model.gradient());
  const auto gradient = to_host(model.gradient());
  // The words read (not the last word of a window, which is only predicted).
  const std::set<int> read = {3, 7, 0, 5};
  for (int word = 0; word < tiny.vocabulary; ++word) {
    double largest = 0;
    for (int e = 0; e < tiny.embedding; ++e) {
      largest = std::max(largest, std::abs(gradient[word * tiny.embedding + e]));
    }
    if (read.count(word) > 0) {
      EXPECT_GT(largest, 0.0) << "word " << word;
    } else {
      EXPECT_EQ(largest, 0.0) << "word " << word;
    }
  }
}

TEST(LanguageModel, ReadyHearsEachBlockOnceItIsFinalLastLayerFirst) {
  const ExecutionSpace exec;
  BasicLanguageModel<double> model(tiny, 5);
  const auto n = model.num_parameters();
  Kokkos::deep_copy(model.gradient(), 7.0);  // garbage that the pass overwrites
  std::vector<std::int64_t> froms;
  std::vector<std::vector<double>> suffixes;  // the entries [from, n) when `from` was new
  const auto ready = [&](std::int64_t from) {
    ASSERT_TRUE(froms.empty() || from <= froms.back()) << "from grew: " << from;
    if (froms.empty() || from < froms.back()) {
      exec.fence();
      const auto gradient = to_host(model.gradient());
      suffixes.emplace_back(gradient.begin() + from, gradient.end());
    }
    froms.push_back(from);
  };
  model.forward_backward(exec, tiny_batch(), model.gradient(), ready);
  const auto final_gradient = to_host(model.gradient());
  // The output layer (H x V weights, V biases), then the LSTM's blocks, then the embedding.
  const std::int64_t V = tiny.vocabulary, E = tiny.embedding, H = tiny.hidden;
  const std::vector<std::int64_t> expected = {n - V * H - V, V * E, 0};
  std::vector<std::int64_t> distinct = froms;
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  EXPECT_EQ(distinct, expected);
  EXPECT_GT(froms.size(), distinct.size());  // polled between the steps back through time
  ASSERT_EQ(suffixes.size(), distinct.size());
  for (std::size_t b = 0; b < distinct.size(); ++b) {
    for (std::int64_t i = distinct[b]; i < n; ++i) {
      ASSERT_EQ(suffixes[b][i - distinct[b]], final_gradient[i])
          << "entry " << i << " changed after ready(" << distinct[b] << ")";
    }
  }
}

TEST(LanguageModel, FloatMatchesDoubleAndLossDecreasesUnderSgd) {
  const ExecutionSpace exec;
  BasicLanguageModel<double> reference(tiny, 9);
  BasicLanguageModel<float> model(tiny, 9);
  const auto windows = tiny_batch();
  const double loss_double = reference.forward_backward(exec, windows, reference.gradient());
  const double first = model.forward_backward(exec, windows, model.gradient());
  EXPECT_NEAR(first, loss_double, 1e-5);
  const auto gd = to_host(reference.gradient());
  const auto gf = to_host(model.gradient());
  for (std::size_t i = 0; i < gd.size(); ++i) ASSERT_NEAR(gf[i], gd[i], 1e-5) << i;

  Kokkos::View<float*, MemorySpace> velocity("velocity", model.num_parameters());
  double last = first;
  for (int step = 0; step < 30; ++step) {
    oktopk::train::sgd_momentum_step<float>(exec, model.parameters(), model.gradient(), velocity,
                                            0.5, 0.9);
    last = model.forward_backward(exec, windows, model.gradient());
    ASSERT_TRUE(std::isfinite(last)) << "step " << step;
  }
  EXPECT_LT(last, 0.5 * first);  // one batch, memorized
}

TEST(LanguageModel, BadArgumentsThrow) {
  const ExecutionSpace exec;
  BasicLanguageModel<double> model(tiny, 1);
  EXPECT_THROW(model.forward_backward(exec, device_windows({{1, 2, 13}}), model.gradient()),
               std::invalid_argument);
  EXPECT_THROW(model.loss(exec, device_windows({{1, -1}})), std::invalid_argument);
  EXPECT_THROW(model.loss(exec, device_windows({{1}})), std::invalid_argument);  // T = 0
  Kokkos::View<double*, MemorySpace> short_gradient("short", 5);
  EXPECT_THROW(model.forward_backward(exec, tiny_batch(), short_gradient), std::invalid_argument);
  EXPECT_THROW(BasicLanguageModel<double>({1, 3, 4}, 1), std::invalid_argument);
}

}  // namespace
