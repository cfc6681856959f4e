// SPDX-License-Identifier: BSD-3-Clause
// The layout of a fused gradient buffer: which ranges hold embedding-like rows (naturally
// sparse: a step touches few rows) and which hold dense parameters. DDP buckets fuse both
// kinds; S2 sketches only the rows and averages the rest exactly, and every method labels its
// statistics by segment.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace oktopk {

/// \brief What a Segment of a fused buffer holds.
enum class SegmentKind {
  Dense,      ///< parameters whose gradient is mostly non-zero
  SparseRows  ///< rows of row_width entries (e.g. an embedding matrix), most of them zero
};

/// "dense" or "rows".
std::string to_string(SegmentKind kind);
std::ostream& operator<<(std::ostream& os, SegmentKind kind);

/// \brief A range [offset, offset + length) of a fused buffer and what it holds.
struct Segment {
  std::int64_t offset = 0;
  std::int64_t length = 0;
  SegmentKind kind = SegmentKind::Dense;
  /// Entries per row, for SparseRows (the last row is shorter when length is not a multiple);
  /// ignored for Dense.
  std::int64_t row_width = 1;
  /// A label for statistics and messages (need not be unique).
  std::string name;

  /// ceil(length / row_width) for SparseRows, 0 for Dense.
  std::int64_t rows() const;
};

bool operator==(const Segment& a, const Segment& b);
bool operator!=(const Segment& a, const Segment& b);

/// \brief The segments of a fused buffer, sorted by offset, covering it exactly.
///
/// The empty layout (the default) describes no segments: every method then behaves as it
/// does without a layout, bit for bit. Every rank must pass the same layout (the factory
/// checks the digest, names included).
class Layout {
 public:
  Layout() = default;
  explicit Layout(std::vector<Segment> segments) : segments_(std::move(segments)) {}

  /// Appends a Dense segment starting where the last segment ends.
  Layout& append_dense(std::int64_t length, std::string name = {});
  /// Appends a SparseRows segment of `length` entries starting where the last segment ends.
  Layout& append_sparse_rows(std::int64_t length, std::int64_t row_width, std::string name = {});

  const std::vector<Segment>& segments() const { return segments_; }
  bool empty() const { return segments_.empty(); }
  /// Where the last segment ends (0 for the empty layout).
  std::int64_t end() const;
  /// Entries and rows in SparseRows segments, entries in Dense ones.
  std::int64_t sparse_entries() const;
  std::int64_t sparse_rows() const;
  std::int64_t dense_entries() const;

  /// \brief Throws std::invalid_argument("oktopk::Layout::validate: ...") unless the layout
  /// is empty or its segments are sorted by offset, do not overlap and cover [0, n) exactly,
  /// with lengths >= 0 and row_width >= 1 for SparseRows.
  void validate(std::int64_t n) const;

  /// A digest of every field of every segment (names included), for cross-rank agreement
  /// checks and checkpoints.
  std::int64_t digest() const;

 private:
  std::vector<Segment> segments_;
};

bool operator==(const Layout& a, const Layout& b);
bool operator!=(const Layout& a, const Layout& b);

/// One line: `name:kind:[offset,end)[:width]` per segment, separated by spaces ("empty" for
/// the empty layout).
std::ostream& operator<<(std::ostream& os, const Layout& layout);

}  // namespace oktopk
