// SPDX-License-Identifier: BSD-3-Clause
#include "checkpoint.hpp"

#include <oktopk/section_file.hpp>

#include <mpi.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace oktopk::train {

namespace {

constexpr char kMagic[8] = {'O', 'K', 'T', 'O', 'P', 'K', 'T', 'R'};
constexpr std::uint32_t kVersion = 1;
/// No section of a checkpoint is limited but by the file's size.
constexpr std::uint64_t kAnyLength = std::numeric_limits<std::uint64_t>::max();

/// Collective: if any rank passes a non-empty `error`, every rank throws the first such rank's,
/// as std::runtime_error("<context>: rank R: <error>").
void agree_on_errors(const Communicator& comm, const std::string& context,
                     const std::string& error) {
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

std::string system_error(const std::string& what) { return what + ": " + std::strerror(errno); }

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
  std::ostringstream bytes;
  SectionWriter file(bytes, "oktopk-train");
  file.header(kMagic, kVersion);
  std::string text;
  for (const auto& [name, value] : c.settings) text += name + "=" + value + "\n";
  file.section("SETT", text);
  SectionPayload progress;
  progress.put_u32(static_cast<std::uint32_t>(c.rank));
  progress.put_u32(static_cast<std::uint32_t>(c.ranks));
  const TrainingProgress& p = c.progress;
  progress.put_i64(p.epoch);
  progress.put_i64(p.step);
  progress.put_i64(p.global_step);
  progress.put_f64(p.lr);
  progress.put_f64(p.loss_sum);
  progress.put_f64(p.bytes_sum);
  progress.put_f64(p.density_sum);
  progress.put_f64(p.final_accuracy);
  file.section("PROG", progress.bytes());
  SectionPayload parameters;
  parameters.put_floats(c.parameters);
  file.section("PARM", parameters.bytes());
  SectionPayload velocity;
  velocity.put_floats(c.velocity);
  file.section("VELO", velocity.bytes());
  file.section("HNDL", c.allreduce_state);
  return bytes.str();
}

TrainingCheckpoint decode_checkpoint(const std::string& bytes) {
  std::istringstream stream(bytes);
  SectionReader file(stream);
  if (bytes.size() < sizeof kMagic || !file.magic(kMagic)) {
    throw std::runtime_error("is not an oktopk-train checkpoint (wrong magic bytes)");
  }
  const std::uint32_t version = file.version();
  if (version != kVersion) {
    throw std::runtime_error("has format version " + std::to_string(version) +
                             ", this oktopk-train reads version " + std::to_string(kVersion));
  }
  TrainingCheckpoint c;
  std::istringstream lines(file.section("SETT", "settings", kAnyLength).rest());
  for (std::string line; std::getline(lines, line);) {
    const auto equals = line.find('=');
    if (equals == std::string::npos)
      throw std::runtime_error("is corrupt: a settings line lacks '='");
    c.settings.emplace_back(line.substr(0, equals), line.substr(equals + 1));
  }
  SectionParser progress = file.section("PROG", "progress", kAnyLength);
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
  SectionParser parameters = file.section("PARM", "parameters", kAnyLength);
  c.parameters = parameters.floats();
  parameters.expect_end();
  SectionParser velocity = file.section("VELO", "momentum", kAnyLength);
  c.velocity = velocity.floats();
  velocity.expect_end();
  c.allreduce_state = file.section("HNDL", "allreduce state", kAnyLength).rest();
  if (stream.peek() != std::char_traits<char>::eof()) {
    throw std::runtime_error("is corrupt: unexpected bytes after the last section");
  }
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

TrainingCheckpoint load_checkpoint(
    const Communicator& comm, const std::string& prefix,
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
      error = file + " was written by a run on " + std::to_string(c.ranks) +
              " ranks, this run has " + std::to_string(comm.size());
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
