#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""OkTopk's exact top-k selection against torch.topk, on the same tensor.

    python3 bench.py --device cuda --n 16777216 67108864 --density 0.01

For each n, one float32 tensor of normal(0, 1) values (torch's generator, --seed) on --device is
given to both:

* OkTopk: a TopkA handle on one rank (MPI.COMM_WORLD of a single process; a fresh handle per
  repetition, so no residual is added) reduces it; the time is its call's "select" phase from
  stats(): the (k+1)-th largest magnitude by radix select,
  then the compaction of the entries above it (and the ties that complete k), in ascending
  index order. A CUDA tensor needs a build of OkTopk for CUDA; a build for CPUs takes CPU
  tensors only.
* torch: torch.topk(x.abs(), k, sorted=False), timed with the device synchronised before and
  after, so both times are the selection alone.

Prints one line per n and selector: "select n=N k=K selector=S median_ms=T" (the median over
--reps timed repetitions, after one untimed), and a last line "speedup n=N torch/oktopk=R"
per n. Both must select k entries, or the program says so and exits 1.
"""

import argparse
import statistics
import sys
import time


def parse_arguments(argv):
    parser = argparse.ArgumentParser(
        prog="bench.py", description="Times OkTopk's exact top-k selection against torch.topk "
                                     "on the same tensor.")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="where the tensor lives (default cpu)")
    parser.add_argument("--n", type=int, nargs="+", default=[1 << 24, 1 << 26],
                        help="tensor lengths, each in [1, 2^31 - 1] (default 2^24 2^26)")
    parser.add_argument("--density", type=float, default=0.01,
                        help="k = floor(density * n), in (0, 1] (default 0.01)")
    parser.add_argument("--reps", type=int, default=10,
                        help="timed repetitions, >= 1 (default 10)")
    parser.add_argument("--seed", type=int, default=1, help="torch's generator (default 1)")
    args = parser.parse_args(argv)
    if not 0 < args.density <= 1:
        parser.error(f"--density must be in (0, 1], not {args.density}")
    if args.reps < 1:
        parser.error(f"--reps must be >= 1, not {args.reps}")
    for n in args.n:
        if not 1 <= n < 1 << 31:
            parser.error(f"--n must be in [1, 2^31 - 1], not {n}")
    return args


def synchronize(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_torch(torch, x, k, reps):
    """Median seconds of torch.topk(|x|, k); the count it returned."""
    times = []
    count = 0
    for rep in range(reps + 1):
        synchronize(torch, x.device)
        start = time.perf_counter()
        values, _ = torch.topk(x.abs(), k, sorted=False)
        synchronize(torch, x.device)
        if rep > 0:
            times.append(time.perf_counter() - start)
        count = values.numel()
    return statistics.median(times), count


def time_oktopk(oktopk, x, density, reps):
    """Median seconds of a TopkA call's select phase on x, a fresh handle each repetition (so
    that no residual is added to x); the handle's k and the entries it selected."""
    times = []
    k = count = 0
    for rep in range(reps + 1):
        handle = oktopk.Handle(algorithm="topka", n=x.numel(), density=density)
        try:
            handle.reduce(x)
            stats = handle.stats()
        finally:
            handle.close()
        if rep > 0:
            times.append(stats["phases"]["select"]["seconds"])
        k, count = stats["k"], stats["local_selected"]
    return statistics.median(times), k, count


def main(argv):
    args = parse_arguments(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench.py: --device cuda, but torch sees no GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before the first handle: OkTopk's GPU is torch's
    import oktopk

    print(f"# oktopk {oktopk.version()} on {oktopk.backend()}, torch {torch.__version__} on "
          f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'the CPU'}",
          flush=True)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    ok = True
    for n in args.n:
        x = torch.randn(n, generator=generator, device=device, dtype=torch.float32)
        ours, k, ours_count = time_oktopk(oktopk, x, args.density, args.reps)
        theirs, theirs_count = time_torch(torch, x, k, args.reps)
        for name, seconds, count in (("oktopk", ours, ours_count),
                                     ("torch.topk", theirs, theirs_count)):
            print(f"select n={n} k={k} selector={name} median_ms={1e3 * seconds:.3f}"
                  f"{'' if count == k else f' (selected {count}, not k)'}", flush=True)
            ok = ok and count == k
        print(f"speedup n={n} torch/oktopk={theirs / ours:.2f}", flush=True)
    if not ok:
        print("bench.py: a selector did not select k entries", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
