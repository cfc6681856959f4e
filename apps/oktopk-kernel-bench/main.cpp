// SPDX-License-Identifier: BSD-3-Clause
// oktopk-kernel-bench: single-process timings of OkTopk's kernels against a memory-bandwidth
// reference (copy) and two naive top-k references: std::nth_element on the host and a full
// sort of |x| on the execution space (the device sort a radix select replaces). Links no MPI.
#include "common/app_kokkos_compat.hpp"
#include "common/cli.hpp"
#include "common/gradient_types.hpp"
#include "kernel_times.hpp"

#include <oktopk/pack.hpp>
#include <oktopk/residual.hpp>
#include <oktopk/select.hpp>
#include <oktopk/topk.hpp>

#include <Kokkos_Core.hpp>
#include <Kokkos_Random.hpp>
#include <Kokkos_Sort.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr const char* usage = R"(Usage: oktopk-kernel-bench [options] [--kokkos-... flags]

Times OkTopk's kernels on one process (default execution space) and prints one row per kernel:
  kernel,n,k,time_s_med,gb_per_s,dtype
time_s_med is the median over the repetitions (each fenced); gb_per_s is the bytes a minimal
implementation must move (listed in docs/benchmarks.md) divided by that time. The gradient x
holds --dtype values; the kernels that form sums (residual_update's residual, scatter_add,
merge_sorted) work in its arithmetic type (float for the 16-bit types).

Options:
  --n N          gradient length, 1 <= N <= 2^31-1           (default 67108864 = 2^26)
  --density D    k = max(1, floor(D * N)), 0 < D <= 1          (default 0.01)
  --reps R       timed repetitions per kernel, R >= 1          (default 10)
  --seed S       seed of the normal(0,1) test data             (default 42)
  --format F     csv or table                                  (default csv)
  --dtype T      the gradient's type: float32, float64, bfloat16 or float16
                                                               (default float32)
  --kernel-times ROWS
                 also time each Kokkos kernel and deep copy that the listed rows launch
                 (comma-separated kernel names as in the first column, or all): more
                 repetitions of those rows, with a global fence before and after every
                 launch, so the rows' own times are not affected. Printed after the rows,
                 one line per launch of a call, in order:
                   row,launch,time_s_med,dtype
                 launch is the kernel's label, or "deep_copy DST <- SRC" with the Views'
                 labels, followed by [i/m] when a call launches it m times; time_s_med is its
                 median over the repetitions (table: with x_row, that time over the row's)
  --help         print this text
)";

/// The rows, in the order they run (the names --kernel-times takes).
const std::vector<std::string> row_names = {"copy",
                                            "count_above",
                                            "threshold_select",
                                            "select_by_region",
                                            "exact_kth",
                                            "exact_kth_no_gather",
                                            "nth_element",
                                            "sort_abs",
                                            "sampled_threshold",
                                            "gaussian_threshold",
                                            "residual_update",
                                            "scatter_add",
                                            "merge_sorted",
                                            "intersect_sorted"};

struct Options {
  std::int64_t n = std::int64_t{1} << 26;
  double density = 0.01;
  int reps = 10;
  std::uint64_t seed = 42;
  std::string format = "csv";
  std::string dtype = "float32";
  std::vector<std::string> kernel_times;  // rows whose launches are timed one by one

  bool times_kernels_of(const std::string& row) const {
    return std::find(kernel_times.begin(), kernel_times.end(), row) != kernel_times.end();
  }
};

[[noreturn]] void fail(const std::string& message) {
  std::cerr << "oktopk-kernel-bench: " << message << " (see --help)\n";
  std::exit(2);
}

template <class T>
T parse_number(const std::string& flag, const std::string& text) {
  try {
    return oktopk::apps::parse_number<T>(flag, text);
  } catch (const oktopk::apps::UsageError& e) {
    fail(e.what());
  }
}

Options parse(int argc, char* argv[]) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag.rfind("--kokkos-", 0) == 0) continue;  // Kokkos's own, handled by Kokkos
    if (flag == "--help" || flag == "-h") {
      std::cout << usage;
      std::exit(0);
    }
    if (i + 1 >= argc) fail("unknown option or missing value: " + flag);
    const std::string value = argv[++i];
    if (flag == "--n") {
      o.n = parse_number<std::int64_t>(flag, value);
    } else if (flag == "--density") {
      o.density = parse_number<double>(flag, value);
    } else if (flag == "--reps") {
      o.reps = parse_number<int>(flag, value);
    } else if (flag == "--seed") {
      o.seed = parse_number<std::uint64_t>(flag, value);
    } else if (flag == "--format") {
      o.format = value;
    } else if (flag == "--dtype") {
      o.dtype = value;
    } else if (flag == "--kernel-times") {
      o.kernel_times.clear();  // as every option, the last one given counts
      for (const auto& row : oktopk::apps::split_at(value, ',')) {
        if (row == "all") {
          o.kernel_times = row_names;
        } else if (std::find(row_names.begin(), row_names.end(), row) != row_names.end()) {
          o.kernel_times.push_back(row);
        } else {
          std::string valid;
          for (const auto& name : row_names) valid += " " + name;
          fail("--kernel-times: no row '" + row + "' (rows:" + valid + ", or all)");
        }
      }
    } else {
      fail("unknown option " + flag);
    }
  }
  if (o.n < 1 || o.n > std::numeric_limits<std::int32_t>::max()) fail("--n must be in [1, 2^31-1]");
  if (!(o.density > 0.0 && o.density <= 1.0)) fail("--density must be in (0, 1]");
  if (o.reps < 1) fail("--reps must be at least 1");
  if (o.format != "csv" && o.format != "table") fail("--format must be csv or table");
  if (!oktopk::apps::is_dtype(o.dtype)) {
    fail(std::string("--dtype must be ") + oktopk::apps::dtype_list + ", got '" + o.dtype + "'");
  }
  return o;
}

struct Row {
  std::string kernel;
  std::int64_t k;
  double seconds;
  double bytes;
  std::vector<oktopk::apps::KernelTime> launches;  // with --kernel-times, for the rows it names
};

/// Median of `reps` timed calls of `body`, after one untimed warm-up call. `setup` runs before
/// each call, untimed (e.g. to restore an input the kernel overwrites).
template <class ExecSpace>
double median_seconds(
    const ExecSpace& exec, int reps, const std::function<void()>& body,
    const std::function<void()>& setup = [] {}) {
  std::vector<double> times;
  for (int r = 0; r <= reps; ++r) {
    setup();
    exec.fence();
    Kokkos::Timer timer;
    body();
    exec.fence();
    if (r > 0) times.push_back(timer.seconds());
  }
  return oktopk::apps::median_of(times);
}

/// |x| as a float, as the library ranks it: a 16-bit value widened exactly, a double rounded.
template <class Value>
KOKKOS_INLINE_FUNCTION float magnitude_of(Value x) {
  const auto f = static_cast<float>(oktopk::apps::number_of(x));
  return f < 0.0f ? -f : f;
}

/// Rounds normal(0, 1) draws into x: the same draws whatever x's type.
template <class ExecSpace, class Values>
void fill_normal(const ExecSpace& exec, const Values& x, std::uint64_t seed) {
  using Value = typename Values::non_const_value_type;
  Kokkos::Random_XorShift64_Pool<ExecSpace> pool(seed);
  Kokkos::parallel_for(
      "oktopk::kernel_bench::fill_normal",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, x.extent(0)),
      KOKKOS_LAMBDA(std::int64_t i) {
        auto gen = pool.get_state();
        const auto draw = static_cast<float>(gen.normal());
        pool.free_state(gen);
        x(i) = oktopk::apps::value_from_float<Value>(draw);
      });
}

/// The kernels on a gradient of type Value, with sums in Real.
template <class ExecSpace, class Value, class Real>
std::vector<Row> run(const Options& o) {
  using Memory = typename ExecSpace::memory_space;
  using Values = Kokkos::View<Value*, Memory>;
  using Reals = Kokkos::View<Real*, Memory>;
  using Floats = Kokkos::View<float*, Memory>;
  using Indices = Kokkos::View<std::int32_t*, Memory>;
  ExecSpace exec;
  const std::int64_t n = o.n;
  const auto k = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::floor(o.density * n)));
  const auto size = static_cast<std::size_t>(n);

  Values x("oktopk::kernel_bench::x", size), y("oktopk::kernel_bench::y", size);
  Reals residual("oktopk::kernel_bench::residual", size), sums("oktopk::kernel_bench::sums", size);
  fill_normal(exec, x, o.seed);
  oktopk::KthLargestWorkspace<ExecSpace> workspace(exec);
  const float threshold = oktopk::kth_largest_abs(exec, x, k, workspace);
  // Room for the k-1 strictly-above entries plus ties at the threshold.
  const auto capacity = static_cast<std::size_t>(oktopk::count_above(exec, x, threshold) + 1);
  Indices indices("oktopk::kernel_bench::indices", capacity);
  Values values("oktopk::kernel_bench::values", capacity);
  const std::int64_t selected = oktopk::select_above(exec, x, threshold, indices, values);
  // The pair kernels that sum take the selection in the arithmetic type.
  Reals real_values("oktopk::kernel_bench::real_values", capacity);
  oktopk::select_above(exec, x, threshold, indices, real_values);
  const auto selected_range = std::make_pair(std::int64_t{0}, selected);
  const auto sel_idx = Kokkos::subview(indices, selected_range);
  const auto sel_val = Kokkos::subview(real_values, selected_range);

  std::vector<Row> rows;
  const double fb = sizeof(Value);
  const double rb = sizeof(Real);
  const double pair_bytes = sizeof(Value) + sizeof(std::int32_t);
  const double real_pair_bytes = sizeof(Real) + sizeof(std::int32_t);
  auto add_with_setup = [&](const std::string& name, double bytes,
                            const std::function<void()>& body, const std::function<void()>& setup) {
    if (std::find(row_names.begin(), row_names.end(), name) == row_names.end()) {
      throw std::logic_error("run: the row " + name +
                             " is missing from row_names, so --kernel-times cannot name it");
    }
    rows.push_back({name, k, median_seconds(exec, o.reps, body, setup), bytes, {}});
    if (o.times_kernels_of(name)) {
      rows.back().launches = oktopk::apps::time_kernels(o.reps, body, setup);
    }
  };
  // Not a default argument of add_with_setup: hipcc (clang 15) warns that such a lambda default
  // may be passed unaligned (-Walign-mismatch).
  auto add = [&](const std::string& name, double bytes, const std::function<void()>& body) {
    add_with_setup(name, bytes, body, [] {});
  };

  add("copy", 2 * fb * n, [&] { Kokkos::deep_copy(exec, y, x); });
  add("count_above", fb * n, [&] { oktopk::count_above(exec, x, threshold); });
  add("threshold_select", fb * n + pair_bytes * selected,
      [&] { oktopk::select_above(exec, x, threshold, indices, values); });

  constexpr int regions = 16;
  Kokkos::View<std::int64_t*, Memory> offsets("oktopk::kernel_bench::offsets", regions + 1);
  Kokkos::View<std::int64_t*, Memory> counts("oktopk::kernel_bench::counts", regions);
  Kokkos::parallel_for(
      "oktopk::kernel_bench::offsets", Kokkos::RangePolicy<ExecSpace>(exec, 0, regions + 1),
      KOKKOS_LAMBDA(int r) { offsets(r) = n * r / regions; });
  Indices region_idx("oktopk::kernel_bench::region_indices", capacity);
  Values region_val("oktopk::kernel_bench::region_values", capacity);
  add("select_by_region", fb * n + pair_bytes * selected, [&] {
    oktopk::select_above_by_region(exec, x, threshold, offsets, region_idx, region_val, counts);
  });

  add("exact_kth", fb * n, [&] { oktopk::kth_largest_abs(exec, x, k, workspace); });
  // Beside it, the selection that reads x in every pass: on GPUs what gathering the first
  // digit's bin saves (on the host, which never gathers, the same kernels).
  oktopk::KthLargestWorkspace<ExecSpace> three_pass_workspace(exec);
  three_pass_workspace.gather_candidates = false;
  add("exact_kth_no_gather", fb * n,
      [&] { oktopk::kth_largest_abs(exec, x, k, three_pass_workspace); });
  {
    // The host reference ranks floats whatever the type: |x| widened, as the library ranks it.
    Floats widened("oktopk::kernel_bench::widened", size);
    Kokkos::parallel_for(
        "oktopk::kernel_bench::widen",
        Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, n),
        KOKKOS_LAMBDA(std::int64_t i) { widened(i) = magnitude_of(x(i)); });
    auto host_x = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), widened);
    std::vector<float> magnitudes(size), work(size);
    for (std::size_t i = 0; i < size; ++i) magnitudes[i] = host_x(i);
    add_with_setup(
        "nth_element", fb * n,
        [&] {
          std::nth_element(work.begin(), work.begin() + (k - 1), work.end(), std::greater<>());
        },
        [&] { std::copy(magnitudes.begin(), magnitudes.end(), work.begin()); });
  }
  {
    // The alternative to a radix select on a device: sort every |x| and read the k-th.
    Floats magnitudes("oktopk::kernel_bench::magnitudes", size),
        sorted("oktopk::kernel_bench::sorted", size);
    Kokkos::parallel_for(
        "oktopk::kernel_bench::magnitudes",
        Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, n),
        KOKKOS_LAMBDA(std::int64_t i) { magnitudes(i) = magnitude_of(x(i)); });
    add_with_setup(
        "sort_abs", fb * n, [&] { oktopk::apps::sort_ascending(exec, sorted); },
        [&] { Kokkos::deep_copy(exec, sorted, magnitudes); });
  }
  const std::int64_t samples = std::min<std::int64_t>(n, 1 << 20);
  oktopk::SampledThresholdWorkspace<ExecSpace, Value> sampled_workspace(exec);
  add("sampled_threshold", fb * samples,
      [&] { oktopk::estimate_threshold_sampled(exec, x, k, samples, 7, sampled_workspace); });
  add("gaussian_threshold", 2 * fb * n, [&] { oktopk::estimate_threshold_gaussian(exec, x, k); });
  add("residual_update", (2 * rb + fb) * n,
      [&] { oktopk::accumulate_residual(exec, residual, x, 1.0f, residual); });
  add("scatter_add", 2 * real_pair_bytes * selected,
      [&] { oktopk::scatter_add(exec, sel_idx, sel_val, sums); });
  Indices merged_idx("oktopk::kernel_bench::merged_indices", 2 * capacity);
  Reals merged_val("oktopk::kernel_bench::merged_values", 2 * capacity);
  add("merge_sorted", 4 * real_pair_bytes * selected, [&] {
    oktopk::merge_sorted(exec, sel_idx, sel_val, sel_idx, sel_val, merged_idx, merged_val);
  });
  add("intersect_sorted", 3 * sizeof(std::int32_t) * double(selected),
      [&] { oktopk::intersect_sorted(exec, sel_idx, sel_idx, merged_idx); });
  return rows;
}

/// A launch's label, with its place among the call's launches of that label when there are more.
std::string launch_name(const oktopk::apps::KernelTime& launch) {
  if (launch.of == 1) return launch.label;
  return launch.label + " [" + std::to_string(launch.nth) + "/" + std::to_string(launch.of) + "]";
}

void print(const Options& o, const std::vector<Row>& rows) {
  auto rate = [](const Row& r) { return r.bytes > 0 ? r.bytes / r.seconds / 1e9 : 0.0; };
  if (o.format == "csv") {
    std::printf("kernel,n,k,time_s_med,gb_per_s,dtype\n");
    for (const auto& r : rows) {
      std::printf("%s,%lld,%lld,%.6e,%.3f,%s\n", r.kernel.c_str(), static_cast<long long>(o.n),
                  static_cast<long long>(r.k), r.seconds, rate(r), o.dtype.c_str());
    }
    if (o.kernel_times.empty()) return;
    std::printf("\nrow,launch,time_s_med,dtype\n");
    for (const auto& r : rows) {
      for (const auto& launch : r.launches) {
        std::printf("%s,%s,%.6e,%s\n", r.kernel.c_str(), launch_name(launch).c_str(),
                    launch.seconds, o.dtype.c_str());
      }
    }
    return;
  }
  std::printf("# oktopk-kernel-bench: %s, concurrency %d, n = %lld, density %g, %d reps, %s\n",
              Kokkos::DefaultExecutionSpace::name(), Kokkos::DefaultExecutionSpace().concurrency(),
              static_cast<long long>(o.n), o.density, o.reps, o.dtype.c_str());
  const double copy_seconds = rows.front().seconds;
  std::printf("%-20s %12s %12s %10s %10s\n", "kernel", "k", "time_s_med", "gb_per_s", "x_copy");
  for (const auto& r : rows) {
    std::printf("%-20s %12lld %12.6f %10.3f %10.2f\n", r.kernel.c_str(),
                static_cast<long long>(r.k), r.seconds, rate(r), r.seconds / copy_seconds);
  }
  if (o.kernel_times.empty()) return;
  std::printf("\n# launches of the rows (--kernel-times), each fenced before and after\n");
  std::printf("%-20s %12s %8s  %s\n", "row", "time_s_med", "x_row", "launch");
  for (const auto& r : rows) {
    for (const auto& launch : r.launches) {
      std::printf("%-20s %12.6f %8.2f  %s\n", r.kernel.c_str(), launch.seconds,
                  launch.seconds / r.seconds, launch_name(launch).c_str());
    }
  }
}

}  // namespace

int main(int argc, char* argv[]) {
  // Parse first, so --help and bad arguments exit before Kokkos starts.
  const Options options = parse(argc, argv);
  Kokkos::ScopeGuard kokkos(argc, argv);
  try {
    if (!options.kernel_times.empty()) oktopk::apps::require_no_kokkos_tool();
    using Exec = Kokkos::DefaultExecutionSpace;
    oktopk::apps::with_dtype(options.dtype, [&](auto value) {
      using Value = decltype(value);
      using Real = decltype(oktopk::apps::number_of(value));  // float for the 16-bit types
      print(options, run<Exec, Value, Real>(options));
    });
  } catch (const std::exception& e) {
    std::cerr << "oktopk-kernel-bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
