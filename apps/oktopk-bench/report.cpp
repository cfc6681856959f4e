// SPDX-License-Identifier: BSD-3-Clause
// oktopk-bench's report: one row per method as table, csv or json, the --phases rows, and the
// progress lines on stderr.
#include "report.hpp"

#include "types.hpp"

#include <cstdio>
#include <sstream>

namespace oktopk::bench {

void Progress::start(const std::string& algo, std::size_t index, std::size_t count) {
  algo_ = algo;
  if (rank_ == 0) {
    std::fprintf(stderr, "oktopk-bench: [%zu/%zu] %s\n", index + 1, count, algo.c_str());
  }
  since_start_.reset();
  since_print_.reset();
}

void Progress::tick(std::int64_t call, std::int64_t calls) {
  if (rank_ != 0 || since_print_.seconds() < 10.0) return;
  std::fprintf(stderr, "oktopk-bench: %s: call %lld/%lld, %.0f s\n", algo_.c_str(),
               static_cast<long long>(call + 1), static_cast<long long>(calls),
               since_start_.seconds());
  since_print_.reset();
}

void Printer::begin(std::int64_t k) {
  if (rank_ != 0) return;
  if (args_.format == "csv") {
    std::printf("%s\n", csv_header);
  } else if (args_.format == "json") {
    std::printf("[");
  } else {
    std::ostringstream options;
    options << args_.options;
    std::printf(
        "# oktopk-bench: P=%d n=%lld k=%lld dtype=%s dist=%s seed=%llu warmup=%lld iters=%lld "
        "check=%s exec=%s\n",
        P_, static_cast<long long>(args_.n), static_cast<long long>(k), args_.dtype.c_str(),
        args_.dist.text.c_str(), static_cast<unsigned long long>(args_.seed),
        static_cast<long long>(args_.warmup), static_cast<long long>(args_.iters),
        args_.check ? "on" : "off", Exec::name());
    std::printf("# options: %s\n", options.str().c_str());
    std::ostringstream nodes;
    nodes << nodes_;
    std::printf("# nodes: %s\n", nodes.str().c_str());
    if (!args_.layout.empty()) {
      std::ostringstream layout;
      layout << args_.layout;
      std::printf("# layout: %s\n", layout.str().c_str());
    }
    std::printf("%-10s %5s %11s %10s %8s %6s %12s %12s %18s %18s %25s %10s %6s %12s %25s %32s\n",
                "algo", "P", "n", "k", "density", "iters", "time_s_med", "time_s_max",
                "bytes_per_rank_avg", "bytes_per_rank_max", "words_per_rank_max_over_k", "nnz_out",
                "wrong", "nnz_out_avg", "words_per_call_max_over_k",
                "between_nodes_bytes_per_rank_max");
  }
  std::fflush(stdout);
}

void Printer::row(const Result& r) {
  results_.push_back(r);
  if (rank_ != 0) return;
  const std::string words =
      r.k > 0 ? format("%.4f", r.bytes_max / 4.0 / static_cast<double>(r.k)) : "-";
  const std::string call_words =
      r.k > 0 ? format("%.4f", r.bytes_call_max / 4.0 / static_cast<double>(r.k)) : "-";
  const bool checked = args_.check && !r.unchecked;
  const std::string wrong = checked ? std::to_string(r.wrong) : "-";
  if (args_.format == "csv") {
    std::printf("%s,%d,%lld,%lld,%g,%lld,%.6e,%.6e,%.1f,%.1f,%s,%lld,%s,%.1f,%s,%.1f\n",
                r.algo.c_str(), P_, static_cast<long long>(args_.n), static_cast<long long>(r.k),
                args_.density, static_cast<long long>(args_.iters), r.time_med, r.time_max,
                r.bytes_avg, r.bytes_max, words.c_str(), static_cast<long long>(r.nnz),
                wrong.c_str(), r.nnz_avg, call_words.c_str(), r.between_nodes_bytes_max);
  } else if (args_.format == "json") {
    std::printf(
        "%s\n  {\"algo\": \"%s\", \"P\": %d, \"n\": %lld, \"k\": %lld, \"density\": %.17g, "
        "\"iters\": %lld, \"time_s_med\": %.9g, \"time_s_max\": %.9g, "
        "\"bytes_per_rank_avg\": %.17g, \"bytes_per_rank_max\": %.17g, "
        "\"words_per_rank_max_over_k\": %s, \"nnz_out\": %lld, \"wrong\": %s, "
        "\"nnz_out_avg\": %.17g, \"words_per_call_max_over_k\": %s",
        results_.size() > 1 ? "," : "", r.algo.c_str(), P_, static_cast<long long>(args_.n),
        static_cast<long long>(r.k), args_.density, static_cast<long long>(args_.iters), r.time_med,
        r.time_max, r.bytes_avg, r.bytes_max,
        r.k > 0 ? format("%.17g", r.bytes_max / 4.0 / static_cast<double>(r.k)).c_str() : "null",
        static_cast<long long>(r.nnz), checked ? wrong.c_str() : "null", r.nnz_avg,
        r.k > 0 ? format("%.17g", r.bytes_call_max / 4.0 / static_cast<double>(r.k)).c_str()
                : "null");
    std::printf(", \"between_nodes_bytes_per_rank_max\": %.17g, \"dtype\": \"%s\"",
                r.between_nodes_bytes_max, args_.dtype.c_str());
    if (args_.phases) {
      std::printf(", \"phases\": [");
      for (std::size_t p = 0; p < r.phases.size(); ++p) {
        std::printf(
            "%s{\"phase\": \"%s\", \"time_s_med\": %.9g, \"bytes_per_rank_max\": %.17g, "
            "\"between_nodes_bytes_per_rank_max\": %.17g}",
            p > 0 ? ", " : "", r.phases[p].name.c_str(), r.phases[p].seconds, r.phases[p].bytes,
            r.phases[p].between_nodes_bytes);
      }
      std::printf("]");
    }
    std::printf("}");
  } else {
    std::printf(
        "%-10s %5d %11lld %10lld %8g %6lld %12.4e %12.4e %18.1f %18.1f %25s %10lld %6s %12.1f "
        "%25s %32.1f\n",
        r.algo.c_str(), P_, static_cast<long long>(args_.n), static_cast<long long>(r.k),
        args_.density, static_cast<long long>(args_.iters), r.time_med, r.time_max, r.bytes_avg,
        r.bytes_max, words.c_str(), static_cast<long long>(r.nnz), wrong.c_str(), r.nnz_avg,
        call_words.c_str(), r.between_nodes_bytes_max);
  }
  std::fflush(stdout);
}

void Printer::end() {
  if (rank_ != 0) return;
  if (args_.format == "json") {
    std::printf("\n]\n");
  } else if (args_.phases && args_.format == "csv") {
    std::printf(
        "\nalgo,phase,time_s_med,share,bytes_per_rank_max,between_nodes_bytes_per_rank_max\n");
    for (const auto& r : results_) {
      const double sum = phase_seconds(r);
      for (const auto& p : r.phases) {
        std::printf("%s,%s,%.6e,%.4f,%.1f,%.1f\n", r.algo.c_str(), p.name.c_str(), p.seconds,
                    sum > 0 ? p.seconds / sum : 0.0, p.bytes, p.between_nodes_bytes);
      }
    }
  } else if (args_.phases) {
    std::printf(
        "\n# phases: time_s_med = median over iterations of the max over ranks; share "
        "= of the sum over phases;\n# bytes_per_rank_max = mean over iterations of "
        "the max over ranks of max(sent, received); between_nodes = the same, of the bytes\n# to "
        "and from ranks on other nodes\n");
    std::printf("%-10s %-24s %12s %7s %18s %18s\n", "algo", "phase", "time_s_med", "share",
                "bytes_per_rank_max", "between_nodes");
    for (const auto& r : results_) {
      const double sum = phase_seconds(r);
      for (const auto& p : r.phases) {
        std::printf("%-10s %-24s %12.4e %6.1f%% %18.1f %18.1f\n", r.algo.c_str(), p.name.c_str(),
                    p.seconds, sum > 0 ? 100.0 * p.seconds / sum : 0.0, p.bytes,
                    p.between_nodes_bytes);
      }
    }
  }
  std::fflush(stdout);
}

std::string Printer::format(const char* spec, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), spec, value);
  return buffer;
}

double Printer::phase_seconds(const Result& r) {
  double sum = 0.0;
  for (const auto& p : r.phases) sum += p.seconds;
  return sum;
}

}  // namespace oktopk::bench
