// SPDX-License-Identifier: BSD-3-Clause
#include "fashion_mnist.hpp"

#include "common/app_hash.hpp"
#include "common/app_kokkos_compat.hpp"

#include <oktopk/error.hpp>

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <utility>

namespace oktopk::train {

namespace {

constexpr const char* where = "oktopk::train::load_fashion_mnist";
constexpr std::uint32_t images_magic = 2051;  // 0x00000803: unsigned bytes, 3 dimensions
constexpr std::uint32_t labels_magic = 2049;  // 0x00000801: unsigned bytes, 1 dimension

#define OKTOPK_TRAIN_DATA_REQUIRE(cond, file, message) \
  OKTOPK_REQUIRE(cond, std::runtime_error, where, (file) << ": " << message)

/// A gzip file open for reading; zlib also reads uncompressed files transparently.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {
    std::error_code ec;
    OKTOPK_TRAIN_DATA_REQUIRE(std::filesystem::exists(path, ec), path, "missing file");
    errno = 0;
    file_ = gzopen(path.c_str(), "rb");
    OKTOPK_TRAIN_DATA_REQUIRE(
        file_ != nullptr, path,
        "cannot open: " << (errno != 0 ? std::strerror(errno) : "out of memory"));
  }
  ~GzReader() { gzclose_r(file_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  /// Reads up to `bytes`; returns how many were read (fewer only at the end of the data).
  std::size_t read(void* out, std::size_t bytes) {
    std::size_t done = 0;
    while (done < bytes) {
      // gzread takes an unsigned length and returns an int, so read at most 1 GiB at a time.
      const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(bytes - done, 1u << 30));
      const int got = gzread(file_, static_cast<unsigned char*>(out) + done, chunk);
      if (got < 0) {
        int code = Z_OK;
        const char* message = gzerror(file_, &code);
        OKTOPK_TRAIN_DATA_REQUIRE(false, path_, "corrupt gzip data: " << message);
      }
      if (got == 0) break;
      done += static_cast<std::size_t>(got);
    }
    return done;
  }

  /// Reads exactly `bytes`, naming `what` in the error when the data ends first.
  void read_exact(void* out, std::size_t bytes, const char* what) {
    const std::size_t got = read(out, bytes);
    OKTOPK_TRAIN_DATA_REQUIRE(
        got == bytes, path_,
        "truncated: " << what << " needs " << bytes << " bytes, found " << got);
  }

  /// IDX integers are big-endian 32-bit.
  std::uint32_t read_u32(const char* what) {
    unsigned char b[4];
    read_exact(b, 4, what);
    return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) |
           std::uint32_t{b[3]};
  }

  /// Reads `bytes` of payload in pieces, so a corrupt header claiming a huge count costs no more
  /// memory than the data actually present.
  std::vector<unsigned char> read_payload(std::size_t bytes, const char* what) {
    std::vector<unsigned char> data;
    constexpr std::size_t piece = std::size_t{1} << 22;
    while (data.size() < bytes) {
      const std::size_t old = data.size();
      const std::size_t want = std::min(piece, bytes - old);
      data.resize(old + want);
      const std::size_t got = read(data.data() + old, want);
      OKTOPK_TRAIN_DATA_REQUIRE(
          got == want, path_,
          "truncated: " << what << " needs " << bytes << " bytes, found " << old + got);
    }
    unsigned char extra = 0;
    OKTOPK_TRAIN_DATA_REQUIRE(read(&extra, 1) == 0, path_,
                              "unexpected trailing data after " << bytes << " bytes of " << what);
    return data;
  }

 private:
  std::string path_;
  gzFile file_ = nullptr;
};

}  // namespace

std::string fashion_mnist_images_file(const std::string& dir, bool train) {
  return (std::filesystem::path(dir) /
          (train ? "train-images-idx3-ubyte.gz" : "t10k-images-idx3-ubyte.gz"))
      .string();
}

std::string fashion_mnist_labels_file(const std::string& dir, bool train) {
  return (std::filesystem::path(dir) /
          (train ? "train-labels-idx1-ubyte.gz" : "t10k-labels-idx1-ubyte.gz"))
      .string();
}

Dataset load_fashion_mnist(const std::string& dir, bool train) {
  const std::string images_path = fashion_mnist_images_file(dir, train);
  const std::string labels_path = fashion_mnist_labels_file(dir, train);

  std::vector<unsigned char> pixels;
  std::uint32_t image_count = 0;
  {
    GzReader in(images_path);
    const std::uint32_t magic = in.read_u32("the header");
    OKTOPK_TRAIN_DATA_REQUIRE(
        magic == images_magic, images_path,
        "bad magic number " << magic << " (IDX images have " << images_magic << ")");
    image_count = in.read_u32("the header");
    const std::uint32_t rows = in.read_u32("the header");
    const std::uint32_t cols = in.read_u32("the header");
    OKTOPK_TRAIN_DATA_REQUIRE(rows == Dataset::rows && cols == Dataset::cols, images_path,
                              "images are " << rows << "x" << cols << ", expected " << Dataset::rows
                                            << "x" << Dataset::cols);
    pixels = in.read_payload(std::size_t{image_count} * Dataset::pixels, "the pixel data");
  }

  std::vector<unsigned char> raw_labels;
  {
    GzReader in(labels_path);
    const std::uint32_t magic = in.read_u32("the header");
    OKTOPK_TRAIN_DATA_REQUIRE(
        magic == labels_magic, labels_path,
        "bad magic number " << magic << " (IDX labels have " << labels_magic << ")");
    const std::uint32_t label_count = in.read_u32("the header");
    OKTOPK_TRAIN_DATA_REQUIRE(
        label_count == image_count, labels_path,
        label_count << " labels for " << image_count << " images in " << images_path);
    raw_labels = in.read_payload(label_count, "the labels");
  }

  Dataset data;
  data.labels.resize(raw_labels.size());
  for (std::size_t i = 0; i < raw_labels.size(); ++i) {
    OKTOPK_TRAIN_DATA_REQUIRE(raw_labels[i] < Dataset::classes, labels_path,
                              "label " << int{raw_labels[i]} << " of sample " << i
                                       << " is outside 0.." << Dataset::classes - 1);
    data.labels[i] = raw_labels[i];
  }
  data.images.resize(pixels.size());
  const float scale = 1.0f / (255.0f * Dataset::pixel_std);
  const float shift = Dataset::pixel_mean / Dataset::pixel_std;
  std::transform(pixels.begin(), pixels.end(), data.images.begin(),
                 [=](unsigned char p) { return static_cast<float>(p) * scale - shift; });
  return data;
}

#undef OKTOPK_TRAIN_DATA_REQUIRE

std::int64_t shard_begin(std::int64_t n, int rank, int ranks) {
  OKTOPK_REQUIRE(ranks > 0 && rank >= 0 && rank < ranks && n >= 0, std::invalid_argument,
                 "oktopk::train::shard_begin", "rank " << rank << " of " << ranks << ", n = " << n);
  const std::int64_t base = n / ranks;
  const std::int64_t extra = n % ranks;
  return rank * base + std::min<std::int64_t>(rank, extra);
}

std::int64_t shard_size(std::int64_t n, int rank, int ranks) {
  OKTOPK_REQUIRE(ranks > 0 && rank >= 0 && rank < ranks && n >= 0, std::invalid_argument,
                 "oktopk::train::shard_size", "rank " << rank << " of " << ranks << ", n = " << n);
  return n / ranks + (rank < n % ranks ? 1 : 0);
}

Dataset shard(const Dataset& data, int rank, int ranks) {
  const std::int64_t begin = shard_begin(data.size(), rank, ranks);
  const std::int64_t size = shard_size(data.size(), rank, ranks);
  Dataset part;
  part.labels.assign(data.labels.begin() + begin, data.labels.begin() + begin + size);
  part.images.assign(data.images.begin() + begin * Dataset::pixels,
                     data.images.begin() + (begin + size) * Dataset::pixels);
  return part;
}

std::int64_t common_steps_per_epoch(std::int64_t n, int ranks, std::int64_t batch) {
  OKTOPK_REQUIRE(ranks > 0 && batch > 0 && n >= 0, std::invalid_argument,
                 "oktopk::train::common_steps_per_epoch",
                 "n = " << n << ", ranks = " << ranks << ", batch = " << batch);
  return (n / ranks) / batch;
}

std::vector<std::int64_t> epoch_permutation(std::int64_t n, std::uint64_t seed,
                                            std::int64_t epoch) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) order[i] = i;
  const std::uint64_t stream = ::oktopk::apps::splitmix64(
      seed ^ ::oktopk::apps::splitmix64(static_cast<std::uint64_t>(epoch)));
  for (std::int64_t i = n - 1; i > 0; --i) {
    // The modulo's bias is below (i + 1) / 2^64: far below anything a shuffle can show.
    const std::uint64_t draw = ::oktopk::apps::splitmix64(stream + static_cast<std::uint64_t>(i));
    const auto j = static_cast<std::int64_t>(draw % static_cast<std::uint64_t>(i + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

DeviceDataset to_device(const Kokkos::DefaultExecutionSpace& exec, const Dataset& data) {
  const std::int64_t n = data.size();
  DeviceDataset out;
  out.images = decltype(out.images)(
      Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::train::dataset_images"), n,
      Dataset::pixels);
  out.labels = decltype(out.labels)(
      Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::train::dataset_labels"), n);
  Kokkos::View<const float**, Kokkos::LayoutRight, Kokkos::HostSpace,
               Kokkos::MemoryTraits<Kokkos::Unmanaged>>
      host_images(data.images.data(), n, Dataset::pixels);
  Kokkos::View<const int*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> host_labels(
      data.labels.data(), n);
  static_assert(sizeof(int) == sizeof(std::int32_t), "labels are copied as int");
  Kokkos::deep_copy(exec, out.images, host_images);
  Kokkos::deep_copy(exec, out.labels, host_labels);
  // The host arrays belong to the caller and may go away once we return.
  ::oktopk::apps::fence(exec, "oktopk::train::to_device");
  return out;
}

void gather_batch(
    const Kokkos::DefaultExecutionSpace& exec, const DeviceDataset& data,
    const Kokkos::View<const std::int64_t*, DeviceDataset::MemorySpace>& order, std::int64_t begin,
    std::int64_t count,
    const Kokkos::View<float**, Kokkos::LayoutRight, DeviceDataset::MemorySpace>& images,
    const Kokkos::View<int*, DeviceDataset::MemorySpace>& labels) {
  OKTOPK_REQUIRE(
      begin >= 0 && count >= 0 && begin + count <= static_cast<std::int64_t>(order.extent(0)) &&
          count <= static_cast<std::int64_t>(images.extent(0)) &&
          count <= static_cast<std::int64_t>(labels.extent(0)) &&
          images.extent(1) == static_cast<std::size_t>(Dataset::pixels),
      std::invalid_argument, "oktopk::train::gather_batch",
      "samples [" << begin << ", " << begin + count << ") of an order of " << order.extent(0)
                  << " into a batch of " << images.extent(0) << "x" << images.extent(1));
  const auto src_images = data.images;
  const auto src_labels = data.labels;
  using Policy = Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace>;
  Kokkos::parallel_for(
      "oktopk::train::gather_batch", Policy(exec, 0, count * Dataset::pixels),
      KOKKOS_LAMBDA(const std::int64_t e) {
        const std::int64_t row = e / Dataset::pixels;
        const std::int64_t col = e % Dataset::pixels;
        const std::int64_t sample = order(begin + row);
        images(row, col) = src_images(sample, col);
        if (col == 0) labels(row) = src_labels(sample);
      });
}

}  // namespace oktopk::train
