// SPDX-License-Identifier: BSD-3-Clause
// Fashion-MNIST for oktopk-train: the IDX gz files read with zlib and checked, per-rank shards,
// a per-epoch shuffle that is the same on every platform, and mini-batches gathered on the
// device from a device-resident copy.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace oktopk::train {

/// \brief Images and labels held on the host, images standardized.
struct Dataset {
  static constexpr int rows = 28;
  static constexpr int cols = 28;
  static constexpr int pixels = rows * cols;
  static constexpr int classes = 10;
  /// Pixels are scaled to [0, 1], then standardized with these fixed constants: the mean and
  /// standard deviation of the Fashion-MNIST training images. Fixed rather than computed so that
  /// every rank (each holding only a shard) and the test set use the same transform.
  static constexpr float pixel_mean = 0.2860f;
  static constexpr float pixel_std = 0.3530f;

  std::vector<float> images;         ///< size() x pixels, row-major
  std::vector<std::int32_t> labels;  ///< size() entries in [0, classes)

  std::int64_t size() const { return static_cast<std::int64_t>(labels.size()); }
};

/// \brief Reads `dir`/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz.
/// Throws std::runtime_error("oktopk::train::load_fashion_mnist: <file>: <what>") when a file is
/// missing or unreadable, not gzip/IDX, has the wrong magic number (2051 images, 2049 labels),
/// images that are not 28x28, truncated or trailing data, image and label counts that differ, or
/// a label outside 0..9.
Dataset load_fashion_mnist(const std::string& dir, bool train);

/// \brief The file names load_fashion_mnist reads in `dir`.
std::string fashion_mnist_images_file(const std::string& dir, bool train);
std::string fashion_mnist_labels_file(const std::string& dir, bool train);

/// \brief The first index and the length of rank's contiguous shard of n samples: the first
/// n % ranks ranks hold one sample more. Contiguous is enough because the files are already in
/// random order (all classes are spread evenly over them).
std::int64_t shard_begin(std::int64_t n, int rank, int ranks);
std::int64_t shard_size(std::int64_t n, int rank, int ranks);

/// \brief A copy of rank's shard of `data` (see shard_begin).
Dataset shard(const Dataset& data, int rank, int ranks);

/// \brief Mini-batches every rank can run in one epoch: the smallest shard divided by batch.
/// Every rank must call the collective once per step, so the training loop runs this many steps
/// on every rank even where a shard is one sample longer.
std::int64_t common_steps_per_epoch(std::int64_t n, int ranks, std::int64_t batch);

/// \brief A permutation of 0..n-1 for one epoch: Fisher-Yates driven by SplitMix64 on
/// (seed, epoch), so it is the same on every platform and standard library (std::shuffle is not).
std::vector<std::int64_t> epoch_permutation(std::int64_t n, std::uint64_t seed, std::int64_t epoch);

/// \brief A Dataset copied once to the device, so each mini-batch is gathered there and only the
/// permutation crosses per epoch.
struct DeviceDataset {
  using MemorySpace = Kokkos::DefaultExecutionSpace::memory_space;
  Kokkos::View<float**, Kokkos::LayoutRight, MemorySpace> images;  ///< size x pixels
  Kokkos::View<int*, MemorySpace> labels;

  std::int64_t size() const { return static_cast<std::int64_t>(labels.extent(0)); }
};

DeviceDataset to_device(const Kokkos::DefaultExecutionSpace& exec, const Dataset& data);

/// \brief Gathers samples order(begin), ..., order(begin + count - 1) of `data` into the first
/// `count` rows of `images` and entries of `labels`.
void gather_batch(
    const Kokkos::DefaultExecutionSpace& exec, const DeviceDataset& data,
    const Kokkos::View<const std::int64_t*, DeviceDataset::MemorySpace>& order, std::int64_t begin,
    std::int64_t count,
    const Kokkos::View<float**, Kokkos::LayoutRight, DeviceDataset::MemorySpace>& images,
    const Kokkos::View<int*, DeviceDataset::MemorySpace>& labels);

}  // namespace oktopk::train
