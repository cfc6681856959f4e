#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Time to quality from the runs of run.sh: reads data/time-to-quality/<variant>.csv
(oktopk-train --csv: one row per epoch of 50 steps, its training seconds and the test
perplexity after it) and prints a markdown table; with --plot FILE also draws the test
perplexity over the training seconds.

The target is the reference run's final perplexity, with the language-model tolerance of the
training tables (1 %): a run reaches it at the first epoch whose perplexity is at most
final * 1.01. Time to target is the sum of the training seconds up to that epoch (the test
evaluations between epochs are not counted); seconds per step and bytes per rank per step are
averaged over the same epochs (over all of them for a run that does not reach the target).

    /usr/bin/python3 data/time-to-quality/summary.py [--reference dense-fp32-ring]
        [--plot docs/time-to-quality.png] [VARIANT ...]
"""

import argparse
import csv
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOLERANCE = 0.01
STEPS_PER_EPOCH = 50
LABELS = {
    "dense-fp32-mpi": "dense float32 (MPI_Allreduce)",
    "dense-fp32-ring": "dense float32 (ring)",
    "dense-bf16": "dense bfloat16 (ring)",
    "dense-fp32-overlap": "dense float32, overlapped with backprop",
    "dense-bf16-overlap": "dense bfloat16, overlapped with backprop",
    "oktopk": "Ok-Topk, density 0.01",
    "topka": "TopkA, density 0.01",
    "gaussiank": "Gaussian-k, density 0.01",
}


def read(variant):
    path = os.path.join(HERE, f"{variant}.csv")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise SystemExit(f"summary.py: {path} has no epochs")
    elapsed, out = 0.0, []
    for r in rows:
        elapsed += float(r["seconds"])
        out.append({"epoch": int(r["epoch"]), "ppl": float(r["test_ppl"]), "elapsed": elapsed,
                    "bytes": float(r["bytes_per_rank_per_step"]), "seconds": float(r["seconds"])})
    return out


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", default="dense-fp32-ring",
                        help="the run whose final perplexity is the target")
    parser.add_argument("--plot", help="write the curves to this PNG file")
    parser.add_argument("variants", nargs="*", help="runs to list (default: every CSV here)")
    args = parser.parse_args(argv)
    variants = args.variants or sorted(
        f[:-4] for f in os.listdir(HERE) if f.endswith(".csv"))
    runs = {v: read(v) for v in variants}
    if args.reference not in runs:
        runs[args.reference] = read(args.reference)
    final = runs[args.reference][-1]["ppl"]
    target = final * (1 + TOLERANCE)
    print(f"Target: test perplexity <= {target:.2f} ({args.reference}'s final {final:.2f} "
          f"+ {100 * TOLERANCE:g} %)\n")
    print("| run | s per step | MB per rank per step | epochs to target "
          "| time to target (s) | fastest dense's time / this run's | final ppl (epochs) |")
    print("|---|---|---|---|---|---|---|")
    reached = {}
    for v, rows in runs.items():
        hit = next((r for r in rows if r["ppl"] <= target), None)
        reached[v] = hit["elapsed"] if hit else None
    dense = [t for v, t in reached.items() if v.startswith("dense") and t is not None]
    fastest_dense = min(dense) if dense else None
    for v in variants:
        rows = runs[v]
        hit = next((r for r in rows if r["ppl"] <= target), None)
        upto = rows[:hit["epoch"]] if hit else rows
        step = sum(r["seconds"] for r in upto) / (len(upto) * STEPS_PER_EPOCH)
        megabytes = sum(r["bytes"] for r in upto) / len(upto) / 1e6
        when = f"{hit['epoch']}" if hit else f"not in {len(rows)}"
        time = f"{hit['elapsed']:.0f}" if hit else "-"
        ratio = (f"{fastest_dense / hit['elapsed']:.2f}×" if hit and fastest_dense else "-")
        print(f"| {LABELS.get(v, v)} | {step:.3f} | {megabytes:.2f} | {when} | {time} "
              f"| {ratio} | {rows[-1]['ppl']:.2f} ({len(rows)}) |")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for v in variants:
            rows = runs[v]
            ax.plot([r["elapsed"] for r in rows], [r["ppl"] for r in rows], marker=".",
                    label=LABELS.get(v, v))
        ax.axhline(target, color="grey", linestyle="--", linewidth=1,
                   label=f"target {target:.1f}")
        ax.set_xlabel("training time on the emulated 1 Gbit/s cluster (s), P = 4")
        ax.set_ylabel("test perplexity")
        ax.set_yscale("log")
        ax.set_ylim(top=500)
        ax.set_yticks([100, 125, 150, 200, 300, 400])
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title("LSTM language model, 11.2 M parameters: time to quality")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
