// SPDX-License-Identifier: BSD-3-Clause
// The gradient file, the one definition of its format: oktopk-bench and oktopk-train write it
// (--dump-gradients), oktopk-bench replays it (--dist file:PATH). The 8 bytes "OKTOPKG1", int64
// n, int64 count, then count gradients of n float32 each, all little endian, with no padding:
// gradient i starts at byte 24 + 4 n i. Header-only, and free of MPI and Kokkos.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace oktopk::apps {

/// \brief The header's two numbers.
struct GradientFileHeader {
  std::int64_t n = 0;      ///< floats per gradient, in [1, 2^31-1] (MPI counts are int)
  std::int64_t count = 0;  ///< gradients, >= 1
};

namespace gradient_file {

inline constexpr char magic[8] = {'O', 'K', 'T', 'O', 'P', 'K', 'G', '1'};
inline constexpr std::int64_t header_bytes = 24;

inline bool host_is_little_endian() {
  const std::uint32_t one = 1;
  unsigned char first = 0;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

/// Converts `count` values of `size` bytes each between the host's byte order and the file's
/// (little endian), in place; the same swap goes both ways, and nothing on a little-endian host.
inline void convert_byte_order(void* data, std::size_t count, std::size_t size) {
  if (host_is_little_endian()) return;
  auto* bytes = static_cast<unsigned char*>(data);
  for (std::size_t e = 0; e < count; ++e) std::reverse(bytes + e * size, bytes + (e + 1) * size);
}

/// Where gradient `index` of a file of gradients of `n` floats starts.
inline std::int64_t offset(std::int64_t n, std::int64_t index) {
  return header_bytes + index * n * static_cast<std::int64_t>(sizeof(float));
}

}  // namespace gradient_file

/// Reads and validates the header of `path`, and checks the file's size against it; returns
/// an error message (naming the file), empty if it is fine.
inline std::string read_gradient_file_header(const std::string& path, GradientFileHeader& header) {
  using gradient_file::header_bytes;
  std::ifstream in(path, std::ios::binary);
  if (!in) return "cannot open gradient file '" + path + "'";
  char bytes[header_bytes];
  in.read(bytes, header_bytes);
  if (in.gcount() != header_bytes) {
    return "'" + path + "' is not a gradient file (shorter than the 24-byte header)";
  }
  if (std::memcmp(bytes, gradient_file::magic, sizeof(gradient_file::magic)) != 0) {
    return "'" + path + "' is not a gradient file (it does not start with OKTOPKG1)";
  }
  std::int64_t fields[2];
  std::memcpy(fields, bytes + sizeof(gradient_file::magic), sizeof(fields));
  gradient_file::convert_byte_order(fields, 2, sizeof(std::int64_t));
  header.n = fields[0];
  header.count = fields[1];
  if (header.n < 1 || header.n > std::numeric_limits<std::int32_t>::max()) {
    return "'" + path + "' is malformed: its n = " + std::to_string(header.n) +
           " is outside [1, 2^31-1]";
  }
  if (header.count < 1) {
    return "'" + path + "' is malformed: it announces " + std::to_string(header.count) +
           " gradients";
  }
  const std::int64_t record = header.n * static_cast<std::int64_t>(sizeof(float));
  if (header.count > (std::numeric_limits<std::int64_t>::max() - header_bytes) / record) {
    return "'" + path + "' is malformed: n = " + std::to_string(header.n) +
           " times count = " + std::to_string(header.count) + " overflows";
  }
  const std::int64_t expected = header_bytes + header.count * record;
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::int64_t>(in.tellg());
  if (size != expected) {
    return "'" + path + "' is malformed: " + std::to_string(size) +
           " bytes, but its header (n = " + std::to_string(header.n) +
           ", count = " + std::to_string(header.count) + ") needs " + std::to_string(expected);
  }
  return {};
}

/// Reads gradient `index` of the file `path`, whose header is `header`, into `gradient` (n
/// floats, in the host's byte order); returns false if it cannot.
inline bool read_gradient(const std::string& path, const GradientFileHeader& header,
                          std::int64_t index, float* gradient) {
  const std::int64_t bytes = header.n * static_cast<std::int64_t>(sizeof(float));
  std::ifstream in(path, std::ios::binary);
  in.seekg(gradient_file::offset(header.n, index));
  in.read(reinterpret_cast<char*>(gradient), bytes);
  if (!in || in.gcount() != bytes) return false;
  gradient_file::convert_byte_order(gradient, static_cast<std::size_t>(header.n), sizeof(float));
  return true;
}

/// \brief Writes a gradient file front to back: the header, then the floats of its gradients in
/// order, in as many pieces as the caller likes.
class GradientFileWriter {
 public:
  /// Creates (or truncates) `path` and writes the header; returns whether that worked.
  bool open(const std::string& path, const GradientFileHeader& header) {
    out_.open(path, std::ios::binary | std::ios::trunc);
    std::int64_t fields[2] = {header.n, header.count};
    gradient_file::convert_byte_order(fields, 2, sizeof(std::int64_t));
    out_.write(gradient_file::magic, sizeof(gradient_file::magic));
    out_.write(reinterpret_cast<const char*>(fields), sizeof(fields));
    return good();
  }

  /// Appends `count` floats (host byte order) to the gradients written so far.
  void write(const float* values, std::size_t count) {
    if (!gradient_file::host_is_little_endian()) {
      swapped_.assign(values, values + count);
      gradient_file::convert_byte_order(swapped_.data(), count, sizeof(float));
      values = swapped_.data();
    }
    out_.write(reinterpret_cast<const char*>(values),
               static_cast<std::streamsize>(count * sizeof(float)));
  }

  /// Closes the file; returns whether every write and the close succeeded.
  bool close() {
    out_.close();
    return good();
  }

  bool good() const { return !out_.fail(); }

 private:
  std::ofstream out_;
  std::vector<float> swapped_;  // a big-endian host's little-endian copy
};

}  // namespace oktopk::apps
