// SPDX-License-Identifier: BSD-3-Clause
// oktopk-train's data loader and models: IDX error paths, shards, shuffles, initialization,
// and the backward pass against central finite differences.
#include <fashion_mnist.hpp>
#include <model.hpp>

#include <oktopk/impl/base/hash.hpp>

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

using oktopk::train::BasicModel;
using oktopk::train::Dataset;
using oktopk::train::ExecutionSpace;
using oktopk::train::MemorySpace;

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// Loader

/// A scratch directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("oktopk_train_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

void put_u32(std::vector<unsigned char>& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<unsigned char>(v >> shift));
}

std::vector<unsigned char> idx_images(std::uint32_t magic, std::uint32_t count, std::uint32_t rows,
                                      std::uint32_t cols, std::size_t pixel_bytes) {
  std::vector<unsigned char> out;
  put_u32(out, magic);
  put_u32(out, count);
  put_u32(out, rows);
  put_u32(out, cols);
  for (std::size_t i = 0; i < pixel_bytes; ++i) out.push_back(static_cast<unsigned char>(i * 7));
  return out;
}

std::vector<unsigned char> idx_images(std::uint32_t count) {
  return idx_images(2051, count, 28, 28, std::size_t{count} * 784);
}

std::vector<unsigned char> idx_labels(std::uint32_t magic, std::uint32_t count,
                                      std::vector<unsigned char> labels) {
  std::vector<unsigned char> out;
  put_u32(out, magic);
  put_u32(out, count);
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

std::vector<unsigned char> idx_labels(std::uint32_t count) {
  std::vector<unsigned char> labels(count);
  for (std::uint32_t i = 0; i < count; ++i) labels[i] = static_cast<unsigned char>(i % 10);
  return idx_labels(2049, count, labels);
}

void write_gz(const std::string& path, const std::vector<unsigned char>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(f), Z_OK);
}

void write_pair(const TempDir& dir, const std::vector<unsigned char>& images,
                const std::vector<unsigned char>& labels) {
  write_gz(oktopk::train::fashion_mnist_images_file(dir.str(), true), images);
  write_gz(oktopk::train::fashion_mnist_labels_file(dir.str(), true), labels);
}

/// Expects load_fashion_mnist(dir, train) to throw runtime_error
/// "oktopk::train::load_fashion_mnist: <file>: ..." mentioning `what`.
void expect_load_error(const std::string& dir, const std::string& file, const std::string& what) {
  try {
    oktopk::train::load_fashion_mnist(dir, true);
    ADD_FAILURE() << "no exception; expected one about " << what;
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    const std::string prefix = "oktopk::train::load_fashion_mnist: " + file + ": ";
    EXPECT_EQ(message.rfind(prefix, 0), 0u) << message;
    EXPECT_NE(message.find(what), std::string::npos) << message;
  }
}

TEST(FashionMnistLoader, ReadsAndStandardizesAValidPair) {
  TempDir dir;
  write_pair(dir, idx_images(5), idx_labels(5));
  const Dataset data = oktopk::train::load_fashion_mnist(dir.str(), true);
  ASSERT_EQ(data.size(), 5);
  ASSERT_EQ(data.images.size(), 5u * 784u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(data.labels[i], i % 10);
  for (std::size_t i = 0; i < data.images.size(); ++i) {
    const float raw = static_cast<float>(static_cast<unsigned char>(i * 7));
    const float expected = (raw / 255.0f - Dataset::pixel_mean) / Dataset::pixel_std;
    ASSERT_NEAR(data.images[i], expected, 1e-5f) << i;
  }
}

TEST(FashionMnistLoader, MissingFiles) {
  TempDir dir;
  const std::string images = oktopk::train::fashion_mnist_images_file(dir.str(), true);
  const std::string labels = oktopk::train::fashion_mnist_labels_file(dir.str(), true);
  expect_load_error(dir.str(), images, "missing file");
  write_gz(images, idx_images(3));
  expect_load_error(dir.str(), labels, "missing file");
  expect_load_error(dir.str() + "/no/such/dir",
                    oktopk::train::fashion_mnist_images_file(dir.str() + "/no/such/dir", true),
                    "missing file");
}

TEST(FashionMnistLoader, BadMagicNumbers) {
  TempDir dir;
  const std::string images = oktopk::train::fashion_mnist_images_file(dir.str(), true);
  const std::string labels = oktopk::train::fashion_mnist_labels_file(dir.str(), true);
  // The two files swapped: each has the other's magic number.
  write_pair(dir, idx_labels(3), idx_images(3));
  expect_load_error(dir.str(), images, "bad magic number 2049");
  write_pair(dir, idx_images(3), idx_images(3));
  expect_load_error(dir.str(), labels, "bad magic number 2051");
}

TEST(FashionMnistLoader, WrongImageSize) {
  TempDir dir;
  write_pair(dir, idx_images(2051, 2, 32, 32, 2 * 32 * 32), idx_labels(2));
  expect_load_error(dir.str(), oktopk::train::fashion_mnist_images_file(dir.str(), true),
                    "images are 32x32, expected 28x28");
}

TEST(FashionMnistLoader, TruncatedData) {
  TempDir dir;
  const std::string images = oktopk::train::fashion_mnist_images_file(dir.str(), true);
  const std::string labels = oktopk::train::fashion_mnist_labels_file(dir.str(), true);
  // Headers promising more than the files hold.
  write_pair(dir, idx_images(2051, 4, 28, 28, 3 * 784 + 100), idx_labels(4));
  expect_load_error(dir.str(), images, "truncated: the pixel data needs 3136 bytes, found 2452");
  write_pair(dir, idx_images(4), idx_labels(2049, 4, {1, 2, 3}));
  expect_load_error(dir.str(), labels, "truncated: the labels");
  // A header cut short.
  write_pair(dir, std::vector<unsigned char>{0, 0, 8, 3, 0, 0}, idx_labels(4));
  expect_load_error(dir.str(), images, "truncated: the header");
  // An empty file.
  write_pair(dir, {}, idx_labels(4));
  expect_load_error(dir.str(), images, "truncated: the header");
}

TEST(FashionMnistLoader, TruncatedGzipStream) {
  TempDir dir;
  const std::string images = oktopk::train::fashion_mnist_images_file(dir.str(), true);
  write_pair(dir, idx_images(50), idx_labels(50));
  // Cut the compressed file in half: zlib stops mid-stream.
  const auto size = fs::file_size(images);
  fs::resize_file(images, size / 2);
  try {
    oktopk::train::load_fashion_mnist(dir.str(), true);
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("oktopk::train::load_fashion_mnist: " + images + ": ", 0), 0u)
        << message;
    EXPECT_TRUE(message.find("truncated") != std::string::npos ||
                message.find("corrupt gzip data") != std::string::npos)
        << message;
  }
}

TEST(FashionMnistLoader, CountMismatch) {
  TempDir dir;
  write_pair(dir, idx_images(5), idx_labels(4));
  expect_load_error(dir.str(), oktopk::train::fashion_mnist_labels_file(dir.str(), true),
                    "4 labels for 5 images");
}

TEST(FashionMnistLoader, LabelOutOfRange) {
  TempDir dir;
  write_pair(dir, idx_images(3), idx_labels(2049, 3, {0, 10, 2}));
  expect_load_error(dir.str(), oktopk::train::fashion_mnist_labels_file(dir.str(), true),
                    "label 10 of sample 1 is outside 0..9");
}

TEST(FashionMnistLoader, TrailingData) {
  TempDir dir;
  auto images = idx_images(3);
  images.push_back(0);
  write_pair(dir, images, idx_labels(3));
  expect_load_error(dir.str(), oktopk::train::fashion_mnist_images_file(dir.str(), true),
                    "unexpected trailing data");
}

TEST(FashionMnistLoader, RealDataSmokeTest) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(oktopk::train::fashion_mnist_images_file(dir, true))) {
    GTEST_SKIP() << dir << " is not installed (Debian package dataset-fashion-mnist)";
  }
  for (const bool train : {true, false}) {
    const Dataset data = oktopk::train::load_fashion_mnist(dir, train);
    const std::int64_t n = train ? 60000 : 10000;
    ASSERT_EQ(data.size(), n);
    ASSERT_EQ(static_cast<std::int64_t>(data.images.size()), n * Dataset::pixels);
    std::vector<std::int64_t> per_class(Dataset::classes, 0);
    for (const auto label : data.labels) {
      ASSERT_GE(label, 0);
      ASSERT_LT(label, Dataset::classes);
      ++per_class[label];
    }
    // Fashion-MNIST is balanced: 6000 (train) or 1000 (test) images per class.
    for (const auto count : per_class) EXPECT_EQ(count, n / Dataset::classes);
    if (train) {
      // The fixed constants are the training set's statistics: standardized, it has mean 0, std 1.
      double sum = 0;
      double sum_sq = 0;
      for (const float x : data.images) {
        sum += x;
        sum_sq += static_cast<double>(x) * x;
      }
      const double count = static_cast<double>(data.images.size());
      const double mean = sum / count;
      EXPECT_NEAR(mean, 0.0, 1e-3);
      EXPECT_NEAR(std::sqrt(sum_sq / count - mean * mean), 1.0, 1e-3);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Shards, shuffles, batches

TEST(Shards, SizesSumToTheDatasetAndDifferByAtMostOne) {
  for (const std::int64_t n : {0, 1, 7, 10000, 60000, 60001}) {
    for (const int ranks : {1, 2, 3, 4, 7, 8, 13}) {
      std::int64_t total = 0;
      std::int64_t smallest = std::numeric_limits<std::int64_t>::max();
      std::int64_t largest = 0;
      for (int r = 0; r < ranks; ++r) {
        const std::int64_t size = oktopk::train::shard_size(n, r, ranks);
        EXPECT_EQ(oktopk::train::shard_begin(n, r, ranks), total) << n << " " << r << "/" << ranks;
        total += size;
        smallest = std::min(smallest, size);
        largest = std::max(largest, size);
      }
      EXPECT_EQ(total, n);
      EXPECT_LE(largest - smallest, 1);
      const std::int64_t batch = 64;
      EXPECT_EQ(oktopk::train::common_steps_per_epoch(n, ranks, batch), smallest / batch);
    }
  }
  EXPECT_THROW(oktopk::train::shard_size(10, 3, 3), std::invalid_argument);
  EXPECT_THROW(oktopk::train::shard_begin(10, 0, 0), std::invalid_argument);
}

TEST(Shards, ShardCopiesTheRightSamples) {
  Dataset data;
  const int n = 11;
  for (int i = 0; i < n; ++i) {
    data.labels.push_back(i % 10);
    for (int p = 0; p < Dataset::pixels; ++p) data.images.push_back(static_cast<float>(i));
  }
  std::int64_t seen = 0;
  for (int r = 0; r < 3; ++r) {
    const Dataset part = oktopk::train::shard(data, r, 3);
    ASSERT_EQ(static_cast<std::int64_t>(part.images.size()), part.size() * Dataset::pixels);
    for (std::int64_t i = 0; i < part.size(); ++i) {
      EXPECT_EQ(part.labels[i], (seen + i) % 10);
      EXPECT_EQ(part.images[i * Dataset::pixels + 5], static_cast<float>(seen + i));
    }
    seen += part.size();
  }
  EXPECT_EQ(seen, n);
}

TEST(Shuffle, DeterministicPermutationPerSeedAndEpoch) {
  const std::int64_t n = 1000;
  const auto a = oktopk::train::epoch_permutation(n, 42, 0);
  std::vector<std::int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::int64_t> identity(n);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(sorted, identity);
  EXPECT_EQ(a, oktopk::train::epoch_permutation(n, 42, 0));
  EXPECT_NE(a, oktopk::train::epoch_permutation(n, 42, 1));
  EXPECT_NE(a, oktopk::train::epoch_permutation(n, 43, 0));
  EXPECT_NE(a, identity);
  EXPECT_TRUE(oktopk::train::epoch_permutation(0, 1, 0).empty());
  EXPECT_EQ(oktopk::train::epoch_permutation(1, 1, 0), std::vector<std::int64_t>{0});
  // Pinned: the order must not depend on the platform or standard library, so runs reproduce.
  EXPECT_EQ(oktopk::train::epoch_permutation(10, 1, 0),
            (std::vector<std::int64_t>{9, 1, 6, 3, 2, 8, 5, 7, 0, 4}));
}

TEST(Batches, GatherFollowsTheOrder) {
  ExecutionSpace exec;
  Dataset data;
  for (int i = 0; i < 6; ++i) {
    data.labels.push_back(i);
    for (int p = 0; p < Dataset::pixels; ++p)
      data.images.push_back(static_cast<float>(i * 1000 + p));
  }
  const auto device = oktopk::train::to_device(exec, data);
  ASSERT_EQ(device.size(), 6);
  Kokkos::View<std::int64_t*, MemorySpace> order("order", 6);
  auto order_host = Kokkos::create_mirror_view(order);
  for (int i = 0; i < 6; ++i) order_host(i) = 5 - i;
  Kokkos::deep_copy(order, order_host);
  Kokkos::View<float**, Kokkos::LayoutRight, MemorySpace> images("images", 4, Dataset::pixels);
  Kokkos::View<int*, MemorySpace> labels("labels", 4);
  oktopk::train::gather_batch(exec, device, order, 2, 3, images, labels);
  exec.fence();
  auto images_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), images);
  auto labels_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), labels);
  for (int row = 0; row < 3; ++row) {
    const int sample = 5 - (2 + row);
    EXPECT_EQ(labels_host(row), sample);
    for (int p = 0; p < Dataset::pixels; ++p) {
      ASSERT_EQ(images_host(row, p), static_cast<float>(sample * 1000 + p));
    }
  }
  EXPECT_THROW(oktopk::train::gather_batch(exec, device, order, 4, 3, images, labels),
               std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// Models

template <class Scalar>
std::vector<Scalar> to_host(const Kokkos::View<Scalar*, MemorySpace>& v) {
  std::vector<Scalar> out(v.extent(0));
  Kokkos::deep_copy(Kokkos::View<Scalar*, Kokkos::HostSpace>(out.data(), out.size()), v);
  return out;
}

template <class Scalar>
void from_host(const Kokkos::View<Scalar*, MemorySpace>& v, const std::vector<Scalar>& values) {
  Kokkos::deep_copy(v,
                    Kokkos::View<const Scalar*, Kokkos::HostSpace>(values.data(), values.size()));
}

/// A uniform draw in [-1, 1) from a counter.
double noise(std::uint64_t seed, std::uint64_t i) {
  const std::uint64_t h = oktopk::impl::splitmix64(seed ^ oktopk::impl::splitmix64(i));
  return static_cast<double>(h >> 11) * 0x1.0p-52 - 1.0;
}

/// A batch of images (noise plus a per-class pattern, so it is learnable) and labels.
template <class Scalar>
struct Batch {
  Kokkos::View<Scalar**, Kokkos::LayoutRight, MemorySpace> images;
  Kokkos::View<int*, MemorySpace> labels;

  Batch(int size, std::uint64_t seed)
      : images("images", size, Dataset::pixels), labels("labels", size) {
    auto images_host = Kokkos::create_mirror_view(images);
    auto labels_host = Kokkos::create_mirror_view(labels);
    for (int i = 0; i < size; ++i) {
      const int label = static_cast<int>((oktopk::impl::splitmix64(seed + i) >> 33) % 10);
      labels_host(i) = label;
      for (int p = 0; p < Dataset::pixels; ++p) {
        const double pattern = ((p / 28) / 3 + (p % 28) / 3) % 10 == label ? 1.0 : 0.0;
        images_host(i, p) =
            static_cast<Scalar>(pattern + noise(seed, static_cast<std::uint64_t>(i * 784 + p)));
      }
    }
    Kokkos::deep_copy(images, images_host);
    Kokkos::deep_copy(labels, labels_host);
  }
};

TEST(Models, ArchitecturesAndParameterCounts) {
  const auto mlp = oktopk::train::make_model("mlp", 1);
  EXPECT_EQ(mlp->num_parameters(), 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  EXPECT_EQ(mlp->num_parameters(), 235146);
  const auto cnn = oktopk::train::make_model("cnn", 1);
  EXPECT_EQ(cnn->num_parameters(),
            (25 * 16 + 16) + (25 * 16 * 32 + 32) + (7 * 7 * 32 * 128 + 128) + (128 * 10 + 10));
  EXPECT_EQ(cnn->num_parameters(), 215370);
  for (const auto* model : {mlp.get(), cnn.get()}) {
    EXPECT_EQ(model->num_inputs(), 784);
    EXPECT_EQ(model->num_classes(), 10);
    EXPECT_EQ(static_cast<std::int64_t>(model->parameters().extent(0)), model->num_parameters());
    EXPECT_EQ(static_cast<std::int64_t>(model->gradient().extent(0)), model->num_parameters());
    // The blocks tile the flat buffer.
    std::int64_t next = 0;
    for (const auto& block : model->parameter_blocks()) {
      EXPECT_EQ(block.offset, next) << block.name;
      next += block.size;
    }
    EXPECT_EQ(next, model->num_parameters());
    EXPECT_FALSE(model->summary().empty());
  }
  EXPECT_EQ(cnn->parameter_blocks().front().name, "0.conv.weight");
  EXPECT_EQ(mlp->parameter_blocks().back().name, "4.dense.bias");
  EXPECT_EQ(oktopk::train::model_names(), (std::vector<std::string>{"mlp", "cnn"}));
}

TEST(Models, UnknownNameThrows) {
  try {
    oktopk::train::make_model("resnet", 1);
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("oktopk::train::make_model: unknown model 'resnet'", 0),
              0u)
        << e.what();
  }
}

TEST(Models, InitializationDependsOnTheSeedOnly) {
  for (const std::string name : {"mlp", "cnn"}) {
    const auto a = to_host(oktopk::train::make_model(name, 7)->parameters());
    const auto b = to_host(oktopk::train::make_model(name, 7)->parameters());
    const auto c = to_host(oktopk::train::make_model(name, 8)->parameters());
    EXPECT_EQ(a, b) << name;
    std::int64_t differ = 0;
    for (std::size_t i = 0; i < a.size(); ++i) differ += a[i] != c[i] ? 1 : 0;
    const auto model = oktopk::train::make_model(name, 7);
    std::int64_t biases = 0;
    for (const auto& block : model->parameter_blocks()) {
      const bool bias = block.name.find("bias") != std::string::npos;
      double largest = 0;
      for (std::int64_t i = block.offset; i < block.offset + block.size; ++i) {
        largest = std::max(largest, std::abs(static_cast<double>(a[i])));
      }
      if (bias) {
        EXPECT_EQ(largest, 0.0) << name << " " << block.name;
        biases += block.size;
      } else {
        // Uniform in (-bound, bound) with bound <= sqrt(6 / fan_in) <= sqrt(6 / 25).
        EXPECT_GT(largest, 0.0) << name << " " << block.name;
        EXPECT_LT(largest, std::sqrt(6.0 / 25.0) + 1e-6) << name << " " << block.name;
      }
    }
    // Every weight differs between seeds (the biases are zero for both).
    EXPECT_EQ(differ, static_cast<std::int64_t>(a.size()) - biases) << name;
    // The double model starts from the same values.
    const auto d = to_host(oktopk::train::make_model<double>(name, 7)->parameters());
    for (std::size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], static_cast<float>(d[i])) << i;
  }
}

/// Adds noise to every parameter: nonzero biases, and values that are not the initializer's.
template <class Scalar>
void perturb(BasicModel<Scalar>& model, double scale) {
  auto p = to_host(model.parameters());
  for (std::size_t i = 0; i < p.size(); ++i) p[i] += static_cast<Scalar>(scale * noise(99, i));
  from_host(model.parameters(), p);
}

/// `total` parameters to check, spread evenly over the blocks (every layer's weights and
/// biases): a block smaller than its share gives all its entries and leaves the rest to the
/// others, so the small conv and bias blocks are not drowned out by the large dense weights.
template <class Scalar>
std::vector<std::int64_t> sample_parameters(const BasicModel<Scalar>& model, std::int64_t total) {
  auto blocks = model.parameter_blocks();
  std::sort(blocks.begin(), blocks.end(),
            [](const auto& a, const auto& b) { return a.size < b.size; });
  std::vector<std::int64_t> picked;
  std::int64_t remaining = total;
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    const auto& block = blocks[b];
    const std::int64_t share =
        std::min(block.size, remaining / static_cast<std::int64_t>(blocks.size() - b));
    std::set<std::int64_t> chosen;
    for (std::uint64_t draw = 0; static_cast<std::int64_t>(chosen.size()) < share; ++draw) {
      chosen.insert(block.offset +
                    static_cast<std::int64_t>(oktopk::impl::splitmix64(block.offset * 7919 + draw) %
                                              static_cast<std::uint64_t>(block.size)));
    }
    picked.insert(picked.end(), chosen.begin(), chosen.end());
    remaining -= share;
  }
  return picked;
}

class GradientCheck : public ::testing::TestWithParam<std::string> {};

// Central differences in double: with h = 1e-6 the truncation error (h^2/6 |f'''|) is ~1e-13 and
// the rounding error (eps |f| / h, f ~ 2.3) ~5e-10, so agreement to 1e-6 relative (plus 1e-8
// absolute for gradients near zero) is what a correct backward pass gives. The risk is a
// ReLU or max-pool kink within h of the evaluation point, which makes the function
// non-differentiable there; the noise added to the parameters makes that a measure-zero event,
// and a mismatch is only counted if it persists at h / 10 (where a kink at distance d > h/10
// can no longer be crossed).
TEST_P(GradientCheck, DoubleBackwardMatchesCentralDifferences) {
  ExecutionSpace exec;
  auto model = oktopk::train::make_model<double>(GetParam(), 3);
  perturb(*model, 0.02);
  const Batch<double> batch(3, 5);
  const double loss = model->forward_backward(exec, batch.images, batch.labels, model->gradient());
  EXPECT_TRUE(std::isfinite(loss));
  const auto analytic = to_host(model->gradient());
  auto params = to_host(model->parameters());
  const auto picked = sample_parameters(*model, 200);
  EXPECT_GE(picked.size(), 195u);  // the integer shares may leave a few out

  auto central = [&](std::int64_t i, double h) {
    const double saved = params[i];
    params[i] = saved + h;
    from_host(model->parameters(), params);
    const double plus = model->loss(exec, batch.images, batch.labels);
    params[i] = saved - h;
    from_host(model->parameters(), params);
    const double minus = model->loss(exec, batch.images, batch.labels);
    params[i] = saved;
    from_host(model->parameters(), params);
    return (plus - minus) / (2 * h);
  };
  auto agrees = [&](double fd, double g) {
    return std::abs(fd - g) <= 1e-8 + 1e-6 * std::max(std::abs(fd), std::abs(g));
  };

  int nonzero = 0;
  for (const std::int64_t i : picked) {
    double fd = central(i, 1e-6);
    if (!agrees(fd, analytic[i])) fd = central(i, 1e-7);
    EXPECT_TRUE(agrees(fd, analytic[i]))
        << GetParam() << " parameter " << i << ": analytic " << analytic[i] << ", central " << fd;
    nonzero += std::abs(analytic[i]) > 1e-6 ? 1 : 0;
  }
  // A check of zeros against zeros would prove little.
  EXPECT_GT(nonzero, static_cast<int>(picked.size()) / 2);
  // Every bias block gets a nonzero gradient somewhere.
  for (const auto& block : model->parameter_blocks()) {
    double largest = 0;
    for (std::int64_t i = block.offset; i < block.offset + block.size; ++i) {
      largest = std::max(largest, std::abs(analytic[i]));
    }
    EXPECT_GT(largest, 1e-6) << block.name;
  }
}

// The float path (the one that trains) runs the same code; compare it with the double gradient
// checked above. Float carries ~6e-8 relative rounding per operation and a few hundred
// operations per entry in sums of mixed signs; 1e-3 of the gradient's largest entry bounds the
// accumulated error with a wide margin and still catches any wrong index or missing term.
TEST_P(GradientCheck, FloatBackwardMatchesDouble) {
  ExecutionSpace exec;
  auto model_d = oktopk::train::make_model<double>(GetParam(), 3);
  auto model_f = oktopk::train::make_model<float>(GetParam(), 3);
  perturb(*model_d, 0.02);
  {
    const auto pd = to_host(model_d->parameters());
    std::vector<float> pf(pd.begin(), pd.end());
    from_host(model_f->parameters(), pf);
    // Compare on equal parameters: the double model gets the float-rounded values too.
    from_host(model_d->parameters(), std::vector<double>(pf.begin(), pf.end()));
  }
  const Batch<double> batch_d(4, 11);
  const Batch<float> batch_f(4, 11);
  // Poison the float gradient: forward_backward must overwrite every entry.
  Kokkos::deep_copy(model_f->gradient(), std::numeric_limits<float>::quiet_NaN());
  const double loss_d =
      model_d->forward_backward(exec, batch_d.images, batch_d.labels, model_d->gradient());
  const double loss_f =
      model_f->forward_backward(exec, batch_f.images, batch_f.labels, model_f->gradient());
  EXPECT_NEAR(loss_f, loss_d, 1e-5 * loss_d);
  const auto gd = to_host(model_d->gradient());
  const auto gf = to_host(model_f->gradient());
  double largest = 0;
  for (const double g : gd) largest = std::max(largest, std::abs(g));
  ASSERT_GT(largest, 0.0);
  for (std::size_t i = 0; i < gd.size(); ++i) {
    ASSERT_TRUE(std::isfinite(gf[i])) << "entry " << i << " not written";
    ASSERT_NEAR(gf[i], gd[i], 1e-3 * largest) << GetParam() << " entry " << i;
  }
}

TEST_P(GradientCheck, LossDecreasesUnderSgd) {
  ExecutionSpace exec;
  auto model = oktopk::train::make_model(GetParam(), 1);
  const Batch<float> batch(32, 17);
  Kokkos::View<float*, MemorySpace> velocity("velocity", model->num_parameters());
  const double first = model->loss(exec, batch.images, batch.labels);
  double last = first;
  for (int step = 0; step < 15; ++step) {
    last = model->forward_backward(exec, batch.images, batch.labels, model->gradient());
    ASSERT_TRUE(std::isfinite(last)) << "step " << step;
    oktopk::train::sgd_momentum_step(exec, model->parameters(), model->gradient(), velocity, 0.02,
                                     0.9);
  }
  last = model->loss(exec, batch.images, batch.labels);
  EXPECT_LT(last, 0.5 * first) << GetParam() << ": " << first << " -> " << last;
  const auto score = model->evaluate(exec, batch.images, batch.labels);
  EXPECT_NEAR(score.loss, last, 1e-6 * last);
  EXPECT_GT(score.accuracy, 0.5);
  // predict agrees with evaluate's accuracy.
  Kokkos::View<int*, MemorySpace> predictions("predictions", 32);
  model->predict(exec, batch.images, predictions);
  const auto p = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), predictions);
  const auto l = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), batch.labels);
  int correct = 0;
  for (int i = 0; i < 32; ++i) correct += p(i) == l(i) ? 1 : 0;
  EXPECT_DOUBLE_EQ(score.accuracy, correct / 32.0);
}

TEST_P(GradientCheck, BadArgumentsThrow) {
  ExecutionSpace exec;
  auto model = oktopk::train::make_model(GetParam(), 1);
  const Batch<float> batch(4, 3);
  Kokkos::View<int*, MemorySpace> bad_labels("labels", 4);
  Kokkos::deep_copy(bad_labels, 10);
  EXPECT_THROW(model->forward_backward(exec, batch.images, bad_labels, model->gradient()),
               std::invalid_argument);
  Kokkos::View<int*, MemorySpace> short_labels("labels", 3);
  EXPECT_THROW(model->forward_backward(exec, batch.images, short_labels, model->gradient()),
               std::invalid_argument);
  Kokkos::View<float*, MemorySpace> short_gradient("gradient", 10);
  EXPECT_THROW(model->forward_backward(exec, batch.images, batch.labels, short_gradient),
               std::invalid_argument);
  Kokkos::View<float**, Kokkos::LayoutRight, MemorySpace> wrong_images("images", 4, 100);
  EXPECT_THROW(model->loss(exec, wrong_images, batch.labels), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Models, GradientCheck, ::testing::Values("mlp", "cnn"));

Kokkos::View<double*, MemorySpace> device_copy(const char* label, const std::vector<double>& host) {
  Kokkos::View<double*, MemorySpace> v(std::string(label), host.size());
  Kokkos::deep_copy(
      v, Kokkos::View<const double*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
             host.data(), host.size()));
  return v;
}

// Momentum correction, with an exact average: velocity per rank, then params -= lr average,
// is the same update as SGD with momentum after the allreduce, entry for entry.
TEST(MomentumCorrection, WithAnExactAverageIsSgdWithMomentum) {
  ExecutionSpace exec;
  const std::int64_t n = 37;
  const double lr = 0.05, momentum = 0.9, decay = 1e-3;
  std::vector<double> params0(n);
  for (std::int64_t i = 0; i < n; ++i) params0[i] = std::sin(0.7 * static_cast<double>(i));
  auto params_a = device_copy("params_a", params0);
  auto params_b = device_copy("params_b", params0);
  Kokkos::View<double*, MemorySpace> velocity_a("velocity_a", n), velocity_b("velocity_b", n);
  std::vector<double> p = params0, v(n, 0.0);  // host reference of the corrected update
  for (int step = 0; step < 5; ++step) {
    std::vector<double> g(n);
    for (std::int64_t i = 0; i < n; ++i) g[i] = std::cos(1.3 * static_cast<double>(i + 5 * step));
    const auto gradient = device_copy("gradient", g);
    oktopk::train::sgd_momentum_step<double>(exec, params_a, gradient, velocity_a, lr, momentum,
                                             decay);
    oktopk::train::accumulate_velocity<double>(exec, params_b, gradient, velocity_b, momentum,
                                               decay);
    oktopk::train::sgd_apply<double>(exec, params_b, velocity_b, lr);
    for (std::int64_t i = 0; i < n; ++i) {
      v[i] = momentum * v[i] + g[i] + decay * p[i];
      p[i] -= lr * v[i];
    }
  }
  exec.fence();
  const auto a = to_host(params_a), b = to_host(params_b);
  const auto va = to_host(velocity_a), vb = to_host(velocity_b);
  for (std::int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(a[i], b[i]) << "entry " << i;
    EXPECT_EQ(va[i], vb[i]) << "entry " << i;
    EXPECT_NEAR(b[i], p[i], 1e-12) << "entry " << i;
    EXPECT_NEAR(vb[i], v[i], 1e-12) << "entry " << i;
  }
}

// sgd_apply applies the update it is given (a sparse average, say), not the velocity.
TEST(MomentumCorrection, SgdApplyUsesTheUpdate) {
  ExecutionSpace exec;
  const std::vector<double> params0 = {1.0, -2.0, 3.0, 0.5};
  const std::vector<double> update = {0.0, 4.0, 0.0, -1.0};
  auto params = device_copy("params", params0);
  oktopk::train::sgd_apply<double>(exec, params, device_copy("update", update), 0.25);
  exec.fence();
  const auto after = to_host(params);
  for (std::size_t i = 0; i < params0.size(); ++i)
    EXPECT_EQ(after[i], params0[i] - 0.25 * update[i]) << "entry " << i;
}

TEST(MomentumCorrection, MismatchedSizesThrow) {
  ExecutionSpace exec;
  Kokkos::View<float*, MemorySpace> params("params", 8), gradient("gradient", 8),
      velocity("velocity", 7), update("update", 9);
  EXPECT_THROW(
      oktopk::train::accumulate_velocity<float>(exec, params, gradient, velocity, 0.9, 0.0),
      std::invalid_argument);
  EXPECT_THROW(oktopk::train::sgd_apply<float>(exec, params, update, 0.1), std::invalid_argument);
}

}  // namespace
