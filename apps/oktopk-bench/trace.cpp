// SPDX-License-Identifier: BSD-3-Clause
// oktopk-bench --trace: the rows of every rank's messages, gathered by rank 0 into one file.
#include "trace.hpp"

#include <stdexcept>

namespace oktopk::bench {

Trace::Trace(const oktopk::Communicator& world, const std::string& path)
    : world_(world), path_(path) {
  if (path_.empty()) return;
  std::int64_t ok = 1;
  if (world_.rank() == 0) {
    out_.open(path_, std::ios::trunc);
    out_ << trace_header << '\n';
    out_.flush();
    ok = out_ ? 1 : 0;
  }
  world_.bcast(&ok, 1, 0);
  if (ok == 0) throw std::runtime_error("cannot write trace file '" + path_ + "'");
}

void Trace::add_call(const std::string& algo, std::int64_t call, const oktopk::Communicator& comm) {
  for (const oktopk::MessageRecord& m : comm.message_log()) {
    rows_ << algo << ',' << call << ',' << world_.rank() << ',' << m.phase << ',' << m.operation
          << ',' << m.peer << ',' << m.bytes_sent << ',' << m.bytes_received << '\n';
  }
}

void Trace::flush() {
  if (path_.empty()) return;
  const std::string mine = rows_.str();
  rows_.str(std::string());
  const int P = world_.size();
  std::int64_t ok = 1;
  if (world_.rank() == 0) {
    out_ << mine;
    for (int r = 1; r < P; ++r) {
      std::int64_t length = 0;
      {
        oktopk::Communicator::Requests requests;
        world_.irecv(&length, 1, r, 11, requests);
        requests.wait_all();
      }
      std::string text(static_cast<std::size_t>(length), '\0');
      oktopk::Communicator::Requests requests;
      world_.irecv(text.data(), length, r, 12, requests);
      requests.wait_all();
      out_ << text;
    }
    out_.flush();
    ok = out_ ? 1 : 0;
  } else {
    const auto length = static_cast<std::int64_t>(mine.size());
    oktopk::Communicator::Requests requests;
    world_.isend(&length, 1, 0, 11, requests);
    world_.isend(mine.data(), length, 0, 12, requests);
    requests.wait_all();
  }
  world_.bcast(&ok, 1, 0);
  if (ok == 0) throw std::runtime_error("writing trace file '" + path_ + "' failed");
}

}  // namespace oktopk::bench
