// SPDX-License-Identifier: BSD-3-Clause
#include "checkpoint.hpp"

#include <mpi.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string_view>

namespace oktopk::train {

namespace {

constexpr char kMagic[8] = {'O', 'K', 'T', 'O', 'P', 'K', 'T', 'R'};
constexpr std::uint32_t kVersion = 1;

std::uint64_t checksum(std::string_view bytes) {
  return static_cast<std::uint64_t>(agreement_digest(bytes));  // FNV-1a 64
}

class Encoder {
 public:
  void u32(std::uint32_t v) { put(v, 4); }
  void u64(std::uint64_t v) { put(v, 8); }
  void i64(std::int64_t v) { put(static_cast<std::uint64_t>(v), 8); }
  void f64(double v) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    put(bits, 8);
  }
  void floats(const std::vector<float>& values) {
    u64(values.size());
    for (const float v : values) {
      std::uint32_t bits = 0;
      std::memcpy(&bits, &v, sizeof bits);
      put(bits, 4);
    }
  }
  void raw(std::string_view bytes) { bytes_.append(bytes.data(), bytes.size()); }
  void section(const char* tag, const Encoder& payload) {
    raw(std::string_view(tag, 4));
    u64(payload.bytes_.size());
    raw(payload.bytes_);
    u64(checksum(payload.bytes_));
  }
  const std::string& bytes() const { return bytes_; }

 private:
  void put(std::uint64_t v, int size) {
    for (int i = 0; i < size; ++i) bytes_.push_back(static_cast<char>((v >> (8 * i)) & 0xffu));
  }
  std::string bytes_;
};

class Decoder {
 public:
  Decoder(std::string_view bytes, std::string what) : bytes_(bytes), what_(std::move(what)) {}

  std::uint32_t u32() { return static_cast<std::uint32_t>(get(4)); }
  std::uint64_t u64() { return get(8); }
  std::int64_t i64() { return static_cast<std::int64_t>(get(8)); }
  double f64() {
    const std::uint64_t bits = get(8);
    double v = 0.0;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
  std::vector<float> floats() {
    const std::uint64_t count = u64();
    if (count > remaining() / 4) fail("is truncated: it ends inside " + what_);
    std::vector<float> values(count);
    for (auto& v : values) {
      const auto bits = static_cast<std::uint32_t>(get(4));
      std::memcpy(&v, &bits, sizeof v);
    }
    return values;
  }
  std::string_view raw(std::size_t size) {
    if (size > remaining()) fail("is truncated: it ends inside " + what_);
    const std::string_view part = bytes_.substr(position_, size);
    position_ += size;
    return part;
  }
  /// The next section's payload, checked against its tag, length and checksum.
  Decoder section(const char* tag, const std::string& name) {
    const std::string what = "the " + name + " section";
    Decoder head(raw_or_truncated(12, what), what);
    const std::string_view found = head.raw(4);
    if (found != std::string_view(tag, 4)) {
      fail("is corrupt: expected " + what + ", found another tag");
    }
    const std::uint64_t length = head.u64();
    if (length > remaining()) fail("is truncated: it ends inside " + what);
    const std::string_view payload = raw(static_cast<std::size_t>(length));
    Decoder sum(raw_or_truncated(8, what), what);
    if (sum.u64() != checksum(payload)) fail("is corrupt: " + what + " does not match its checksum");
    return Decoder(payload, what);
  }
  void expect_end() const {
    if (remaining() != 0) fail("is corrupt: " + what_ + " has unexpected trailing bytes");
  }
  std::size_t remaining() const { return bytes_.size() - position_; }

 private:
  std::string_view raw_or_truncated(std::size_t size, const std::string& what) {
    if (size > remaining()) fail("is truncated: it ends inside " + what);
    return raw(size);
  }
  std::uint64_t get(int size) {
    if (static_cast<std::size_t>(size) > remaining()) {
      fail("is corrupt: " + what_ + " is too short");
    }
    std::uint64_t v = 0;
    for (int i = 0; i < size; ++i) {
      v |= static_cast<std::uint64_t>(static_cast<unsigned char>(bytes_[position_ + i])) << (8 * i);
    }
    position_ += static_cast<std::size_t>(size);
    return v;
  }
  [[noreturn]] static void fail(const std::string& what) { throw std::runtime_error(what); }

  std::string_view bytes_;
  std::string what_;
  std::size_t position_ = 0;
};

/// Collective: if any rank passes a non-empty `error`, every rank throws the first such rank's,
/// as std::runtime_error("<context>: rank R: <error>").
void agree_on_errors(const Communicator& comm, const std::string& context, const std::string& error) {
  const int P = comm.size();
  std::int64_t first = error.empty() ? 0 : P - comm.rank();
  comm.allreduce_in_place(&first, 1, MPI_MAX);
  if (first == 0) return;
  const int root = P - static_cast<int>(first);
  std::int64_t length = static_cast<std::int64_t>(error.size());
  comm.bcast(&length, 1, root);
  std::string text = error;
  text.resize(static_cast<std::size_t>(length));
  comm.bcast(text.data(), length, root);
  throw std::runtime_error(context + ": rank " + std::to_string(root) + ": " + text);
}

std::string system_error(const std::string& what) {
  return what + ": " + std::strerror(errno);
}

/// Writes `bytes` to `path` and flushes them to the disk; returns "" or what went wrong.
std::string write_synced(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return system_error("cannot write " + path);
  std::size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string error = system_error("cannot write " + path);
      ::close(fd);
      return error;
    }
    written += static_cast<std::size_t>(n);
  }
  // Renamed over the old checkpoint only once its bytes are on the disk.
  if (::fsync(fd) != 0) {
    const std::string error = system_error("cannot flush " + path);
    ::close(fd);
    return error;
  }
  if (::close(fd) != 0) return system_error("cannot close " + path);
  return {};
}

}  // namespace

std::string checkpoint_file(const std::string& prefix, int rank) {
  return prefix + ".rank" + std::to_string(rank);
}

std::string encode_checkpoint(const TrainingCheckpoint& c) {
  Encoder file;
  file.raw(std::string_view(kMagic, sizeof kMagic));
  file.u32(kVersion);
  Encoder settings;
  std::string text;
  for (const auto& [name, value] : c.settings) text += name + "=" + value + "\n";
  settings.raw(text);
  file.section("SETT", settings);
  Encoder progress;
  progress.u32(static_cast<std::uint32_t>(c.rank));
  progress.u32(static_cast<std::uint32_t>(c.ranks));
  const TrainingProgress& p = c.progress;
  progress.i64(p.epoch);
  progress.i64(p.step);
  progress.i64(p.global_step);
  progress.f64(p.lr);
  progress.f64(p.loss_sum);
  progress.f64(p.bytes_sum);
  progress.f64(p.density_sum);
  progress.f64(p.final_accuracy);
  file.section("PROG", progress);
  Encoder parameters;
  parameters.floats(c.parameters);
  file.section("PARM", parameters);
  Encoder velocity;
  velocity.floats(c.velocity);
  file.section("VELO", velocity);
  Encoder allreduce;
  allreduce.raw(c.allreduce_state);
  file.section("HNDL", allreduce);
  return file.bytes();
}

TrainingCheckpoint decode_checkpoint(const std::string& bytes) {
  Decoder file(bytes, "the file header");
  if (bytes.size() < sizeof kMagic || bytes.compare(0, sizeof kMagic, kMagic, sizeof kMagic) != 0) {
    throw std::runtime_error("is not an oktopk-train checkpoint (wrong magic bytes)");
  }
  file.raw(sizeof kMagic);
  if (file.remaining() < 4) throw std::runtime_error("is truncated: it ends inside the file header");
  const std::uint32_t version = file.u32();
  if (version != kVersion) {
    throw std::runtime_error("has format version " + std::to_string(version) +
                             ", this oktopk-train reads version " + std::to_string(kVersion));
  }
  TrainingCheckpoint c;
  Decoder settings = file.section("SETT", "settings");
  std::istringstream lines(std::string(settings.raw(settings.remaining())));
  for (std::string line; std::getline(lines, line);) {
    const auto equals = line.find('=');
    if (equals == std::string::npos) throw std::runtime_error("is corrupt: a settings line lacks '='");
    c.settings.emplace_back(line.substr(0, equals), line.substr(equals + 1));
  }
  Decoder progress = file.section("PROG", "progress");
  c.rank = static_cast<std::int32_t>(progress.u32());
  c.ranks = static_cast<std::int32_t>(progress.u32());
  TrainingProgress& p = c.progress;
  p.epoch = progress.i64();
  p.step = progress.i64();
  p.global_step = progress.i64();
  p.lr = progress.f64();
  p.loss_sum = progress.f64();
  p.bytes_sum = progress.f64();
  p.density_sum = progress.f64();
  p.final_accuracy = progress.f64();
  progress.expect_end();
  Decoder parameters = file.section("PARM", "parameters");
  c.parameters = parameters.floats();
  parameters.expect_end();
  Decoder velocity = file.section("VELO", "momentum");
  c.velocity = velocity.floats();
  velocity.expect_end();
  Decoder allreduce = file.section("HNDL", "allreduce state");
  c.allreduce_state = std::string(allreduce.raw(allreduce.remaining()));
  file.expect_end();
  if (p.epoch < 1 || p.step < 0 || p.global_step < 0) {
    throw std::runtime_error("is corrupt: negative position");
  }
  return c;
}

void save_checkpoint(const Communicator& comm, const std::string& prefix,
                     const TrainingCheckpoint& mine) {
  const std::string context = "--checkpoint " + prefix;
  const std::string file = checkpoint_file(prefix, comm.rank());
  const std::string temporary = file + ".tmp";
  std::string error;
  try {
    error = write_synced(temporary, encode_checkpoint(mine));
  } catch (const std::exception& e) {
    error = std::string("cannot write ") + temporary + ": " + e.what();
  }
  try {
    agree_on_errors(comm, context, error);
  } catch (...) {
    std::remove(temporary.c_str());  // the previous checkpoint stays untouched
    throw;
  }
  // Every rank has its new file complete: replace the old ones (rename is atomic per file).
  error.clear();
  if (std::rename(temporary.c_str(), file.c_str()) != 0) {
    error = system_error("cannot rename " + temporary + " to " + file);
    std::remove(temporary.c_str());
  }
  agree_on_errors(comm, context, error);
}

TrainingCheckpoint load_checkpoint(const Communicator& comm, const std::string& prefix,
                                   const std::vector<std::pair<std::string, std::string>>& expected,
                                   const std::vector<std::pair<std::string, std::string>>& implied) {
  const std::string file = checkpoint_file(prefix, comm.rank());
  TrainingCheckpoint c;
  std::string error;
  try {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw std::runtime_error(system_error("cannot read " + file));
    std::ostringstream bytes;
    bytes << in.rdbuf();
    if (in.bad()) throw std::runtime_error(system_error("cannot read " + file));
    try {
      c = decode_checkpoint(bytes.str());
    } catch (const std::exception& e) {
      throw std::runtime_error(file + " " + e.what());
    }
    if (c.ranks != comm.size()) {
      error = file + " was written by a run on " + std::to_string(c.ranks) + " ranks, this run has " +
              std::to_string(comm.size());
    } else if (c.rank != comm.rank()) {
      error = file + " was written by rank " + std::to_string(c.rank);
    } else {
      // Per setting name, in order: all its values (--option repeats), else its implied value,
      // else "(nothing)". Names only the checkpoint has count too.
      auto values_of = [&implied](const std::vector<std::pair<std::string, std::string>>& settings,
                                  const std::string& name) {
        std::string values;
        for (const auto& [n, v] : settings) {
          if (n == name) values += (values.empty() ? "" : " ") + v;
        }
        for (const auto& [n, v] : implied) {
          if (values.empty() && n == name) values = v;
        }
        return values.empty() ? std::string("(nothing)") : values;
      };
      std::vector<std::string> names;
      for (const auto& settings : {expected, c.settings}) {
        for (const auto& setting : settings) {
          if (std::find(names.begin(), names.end(), setting.first) == names.end())
            names.push_back(setting.first);
        }
      }
      for (const auto& name : names) {
        const std::string written = values_of(c.settings, name);
        const std::string value = values_of(expected, name);
        if (written != value) {
          error = file + " was written with " + name + " " + written + ", this run has " + name +
                  " " + value;
          break;
        }
      }
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_on_errors(comm, "--resume " + prefix, error);
  comm.check_agreement(("--resume " + prefix).c_str(),
                       {{"the checkpoint's step", c.progress.global_step}});
  return c;
}

}  // namespace oktopk::train
