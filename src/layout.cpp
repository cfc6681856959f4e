// SPDX-License-Identifier: BSD-3-Clause
// Layout: building, validation, printing and digest.
#include <oktopk/communicator.hpp>
#include <oktopk/error.hpp>
#include <oktopk/fwd.hpp>
#include <oktopk/layout.hpp>

#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace oktopk {

namespace {

/// "segment 2 ('embedding')" or "segment 2" for an unnamed one: what messages call it.
std::string describe(std::size_t index, const Segment& segment) {
  std::string text = "segment " + std::to_string(index);
  if (!segment.name.empty()) text += " ('" + segment.name + "')";
  return text;
}

}  // namespace

std::string to_string(SegmentKind kind) {
  switch (kind) {
    case SegmentKind::Dense:
      return "dense";
    case SegmentKind::SparseRows:
      return "rows";
  }
  return "unknown(" + std::to_string(static_cast<int>(kind)) + ")";
}

std::ostream& operator<<(std::ostream& os, SegmentKind kind) { return os << to_string(kind); }

std::int64_t Segment::rows() const {
  if (kind != SegmentKind::SparseRows || row_width < 1 || length <= 0) return 0;
  return length / row_width + (length % row_width != 0 ? 1 : 0);
}

bool operator==(const Segment& a, const Segment& b) {
  return a.offset == b.offset && a.length == b.length && a.kind == b.kind &&
         (a.kind == SegmentKind::Dense || a.row_width == b.row_width) && a.name == b.name;
}
bool operator!=(const Segment& a, const Segment& b) { return !(a == b); }

namespace {
/// Where a segment of `length` entries appended after `end` starts; throws when it would not
/// fit in a gradient's 2^31 - 1 entries (or `end` is past them), before any sum can overflow.
std::int64_t appended_offset(const char* where, std::int64_t end, std::int64_t length) {
  constexpr std::int64_t most = std::numeric_limits<index_type>::max();
  OKTOPK_REQUIRE(
      length >= 0 && end >= 0 && end <= most && length <= most - end, std::invalid_argument, where,
      "a segment of " << length << " entries after " << end << " must lie in [0, 2^31 - 1]");
  return end;
}
}  // namespace

Layout& Layout::append_dense(std::int64_t length, std::string name) {
  const std::int64_t offset = appended_offset("oktopk::Layout::append_dense", end(), length);
  segments_.push_back(Segment{offset, length, SegmentKind::Dense, 1, std::move(name)});
  return *this;
}

Layout& Layout::append_sparse_rows(std::int64_t length, std::int64_t row_width, std::string name) {
  const std::int64_t offset = appended_offset("oktopk::Layout::append_sparse_rows", end(), length);
  segments_.push_back(Segment{offset, length, SegmentKind::SparseRows, row_width, std::move(name)});
  return *this;
}

std::int64_t Layout::end() const {
  return segments_.empty() ? 0 : segments_.back().offset + segments_.back().length;
}

std::int64_t Layout::sparse_entries() const {
  std::int64_t total = 0;
  for (const Segment& s : segments_) {
    if (s.kind == SegmentKind::SparseRows) total += s.length;
  }
  return total;
}

std::int64_t Layout::sparse_rows() const {
  std::int64_t total = 0;
  for (const Segment& s : segments_) total += s.rows();
  return total;
}

std::int64_t Layout::dense_entries() const {
  std::int64_t total = 0;
  for (const Segment& s : segments_) {
    if (s.kind == SegmentKind::Dense) total += s.length;
  }
  return total;
}

void Layout::validate(std::int64_t n) const {
  constexpr const char* where = "oktopk::Layout::validate";
  if (segments_.empty()) return;
  std::int64_t expected = 0;  // where the previous segment ends
  for (std::size_t i = 0; i < segments_.size(); ++i) {
    const Segment& s = segments_[i];
    OKTOPK_REQUIRE(s.kind == SegmentKind::Dense || s.kind == SegmentKind::SparseRows,
                   std::invalid_argument, where,
                   describe(i, s) << " has no valid kind (" << static_cast<int>(s.kind) << ")");
    OKTOPK_REQUIRE(s.length >= 0, std::invalid_argument, where,
                   describe(i, s) << " has length " << s.length << " < 0");
    OKTOPK_REQUIRE(s.kind != SegmentKind::SparseRows || s.row_width >= 1, std::invalid_argument,
                   where,
                   describe(i, s) << " holds sparse rows of width " << s.row_width << " < 1");
    OKTOPK_REQUIRE(s.offset >= expected, std::invalid_argument, where,
                   describe(i, s) << " starts at " << s.offset << ", before "
                                  << (i == 0 ? std::string("0")
                                             : "the end of " + describe(i - 1, segments_[i - 1]) +
                                                   " at " + std::to_string(expected))
                                  << ": segments must be sorted by offset and must not overlap");
    OKTOPK_REQUIRE(s.offset == expected, std::invalid_argument, where,
                   describe(i, s) << " starts at " << s.offset << ", leaving [" << expected << ", "
                                  << s.offset << ") uncovered: segments must leave no gap");
    OKTOPK_REQUIRE(s.length <= n - s.offset, std::invalid_argument, where,
                   describe(i, s) << " ends at " << s.offset + s.length << ", past n = " << n);
    expected = s.offset + s.length;
  }
  OKTOPK_REQUIRE(expected == n, std::invalid_argument, where,
                 "the segments cover [0, " << expected << "), not [0, n) with n = " << n);
}

std::int64_t Layout::digest() const {
  // Lengths before names, so that no two layouts print to the same text.
  std::ostringstream os;
  for (const Segment& s : segments_) {
    os << static_cast<int>(s.kind) << ' ' << s.offset << ' ' << s.length << ' '
       << (s.kind == SegmentKind::SparseRows ? s.row_width : 0) << ' ' << s.name.size() << ' '
       << s.name << ';';
  }
  return agreement_digest(os.str());
}

bool operator==(const Layout& a, const Layout& b) { return a.segments() == b.segments(); }
bool operator!=(const Layout& a, const Layout& b) { return !(a == b); }

std::ostream& operator<<(std::ostream& os, const Layout& layout) {
  if (layout.empty()) return os << "empty";
  const char* separator = "";
  for (const Segment& s : layout.segments()) {
    os << separator << (s.name.empty() ? "-" : s.name) << ':' << s.kind << ":[" << s.offset << ','
       << s.offset + s.length << ')';
    if (s.kind == SegmentKind::SparseRows) os << ':' << s.row_width;
    separator = " ";
  }
  return os;
}

}  // namespace oktopk
