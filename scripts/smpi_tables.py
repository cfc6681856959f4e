#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""smpi_tables.py: the figures scripts/smpi.sh's `tables` prints, from the CSV files it wrote.

  smpi_tables.py speedup --cpu CSV [--gpu CSV] [--gpu-copy-gbs G]
      The factor by which a GPU node runs OkTopk's kernels faster than one core of this
      machine: the median over the kernels of (time here) / (time on the H200 of
      data/smpi/h200-kernels.csv), both oktopk-kernel-bench at n = 2^26, float32, scaled by
      G / 3870, the GPU's copy bandwidth over the H200's measured 3870 GB/s (the kernels are
      bound by memory bandwidth). Prints the factor, then the kernels' lowest and highest
      ratio on one line each, as "name ratio".
  smpi_tables.py weak --dir DIR [--platform NAME] [--alpha S --bandwidth B] [--plot PNG]
      Markdown tables of DIR/NAME-P.csv (compute charged) and DIR/NAME-net-P.csv (network
      only; NAME default daint) beside scripts/alphabeta.py's prediction with alpha S seconds
      and B bytes/s (default 1e-6 and 10e9, its aries profile): time per call of every method,
      Ok-Topk's words per rank against the 6k(P-1)/P bound, and the model's error.
      With compute charged, also the time per training step: the step's forward and backward
      pass, charged as 6 n T / F seconds (T tokens per GPU per step, F the GPU's sustained
      flop/s: --step-tokens, default 4096, and --step-flops, default 3.72e12, 40% of a P100's
      9.3 Tflop/s in float32), then the call, which starts once the whole gradient is there.
  smpi_tables.py bed-link --dir DIR
      The bed's links from DIR/bed-fit-P-2eE.csv (Open MPI's allreduce on the emulated
      cluster): alpha and beta of the ring's 2(P-1)(alpha + 4n/P beta), by least squares of the
      relative error, printed as "LATENCY_S,BANDWIDTH_BPS" of one link (a message crosses two:
      host to switch, switch to host).
  smpi_tables.py calibration --dir DIR
      Every method on the bed (DIR/bed-P.csv) against SMPI on the bed platform with those links
      (DIR/bed-smpi-P.csv: compute as measured here; bed-smpi-shared-P.csv: compute charged
      P/2 times slower, as P ranks sharing 2 cores).
  smpi_tables.py targets --dir DIR
      The targets of DIR/target-*.csv (scripts/smpi.sh targets): Ok-Topk on the bfloat16 wire
      against the bfloat16 dense ring (goal 5x), the slowest call against the median (goal
      1.3x), hierarchical against flat (goal 1.5x).
"""

import argparse
import csv
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

H200_COPY_GBS = 3870.0
METHODS = ["dense", "topka", "topkdsa", "gtopk", "gaussiank", "oktopk", "s2"]
HERE = os.path.dirname(os.path.abspath(__file__))


def read_rows(path):
    with open(path) as f:
        return [r for r in csv.DictReader(line for line in f if not line.startswith(("#", "[")))]


def speedup(args):
    cpu = {r["kernel"]: float(r["time_s_med"]) for r in read_rows(args.cpu)}
    gpu = {r["kernel"]: float(r["time_s_med"]) for r in read_rows(args.gpu)}
    ratios = {k: cpu[k] / gpu[k] for k in gpu if k in cpu}
    if not ratios:
        sys.exit("smpi_tables.py speedup: no kernel is in both files")
    scale = args.gpu_copy_gbs / H200_COPY_GBS
    factor = statistics.median(ratios.values()) * scale
    lo = min(ratios, key=ratios.get)
    hi = max(ratios, key=ratios.get)
    print(f"{factor:.3g}")
    print(f"{lo} {ratios[lo] * scale:.3g}")
    print(f"{hi} {ratios[hi] * scale:.3g}")


def by_p(pattern):
    rows = {}
    for path in glob.glob(pattern):
        m = re.search(r"-(\d+)\.csv$", path)
        if m:
            rows[int(m.group(1))] = {r["algo"]: r for r in read_rows(path)}
    return dict(sorted(rows.items()))


def model(P, n, density, alpha, bandwidth):
    with tempfile.NamedTemporaryFile("w", suffix=".json") as params:
        json.dump({"alpha": alpha, "beta": 1.0 / bandwidth}, params)
        params.flush()
        out = subprocess.run([sys.executable, os.path.join(HERE, "alphabeta.py"), "predict",
                              "--params", params.name, "--P", str(P), "--n", str(n),
                              "--density", str(density)],
                             check=True, capture_output=True, text=True).stdout
    return {r["algo"]: r for r in csv.DictReader(out.splitlines())}


def ms(row):
    return 1e3 * float(row["time_s_med"])


def weak(args):
    name = args.platform
    full = by_p(os.path.join(args.dir, f"{name}-[0-9]*.csv"))
    net = by_p(os.path.join(args.dir, f"{name}-net-[0-9]*.csv"))
    if not full and not net:
        sys.exit(f"smpi_tables.py weak: no {name}-P.csv or {name}-net-P.csv in {args.dir}")
    methods = [m for m in METHODS if any(m in rows for rows in list(full.values()) + list(net.values()))]
    if full:
        print("Time per call (ms, median of the timed calls, the slowest rank), compute charged "
              "as on a P100:\n")
        print("| P | " + " | ".join(methods) + " | dense / oktopk |")
        print("|---" * (len(methods) + 2) + "|")
        for P, rows in full.items():
            cells = [f"{ms(rows[m]):.3f}" if m in rows else "" for m in methods]
            ratio = (f"{ms(rows['dense']) / ms(rows['oktopk']):.2f}"
                     if "dense" in rows and "oktopk" in rows else "")
            print(f"| {P} | " + " | ".join(cells) + f" | {ratio} |")
        print()
        print("Ok-Topk's words per rank per call (the slowest call's max(sent, received) over "
              "the ranks, /4/k) against the bound 6(P-1)/P:\n")
        print("| P | words / k | worst call / k | 6(P-1)/P |")
        print("|---|---|---|---|")
        for P, rows in full.items():
            if "oktopk" in rows:
                r = rows["oktopk"]
                print(f"| {P} | {float(r['words_per_rank_max_over_k']):.3f} | "
                      f"{float(r['words_per_call_max_over_k']):.3f} | {6 * (P - 1) / P:.3f} |")
        print()
        n = int(next(iter(next(iter(full.values())).values()))["n"])
        step_ms = 1e3 * 6 * n * args.step_tokens / args.step_flops
        print(f"Time per training step (ms): a BERT-like step's forward and backward pass over "
              f"n = {n} parameters, {args.step_tokens:g} tokens per GPU at "
              f"{args.step_flops / 1e12:g} Tflop/s ({step_ms:.3f} ms), then the call; "
              f"dense / method in brackets:\n")
        print("| P | " + " | ".join(methods) + " |")
        print("|---" * (len(methods) + 1) + "|")
        for P, rows in full.items():
            dense = step_ms + ms(rows["dense"]) if "dense" in rows else None
            cells = []
            for m in methods:
                if m not in rows:
                    cells.append("")
                    continue
                t = step_ms + ms(rows[m])
                cells.append(f"{t:.2f} ({dense / t:.2f})" if dense else f"{t:.2f}")
            print(f"| {P} | " + " | ".join(cells) + " |")
        print()
    if net:
        print(f"Network only (compute not charged): SMPI against scripts/alphabeta.py with "
              f"alpha = {args.alpha:g} s and {args.bandwidth / 1e9:g} GB/s (ms per call; "
              f"error = model / SMPI - 1):\n")
        print("| P | method | SMPI | model | error |")
        print("|---|---|---|---|---|")
        worst = {}
        for P, rows in net.items():
            any_row = next(iter(rows.values()))
            predicted = model(P, int(any_row["n"]), float(any_row["density"]), args.alpha,
                              args.bandwidth)
            for m in methods:
                if m not in rows or m not in predicted:
                    continue
                s = ms(rows[m])
                p = 1e3 * float(predicted[m]["comm_s"])
                err = p / s - 1
                worst[m] = max(worst.get(m, 0.0), abs(err))
                print(f"| {P} | {m} | {s:.3f} | {p:.3f} | {100 * err:+.0f}% |")
        print()
        print("Largest |error| per method: " +
              ", ".join(f"{m} {100 * e:.0f}%" for m, e in worst.items()) + "\n")
    if args.plot and full:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            sys.exit("smpi_tables.py: --plot needs matplotlib (Debian: python3-matplotlib)")
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for m in methods:
            pts = [(P, ms(rows[m])) for P, rows in full.items() if m in rows]
            ax.plot([p for p, _ in pts], [t for _, t in pts], marker="o", label=m)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("P (ranks, one per node)")
        ax.set_ylabel("ms per call")
        n = next(iter(next(iter(full.values())).values()))["n"]
        ax.set_title(f"SMPI, platform {name}, n = {n}, density 0.01", fontsize=10)
        ax.legend(fontsize=8, ncol=2)
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"(plot: {args.plot})", file=sys.stderr)


def bed_link(args):
    rows = []
    for path in sorted(glob.glob(os.path.join(args.dir, "bed-fit-*-2e*.csv"))):
        for r in read_rows(path):
            if r["algo"] == "mpi_allreduce":
                rows.append((int(r["P"]), int(r["n"]), float(r["time_s_med"])))
    if len({P for P, _, _ in rows}) < 1 or len(rows) < 2:
        sys.exit(f"smpi_tables.py bed-link: fewer than 2 mpi_allreduce rows in "
                 f"{args.dir}/bed-fit-*.csv")
    # t = a alpha + b beta, weighted by 1/t: the normal equations of the relative error.
    saa = sab = sbb = sat = sbt = 0.0
    for P, n, t in rows:
        a, b = 2 * (P - 1) / t, 2 * (P - 1) / P * 4 * n / t
        saa, sab, sbb, sat, sbt = saa + a * a, sab + a * b, sbb + b * b, sat + a, sbt + b
    det = saa * sbb - sab * sab
    if det <= 0:
        sys.exit("smpi_tables.py bed-link: the fit is singular (one size only?)")
    alpha = (sat * sbb - sbt * sab) / det
    beta = (saa * sbt - sab * sat) / det
    if not (alpha > 0 and beta > 0):
        sys.exit(f"smpi_tables.py bed-link: the fit gave alpha = {alpha:g}, beta = {beta:g}")
    print(f"{alpha / 2:.6g},{1 / beta:.6g}")
    worst = max(abs((2 * (P - 1) * alpha + 2 * (P - 1) / P * 4 * n * beta) / t - 1)
                for P, n, t in rows)
    print(f"bed-link: alpha {1e3 * alpha:.3f} ms, {8 / beta / 1e9:.3f} Gbit/s, from {len(rows)} "
          f"calls; largest error {100 * worst:.0f}%", file=sys.stderr)


def calibration(args):
    bed = by_p(os.path.join(args.dir, "bed-[0-9]*.csv"))
    sim = by_p(os.path.join(args.dir, "bed-smpi-[0-9]*.csv"))
    shared = by_p(os.path.join(args.dir, "bed-smpi-shared-[0-9]*.csv"))
    if not bed or not sim:
        sys.exit(f"smpi_tables.py calibration: no bed-P.csv or bed-smpi-P.csv in {args.dir}")
    print("The emulated cluster (1 Gbit/s, P ranks on 2 cores) against SMPI on the bed "
          "platform with its fitted links (ms per call; error = SMPI / bed - 1). \"own core\": "
          "compute as measured here on one core; \"shared\": compute charged max(1, P/2) "
          "times slower, as on the bed's shared cores:\n")
    print("| P | n | method | bed | SMPI, own core | error | SMPI, shared | error |")
    print("|---|---|---|---|---|---|---|---|")
    for P, rows in bed.items():
        for m in [m for m in METHODS if m in rows and m in sim.get(P, {})]:
            b, s = ms(rows[m]), ms(sim[P][m])
            cells = [f"{s:.1f}", f"{100 * (s / b - 1):+.0f}%"]
            if m in shared.get(P, {}):
                h = ms(shared[P][m])
                cells += [f"{h:.1f}", f"{100 * (h / b - 1):+.0f}%"]
            else:
                cells += ["", ""]
            print(f"| {P} | {rows[m]['n']} | {m} | {b:.1f} | " + " | ".join(cells) + " |")
    print()


def one(path):
    return {r["algo"]: r for r in read_rows(path)}


def verdict(value, goal):
    return "**met**" if value >= goal else "**not met**"


def targets(args):
    d = args.dir
    found = False
    bf16 = sorted(glob.glob(os.path.join(d, "target-bf16-*.csv")))
    if bf16:
        found = True
        print("Ok-Topk on the bfloat16 wire against the bfloat16 dense ring (`--wire bf16`, both; "
              "goal 5x):\n")
        print("| platform | P | n | dense ring, ms | Ok-Topk, ms | ratio | target |")
        print("|---|---|---|---|---|---|---|")
        for path in bf16:
            name = re.search(r"target-bf16-(\w+)-\d+\.csv$", path).group(1)
            rows = one(path)
            dense, ok = ms(rows["dense"]), ms(rows["oktopk"])
            print(f"| {name} | {rows['oktopk']['P']} | {rows['oktopk']['n']} | {dense:.3f} | "
                  f"{ok:.3f} | {dense / ok:.2f}x | {verdict(dense / ok, 5)} |")
        print()
    calls = sorted(glob.glob(os.path.join(d, "target-calls-*.csv")))
    if calls:
        found = True
        print("Ok-Topk's slowest call against the median call (goal: within 1.3x):\n")
        print("| platform | P | n | calls | median, ms | slowest, ms | ratio | target |")
        print("|---|---|---|---|---|---|---|---|")
        for path in calls:
            name = re.search(r"target-calls-(\w+)-\d+\.csv$", path).group(1)
            r = one(path)["oktopk"]
            med, worst = ms(r), 1e3 * float(r["time_s_max"])
            ok = "**met**" if worst / med <= 1.3 else "**not met**"
            print(f"| {name} | {r['P']} | {r['n']} | {r['iters']} | {med:.3f} | {worst:.3f} | "
                  f"{worst / med:.2f}x | {ok} |")
        print()
    flat = sorted(glob.glob(os.path.join(d, "target-hierarchical-off-*.csv")))
    if flat:
        found = True
        print("Hierarchical against flat on nodes of 4 GPUs (goal: hierarchical Ok-Topk 1.5x "
              "faster than flat):\n")
        print("| P | n | method | flat, ms | hierarchical, ms | flat / hierarchical | between nodes, "
              "flat / hierarchical bytes | target |")
        print("|---|---|---|---|---|---|---|---|")
        for path in flat:
            hier_path = path.replace("-off-", "-on-")
            if not os.path.exists(hier_path):
                continue
            f, h = one(path), one(hier_path)
            for m in [m for m in METHODS if m in f and m in h]:
                ratio = ms(f[m]) / ms(h[m])
                bytes_ratio = (float(f[m]["between_nodes_bytes_per_rank_max"]) /
                               float(h[m]["between_nodes_bytes_per_rank_max"]))
                goal = verdict(ratio, 1.5) if m == "oktopk" else ""
                print(f"| {f[m]['P']} | {f[m]['n']} | {m} | {ms(f[m]):.3f} | {ms(h[m]):.3f} | "
                      f"{ratio:.2f}x | {bytes_ratio:.2f}x | {goal} |")
        print()
    if not found:
        sys.exit(f"smpi_tables.py targets: no target-*.csv in {d}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("speedup", help="a GPU node's kernel speed over one core here")
    s.add_argument("--cpu", required=True, help="oktopk-kernel-bench CSV from this machine")
    s.add_argument("--gpu", default=os.path.join(HERE, "..", "data", "smpi", "h200-kernels.csv"))
    s.add_argument("--gpu-copy-gbs", type=float, default=H200_COPY_GBS,
                   help="the target GPU's copy bandwidth in GB/s (default the H200's 3870)")
    w = sub.add_parser("weak", help="the weak-scaling tables")
    w.add_argument("--dir", required=True)
    w.add_argument("--platform", default="daint", help="the files' platform (default daint)")
    w.add_argument("--alpha", type=float, default=1e-6, help="the model's latency in s")
    w.add_argument("--bandwidth", type=float, default=10e9, help="the model's bytes/s")
    w.add_argument("--plot", help="also a PNG of the compute-charged times")
    w.add_argument("--step-tokens", type=float, default=4096,
                   help="tokens per GPU per training step (default 4096)")
    w.add_argument("--step-flops", type=float, default=0.4 * 9.3e12,
                   help="the GPU's sustained flop/s in the step (default 40%% of a P100's)")
    t = sub.add_parser("targets", help="the targets the emulated cluster could not measure")
    t.add_argument("--dir", required=True)
    b = sub.add_parser("bed-link", help="the bed's links, fitted from Open MPI's allreduce")
    b.add_argument("--dir", required=True)
    c = sub.add_parser("calibration", help="the bed against SMPI on the bed platform")
    c.add_argument("--dir", required=True)
    args = p.parse_args()
    return {"speedup": speedup, "weak": weak, "targets": targets, "bed-link": bed_link,
            "calibration": calibration}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
