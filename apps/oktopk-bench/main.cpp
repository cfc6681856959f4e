// SPDX-License-Identifier: BSD-3-Clause
// oktopk-bench: the collective benchmark, in the spirit of OSU and nccl-tests. Times every
// sparse allreduce method on generated (or replayed) gradients, reports time and traffic per
// rank, and with --check holds every output element to the oracle of oktopk/oracle.hpp.
#include "common/cli.hpp"
#include "common/failure.hpp"

#include <oktopk/oktopk.hpp>
#include <oktopk/oracle.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

// Math in kernels: Kokkos::Experimental in 3.4-3.6, Kokkos from 3.7.
#if KOKKOS_VERSION >= 30700
namespace kmath = Kokkos;
#else
namespace kmath = Kokkos::Experimental;
#endif

using Exec = Kokkos::DefaultExecutionSpace;
using Handle = oktopk::SparseAllreduce<Exec>;
using Vector = Handle::vector_type;

constexpr const char* csv_header =
    "algo,P,n,k,density,iters,time_s_med,time_s_max,bytes_per_rank_avg,bytes_per_rank_max,"
    "words_per_rank_max_over_k,nnz_out,wrong,nnz_out_avg,words_per_call_max_over_k";
constexpr const char* trace_header =
    "algo,call,rank,phase,operation,peer,bytes_sent,bytes_received";
constexpr char file_magic[8] = {'O', 'K', 'T', 'O', 'P', 'K', 'G', '1'};
constexpr std::int64_t file_header_bytes = 24;
constexpr std::int64_t rows_width = 64;  // entries per row of --dist rows:R

std::string usage() {
  const oktopk::Options d;
  std::ostringstream os;
  os << R"(Usage: mpirun -np P oktopk-bench [options] [--kokkos-... flags]

Times sparse allreduce methods on P ranks and prints one row per method:
  )" << csv_header
     << R"(
time: per iteration, the max over ranks of one reduce call (barrier before, fence after);
  time_s_med and time_s_max are the median and the max over the timed iterations.
bytes: per rank per iteration, max(bytes sent, bytes received) from the method's traffic
  accounting (MPI collectives are charged the bandwidth-optimal volume, formulas in
  oktopk/communicator.hpp), averaged over the iterations; _avg and _max over ranks.
words_per_rank_max_over_k = bytes_per_rank_max / 4 / k ('-' when k = 0).
nnz_out: non-zeros of the last output. wrong: output elements that differ from the oracle,
  summed over the timed iterations ('-' without --check). nnz_out_avg: the mean over the timed
  iterations of the output's non-zeros. words_per_call_max_over_k: the largest over the timed
  iterations and the ranks of max(bytes sent, received) / 4 / k, the worst call's traffic.
With --mpi-baseline, a last row mpi_allreduce times a bare MPI_Allreduce of the same
  gradients (host memory, separate send and receive buffers, no averaging; wrong is '-').

Options (--flag value or --flag=value; a later flag overrides an earlier one):
  --algo LIST            comma-separated methods, or all (default all):
                         dense topka topkdsa gtopk gaussiank oktopk s2
  --n N                  gradient length, 1 <= N <= 2^31-1 (default 1048576; with
                         --dist file:PATH the file's)
  --density D            k = floor(D * N), 0 <= D <= 1 (default 0.01)
  --iters I              timed iterations, I >= 1 (default 20)
  --warmup W             untimed, unchecked calls before them, W >= 0 (default 5)
  --dist NAME            the gradients, per rank and call (default normal):
                           normal          N(0, 1)
                           laplace         Laplace(0, 1)
                           lognormal       heavy-tailed: random sign * exp(2 z), z ~ N(0, 1)
                           correlated:RHO  sqrt(RHO) * shared + sqrt(1 - RHO) * own, both
                                           N(0, 1), shared equal on all ranks, 0 <= RHO <= 1
                           rows:R          embedding-like: rows of 64 entries, each row N(0, 1)
                                           with probability R (0 < R <= 1), else all zero
                           file:PATH       replay a gradient file: call t of rank r uses its
                                           gradient (t * P + r) mod count
                         Generated gradients depend only on (seed, rank, call), so every
                         method sees the same data.
  --shifted-draws        draw each rank's vector (and correlated's shared one) once; call t
                         reads it rotated by a random offset of the call, each entry with a
                         random sign of the call: the same distribution per call and across
                         ranks, without the draws' cost per call (seconds at n = 2^26 on one
                         core), at the price of one or two more vectors of memory per rank
  --seed S               seed of the gradients and of the methods' Options (default 1)
  --check                compare every output element with the oracle (oktopk/oracle.hpp)
  --mpi-baseline         also time a bare MPI_Allreduce of the same gradients (row
                         mpi_allreduce), the floor the dense method is measured against
  --format F             table, csv or json (default table)
  --phases               also print, per method and phase, the time (median over iterations
                         of the max over ranks) and bytes (mean over iterations of the max
                         over ranks of max(sent, received)): a second table (table, csv) or
                         a "phases" array (json)
  --dump-gradients PATH  write the gradients of every call (warm-up and timed, every rank) to
                         PATH; --dist file:PATH with the same P, --warmup and --iters
                         replays exactly these calls
  --trace PATH           write every message of the timed calls, of every rank, to PATH (one
                         CSV file, written by rank 0), as the traffic accounting charges them:
                           )" << trace_header << R"(
                         call: timed iteration from 0; operation: send or recv (peer = the
                         other rank; a receive is logged when it completes, with its actual
                         size) or a collective, allreduce alltoall allgather allgatherv bcast
                         (peer -1, bytes = its charged per-rank volume); messages to self are
                         not counted and not listed. Rows are ordered by method, rank, call;
                         per (algo, call, rank) they sum to the bytes behind bytes_per_rank_*
                         and --phases. The mpi_allreduce row is traced too.
  --help                 print this text

Method options (oktopk::Options, defaults are the library's):
  --dense-warmup N       the first N calls of each handle are dense allreduces ()"
     << d.warmup_iterations << R"()
  --dense-allreduce A    dense allreduces (method dense, warm-up calls): mpi (MPI_Allreduce)
                         or ring (OkTopk's, the division fused in) ()"
     << d.dense_allreduce << R"()
  --threshold-period N   Ok-Topk: thresholds recomputed exactly every N calls ()"
     << d.threshold_period << R"()
  --repartition-period N Ok-Topk: region boundaries recomputed every N calls ()"
     << d.repartition_period << R"()
  --throttle N           Ok-Topk: messages in flight per split-and-reduce group ()"
     << d.throttle << R"()
  --balancing MODE       Ok-Topk: off, on or adaptive ()"
     << d.balancing << R"()
  --s2-rows N            S2: count-sketch rows ()"
     << d.s2_sketch_rows << R"()
  --s2-columns N         S2: count-sketch columns, 0 = ceil(2 * density * n) ()"
     << d.s2_sketch_columns << R"()
  --s2-row-width N       S2: the gradient is read as rows of N entries ()"
     << d.s2_row_width << R"()
  --layout SPEC          the fused buffer's segments (oktopk::Layout; default none):
                           embedding:F:W  the first floor(F * N / W) rows of W entries are
                                          sparse rows (segment embedding), the rest dense
                                          (segment dense), 0 <= F <= 1, W >= 1
                           or a comma-separated list, sorted, covering [0, N) exactly, of
                           rows:OFFSET:LENGTH:WIDTH (segment rowsI) and dense:OFFSET:LENGTH
                           (segment denseI), I = the item's position from 0
                         S2 sketches only the sparse rows and averages the dense segments
                         exactly; the other methods are unchanged
  --option KEY=VALUE     any other oktopk::Options field by its name (repeatable), e.g.
                         --option guard_low=0 --option guard_factor=1.3333 for the reference's
                         one-sided guard; names and defaults: the user guide, "Options"

Gradient files: the 8 bytes "OKTOPKG1", int64 n, int64 count, then count gradients of n
float32 each, all little endian. Every rank reads the file itself (a shared file system).
)";
  return os.str();
}

// ---- arguments ------------------------------------------------------------------------------

using oktopk::apps::parse_number;
using oktopk::apps::UsageError;

enum class DistKind { Normal, Laplace, Lognormal, Correlated, Rows, File };

struct Distribution {
  DistKind kind = DistKind::Normal;
  double parameter = 0.0;  // RHO or R
  std::string path;        // file:PATH
  std::string text = "normal";
};

struct Args {
  std::vector<oktopk::Algorithm> algorithms{oktopk::all_algorithms.begin(),
                                            oktopk::all_algorithms.end()};
  std::int64_t n = 1048576;
  bool n_given = false;
  double density = 0.01;
  std::int64_t iters = 20;
  std::int64_t warmup = 5;
  Distribution dist;
  std::uint64_t seed = 1;
  bool check = false;
  bool phases = false;
  bool mpi_baseline = false;
  bool shifted_draws = false;
  bool help = false;
  std::string format = "table";
  std::string dump_path;
  std::string trace_path;
  oktopk::Options options;
  std::string layout_spec;  // --layout as given; `layout` once n is known
  oktopk::Layout layout;
};

Distribution parse_distribution(const std::string& text) {
  Distribution d;
  d.text = text;
  const auto colon = text.find(':');
  const std::string name = text.substr(0, colon);
  const std::string value = colon == std::string::npos ? "" : text.substr(colon + 1);
  const bool has_value = colon != std::string::npos;
  if (name == "normal" && !has_value) {
    d.kind = DistKind::Normal;
  } else if (name == "laplace" && !has_value) {
    d.kind = DistKind::Laplace;
  } else if (name == "lognormal" && !has_value) {
    d.kind = DistKind::Lognormal;
  } else if (name == "correlated" && has_value) {
    d.kind = DistKind::Correlated;
    d.parameter = parse_number<double>("--dist correlated:RHO", value);
    if (!(d.parameter >= 0.0 && d.parameter <= 1.0)) {
      throw UsageError("--dist correlated:RHO needs 0 <= RHO <= 1, got " + value);
    }
  } else if (name == "rows" && has_value) {
    d.kind = DistKind::Rows;
    d.parameter = parse_number<double>("--dist rows:R", value);
    if (!(d.parameter > 0.0 && d.parameter <= 1.0)) {
      throw UsageError("--dist rows:R needs 0 < R <= 1, got " + value);
    }
  } else if (name == "file" && has_value && !value.empty()) {
    d.kind = DistKind::File;
    d.path = value;
  } else {
    throw UsageError("unknown --dist '" + text +
                     "' (valid: normal laplace lognormal correlated:RHO rows:R file:PATH)");
  }
  return d;
}

std::vector<oktopk::Algorithm> parse_algorithms(const std::string& list) {
  std::vector<oktopk::Algorithm> result;
  std::size_t begin = 0;
  while (true) {
    const auto comma = list.find(',', begin);
    const std::string name = list.substr(begin, comma == std::string::npos ? comma : comma - begin);
    if (name == "all") {
      result.insert(result.end(), oktopk::all_algorithms.begin(), oktopk::all_algorithms.end());
    } else {
      try {
        result.push_back(oktopk::algorithm_from_string(name));
      } catch (const std::invalid_argument& e) {
        throw UsageError(e.what());
      }
    }
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  return result;
}

/// Parses identically on every rank (it reads nothing but argv), so all ranks agree on
/// whether to run.
Args parse(int argc, char* argv[]) {
  Args a;
  // --help wins over anything else on the line, valid or not.
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      a.help = true;
      return a;
    }
  }
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag.rfind("--kokkos-", 0) == 0) continue;  // Kokkos's own, handled by Kokkos
    std::string value;
    bool has_value = false;
    if (const auto eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_value = true;
    }
    if (flag == "--check" || flag == "--phases" || flag == "--mpi-baseline" ||
        flag == "--shifted-draws") {
      if (has_value) throw UsageError(flag + " takes no value");
      (flag == "--check"           ? a.check
       : flag == "--phases"        ? a.phases
       : flag == "--mpi-baseline"  ? a.mpi_baseline
                                   : a.shifted_draws) = true;
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc) throw UsageError("unknown option or missing value: " + flag);
      value = argv[++i];
    }
    oktopk::Options& o = a.options;
    if (flag == "--algo") {
      a.algorithms = parse_algorithms(value);
    } else if (flag == "--n") {
      a.n = parse_number<std::int64_t>(flag, value);
      a.n_given = true;
    } else if (flag == "--density") {
      a.density = parse_number<double>(flag, value);
    } else if (flag == "--iters") {
      a.iters = parse_number<std::int64_t>(flag, value);
    } else if (flag == "--warmup") {
      a.warmup = parse_number<std::int64_t>(flag, value);
    } else if (flag == "--dist") {
      a.dist = parse_distribution(value);
    } else if (flag == "--seed") {
      a.seed = parse_number<std::uint64_t>(flag, value);
    } else if (flag == "--format") {
      a.format = value;
    } else if (flag == "--dump-gradients") {
      if (value.empty()) throw UsageError("--dump-gradients needs a path");
      a.dump_path = value;
    } else if (flag == "--trace") {
      if (value.empty()) throw UsageError("--trace needs a path");
      a.trace_path = value;
    } else if (flag == "--dense-warmup") {
      o.set_warmup_iterations(parse_number<std::int64_t>(flag, value));
    } else if (flag == "--dense-allreduce") {
      try {
        o.set_dense_allreduce(oktopk::dense_allreduce_from_string(value.c_str()));
      } catch (const std::invalid_argument& e) {
        throw UsageError(e.what());
      }
    } else if (flag == "--threshold-period") {
      o.set_threshold_period(parse_number<std::int64_t>(flag, value));
    } else if (flag == "--repartition-period") {
      o.set_repartition_period(parse_number<std::int64_t>(flag, value));
    } else if (flag == "--throttle") {
      o.set_throttle(parse_number<int>(flag, value));
    } else if (flag == "--balancing") {
      try {
        o.set_balancing(oktopk::balancing_from_string(value.c_str()));
      } catch (const std::invalid_argument& e) {
        throw UsageError(e.what());
      }
    } else if (flag == "--s2-rows") {
      o.set_s2_sketch_rows(parse_number<int>(flag, value));
    } else if (flag == "--s2-columns") {
      o.set_s2_sketch_columns(parse_number<std::int64_t>(flag, value));
    } else if (flag == "--s2-row-width") {
      o.set_s2_row_width(parse_number<std::int64_t>(flag, value));
    } else if (flag == "--layout") {
      if (value.empty()) throw UsageError("--layout needs a SPEC");
      a.layout_spec = value;
    } else if (flag == "--option") {
      const auto equals = value.find('=');
      if (equals == std::string::npos) throw UsageError("--option needs KEY=VALUE, got '" + value + "'");
      try {
        o.set(std::string_view(value).substr(0, equals), std::string_view(value).substr(equals + 1));
      } catch (const std::invalid_argument& e) {
        throw UsageError(e.what());
      }
    } else {
      throw UsageError("unknown option " + flag);
    }
  }
  if (a.n < 1 || a.n > std::numeric_limits<std::int32_t>::max()) {
    throw UsageError("--n must be in [1, 2^31-1], got " + std::to_string(a.n));
  }
  if (!(a.density >= 0.0 && a.density <= 1.0)) throw UsageError("--density must be in [0, 1]");
  if (a.iters < 1) throw UsageError("--iters must be at least 1");
  if (a.warmup < 0) throw UsageError("--warmup must be at least 0");
  if (a.format != "table" && a.format != "csv" && a.format != "json") {
    throw UsageError("--format must be table, csv or json, got '" + a.format + "'");
  }
  if (a.algorithms.empty()) throw UsageError("--algo names no method");
  if (a.shifted_draws && (a.dist.kind == DistKind::Rows || a.dist.kind == DistKind::File)) {
    throw UsageError("--shifted-draws works with normal, laplace, lognormal and correlated:RHO");
  }
  if (!a.dump_path.empty() && !a.dist.path.empty()) {
    // Writing the dump truncates its file first: it must not be the file being replayed.
    std::error_code ignored;
    if (a.dump_path == a.dist.path ||
        std::filesystem::equivalent(a.dump_path, a.dist.path, ignored)) {
      throw UsageError("--dump-gradients " + a.dump_path + " is the file --dist replays");
    }
  }
  a.options.set_density(a.density).set_seed(a.seed);
  try {
    a.options.validate();
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  return a;
}

/// --layout SPEC for a buffer of n entries (the forms are --help's).
oktopk::Layout parse_layout(const std::string& spec, std::int64_t n) {
  oktopk::Layout layout;
  if (spec.empty()) return layout;
  const auto split = [](const std::string& text, char separator) {
    std::vector<std::string> parts;
    std::size_t begin = 0;
    while (true) {
      const auto end = text.find(separator, begin);
      parts.push_back(text.substr(begin, end == std::string::npos ? end : end - begin));
      if (end == std::string::npos) return parts;
      begin = end + 1;
    }
  };
  const std::vector<std::string> items = split(spec, ',');
  const std::vector<std::string> first = split(items[0], ':');
  if (first[0] == "embedding") {
    if (items.size() != 1 || first.size() != 3) {
      throw UsageError("--layout embedding:F:W takes exactly two numbers, got '" + spec + "'");
    }
    const auto fraction = parse_number<double>("--layout embedding:F:W (F)", first[1]);
    const auto width = parse_number<std::int64_t>("--layout embedding:F:W (W)", first[2]);
    if (!(fraction >= 0.0 && fraction <= 1.0) || width < 1) {
      throw UsageError("--layout embedding:F:W needs 0 <= F <= 1 and W >= 1, got '" + spec + "'");
    }
    const std::int64_t rows =
        static_cast<std::int64_t>(std::floor(fraction * static_cast<double>(n))) / width;
    layout.append_sparse_rows(rows * width, width, "embedding")
        .append_dense(n - rows * width, "dense");
    return layout;
  }
  std::vector<oktopk::Segment> segments;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::vector<std::string> fields = split(items[i], ':');
    const std::string what = "--layout item " + std::to_string(i) + " '" + items[i] + "'";
    const auto number = [&](std::size_t field) {
      return parse_number<std::int64_t>(what, fields[field]);
    };
    if (fields[0] == "rows" && fields.size() == 4) {
      segments.push_back(oktopk::Segment{number(1), number(2), oktopk::SegmentKind::SparseRows,
                                         number(3), "rows" + std::to_string(i)});
    } else if (fields[0] == "dense" && fields.size() == 3) {
      segments.push_back(oktopk::Segment{number(1), number(2), oktopk::SegmentKind::Dense, 1,
                                         "dense" + std::to_string(i)});
    } else {
      throw UsageError(what + " is not rows:OFFSET:LENGTH:WIDTH or dense:OFFSET:LENGTH");
    }
  }
  layout = oktopk::Layout(std::move(segments));
  try {
    layout.validate(n);
  } catch (const std::invalid_argument& e) {
    throw UsageError("--layout '" + spec + "' does not fit --n " + std::to_string(n) + ": " +
                     e.what());
  }
  return layout;
}

// ---- gradient files -------------------------------------------------------------------------

bool host_is_little_endian() {
  const std::uint32_t one = 1;
  unsigned char first = 0;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

void swap_bytes_if_big_endian(void* data, std::size_t count, std::size_t size) {
  if (host_is_little_endian()) return;
  auto* bytes = static_cast<unsigned char*>(data);
  for (std::size_t e = 0; e < count; ++e) std::reverse(bytes + e * size, bytes + (e + 1) * size);
}

struct GradientFile {
  std::int64_t n = 0;
  std::int64_t count = 0;
};

/// Reads and validates the header of `path`; returns an error message, empty if it is fine.
std::string read_file_header(const std::string& path, GradientFile& info) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "cannot open gradient file '" + path + "'";
  char header[file_header_bytes];
  in.read(header, file_header_bytes);
  if (in.gcount() != file_header_bytes) {
    return "'" + path + "' is not a gradient file (shorter than the 24-byte header)";
  }
  if (std::memcmp(header, file_magic, sizeof(file_magic)) != 0) {
    return "'" + path + "' is not a gradient file (it does not start with OKTOPKG1)";
  }
  std::int64_t fields[2];
  std::memcpy(fields, header + 8, sizeof(fields));
  swap_bytes_if_big_endian(fields, 2, sizeof(std::int64_t));
  info.n = fields[0];
  info.count = fields[1];
  if (info.n < 1 || info.n > std::numeric_limits<std::int32_t>::max()) {
    return "'" + path + "' is malformed: its n = " + std::to_string(info.n) +
           " is outside [1, 2^31-1]";
  }
  if (info.count < 1) {
    return "'" + path + "' is malformed: it announces " + std::to_string(info.count) + " gradients";
  }
  const std::int64_t record = info.n * static_cast<std::int64_t>(sizeof(float));
  if (info.count > (std::numeric_limits<std::int64_t>::max() - file_header_bytes) / record) {
    return "'" + path + "' is malformed: n = " + std::to_string(info.n) +
           " times count = " + std::to_string(info.count) + " overflows";
  }
  const std::int64_t expected = file_header_bytes + info.count * record;
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::int64_t>(in.tellg());
  if (size != expected) {
    return "'" + path + "' is malformed: " + std::to_string(size) +
           " bytes, but its header (n = " + std::to_string(info.n) +
           ", count = " + std::to_string(info.count) + ") needs " + std::to_string(expected);
  }
  return {};
}

/// Collective: rank 0 reads the header, every rank gets the outcome.
GradientFile check_gradient_file(const oktopk::Communicator& world, const std::string& path) {
  GradientFile info;
  std::string error;
  if (world.rank() == 0) error = read_file_header(path, info);
  std::int64_t fields[3] = {info.n, info.count, static_cast<std::int64_t>(error.size())};
  world.bcast(fields, 3, 0);
  error.resize(static_cast<std::size_t>(fields[2]));
  if (fields[2] > 0) world.bcast(error.data(), fields[2], 0);
  if (!error.empty()) throw UsageError(error);
  return {fields[0], fields[1]};
}

// ---- gradients ----------------------------------------------------------------------------

/// SplitMix64's finalizer: a bijection whose output bits all depend on every input bit, so
/// mix(key + i) gives independent-looking draws per element without shared generator state
/// (results depend on nothing but the key and i: not on threads, not on the backend).
KOKKOS_INLINE_FUNCTION std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// (0, 1] and [0, 1) from the top 53 bits.
KOKKOS_INLINE_FUNCTION double unit_open_low(std::uint64_t h) {
  return static_cast<double>((h >> 11) + 1) * 0x1.0p-53;
}
KOKKOS_INLINE_FUNCTION double unit_closed_low(std::uint64_t h) {
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

/// N(0, 1) by Box-Muller from two draws; `h2`'s lowest bit is left free for a sign.
KOKKOS_INLINE_FUNCTION double normal_from(std::uint64_t h1, std::uint64_t h2) {
  constexpr double two_pi = 6.283185307179586476925;
  return kmath::sqrt(-2.0 * kmath::log(unit_open_low(h1))) *
         kmath::cos(two_pi * unit_closed_low(h2));
}

KOKKOS_INLINE_FUNCTION double normal_at(std::uint64_t key, std::int64_t i) {
  const auto j = static_cast<std::uint64_t>(i);
  return normal_from(mix(key + 2 * j), mix(key + 2 * j + 1));
}

/// The stream of draws of one (seed, who, call); who is a rank, or one of the constants below.
std::uint64_t stream_key(std::uint64_t seed, std::uint64_t who, std::int64_t call) {
  return mix(mix(mix(seed) + who) + static_cast<std::uint64_t>(call));
}
constexpr std::uint64_t shared_stream = ~std::uint64_t{0};
constexpr std::uint64_t row_stream_offset = std::uint64_t{1} << 40;

/// The gradient of every (rank, call): generated on the device, or read from a file.
class GradientSource {
 public:
  GradientSource(const Args& args, const oktopk::Communicator& world, GradientFile file)
      : args_(args), world_(world), file_(file) {}

  /// Collective (file replay: every rank learns whether any rank failed to read).
  void fill(const Exec& exec, std::int64_t call, const Vector& grad) {
    if (args_.dist.kind == DistKind::File) {
      read(exec, call, grad);
    } else if (args_.shifted_draws) {
      if (own_draws_.extent(0) != grad.extent(0)) draw_once(exec, grad.extent(0));
      shift(exec, call, grad);
    } else {
      generate(exec, call, grad);
    }
  }

  // --shifted-draws: the draws of call -1, the own and shared parts of correlated apart.
  void draw_once(const Exec& exec, std::size_t n) {
    own_draws_ = Vector(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing,
                                           "oktopk-bench::own_draws"), n);
    if (args_.dist.kind != DistKind::Correlated) {
      generate(exec, -1, own_draws_);
      return;
    }
    shared_draws_ = Vector(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing,
                                              "oktopk-bench::shared_draws"), n);
    const auto rank = static_cast<std::uint64_t>(world_.rank());
    const std::uint64_t own = stream_key(args_.seed, rank, -1);
    const std::uint64_t shared = stream_key(args_.seed, shared_stream, -1);
    const auto own_draws = own_draws_;
    const auto shared_draws = shared_draws_;
    Kokkos::parallel_for(
        "oktopk-bench::draw_once",
        Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(exec, 0, n),
        KOKKOS_LAMBDA(std::int64_t i) {
          own_draws(i) = static_cast<float>(normal_at(own, i));
          shared_draws(i) = static_cast<float>(normal_at(shared, i));
        });
  }

  // grad(i) = ±draws((i + offset) mod n) with the call's offset and signs (the shared part's
  // the same on every rank), one hash per entry and part.
  void shift(const Exec& exec, std::int64_t call, const Vector& grad) const {
    const auto n = static_cast<std::int64_t>(grad.extent(0));
    const auto rank = static_cast<std::uint64_t>(world_.rank());
    const std::uint64_t own = stream_key(args_.seed, rank, call);
    const std::uint64_t shared = stream_key(args_.seed, shared_stream, call);
    const auto own_offset = static_cast<std::int64_t>(mix(own) % static_cast<std::uint64_t>(n));
    const auto shared_offset =
        static_cast<std::int64_t>(mix(shared) % static_cast<std::uint64_t>(n));
    const bool correlated = args_.dist.kind == DistKind::Correlated;
    const float a = correlated ? static_cast<float>(std::sqrt(args_.dist.parameter)) : 0.0f;
    const float b =
        correlated ? static_cast<float>(std::sqrt(1.0 - std::min(args_.dist.parameter, 1.0))) : 1.0f;
    const auto own_draws = own_draws_;
    const auto shared_draws = correlated ? shared_draws_ : own_draws_;
    Kokkos::parallel_for(
        "oktopk-bench::shift",
        Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(exec, 0, n),
        KOKKOS_LAMBDA(std::int64_t i) {
          const auto j = static_cast<std::uint64_t>(i);
          const std::int64_t o = i + own_offset < n ? i + own_offset : i + own_offset - n;
          float x = ((mix(own + j) & 1u) != 0 ? -b : b) * own_draws(o);
          if (correlated) {
            const std::int64_t s = i + shared_offset < n ? i + shared_offset : i + shared_offset - n;
            x += ((mix(shared + j) & 1u) != 0 ? -a : a) * shared_draws(s);
          }
          grad(i) = x;
        });
  }

  // Public only because CUDA does not allow device lambdas in private member functions.
  void generate(const Exec& exec, std::int64_t call, const Vector& grad) const {
    const auto rank = static_cast<std::uint64_t>(world_.rank());
    const std::uint64_t own = stream_key(args_.seed, rank, call);
    const std::uint64_t shared = stream_key(args_.seed, shared_stream, call);
    const std::uint64_t rows = stream_key(args_.seed, rank + row_stream_offset, call);
    const int kind = static_cast<int>(args_.dist.kind);
    const double p = args_.dist.parameter;
    const double a = std::sqrt(p);
    const double b = std::sqrt(1.0 - std::min(p, 1.0));
    const std::int64_t width = rows_width;
    Kokkos::parallel_for(
        "oktopk-bench::generate",
        Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(exec, 0, grad.extent(0)),
        KOKKOS_LAMBDA(std::int64_t i) {
          const auto j = static_cast<std::uint64_t>(i);
          double x = 0.0;
          switch (static_cast<DistKind>(kind)) {
            case DistKind::Laplace: {
              const double u = (static_cast<double>(mix(own + j) >> 11) + 0.5) * 0x1.0p-53;
              x = u < 0.5 ? kmath::log(2.0 * u) : -kmath::log(2.0 - 2.0 * u);
              break;
            }
            case DistKind::Lognormal: {
              const std::uint64_t h2 = mix(own + 2 * j + 1);
              const double z = normal_from(mix(own + 2 * j), h2);
              x = ((h2 & 1u) != 0 ? -1.0 : 1.0) * kmath::exp(2.0 * z);
              break;
            }
            case DistKind::Correlated:
              x = a * normal_at(shared, i) + b * normal_at(own, i);
              break;
            case DistKind::Rows:
              x = unit_closed_low(mix(rows + static_cast<std::uint64_t>(i / width))) < p
                      ? normal_at(own, i)
                      : 0.0;
              break;
            default:
              x = normal_at(own, i);
              break;
          }
          grad(i) = static_cast<float>(x);
        });
  }

  void read(const Exec& exec, std::int64_t call, const Vector& grad) {
    const int P = world_.size();
    const std::int64_t n = file_.n;
    const std::int64_t record = (call * P + world_.rank()) % file_.count;
    if (host_.extent(0) != static_cast<std::size_t>(n)) {
      host_ = Kokkos::View<float*, Kokkos::HostSpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "oktopk-bench::file_gradient"),
          static_cast<std::size_t>(n));
    }
    std::string error;
    {
      std::ifstream in(args_.dist.path, std::ios::binary);
      in.seekg(file_header_bytes + record * n * static_cast<std::int64_t>(sizeof(float)));
      in.read(reinterpret_cast<char*>(host_.data()), n * static_cast<std::int64_t>(sizeof(float)));
      if (!in || in.gcount() != n * static_cast<std::int64_t>(sizeof(float))) {
        error = "cannot read gradient " + std::to_string(record) + " of '" + args_.dist.path +
                "' on rank " + std::to_string(world_.rank());
      }
    }
    std::int64_t failed = error.empty() ? 0 : world_.rank() + 1;
    world_.allreduce_in_place(&failed, 1, MPI_MAX);
    if (failed != 0) {
      throw std::runtime_error(!error.empty()
                                   ? error
                                   : "reading '" + args_.dist.path + "' failed on rank " +
                                         std::to_string(failed - 1));
    }
    swap_bytes_if_big_endian(host_.data(), static_cast<std::size_t>(n), sizeof(float));
    Kokkos::deep_copy(exec, grad, host_);
  }

 private:
  const Args& args_;
  oktopk::Communicator world_;
  GradientFile file_;
  Kokkos::View<float*, Kokkos::HostSpace> host_;
  Vector own_draws_;     // --shifted-draws
  Vector shared_draws_;  // --shifted-draws, correlated
};

/// Collective: writes the gradients of calls [0, calls) of every rank to `path`, in the
/// replay order (call t of rank r is gradient t * P + r).
void dump_gradients(const Exec& exec, const oktopk::Communicator& world, const Args& args,
                    GradientSource& source) {
  const int P = world.size();
  const int rank = world.rank();
  const std::int64_t n = args.n;
  const std::int64_t calls = args.warmup + args.iters;
  std::ofstream out;
  std::int64_t ok = 1;
  if (rank == 0) {
    out.open(args.dump_path, std::ios::binary | std::ios::trunc);
    std::int64_t fields[2] = {n, calls * P};
    swap_bytes_if_big_endian(fields, 2, sizeof(std::int64_t));
    out.write(file_magic, sizeof(file_magic));
    out.write(reinterpret_cast<const char*>(fields), sizeof(fields));
    ok = out ? 1 : 0;
  }
  world.bcast(&ok, 1, 0);
  if (ok == 0) throw std::runtime_error("cannot write gradient file '" + args.dump_path + "'");

  Vector grad("oktopk-bench::dump_grad", static_cast<std::size_t>(n));
  auto host = Kokkos::create_mirror_view(grad);
  std::vector<float> all(rank == 0 ? static_cast<std::size_t>(n * P) : 0);
  for (std::int64_t t = 0; t < calls; ++t) {
    source.fill(exec, t, grad);
    Kokkos::deep_copy(exec, host, grad);
    exec.fence();
    oktopk::Communicator::Requests requests;
    if (rank == 0) {
      std::copy(host.data(), host.data() + n, all.begin());
      for (int r = 1; r < P; ++r) world.irecv(all.data() + r * n, n, r, 7, requests);
      requests.wait_all();
      swap_bytes_if_big_endian(all.data(), all.size(), sizeof(float));
      out.write(reinterpret_cast<const char*>(all.data()),
                static_cast<std::streamsize>(all.size() * sizeof(float)));
    } else {
      world.isend(host.data(), n, 0, 7, requests);
      requests.wait_all();
    }
  }
  if (rank == 0) {
    out.close();
    ok = out ? 1 : 0;
  }
  world.bcast(&ok, 1, 0);
  if (ok == 0) throw std::runtime_error("writing gradient file '" + args.dump_path + "' failed");
}

// ---- one method -----------------------------------------------------------------------------

struct PhaseRow {
  std::string name;
  double seconds = 0.0;  // median over iterations of the max over ranks
  double bytes = 0.0;    // mean over iterations of the max over ranks of max(sent, received)
};

struct Result {
  std::string algo;
  std::int64_t k = 0;
  double time_med = 0.0;
  double time_max = 0.0;
  double bytes_avg = 0.0;
  double bytes_max = 0.0;
  std::int64_t nnz = 0;
  double nnz_avg = 0.0;         // mean over the timed calls of the output's non-zeros
  double bytes_call_max = 0.0;  // max over the timed calls and ranks of max(sent, received)
  std::int64_t wrong = 0;
  bool unchecked = false;  // a row --check does not apply to (mpi_allreduce)
  std::vector<PhaseRow> phases;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size();
  return m % 2 == 1 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
}

double max_bytes(const oktopk::PhaseTraffic& t) {
  return static_cast<double>(std::max(t.bytes_sent, t.bytes_received));
}

using PhaseLog = std::vector<std::map<std::string, std::pair<double, double>>>;

/// Collective: the union of the phase names of all ranks, then per phase and iteration the max
/// over ranks of time and bytes.
std::vector<PhaseRow> aggregate_phases(const oktopk::Communicator& world, const PhaseLog& log) {
  const int P = world.size();
  std::set<std::string> local;
  for (const auto& iteration : log) {
    for (const auto& entry : iteration) local.insert(entry.first);
  }
  std::string joined;
  for (const auto& name : local) joined += name + '\n';
  const auto length = static_cast<std::int64_t>(joined.size());
  std::vector<std::int64_t> lengths(P);
  world.allgather(&length, 1, lengths.data());
  std::vector<int> counts(P), displacements(P);
  std::int64_t total = 0;
  for (int r = 0; r < P; ++r) {
    counts[r] = static_cast<int>(lengths[r]);
    displacements[r] = static_cast<int>(total);
    total += lengths[r];
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  world.allgatherv(joined.data(), length, all.data(), counts.data(), displacements.data());
  std::set<std::string> names;
  std::istringstream lines(all);
  for (std::string name; std::getline(lines, name);) names.insert(name);

  const std::size_t iters = log.size();
  std::vector<double> seconds(names.size() * iters, 0.0), bytes(names.size() * iters, 0.0);
  std::size_t p = 0;
  for (const auto& name : names) {
    for (std::size_t j = 0; j < iters; ++j) {
      const auto found = log[j].find(name);
      if (found != log[j].end()) {
        seconds[p * iters + j] = found->second.first;
        bytes[p * iters + j] = found->second.second;
      }
    }
    ++p;
  }
  world.allreduce_in_place(seconds.data(), static_cast<std::int64_t>(seconds.size()), MPI_MAX);
  world.allreduce_in_place(bytes.data(), static_cast<std::int64_t>(bytes.size()), MPI_MAX);
  std::vector<PhaseRow> rows;
  p = 0;
  for (const auto& name : names) {
    PhaseRow row;
    row.name = name;
    row.seconds = median({seconds.begin() + p * iters, seconds.begin() + (p + 1) * iters});
    for (std::size_t j = 0; j < iters; ++j) row.bytes += bytes[p * iters + j];
    row.bytes /= static_cast<double>(iters);
    rows.push_back(row);
    ++p;
  }
  return rows;
}

/// Progress on stderr (rank 0): a line when a method starts and every 10 s.
class Progress {
 public:
  explicit Progress(int rank) : rank_(rank) {}
  void start(const std::string& algo, std::size_t index, std::size_t count) {
    algo_ = algo;
    if (rank_ == 0) {
      std::fprintf(stderr, "oktopk-bench: [%zu/%zu] %s\n", index + 1, count, algo.c_str());
    }
    since_start_.reset();
    since_print_.reset();
  }
  void tick(std::int64_t call, std::int64_t calls) {
    if (rank_ != 0 || since_print_.seconds() < 10.0) return;
    std::fprintf(stderr, "oktopk-bench: %s: call %lld/%lld, %.0f s\n", algo_.c_str(),
                 static_cast<long long>(call + 1), static_cast<long long>(calls),
                 since_start_.seconds());
    since_print_.reset();
  }

 private:
  int rank_;
  std::string algo_;
  Kokkos::Timer since_start_;
  Kokkos::Timer since_print_;
};

/// --trace: each rank keeps the CSV rows of its messages; after every method rank 0 collects
/// them (point to point, rank by rank, so the file is ordered by method, then rank, then call)
/// and appends them to the one file. Nothing is recorded without --trace.
class Trace {
 public:
  /// Collective: rank 0 creates the file and writes the header; every rank learns whether it
  /// could, so all throw together rather than some waiting later.
  Trace(const oktopk::Communicator& world, const std::string& path) : world_(world), path_(path) {
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

  bool enabled() const { return !path_.empty(); }

  /// Appends the records `comm` logged in one call (its log holds exactly that call: the
  /// handle resets the accounting at the start of every call).
  void add_call(const std::string& algo, std::int64_t call, const oktopk::Communicator& comm) {
    for (const oktopk::MessageRecord& m : comm.message_log()) {
      rows_ << algo << ',' << call << ',' << world_.rank() << ',' << m.phase << ',' << m.operation
            << ',' << m.peer << ',' << m.bytes_sent << ',' << m.bytes_received << '\n';
    }
  }

  /// Collective: moves every rank's rows to the file and clears them.
  void flush() {
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

 private:
  oktopk::Communicator world_;
  std::string path_;
  std::ofstream out_;
  std::ostringstream rows_;
};

Result run_algorithm(const Exec& exec, const oktopk::Communicator& world, const Args& args,
                     oktopk::Algorithm algorithm, GradientSource& source, Progress& progress,
                     Trace& trace) {
  const int P = world.size();
  const auto n = static_cast<std::size_t>(args.n);
  // The handle gets its own duplicate, so the benchmark's own calls never mix with its traffic.
  oktopk::Communicator comm(MPI_COMM_WORLD);
  // The log only in the timed calls: the warm-up's messages would be kept and dropped unread.
  const auto handle =
      oktopk::make_sparse_allreduce(exec, algorithm, comm, args.n, args.options, args.layout);
  Vector grad("oktopk-bench::grad", n);
  Vector out("oktopk-bench::out", n);
  Vector acc, expected, slack;
  if (args.check) {
    acc = Vector("oktopk-bench::acc", n);
    expected = Vector("oktopk-bench::expected", n);
    slack = Vector("oktopk-bench::slack", n);
  }
  const std::int64_t calls = args.warmup + args.iters;
  const auto iters = static_cast<std::size_t>(args.iters);
  std::vector<double> seconds(iters, 0.0);
  double bytes_sum = 0.0;
  double bytes_call_max = 0.0;
  double nnz_sum = 0.0;
  PhaseLog phase_log(args.phases ? iters : 0);
  Result result;
  result.algo = oktopk::to_string(algorithm);
  result.k = handle->k();

  for (std::int64_t call = 0; call < calls; ++call) {
    source.fill(exec, call, grad);
    const bool timed = call >= args.warmup;
    if (timed && args.check) {
      // The method's input, as it computes it: residual before the call plus the gradient.
      const auto residual = handle->residual();
      const auto g = grad;
      const auto a = acc;
      Kokkos::parallel_for(
          "oktopk-bench::acc",
          Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(exec, 0, n),
          KOKKOS_LAMBDA(std::int64_t i) { a(i) = residual(i) + g(i); });
    }
    exec.fence();
    if (trace.enabled()) comm.set_message_log(timed);
    world.barrier();
    Kokkos::Timer timer;
    handle->reduce(exec, grad, out);
    exec.fence();
    const double elapsed = timer.seconds();
    if (timed) {
      const auto j = static_cast<std::size_t>(call - args.warmup);
      const oktopk::ReduceStats& stats = handle->stats();
      seconds[j] = elapsed;
      bytes_sum += max_bytes(stats.total_traffic());
      bytes_call_max = std::max(bytes_call_max, static_cast<double>(max_bytes(stats.total_traffic())));
      trace.add_call(result.algo, call - args.warmup, comm);
      std::int64_t nonzeros = 0;
      Kokkos::parallel_reduce(
          "oktopk-bench::nnz", Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(exec, 0, n),
          KOKKOS_LAMBDA(std::int64_t i, std::int64_t& count) { count += out(i) != 0.0f ? 1 : 0; },
          nonzeros);
      nnz_sum += static_cast<double>(nonzeros);
      if (args.phases) {
        for (const auto& [name, phase] : stats.phases) {
          phase_log[j][name] = {phase.seconds, max_bytes(phase.traffic)};
        }
      }
      if (args.check) {
        constexpr double tolerance = oktopk::default_oracle_tolerance;
        oktopk::expected_result(exec, *handle, acc, expected, tolerance, slack);
        result.wrong += oktopk::count_mismatches(exec, *handle, expected, out, tolerance, slack);
      }
    }
    progress.tick(call, calls);
  }

  world.allreduce_in_place(seconds.data(), static_cast<std::int64_t>(iters), MPI_MAX);
  result.time_med = median(seconds);
  result.time_max = *std::max_element(seconds.begin(), seconds.end());
  const double mine = bytes_sum / static_cast<double>(iters);
  result.bytes_avg = mine;
  result.bytes_max = mine;
  world.allreduce_in_place(&result.bytes_avg, 1, MPI_SUM);
  result.bytes_avg /= P;
  world.allreduce_in_place(&result.bytes_max, 1, MPI_MAX);
  result.bytes_call_max = bytes_call_max;
  world.allreduce_in_place(&result.bytes_call_max, 1, MPI_MAX);
  result.nnz_avg = nnz_sum / static_cast<double>(iters);
  Kokkos::parallel_reduce(
      "oktopk-bench::nnz", Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i, std::int64_t& count) { count += out(i) != 0.0f ? 1 : 0; },
      result.nnz);
  if (args.phases) result.phases = aggregate_phases(world, phase_log);
  trace.flush();
  return result;
}

/// The floor for the dense method: MPI_Allreduce (through oktopk::Communicator, which counts
/// its bytes) of each call's gradient, copied to host memory untimed, into a second buffer.
Result run_mpi_baseline(const Exec& exec, const oktopk::Communicator& world, const Args& args,
                        GradientSource& source, Progress& progress, Trace& trace) {
  const auto n = static_cast<std::size_t>(args.n);
  oktopk::Communicator comm(MPI_COMM_WORLD);
  Vector grad("oktopk-bench::grad", n);
  Kokkos::View<float*, Kokkos::HostSpace> send("oktopk-bench::mpi_send", n);
  Kokkos::View<float*, Kokkos::HostSpace> receive("oktopk-bench::mpi_receive", n);
  const std::int64_t calls = args.warmup + args.iters;
  const auto iters = static_cast<std::size_t>(args.iters);
  std::vector<double> seconds(iters, 0.0);
  double bytes_sum = 0.0;
  Result result;
  result.algo = "mpi_allreduce";
  result.unchecked = true;
  result.k = std::min<std::int64_t>(
      args.n, static_cast<std::int64_t>(std::floor(args.density * static_cast<double>(args.n))));
  for (std::int64_t call = 0; call < calls; ++call) {
    source.fill(exec, call, grad);
    Kokkos::deep_copy(exec, send, grad);
    exec.fence();
    comm.reset_traffic();
    if (trace.enabled()) comm.set_message_log(call >= args.warmup);
    world.barrier();
    Kokkos::Timer timer;
    comm.allreduce(send.data(), receive.data(), args.n, MPI_SUM);
    const double elapsed = timer.seconds();
    if (call >= args.warmup) {
      seconds[static_cast<std::size_t>(call - args.warmup)] = elapsed;
      bytes_sum += max_bytes(comm.total_traffic());
      trace.add_call(result.algo, call - args.warmup, comm);
    }
    progress.tick(call, calls);
  }
  world.allreduce_in_place(seconds.data(), static_cast<std::int64_t>(iters), MPI_MAX);
  result.time_med = median(seconds);
  result.time_max = *std::max_element(seconds.begin(), seconds.end());
  result.bytes_avg = result.bytes_max = bytes_sum / static_cast<double>(iters);
  world.allreduce_in_place(&result.bytes_avg, 1, MPI_SUM);
  result.bytes_avg /= world.size();
  world.allreduce_in_place(&result.bytes_max, 1, MPI_MAX);
  result.bytes_call_max = result.bytes_max;  // the same bytes every call
  for (std::size_t i = 0; i < n; ++i) result.nnz += receive(i) != 0.0f ? 1 : 0;
  result.nnz_avg = static_cast<double>(result.nnz);
  trace.flush();
  return result;
}

// ---- output ---------------------------------------------------------------------------------

/// Prints on rank 0 only, each row as soon as its method is done.
class Printer {
 public:
  Printer(const Args& args, int ranks, int rank) : args_(args), P_(ranks), rank_(rank) {}

  void begin(std::int64_t k) {
    if (rank_ != 0) return;
    if (args_.format == "csv") {
      std::printf("%s\n", csv_header);
    } else if (args_.format == "json") {
      std::printf("[");
    } else {
      std::ostringstream options;
      options << args_.options;
      std::printf(
          "# oktopk-bench: P=%d n=%lld k=%lld dist=%s seed=%llu warmup=%lld iters=%lld "
          "check=%s exec=%s\n",
          P_, static_cast<long long>(args_.n), static_cast<long long>(k), args_.dist.text.c_str(),
          static_cast<unsigned long long>(args_.seed), static_cast<long long>(args_.warmup),
          static_cast<long long>(args_.iters), args_.check ? "on" : "off", Exec::name());
      std::printf("# options: %s\n", options.str().c_str());
      if (!args_.layout.empty()) {
        std::ostringstream layout;
        layout << args_.layout;
        std::printf("# layout: %s\n", layout.str().c_str());
      }
      std::printf("%-10s %5s %11s %10s %8s %6s %12s %12s %18s %18s %25s %10s %6s %12s %25s\n",
                  "algo", "P", "n", "k", "density", "iters", "time_s_med", "time_s_max",
                  "bytes_per_rank_avg", "bytes_per_rank_max", "words_per_rank_max_over_k",
                  "nnz_out", "wrong", "nnz_out_avg", "words_per_call_max_over_k");
    }
    std::fflush(stdout);
  }

  void row(const Result& r) {
    results_.push_back(r);
    if (rank_ != 0) return;
    const std::string words =
        r.k > 0 ? format("%.4f", r.bytes_max / 4.0 / static_cast<double>(r.k)) : "-";
    const std::string call_words =
        r.k > 0 ? format("%.4f", r.bytes_call_max / 4.0 / static_cast<double>(r.k)) : "-";
    const bool checked = args_.check && !r.unchecked;
    const std::string wrong = checked ? std::to_string(r.wrong) : "-";
    if (args_.format == "csv") {
      std::printf("%s,%d,%lld,%lld,%g,%lld,%.6e,%.6e,%.1f,%.1f,%s,%lld,%s,%.1f,%s\n",
                  r.algo.c_str(), P_, static_cast<long long>(args_.n),
                  static_cast<long long>(r.k), args_.density, static_cast<long long>(args_.iters),
                  r.time_med, r.time_max, r.bytes_avg, r.bytes_max, words.c_str(),
                  static_cast<long long>(r.nnz), wrong.c_str(), r.nnz_avg, call_words.c_str());
    } else if (args_.format == "json") {
      std::printf(
          "%s\n  {\"algo\": \"%s\", \"P\": %d, \"n\": %lld, \"k\": %lld, \"density\": %.17g, "
          "\"iters\": %lld, \"time_s_med\": %.9g, \"time_s_max\": %.9g, "
          "\"bytes_per_rank_avg\": %.17g, \"bytes_per_rank_max\": %.17g, "
          "\"words_per_rank_max_over_k\": %s, \"nnz_out\": %lld, \"wrong\": %s, "
          "\"nnz_out_avg\": %.17g, \"words_per_call_max_over_k\": %s",
          results_.size() > 1 ? "," : "", r.algo.c_str(), P_, static_cast<long long>(args_.n),
          static_cast<long long>(r.k), args_.density, static_cast<long long>(args_.iters),
          r.time_med, r.time_max, r.bytes_avg, r.bytes_max,
          r.k > 0 ? format("%.17g", r.bytes_max / 4.0 / static_cast<double>(r.k)).c_str() : "null",
          static_cast<long long>(r.nnz), checked ? wrong.c_str() : "null", r.nnz_avg,
          r.k > 0 ? format("%.17g", r.bytes_call_max / 4.0 / static_cast<double>(r.k)).c_str()
                  : "null");
      if (args_.phases) {
        std::printf(", \"phases\": [");
        for (std::size_t p = 0; p < r.phases.size(); ++p) {
          std::printf("%s{\"phase\": \"%s\", \"time_s_med\": %.9g, \"bytes_per_rank_max\": %.17g}",
                      p > 0 ? ", " : "", r.phases[p].name.c_str(), r.phases[p].seconds,
                      r.phases[p].bytes);
        }
        std::printf("]");
      }
      std::printf("}");
    } else {
      std::printf(
          "%-10s %5d %11lld %10lld %8g %6lld %12.4e %12.4e %18.1f %18.1f %25s %10lld %6s %12.1f "
          "%25s\n",
          r.algo.c_str(), P_, static_cast<long long>(args_.n), static_cast<long long>(r.k),
          args_.density, static_cast<long long>(args_.iters), r.time_med, r.time_max, r.bytes_avg,
          r.bytes_max, words.c_str(), static_cast<long long>(r.nnz), wrong.c_str(), r.nnz_avg,
          call_words.c_str());
    }
    std::fflush(stdout);
  }

  void end() {
    if (rank_ != 0) return;
    if (args_.format == "json") {
      std::printf("\n]\n");
    } else if (args_.phases && args_.format == "csv") {
      std::printf("\nalgo,phase,time_s_med,share,bytes_per_rank_max\n");
      for (const auto& r : results_) {
        const double sum = phase_seconds(r);
        for (const auto& p : r.phases) {
          std::printf("%s,%s,%.6e,%.4f,%.1f\n", r.algo.c_str(), p.name.c_str(), p.seconds,
                      sum > 0 ? p.seconds / sum : 0.0, p.bytes);
        }
      }
    } else if (args_.phases) {
      std::printf(
          "\n# phases: time_s_med = median over iterations of the max over ranks; share "
          "= of the sum over phases;\n# bytes_per_rank_max = mean over iterations of "
          "the max over ranks of max(sent, received)\n");
      std::printf("%-10s %-24s %12s %7s %18s\n", "algo", "phase", "time_s_med", "share",
                  "bytes_per_rank_max");
      for (const auto& r : results_) {
        const double sum = phase_seconds(r);
        for (const auto& p : r.phases) {
          std::printf("%-10s %-24s %12.4e %6.1f%% %18.1f\n", r.algo.c_str(), p.name.c_str(),
                      p.seconds, sum > 0 ? 100.0 * p.seconds / sum : 0.0, p.bytes);
        }
      }
    }
    std::fflush(stdout);
  }

 private:
  static std::string format(const char* spec, double value) {
    char buffer[64];
    std::snprintf(buffer, sizeof(buffer), spec, value);
    return buffer;
  }
  static double phase_seconds(const Result& r) {
    double sum = 0.0;
    for (const auto& p : r.phases) sum += p.seconds;
    return sum;
  }

  const Args& args_;
  int P_;
  int rank_;
  std::vector<Result> results_;
};

void run_benchmark(const Args& args, const oktopk::Communicator& world, GradientFile file) {
  const Exec exec;
  GradientSource source(args, world, file);
  if (!args.dump_path.empty()) dump_gradients(exec, world, args, source);
  Printer printer(args, world.size(), world.rank());
  printer.begin(std::min<std::int64_t>(
      args.n, static_cast<std::int64_t>(std::floor(args.density * static_cast<double>(args.n)))));
  Progress progress(world.rank());
  Trace trace(world, args.trace_path);
  const std::size_t rows = args.algorithms.size() + (args.mpi_baseline ? 1 : 0);
  for (std::size_t a = 0; a < args.algorithms.size(); ++a) {
    progress.start(oktopk::to_string(args.algorithms[a]), a, rows);
    printer.row(run_algorithm(exec, world, args, args.algorithms[a], source, progress, trace));
  }
  if (args.mpi_baseline) {
    progress.start("mpi_allreduce", rows - 1, rows);
    printer.row(run_mpi_baseline(exec, world, args, source, progress, trace));
  }
  printer.end();
}

/// Everything between MPI_Init and MPI_Finalize; returns the exit status.
int bench_main(int argc, char* argv[], const oktopk::Communicator& world) {
  const bool root = world.rank() == 0;
  Args args;
  GradientFile file;
  try {
    args = parse(argc, argv);
    if (args.help) {
      if (root) std::cout << usage();
      return 0;
    }
    if (args.dist.kind == DistKind::File) {
      file = check_gradient_file(world, args.dist.path);
      if (args.n_given && args.n != file.n) {
        throw UsageError("--n " + std::to_string(args.n) + " does not match the n = " +
                         std::to_string(file.n) + " of '" + args.dist.path + "'");
      }
      args.n = file.n;
    }
    args.layout = parse_layout(args.layout_spec, args.n);
  } catch (const UsageError& e) {
    if (root) std::cerr << "oktopk-bench: " << e.what() << " (see --help)\n";
    return 2;
  }
  int status = 0;
  oktopk::apps::FailureSettlement failures("oktopk-bench");
  Kokkos::ScopeGuard kokkos(argc, argv);
  try {
    run_benchmark(args, world, file);
  } catch (const std::exception& e) {
    // Errors every rank throws alike (the library's checks, bad gradient files) are reported
    // once, by rank 0. One that hit this rank alone ends the job here, with this rank's number.
    failures.settle(e.what());
    std::fflush(stdout);
    if (root) std::cerr << "oktopk-bench: " << e.what() << "\n";
    status = 1;
  }
  return status;
}

}  // namespace

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    // Destroyed before MPI_Finalize.
    const oktopk::Communicator world(MPI_COMM_WORLD);
    status = bench_main(argc, argv, world);
  }
  MPI_Finalize();
  return status;
}
