#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""Plots test accuracy against bytes sent per rank per step, one point per method, for the
CNN training table with momentum correction in docs/benchmarks.md (the rows after `bash
scripts/train-table.sh cnn 4 8 32 0.01 0.8`, Ok-Topk at 0.001 last), into
docs/cnn-accuracy-bytes.png. Reads the table from the
document, so the plot shows exactly the measured rows. Needs python3-matplotlib (Debian).

    /usr/bin/python3 data/fidelity-data/cnn-plot.py [BENCHMARKS_MD] [OUT_PNG]
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.path.join(HERE, "..", "..", "docs")
COMMAND = "bash scripts/train-table.sh cnn 4 8 32 0.01 0.8"


def cnn_rows(markdown):
    """The rows of the first table after COMMAND: (algo, density, test_acc, bytes)."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == COMMAND)
    rows = []
    for line in lines[start:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 10 and cells[0] == "cnn":
            rows.append((cells[1], float(cells[2]), float(cells[5]), float(cells[8])))
        elif rows and not line.startswith("|"):
            break
    if not rows:
        sys.exit(f"cnn-plot: no CNN rows after '{COMMAND}'")
    return rows


def main():
    source = sys.argv[1] if len(sys.argv) > 1 else os.path.join(DOCS, "benchmarks.md")
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(DOCS, "cnn-accuracy-bytes.png")
    with open(source, encoding="utf-8") as f:
        rows = cnn_rows(f.read())
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (algo, density, acc, sent) in enumerate(rows):
        label = algo if density in (1.0, 0.01) else f"{algo} ({density:g})"
        ax.scatter(sent, acc, s=40)
        # Labels above and below in turn: neighbouring methods lie close together.
        ax.annotate(label, (sent, acc), textcoords="offset points",
                    xytext=(5, 4 if i % 2 == 0 else -12), fontsize=9)
    ax.set_xscale("log")
    ax.set_xlabel("bytes sent per rank per step (log scale)")
    ax.set_ylabel("test accuracy after 8 epochs")
    ax.set_title("CNN on Fashion-MNIST, P = 4, momentum correction (not s2),\n"
                 "density 0.01 (oktopk also 0.001)")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"cnn-plot: {len(rows)} methods -> {out}")


if __name__ == "__main__":
    main()
