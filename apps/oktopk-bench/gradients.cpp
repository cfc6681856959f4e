// SPDX-License-Identifier: BSD-3-Clause
// oktopk-bench's gradients: the --dist generators, --shifted-draws, the replay of gradient files
// and --dump-gradients.
#include "gradients.hpp"

#include "common/app_hash.hpp"
#include "common/app_kokkos_compat.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace oktopk::bench {

namespace {

namespace kmath = oktopk::apps::kmath;

constexpr std::int64_t rows_width = 64;  // entries per row of --dist rows:R

// The draws hash (key + i) with the apps' counter-based hash: no shared generator state, and
// results that depend on nothing but the key and i (not on threads, not on the backend).
using oktopk::apps::splitmix64;

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
  return normal_from(splitmix64(key + 2 * j), splitmix64(key + 2 * j + 1));
}

/// The stream of draws of one (seed, who, call); who is a rank, or one of the constants below.
std::uint64_t stream_key(std::uint64_t seed, std::uint64_t who, std::int64_t call) {
  return splitmix64(splitmix64(splitmix64(seed) + who) + static_cast<std::uint64_t>(call));
}
constexpr std::uint64_t shared_stream = ~std::uint64_t{0};
constexpr std::uint64_t row_stream_offset = std::uint64_t{1} << 40;

}  // namespace

GradientFileHeader check_gradient_file(const oktopk::Communicator& world, const std::string& path) {
  GradientFileHeader info;
  std::string error;
  if (world.rank() == 0) error = oktopk::apps::read_gradient_file_header(path, info);
  std::int64_t fields[3] = {info.n, info.count, static_cast<std::int64_t>(error.size())};
  world.bcast(fields, 3, 0);
  error.resize(static_cast<std::size_t>(fields[2]));
  if (fields[2] > 0) world.bcast(error.data(), fields[2], 0);
  if (!error.empty()) throw UsageError(error);
  return {fields[0], fields[1]};
}

void GradientSource::fill(const Exec& exec, std::int64_t call, const Vector& grad) {
  if (args_.dist.kind == DistKind::File) {
    read(exec, call, grad);
  } else if (args_.shifted_draws) {
    if (own_draws_.extent(0) != grad.extent(0)) draw_once(exec, grad.extent(0));
    shift(exec, call, grad);
  } else {
    generate(exec, call, grad);
  }
}

void GradientSource::draw_once(const Exec& exec, std::size_t n) {
  own_draws_ =
      Vector(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::bench::own_draws"), n);
  if (args_.dist.kind != DistKind::Correlated) {
    generate(exec, -1, own_draws_);
    return;
  }
  shared_draws_ = Vector(
      Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "oktopk::bench::shared_draws"), n);
  const auto rank = static_cast<std::uint64_t>(world_.rank());
  const std::uint64_t own = stream_key(args_.seed, rank, -1);
  const std::uint64_t shared = stream_key(args_.seed, shared_stream, -1);
  const auto own_draws = own_draws_;
  const auto shared_draws = shared_draws_;
  Kokkos::parallel_for(
      "oktopk::bench::draw_once",
      Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i) {
        own_draws(i) = static_cast<float>(normal_at(own, i));
        shared_draws(i) = static_cast<float>(normal_at(shared, i));
      });
}

void GradientSource::shift(const Exec& exec, std::int64_t call, const Vector& grad) const {
  const auto n = static_cast<std::int64_t>(grad.extent(0));
  const auto rank = static_cast<std::uint64_t>(world_.rank());
  const std::uint64_t own = stream_key(args_.seed, rank, call);
  const std::uint64_t shared = stream_key(args_.seed, shared_stream, call);
  const auto own_offset =
      static_cast<std::int64_t>(splitmix64(own) % static_cast<std::uint64_t>(n));
  const auto shared_offset =
      static_cast<std::int64_t>(splitmix64(shared) % static_cast<std::uint64_t>(n));
  const bool correlated = args_.dist.kind == DistKind::Correlated;
  const float a = correlated ? static_cast<float>(std::sqrt(args_.dist.parameter)) : 0.0f;
  const float b =
      correlated ? static_cast<float>(std::sqrt(1.0 - std::min(args_.dist.parameter, 1.0))) : 1.0f;
  const auto own_draws = own_draws_;
  const auto shared_draws = correlated ? shared_draws_ : own_draws_;
  Kokkos::parallel_for(
      "oktopk::bench::shift",
      Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(exec, 0, n),
      KOKKOS_LAMBDA(std::int64_t i) {
        const auto j = static_cast<std::uint64_t>(i);
        const std::int64_t o = i + own_offset < n ? i + own_offset : i + own_offset - n;
        float x = ((splitmix64(own + j) & 1u) != 0 ? -b : b) * own_draws(o);
        if (correlated) {
          const std::int64_t s = i + shared_offset < n ? i + shared_offset : i + shared_offset - n;
          x += ((splitmix64(shared + j) & 1u) != 0 ? -a : a) * shared_draws(s);
        }
        grad(i) = x;
      });
}

void GradientSource::generate(const Exec& exec, std::int64_t call, const Vector& grad) const {
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
      "oktopk::bench::generate",
      Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(exec, 0, grad.extent(0)),
      KOKKOS_LAMBDA(std::int64_t i) {
        const auto j = static_cast<std::uint64_t>(i);
        double x = 0.0;
        switch (static_cast<DistKind>(kind)) {
          case DistKind::Laplace: {
            const double u = (static_cast<double>(splitmix64(own + j) >> 11) + 0.5) * 0x1.0p-53;
            x = u < 0.5 ? kmath::log(2.0 * u) : -kmath::log(2.0 - 2.0 * u);
            break;
          }
          case DistKind::Lognormal: {
            const std::uint64_t h2 = splitmix64(own + 2 * j + 1);
            const double z = normal_from(splitmix64(own + 2 * j), h2);
            x = ((h2 & 1u) != 0 ? -1.0 : 1.0) * kmath::exp(2.0 * z);
            break;
          }
          case DistKind::Correlated:
            x = a * normal_at(shared, i) + b * normal_at(own, i);
            break;
          case DistKind::Rows:
            x = unit_closed_low(splitmix64(rows + static_cast<std::uint64_t>(i / width))) < p
                    ? normal_at(own, i)
                    : 0.0;
            break;
          case DistKind::Levels: {
            const std::uint64_t h = splitmix64(own + j);
            const auto level = static_cast<double>(1 + (h >> 1) % static_cast<std::uint64_t>(p));
            x = (h & 1u) != 0 ? -level : level;
            break;
          }
          default:
            x = normal_at(own, i);
            break;
        }
        grad(i) = static_cast<float>(x);
      });
}

void GradientSource::read(const Exec& exec, std::int64_t call, const Vector& grad) {
  const int P = world_.size();
  const std::int64_t n = file_.n;
  const std::int64_t record = (call * P + world_.rank()) % file_.count;
  if (host_.extent(0) != static_cast<std::size_t>(n)) {
    host_ = Kokkos::View<float*, Kokkos::HostSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "oktopk::bench::file_gradient"),
        static_cast<std::size_t>(n));
  }
  std::string error;
  if (!oktopk::apps::read_gradient(args_.dist.path, file_, record, host_.data())) {
    error = "cannot read gradient " + std::to_string(record) + " of '" + args_.dist.path +
            "' on rank " + std::to_string(world_.rank());
  }
  // Every rank throws the (lowest) failing rank's error, which names it.
  const oktopk::AgreedFailure failure = world_.agree_on_failure(!error.empty(), error);
  if (failure) throw std::runtime_error(failure.cause);
  Kokkos::deep_copy(exec, grad, host_);
}

void dump_gradients(const Exec& exec, const oktopk::Communicator& world, const Args& args,
                    GradientSource& source) {
  const int P = world.size();
  const int rank = world.rank();
  const std::int64_t n = args.n;
  const std::int64_t calls = args.warmup + args.iters;
  oktopk::apps::GradientFileWriter out;
  std::int64_t ok = 1;
  if (rank == 0) ok = out.open(args.dump_path, {n, calls * P}) ? 1 : 0;
  world.bcast(&ok, 1, 0);
  if (ok == 0) throw std::runtime_error("cannot write gradient file '" + args.dump_path + "'");

  Vector grad("oktopk::bench::dump_grad", static_cast<std::size_t>(n));
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
      out.write(all.data(), all.size());
    } else {
      world.isend(host.data(), n, 0, 7, requests);
      requests.wait_all();
    }
  }
  if (rank == 0) ok = out.close() ? 1 : 0;
  world.bcast(&ok, 1, 0);
  if (ok == 0) throw std::runtime_error("writing gradient file '" + args.dump_path + "' failed");
}

}  // namespace oktopk::bench
