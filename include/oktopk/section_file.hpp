// SPDX-License-Identifier: BSD-3-Clause
// The binary format of OkTopk's checkpoints, for programs that keep their own state beside a
// handle's: an 8-byte magic, a u32 format version, then sections, each a 4-character tag, the
// payload's length (u64), the payload and its FNV-1a 64 checksum (u64); every scalar
// little-endian. A truncated or damaged file is reported as such instead of being read.
#pragma once

#include <oktopk/impl/base/hash.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <istream>
#include <ostream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace oktopk {

/// \brief Bytes that are not what the reader expects. what() says how, after the file's name:
/// "is truncated: it ends inside ..." when the bytes end too early, otherwise "is corrupt: ...".
class SectionError : public std::runtime_error {
 public:
  SectionError(bool truncated, const std::string& what)
      : std::runtime_error(std::string(truncated ? "is truncated: " : "is corrupt: ") + what) {}
};

namespace impl {

inline bool host_is_little_endian() {
  const std::uint16_t one = 1;
  unsigned char first = 0;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

/// Reverses the bytes of each of `count` words of `width` bytes in place (big-endian hosts
/// only).
inline void swap_words(void* data, std::size_t count, std::size_t width = 4) {
  auto* bytes = static_cast<unsigned char*>(data);
  for (std::size_t i = 0; i < count; ++i, bytes += width) {
    for (std::size_t b = 0; b < width / 2; ++b) std::swap(bytes[b], bytes[width - 1 - b]);
  }
}

}  // namespace impl

/// \brief A section's payload, built from little-endian scalars.
class SectionPayload {
 public:
  void put_u32(std::uint32_t v) { put(v, 4); }
  void put_i32(std::int32_t v) { put(static_cast<std::uint32_t>(v), 4); }
  void put_u64(std::uint64_t v) { put(v, 8); }
  void put_i64(std::int64_t v) { put(static_cast<std::uint64_t>(v), 8); }
  void put_f32(float v) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    put(bits, 4);
  }
  void put_f64(double v) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    put(bits, 8);
  }
  /// A u64 count, then the floats.
  void put_floats(const std::vector<float>& values) {
    put_u64(values.size());
    for (const float v : values) put_f32(v);
  }
  /// Appends `bytes` as they are (SectionParser::rest() reads them back when they come last).
  void put_bytes(const std::string& bytes) { bytes_ += bytes; }
  const std::string& bytes() const { return bytes_; }

 private:
  void put(std::uint64_t v, int size) {
    for (int i = 0; i < size; ++i) bytes_.push_back(static_cast<char>((v >> (8 * i)) & 0xffu));
  }
  std::string bytes_;
};

/// \brief Reads a section's payload back, in the order it was built; reading past its end, or
/// leaving bytes unread (expect_end), throws SectionError naming the section.
class SectionParser {
 public:
  SectionParser(std::string bytes, std::string name)
      : bytes_(std::move(bytes)), name_(std::move(name)) {}

  std::uint32_t u32() { return static_cast<std::uint32_t>(get(4)); }
  std::int32_t i32() { return static_cast<std::int32_t>(static_cast<std::uint32_t>(get(4))); }
  std::uint64_t u64() { return get(8); }
  std::int64_t i64() { return static_cast<std::int64_t>(get(8)); }
  float f32() {
    const auto bits = static_cast<std::uint32_t>(get(4));
    float v = 0.0f;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
  double f64() {
    const std::uint64_t bits = get(8);
    double v = 0.0;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
  /// What put_floats wrote.
  std::vector<float> floats() {
    const std::uint64_t count = u64();
    if (count > remaining() / 4)
      throw SectionError(true, "it ends inside the " + name_ + " section");
    std::vector<float> values(static_cast<std::size_t>(count));
    for (float& v : values) v = f32();
    return values;
  }
  /// The bytes not read yet, all of them.
  std::string rest() {
    std::string part = bytes_.substr(position_);
    position_ = bytes_.size();
    return part;
  }
  std::size_t remaining() const { return bytes_.size() - position_; }
  void expect_end() const {
    if (remaining() != 0) {
      throw SectionError(false, "the " + name_ + " section has " + std::to_string(remaining()) +
                                    " unexpected trailing bytes");
    }
  }

 private:
  std::uint64_t get(int size) {
    if (remaining() < static_cast<std::size_t>(size)) {
      throw SectionError(false, "the " + name_ + " section is too short");
    }
    std::uint64_t v = 0;
    for (int i = 0; i < size; ++i) {
      v |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes_[position_ + i])) << (8 * i);
    }
    position_ += static_cast<std::size_t>(size);
    return v;
  }
  std::string bytes_;
  std::string name_;
  std::size_t position_ = 0;
};

/// \brief Writes a file of sections to a stream. A failed write throws
/// std::runtime_error("<where>: writing the checkpoint failed (stream error)").
class SectionWriter {
 public:
  SectionWriter(std::ostream& os, std::string where) : os_(os), where_(std::move(where)) {}

  void header(const char (&magic)[8], std::uint32_t format_version) {
    write(magic, sizeof magic);
    SectionPayload version;
    version.put_u32(format_version);
    write(version.bytes().data(), version.bytes().size());
  }

  void section(const char* tag, const std::string& payload) {
    begin(tag, payload.size());
    write(payload.data(), payload.size());
    impl::Fnv1a64 hash;
    hash.update(payload.data(), payload.size());
    end(hash.value());
  }

  /// A section of `count` floats or doubles, stored little-endian (no count: the length says
  /// it).
  template <class Real>
  void section_floats(const char* tag, const Real* data, std::size_t count) {
    static_assert(std::is_same_v<Real, float> || std::is_same_v<Real, double>,
                  "sections hold floats or doubles");
    constexpr std::size_t width = sizeof(Real);
    begin(tag, width * static_cast<std::uint64_t>(count));
    impl::Fnv1a64 hash;
    if (impl::host_is_little_endian()) {
      write(data, width * count);
      hash.update(data, width * count);
    } else {
      std::vector<Real> chunk;
      for (std::size_t begin = 0; begin < count; begin += 16384) {
        chunk.assign(data + begin, data + std::min(count, begin + 16384));
        impl::swap_words(chunk.data(), chunk.size(), width);
        write(chunk.data(), width * chunk.size());
        hash.update(chunk.data(), width * chunk.size());
      }
    }
    end(hash.value());
  }

 private:
  void begin(const char* tag, std::uint64_t length) {
    write(tag, 4);
    SectionPayload size;
    size.put_u64(length);
    write(size.bytes().data(), size.bytes().size());
  }
  void end(std::uint64_t checksum) {
    SectionPayload sum;
    sum.put_u64(checksum);
    write(sum.bytes().data(), sum.bytes().size());
  }
  void write(const void* data, std::size_t size) {
    if (size > 0) os_.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
    if (!os_) throw std::runtime_error(where_ + ": writing the checkpoint failed (stream error)");
  }
  std::ostream& os_;
  std::string where_;
};

/// \brief Reads what SectionWriter wrote, section by section, checking tags, lengths and
/// checksums; any problem throws SectionError. Reads exactly the file's bytes, so a caller may
/// keep other data after it in the same stream.
class SectionReader {
 public:
  explicit SectionReader(std::istream& is) : is_(is) {}

  /// Whether the next 8 bytes are `magic` (the caller says what else they are).
  bool magic(const char (&expected)[8]) {
    char found[8] = {};
    read(found, sizeof found, "the file header");
    return std::memcmp(found, expected, sizeof found) == 0;
  }

  /// The u32 after the magic.
  std::uint32_t version() {
    return SectionParser(read_string(4, "the file header"), "version").u32();
  }

  /// A whole section of at most `max_length` bytes (`name` is for messages).
  SectionParser section(const char* tag, const std::string& name, std::uint64_t max_length) {
    const std::uint64_t length = begin(tag, name);
    if (length > max_length) {
      throw SectionError(false, "the " + name + " section claims " + std::to_string(length) +
                                    " bytes (at most " + std::to_string(max_length) + " expected)");
    }
    std::string payload = read_string(static_cast<std::size_t>(length), "the " + name + " section");
    impl::Fnv1a64 hash;
    hash.update(payload.data(), payload.size());
    end(hash.value(), name);
    return SectionParser(std::move(payload), name);
  }

  /// A section of exactly `count` little-endian floats or doubles, read into `data`.
  template <class Real>
  void section_floats(const char* tag, const std::string& name, Real* data, std::size_t count) {
    static_assert(std::is_same_v<Real, float> || std::is_same_v<Real, double>,
                  "sections hold floats or doubles");
    constexpr std::size_t width = sizeof(Real);
    const std::uint64_t length = begin(tag, name);
    if (length != width * static_cast<std::uint64_t>(count)) {
      throw SectionError(false, "the " + name + " section holds " + std::to_string(length) +
                                    " bytes, expected " +
                                    std::to_string(width * static_cast<std::uint64_t>(count)));
    }
    read(data, width * count, "the " + name + " section");
    impl::Fnv1a64 hash;
    hash.update(data, width * count);
    end(hash.value(), name);
    if (!impl::host_is_little_endian()) impl::swap_words(data, count, width);
  }

 private:
  std::uint64_t begin(const char* tag, const std::string& name) {
    char found[4] = {};
    read(found, 4, "the " + name + " section");
    if (std::memcmp(found, tag, 4) != 0) {
      throw SectionError(false, "expected the " + name + " section (tag " + std::string(tag, 4) +
                                    "), found tag " + printable(found));
    }
    return SectionParser(read_string(8, "the " + name + " section"), name).u64();
  }
  void end(std::uint64_t computed, const std::string& name) {
    if (SectionParser(read_string(8, "the " + name + " section"), name).u64() != computed) {
      throw SectionError(false, "the " + name + " section does not match its checksum");
    }
  }
  /// In pieces, so that a damaged length makes a truncated read rather than a huge allocation.
  std::string read_string(std::size_t size, const std::string& where) {
    constexpr std::size_t piece = std::size_t{1} << 20;
    std::string bytes;
    bytes.reserve(std::min(size, piece));
    while (bytes.size() < size) {
      const std::size_t next = std::min(size - bytes.size(), piece);
      const std::size_t at = bytes.size();
      bytes.resize(at + next);
      is_.read(bytes.data() + at, static_cast<std::streamsize>(next));
      const auto got = static_cast<std::size_t>(is_.gcount());
      if (got != next) {
        throw SectionError(true, "it ends inside " + where + " (" + std::to_string(at + got) +
                                     " of " + std::to_string(size) + " bytes read)");
      }
    }
    return bytes;
  }
  void read(void* data, std::size_t size, const std::string& where) {
    if (size == 0) return;
    is_.read(static_cast<char*>(data), static_cast<std::streamsize>(size));
    const auto got = static_cast<std::size_t>(is_.gcount());
    if (got != size) {
      throw SectionError(true, "it ends inside " + where + " (" + std::to_string(got) + " of " +
                                   std::to_string(size) + " bytes read)");
    }
  }
  static std::string printable(const char (&tag)[4]) {
    std::string s;
    for (const char c : tag) {
      const auto u = static_cast<unsigned char>(c);
      if (u >= 0x20 && u < 0x7f) {
        s += c;
      } else {
        s += "\\x";
        s += "0123456789abcdef"[u >> 4];
        s += "0123456789abcdef"[u & 15u];
      }
    }
    return s;
  }
  std::istream& is_;
};

}  // namespace oktopk
