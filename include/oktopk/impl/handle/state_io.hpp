// SPDX-License-Identifier: BSD-3-Clause
// The binary checkpoint format of SparseAllreduce::save_state: little-endian scalars, and
// sections that each carry their length and an FNV-1a checksum, so that a truncated or
// damaged stream is reported as such instead of being restored (docs/user-guide.md,
// "Checkpoint and restart").
#pragma once

#include <oktopk/impl/base/hash.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <istream>
#include <ostream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace oktopk::impl {

/// The first bytes of every SparseAllreduce checkpoint.
inline constexpr char state_magic[8] = {'O', 'K', 'T', 'O', 'P', 'K', 'S', 'A'};
/// Raised whenever the format changes; a reader refuses versions it does not know.
/// Version 2 adds the handle's Layout digest to the header section; handles without a layout
/// still write version 1, which every reader since layouts exist also reads.
inline constexpr std::uint32_t state_format_version = 2;
inline constexpr std::uint32_t state_format_version_without_layout = 1;

/// \brief A checkpoint that cannot be restored. `mismatch()`: intact, but written for another
/// handle (reported as std::invalid_argument); otherwise damaged or unreadable
/// (std::runtime_error).
class StateError : public std::runtime_error {
 public:
  StateError(bool mismatch, const std::string& what) : std::runtime_error(what), mismatch_(mismatch) {}
  bool mismatch() const { return mismatch_; }

 private:
  bool mismatch_;
};

inline bool host_is_little_endian() {
  const std::uint16_t one = 1;
  unsigned char first = 0;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

/// Reverses the bytes of each of `count` 4-byte words in place (big-endian hosts only).
inline void swap_words(void* data, std::size_t count) {
  auto* bytes = static_cast<unsigned char*>(data);
  for (std::size_t i = 0; i < count; ++i, bytes += 4) {
    std::swap(bytes[0], bytes[3]);
    std::swap(bytes[1], bytes[2]);
  }
}

/// \brief The payload of a small section, built from little-endian scalars.
class StateBuffer {
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
  const std::string& bytes() const { return bytes_; }

 private:
  void put(std::uint64_t v, int size) {
    for (int i = 0; i < size; ++i) bytes_.push_back(static_cast<char>((v >> (8 * i)) & 0xffu));
  }
  std::string bytes_;
};

/// \brief Reads a small section's payload back; reading past its end, or leaving bytes unread
/// (expect_end), throws StateError naming the section.
class StateParser {
 public:
  StateParser(std::string bytes, std::string section) : bytes_(std::move(bytes)), section_(std::move(section)) {}

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
  std::size_t remaining() const { return bytes_.size() - position_; }
  void expect_end() const {
    if (remaining() != 0) {
      throw StateError(false, "checkpoint is corrupt: the " + section_ + " section has " +
                                  std::to_string(remaining()) + " unexpected trailing bytes");
    }
  }
  const std::string& section() const { return section_; }

 private:
  std::uint64_t get(int size) {
    if (remaining() < static_cast<std::size_t>(size)) {
      throw StateError(false, "checkpoint is corrupt: the " + section_ + " section is too short");
    }
    std::uint64_t v = 0;
    for (int i = 0; i < size; ++i) {
      v |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes_[position_ + i])) << (8 * i);
    }
    position_ += static_cast<std::size_t>(size);
    return v;
  }
  std::string bytes_;
  std::string section_;
  std::size_t position_ = 0;
};

/// \brief Writes the magic, the version, then sections: a 4-character tag, the payload's
/// length (u64), the payload, and the FNV-1a 64 of the payload (u64). A failed write throws
/// std::runtime_error("<where>: writing the checkpoint failed ...").
class StateWriter {
 public:
  StateWriter(std::ostream& os, std::string where) : os_(os), where_(std::move(where)) {}

  void header(std::uint32_t format_version = state_format_version) {
    write(state_magic, sizeof state_magic);
    StateBuffer version;
    version.put_u32(format_version);
    write(version.bytes().data(), version.bytes().size());
  }

  void section(const char* tag, const std::string& payload) {
    begin(tag, payload.size());
    write(payload.data(), payload.size());
    Fnv1a64 hash;
    hash.update(payload.data(), payload.size());
    end(hash.value());
  }

  /// `count` floats, stored little-endian.
  void section_floats(const char* tag, const float* data, std::size_t count) {
    begin(tag, 4 * static_cast<std::uint64_t>(count));
    Fnv1a64 hash;
    if (host_is_little_endian()) {
      write(data, 4 * count);
      hash.update(data, 4 * count);
    } else {
      std::vector<float> chunk;
      for (std::size_t begin = 0; begin < count; begin += 16384) {
        chunk.assign(data + begin, data + std::min(count, begin + 16384));
        swap_words(chunk.data(), chunk.size());
        write(chunk.data(), 4 * chunk.size());
        hash.update(chunk.data(), 4 * chunk.size());
      }
    }
    end(hash.value());
  }

 private:
  void begin(const char* tag, std::uint64_t length) {
    write(tag, 4);
    StateBuffer size;
    size.put_u64(length);
    write(size.bytes().data(), size.bytes().size());
  }
  void end(std::uint64_t checksum) {
    StateBuffer sum;
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

/// \brief Reads what StateWriter wrote, section by section, checking tags, lengths and
/// checksums; any problem throws StateError. Reads exactly the checkpoint's bytes, so a caller
/// may keep other data after it in the same stream.
class StateReader {
 public:
  explicit StateReader(std::istream& is) : is_(is) {}

  /// Returns the format version, one of those this library reads.
  std::uint32_t header() {
    char magic[sizeof state_magic] = {};
    read(magic, sizeof magic, "the file header");
    if (std::memcmp(magic, state_magic, sizeof magic) != 0) {
      throw StateError(false, "not an OkTopk SparseAllreduce checkpoint (wrong magic bytes)");
    }
    StateParser version(read_string(4, "the file header"), "version");
    const std::uint32_t v = version.u32();
    if (v < state_format_version_without_layout || v > state_format_version) {
      throw StateError(false, "checkpoint format version " + std::to_string(v) +
                                  " is not one this library reads (" +
                                  std::to_string(state_format_version_without_layout) + " to " +
                                  std::to_string(state_format_version) + ")");
    }
    return v;
  }

  /// A whole section of at most `max_length` bytes (`name` is for messages).
  StateParser section(const char* tag, const std::string& name, std::uint64_t max_length) {
    const std::uint64_t length = begin(tag, name);
    if (length > max_length) {
      throw StateError(false, "checkpoint is corrupt: the " + name + " section claims " +
                                  std::to_string(length) + " bytes (at most " +
                                  std::to_string(max_length) + " expected)");
    }
    std::string payload = read_string(static_cast<std::size_t>(length), "the " + name + " section");
    Fnv1a64 hash;
    hash.update(payload.data(), payload.size());
    end(hash.value(), name);
    return StateParser(std::move(payload), name);
  }

  /// A section of exactly `count` little-endian floats, read into `data`.
  void section_floats(const char* tag, const std::string& name, float* data, std::size_t count) {
    const std::uint64_t length = begin(tag, name);
    if (length != 4 * static_cast<std::uint64_t>(count)) {
      throw StateError(false, "checkpoint is corrupt: the " + name + " section holds " +
                                  std::to_string(length) + " bytes, expected " +
                                  std::to_string(4 * static_cast<std::uint64_t>(count)));
    }
    read(data, 4 * count, "the " + name + " section");
    Fnv1a64 hash;
    hash.update(data, 4 * count);
    end(hash.value(), name);
    if (!host_is_little_endian()) swap_words(data, count);
  }

 private:
  std::uint64_t begin(const char* tag, const std::string& name) {
    char found[4] = {};
    read(found, 4, "the " + name + " section");
    if (std::memcmp(found, tag, 4) != 0) {
      throw StateError(false, "checkpoint is corrupt: expected the " + name + " section (tag " +
                                  std::string(tag, 4) + "), found tag " + printable(found));
    }
    StateParser length(read_string(8, "the " + name + " section"), name);
    return length.u64();
  }
  void end(std::uint64_t computed, const std::string& name) {
    StateParser stored(read_string(8, "the " + name + " section"), name);
    if (stored.u64() != computed) {
      throw StateError(false, "checkpoint is corrupt: the " + name +
                                  " section does not match its checksum");
    }
  }
  std::string read_string(std::size_t size, const std::string& where) {
    std::string bytes(size, '\0');
    read(bytes.data(), size, where);
    return bytes;
  }
  void read(void* data, std::size_t size, const std::string& where) {
    if (size == 0) return;
    is_.read(static_cast<char*>(data), static_cast<std::streamsize>(size));
    const auto got = static_cast<std::size_t>(is_.gcount());
    if (got != size) {
      throw StateError(false, "checkpoint is truncated: it ends inside " + where + " (" +
                                  std::to_string(got) + " of " + std::to_string(size) +
                                  " bytes read)");
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

}  // namespace oktopk::impl
