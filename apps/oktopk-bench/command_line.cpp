// SPDX-License-Identifier: BSD-3-Clause
// oktopk-bench's command line: --help, and the parsing of every flag (--dist, --algo, --layout
// and the method options) into Args, with a UsageError for anything it does not accept.
#include "command_line.hpp"

#include "common/gradient_types.hpp"
#include "report.hpp"
#include "trace.hpp"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <utility>

namespace oktopk::bench {

std::string usage() {
  // {}: CUDA 11's front end wants an initializer for a const class object even where every
  // member has one.
  const oktopk::Options d{};
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
between_nodes_bytes_per_rank_max: as bytes_per_rank_max, of the bytes to and from ranks on
  other nodes (the handles' nodes: option node_size, shared memory by default; collectives
  split as the accounting charges them, each block straight to its peer).
With --mpi-baseline, a last row mpi_allreduce times a bare MPI_Allreduce of the same
  gradients (host memory, separate send and receive buffers, no averaging; wrong is '-');
  with --reduce-scatter, a row mpi_reduce_scatter_block times a bare MPI_Reduce_scatter_block.

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
                           levels:L        quantized: a random sign times one of the
                                           magnitudes 1, 2, ..., L (1 <= L <= 65536; 1: all
                                           magnitudes tie)
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
  --dtype T              the gradient's and the output's type: float32, float64, bfloat16
                         or float16 (default float32). The draws are the same whatever T:
                         made as floats, then rounded to nearest even into a 16-bit T (exact
                         into float64), so that every type reduces the same gradients; a
                         16-bit handle sums and keeps its residual in float, a float64 one in
                         double. The wires a type takes: float32 any, float64 native or fp32,
                         a 16-bit type its own (native, or bf16/fp16 as its name). The
                         table's header line and json's rows name it; csv's columns are the
                         same for every type
  --check                compare every output element with the oracle (oktopk/oracle.hpp)
  --sparse-result        call reduce_sparse, which returns the result as indices and values,
                         instead of reduce, which writes n floats (--check scatters the
                         entries into n floats after the timed call)
  --reduce-scatter       call reduce_scatter: each rank receives its equal shard of the
                         result, n/P entries, and no allgather is made (methods oktopk,
                         topka, topkdsa, gaussiank and dense; --check gathers the shards
                         into n values after the timed call, as --sparse-result scatters
                         its entries)
  --mpi-baseline         also time a bare MPI_Allreduce of the same gradients (row
                         mpi_allreduce), the floor the dense method is measured against;
                         with --reduce-scatter a bare MPI_Reduce_scatter_block of n/P
                         entries a rank (row mpi_reduce_scatter_block; P must divide n);
                         float32 and float64 only (MPI has no 16-bit floating type)
  --format F             table, csv or json (default table)
  --phases               also print, per method and phase, the time (median over iterations
                         of the max over ranks) and bytes (mean over iterations of the max
                         over ranks of max(sent, received)), all and between nodes: a
                         second table (table, csv) or a "phases" array (json)
  --dump-gradients PATH  write the gradients of every call (warm-up and timed, every rank) to
                         PATH; --dist file:PATH with the same P, --warmup and --iters
                         replays exactly these calls
  --trace PATH           write every message of the timed calls, of every rank, to PATH (one
                         CSV file, written by rank 0), as the traffic accounting charges them:
                           )"
     << trace_header << R"(
                         call: timed iteration from 0; operation: send or recv (peer = the
                         other rank; a receive is logged when it completes, with its actual
                         size) or a collective, allreduce alltoall allgather allgatherv bcast
                         reduce_scatter
                         (peer -1, bytes = its charged per-rank volume); messages to self are
                         not counted and not listed. Rows are ordered by method, rank, call;
                         per (algo, call, rank) they sum to the bytes behind bytes_per_rank_*
                         and --phases. The mpi_allreduce row is traced too.
  --help                 print this text

Method options (oktopk::Options, defaults are the library's):
  --dense-warmup N       the first N calls of each handle are dense allreduces ()"
     << d.warmup_iterations << R"()
  --dense-allreduce A    dense allreduces (method dense, warm-up calls): mpi (MPI_Allreduce),
                         ring (OkTopk's, the division fused in) or auto (the ring on a CPU
                         where n / P >= 2^14, else mpi) ()"
     << d.dense_allreduce << R"()
  --wire W               the values' type on the wire: native (the gradient's, float), fp32,
                         bf16 or fp16; bf16 and fp16 round every value sent and sum in
                         float (dense on the ring: MPI has no 16-bit floating type), so
                         --algo dense --wire bf16 is the 16-bit dense baseline, as DDP's
                         bf16_compress_hook; S2 averages its sketch on the ring; the
                         methods with error feedback keep each rounding error in the
                         residual ()"
     << d.wire << R"()
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
                         one-sided guard; names and defaults: docs/reference.md, "Options"

Gradient files: the 8 bytes "OKTOPKG1", int64 n, int64 count, then count gradients of n
float32 each, all little endian. Every rank reads the file itself (a shared file system).
--dump-gradients writes the float32 draws, whatever --dtype; a replay with --dtype T rounds
them into T as it does the draws.
)";
  return os.str();
}

namespace {

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
  } else if (name == "levels" && has_value) {
    d.kind = DistKind::Levels;
    d.parameter = parse_number<double>("--dist levels:L", value);
    if (!(d.parameter >= 1.0 && d.parameter <= 65536.0 && d.parameter == std::floor(d.parameter))) {
      throw UsageError("--dist levels:L needs an integer 1 <= L <= 65536, got " + value);
    }
  } else if (name == "file" && has_value && !value.empty()) {
    d.kind = DistKind::File;
    d.path = value;
  } else {
    throw UsageError(
        "unknown --dist '" + text +
        "' (valid: normal laplace lognormal correlated:RHO rows:R levels:L file:PATH)");
  }
  return d;
}

std::vector<oktopk::Algorithm> parse_algorithms(const std::string& list) {
  std::vector<oktopk::Algorithm> result;
  for (const auto& name : oktopk::apps::split_at(list, ',')) {
    if (name == "all") {
      result.insert(result.end(), oktopk::all_algorithms.begin(), oktopk::all_algorithms.end());
      continue;
    }
    try {
      result.push_back(oktopk::algorithm_from_string(name));
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
  }
  return result;
}

}  // namespace

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
        flag == "--shifted-draws" || flag == "--sparse-result" || flag == "--reduce-scatter") {
      if (has_value) throw UsageError(flag + " takes no value");
      (flag == "--check"            ? a.check
       : flag == "--phases"         ? a.phases
       : flag == "--mpi-baseline"   ? a.mpi_baseline
       : flag == "--sparse-result"  ? a.sparse_result
       : flag == "--reduce-scatter" ? a.reduce_scatter
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
    } else if (flag == "--dtype") {
      a.dtype = value;
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
    } else if (flag == "--wire") {
      try {
        o.set_wire(oktopk::wire_from_string(value.c_str()));
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
      if (equals == std::string::npos) {
        throw UsageError("--option needs KEY=VALUE, got '" + value + "'");
      }
      try {
        const std::string_view entry(value);
        o.set(entry.substr(0, equals), entry.substr(equals + 1));
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
  if (!oktopk::apps::is_dtype(a.dtype)) {
    throw UsageError(std::string("--dtype must be ") + oktopk::apps::dtype_list + ", got '" +
                     a.dtype + "'");
  }
  if (a.mpi_baseline && a.dtype != "float32" && a.dtype != "float64") {
    throw UsageError("--mpi-baseline times MPI_Allreduce, which has no " + a.dtype +
                     " type: use --dtype float32 or float64");
  }
  if (a.reduce_scatter && a.sparse_result) {
    throw UsageError("--reduce-scatter and --sparse-result are different calls: pick one");
  }
  if (a.reduce_scatter) {
    for (const oktopk::Algorithm m : a.algorithms) {
      if (m == oktopk::Algorithm::GTopk || m == oktopk::Algorithm::S2Reducer) {
        throw UsageError(
            "--reduce-scatter takes --algo oktopk, topka, topkdsa, gaussiank and dense, the "
            "methods with a reduce-scatter; got " +
            oktopk::to_string(m));
      }
    }
  }
  if (a.shifted_draws && (a.dist.kind == DistKind::Rows || a.dist.kind == DistKind::Levels ||
                          a.dist.kind == DistKind::File)) {
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

oktopk::Layout parse_layout(const std::string& spec, std::int64_t n) {
  oktopk::Layout layout;
  if (spec.empty()) return layout;
  const std::vector<std::string> items = oktopk::apps::split_at(spec, ',');
  const std::vector<std::string> first = oktopk::apps::split_at(items[0], ':');
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
    const std::vector<std::string> fields = oktopk::apps::split_at(items[i], ':');
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

}  // namespace oktopk::bench
