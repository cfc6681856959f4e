#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""alphabeta.py: an alpha-beta model of oktopk's methods, fitted on the emulated network bed
(scripts/netbench.sh) and replayed at scale.

Subcommands (each has --help):
  fit       alpha (seconds per message) and beta (seconds per byte) by least squares from
            oktopk-bench CSV rows of a bare MPI_Allreduce (--mpi-baseline) at several n and P;
            optionally the compute term from a P = 1 run of every method. Writes a JSON file.
  predict   time per call of each method at one (P, n, density) from its message schedule.
  validate  predictions against measured oktopk-bench runs; exit 1 if any error > tolerance.
  table     a markdown table of measured bed runs beside their predictions and a counted floor
            (latency + memory + wire).
  scale     weak-scaling curves, CSV and PNG, for n = 14.7M (VGG-16) and 110M (BERT-base),
            P = 16..4096, on the network profiles aries, ib100, ib200, eth10.
  validate2 the two-level model against the bed's runs with several ranks per host
            (data/link-data/hierarchical/run.sh), flat and hierarchical; exit 1 if any error >
            tolerance.
  scale2    two-level weak-scaling curves, CSV and PNG, for n = 110M (BERT-base) and 1.3B,
            P = 16..4096, on nodes of several GPUs (perlmutter, frontier; aries, one per node):
            dense (the hierarchical mode, a ring across the nodes), Ok-Topk and TopkA flat and
            hierarchical.

The model (its assumptions, all of them):
  * A message of b bytes costs alpha + beta*b. A schedule is a sequence of steps; in a step
    every rank sends and receives messages that are in flight together (full duplex), and the
    step costs alpha (one latency: the messages of a step overlap theirs) + beta * the max over
    ranks of max(bytes out, bytes in). A call's communication time is the sum over its steps:
    steps do not overlap one another, and computation does not overlap communication.
  * Collectives are the schedules a tuned MPI would pick, the cheaper of two where it has a
    choice: allreduce = recursive doubling (ceil(log2 P) steps of the whole buffer) or ring
    reduce-scatter + allgather (2(P-1) steps of B/P); bcast = binomial tree or scatter + ring
    allgather; alltoall = P-1 pairwise steps or Bruck's ceil(log2 P) steps of P/2 blocks.
    allgather(v) = ring (P-1 steps of the largest block) or, for P a power of two, recursive
    doubling (log2 P steps, step i moving the largest sum of 2^i consecutive blocks);
    --allgatherv ring or doubling forces one.
  * Schedules follow the code in include/oktopk/impl (a typical call: Ok-Topk's exact
    thresholds every 32 calls and its repartition every 8 are reported apart, amortized):
      every method: the 32-byte agreement allreduce ("check");
      dense: allreduce of 4n bytes;
      topka, gaussiank: allgather of counts, allgatherv of indices and of values (4 bytes
        each per entry); topka's count per rank is k, gaussiank's k * a measured ratio;
      topkdsa: alltoall of counts, P-1 rotated steps in groups of min(throttle, P-1), each
        step 2 messages (indices, values) of c(r -> r+s) entries; then the reduced regions'
        non-zeros: nnz of region q = (n/P)(1 - (1 - k/n)^P) (independent positions), gathered
        sparse if 2*total < n, else the dense regions (allgatherv of 4n/P bytes);
      gtopk: ceil(log2 P) tree rounds of (the count message; then indices + values of k
        entries in one step)
        and a merge of 2k entries each (compute), then bcast of 16 bytes and of 4k + 4k;
      oktopk: check, alltoall of counts, the rotated split-and-reduce with per-destination
        counts c(r -> q) = (k/P) * ratio, ratios drawn from a measured trace's distribution;
        global threshold: `guard` small allreduces (measured mean; one counts all the guard's
        thresholds since commit 'Ok-Topk: the guards count'); allgather of counts;
        when the measured trace balanced, a balance step (one step, the measured share of
        8T/P bytes) and an allgatherv of equal blocks, else blocks T/P * the measured
        max/mean; T = k * the measured mean of global selected / k.
      s2: allreduce of the sketch (rows * ceil(2 density n) * 4 bytes) and of the row bitmap
        (n/64 bytes).
  * Compute per call = passes(method) * 4n / mem_bw: passes are measured (a P = 1 run of the
    method, no messages, divided by the memory bandwidth of oktopk-kernel-bench's copy row);
    on the bed, where P ranks share `cores` cores, it is multiplied by max(1, P/cores).
  * Each sparse entry is an int32 index + a float32 value = 8 bytes.
The two-level model (validate2, scale2) adds nodes of L ranks, placed in consecutive blocks of L:
  * A step's messages are inside a node or between nodes; the two kinds use different links at
    once and the step costs the slower: between nodes, alpha_inter + max(a rank's largest bytes
    out or in / nic_bw, a node's / (nics * nic_bw)): the L ranks of a node sending at once
    share its NICs; inside, alpha_intra + max(the largest bytes to one peer / pair_bw, a rank's
    / rank_bw). Steps to r + s (ring, pairwise, the split-and-reduce's groups) and with
    r XOR 2^i (recursive doubling and halving) are split exactly; allreduce also weighs
    recursive halving and doubling (Open MPI's reduce-scatter + allgather).
  * Flat methods: the schedules above on the P placed ranks (dense also makes its second small
    allreduce; Ok-Topk's guard no allreduce unless --counts measured some: the default ladder's
    counts ride on the allgather of counts). With one rank per node they give the one-level
    costs.
  * The hierarchical mode (include/oktopk/impl/handle/hierarchical.hpp): allreduces over all P
    of 6 integers and 1 (dense: and of 2), the node's direct reduce-scatter (one step: n/L
    floats to each of the L - 1 peers), the flat method among the N = P/L ranks of one local
    rank on n/L entries with k = density * n/L, its L calls sharing the NICs, then the node's
    allgather, the same one-step exchange of n/L floats to each peer (scale2 --node-allgather
    mpi: MPI_Allgatherv instead, for comparison). Compute: the method's passes over n/L floats, plus
    L + 6 streams of n/L floats (the node's sums, the division by L, the residual's copy).
  * The bed (validate2): inside a host, shared memory, one bandwidth fitted on the
    node_reduce_scatter phases; between hosts, the one-level fit's beta at the size of the
    communicator carrying the bytes; alpha per P fitted on the flat rows; compute from the flat
    rows' phases without messages; see Bed.
Left out: contention inside the network (every link is assumed uncontended, full bisection),
topology, eager/rendezvous protocol switches, MPI's own progress and copies, overlap of the
split-and-reduce's additions with its messages, and anything GPU-specific (kernel launches,
host staging without GPU-aware MPI); in the two-level model also contention and routing inside
a node (GPU-to-NIC affinity, PCIe), and sparse outputs (reduce_sparse: the node's allgather then
moves entries, not n/L floats). Per-destination counts at scale come from the measured
distribution of the trace given, scaled with k/P: gradients whose top-k positions cluster
differently at scale are not modelled.
"""

import argparse
import csv
import json
import math
import os
import sys
import textwrap
from dataclasses import dataclass

try:
    import numpy as np
except ImportError:  # pragma: no cover
    sys.exit("alphabeta.py: needs numpy (Debian: apt-get install python3-numpy)")

METHODS = ["dense", "topka", "topkdsa", "gtopk", "gaussiank", "oktopk", "s2"]
METHODS2 = ["dense", "topka", "oktopk"]  # those the two-level model has
ENTRY_BYTES = 8  # int32 index + float32 value
CHECK_BYTES = 32  # the per-call agreement allreduce of 4 int64

# Network profiles for `scale`: alpha in seconds, bandwidth in bytes/s per node (one rank per
# node), mem_bw the device memory bandwidth the compute term uses.
PROFILES = {
    "aries": dict(alpha=1.0e-6, bandwidth=10.0e9, note="Cray Aries as in the paper: ~1 us, ~10 GB/s per node"),
    "ib100": dict(alpha=1.5e-6, bandwidth=100e9 / 8, note="100 Gbit/s InfiniBand (EDR)"),
    "ib200": dict(alpha=1.5e-6, bandwidth=200e9 / 8, note="200 Gbit/s InfiniBand (HDR)"),
    "eth10": dict(alpha=20e-6, bandwidth=10e9 / 8, note="10 Gbit/s Ethernet, TCP"),
}
MODELS = {"vgg16": dict(n=14_700_000, density=0.02), "bert": dict(n=110_000_000, density=0.01)}

# Machines of several ranks per node for `scale2` (two levels): L ranks (GPUs) per node; alpha
# in seconds; bandwidths in bytes/s each way: pair_bw from one rank to one peer in its node,
# rank_bw from one rank to all its node peers at once, nic_bw of each of the node's `nics` NICs;
# mem_bw the device memory bandwidth of the compute term, about two thirds of the HBM's peak,
# as `scale`'s 500 GB/s is of the P100's 732. Sources (vendor and centre documentation):
#   perlmutter: NERSC, "Perlmutter Architecture": a GPU node holds 4 NVIDIA A100 (40 GB HBM2,
#     1555 GB/s) and 4 HPE Slingshot-11 NICs (200 Gbit/s = 25 GB/s each); the 4 GPUs are all
#     connected to each other. NVIDIA: an A100 has 12 third-generation NVLinks of 25 GB/s each
#     way (600 GB/s in all); 4 links per pair of GPUs gives 100 GB/s each way per pair, 300 GB/s
#     per GPU.
#   frontier: OLCF, "Frontier User Guide": a node holds 4 AMD MI250X of 2 GCDs each (8 GCDs;
#     each GCD 64 GB HBM2E, about 1.6 TB/s) and 4 Slingshot NICs of 25 GB/s (100 GB/s per node);
#     the 2 GCDs of one MI250X are linked by Infinity Fabric at 200 GB/s peak, GCDs on different
#     MI250X at 50-100 GB/s. The model takes 50 GB/s for every pair (the direct exchange waits
#     on the slowest) and lets a GCD reach its 7 peers at once (350 GB/s): an assumption.
#   aries: the paper's machine (Piz Daint, Cray XC50: one P100 per node), as `scale`'s aries
#     profile (1 us, 10 GB/s); with one rank per node the links inside a node are never used.
# alpha = 2 us inside and between nodes on perlmutter and frontier is an assumption (a
# GPU-aware MPI's small-message latency is a few microseconds on either link), not a vendor
# figure.
NODE_PROFILES = {
    "perlmutter": dict(L=4, alpha_intra=2e-6, pair_bw=100e9, rank_bw=300e9, alpha_inter=2e-6,
                       nics=4, nic_bw=25e9, mem_bw=1000e9),
    "frontier": dict(L=8, alpha_intra=2e-6, pair_bw=50e9, rank_bw=350e9, alpha_inter=2e-6,
                     nics=4, nic_bw=25e9, mem_bw=1100e9),
    "aries": dict(L=1, alpha_intra=1e-6, pair_bw=10e9, rank_bw=10e9, alpha_inter=1e-6,
                  nics=1, nic_bw=10e9, mem_bw=500e9),
}
MODELS2 = {"bert": dict(n=110_000_000, density=0.01), "1p3b": dict(n=1_300_000_000, density=0.01)}


class ModelError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


# ---- input files ----------------------------------------------------------------------------


def read_bench_csv(path):
    """The method rows of an oktopk-bench --format csv output (the part before an empty line)."""
    try:
        with open(path, newline="") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ModelError(f"cannot read {path}: {e.strerror}")
    rows = []
    header = None
    for line in lines:
        if line.startswith("["):
            continue  # scripts/netbench.sh's log lines ("[oktopk] ...") share its stdout
        if not line.strip():
            if header is not None:
                break
            continue
        fields = line.split(",")
        if header is None:
            if fields[:2] != ["algo", "P"]:
                continue  # anything before the header (a log line)
            header = fields
            continue
        if len(fields) != len(header):
            raise ModelError(f"{path}: row with {len(fields)} fields, expected {len(header)}: {line}")
        row = dict(zip(header, fields))
        for key in ("P", "n", "k", "iters"):
            row[key] = int(row[key])
        for key in ("density", "time_s_med", "time_s_max", "bytes_per_rank_avg", "bytes_per_rank_max"):
            row[key] = float(row[key])
        row["file"] = path
        rows.append(row)
    if header is None:
        raise ModelError(f"{path}: no oktopk-bench CSV header (algo,P,...) found")
    return rows


def read_trace(path):
    """oktopk-bench --trace rows, as dicts with numeric fields."""
    expected = ["algo", "call", "rank", "phase", "operation", "peer", "bytes_sent", "bytes_received"]
    try:
        with open(path, newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header != expected:
                raise ModelError(f"{path}: not an oktopk-bench trace (header {header})")
            rows = []
            for fields in reader:
                if len(fields) != len(expected):
                    raise ModelError(f"{path}: malformed row {fields}")
                rows.append(dict(algo=fields[0], call=int(fields[1]), rank=int(fields[2]),
                                 phase=fields[3], op=fields[4], peer=int(fields[5]),
                                 sent=int(fields[6]), received=int(fields[7])))
    except OSError as e:
        raise ModelError(f"cannot read {path}: {e.strerror}")
    return rows


class Distributions:
    """What the schedules take from a measured run (trace + its bench CSV), per method, as
    ratios that scale with k/P: per-destination split counts, global selected totals,
    balancing, guard allreduces, Gaussian-k's selected counts."""

    def __init__(self, trace_path, csv_path):
        rows = read_trace(trace_path)
        bench = {r["algo"]: r for r in read_bench_csv(csv_path)}
        self.source = f"{trace_path} (P, k from {csv_path})"
        self.split_ratios = {}
        self.gathered_total_ratio = {}
        self.gather_imbalance = {}
        self.balance_fraction = {}
        self.balance_share = {}
        self.guard_allreduces = {}
        self.union_fraction = {}
        by_algo = {}
        for r in rows:
            by_algo.setdefault(r["algo"], []).append(r)
        for algo, mine in by_algo.items():
            if algo not in bench:
                raise ModelError(f"{trace_path}: method {algo} has no row in {csv_path}")
            P, k, n = bench[algo]["P"], bench[algo]["k"], bench[algo]["n"]
            calls = sorted({r["call"] for r in mine})
            # Split-and-reduce: entries per (call, rank, destination), zeros included.
            split = {}
            for r in mine:
                if r["phase"] == "split_reduce" and r["op"] == "send":
                    key = (r["call"], r["rank"], r["peer"])
                    split[key] = split.get(key, 0) + r["sent"]
            if split and k > 0 and P > 1:
                ratios = []
                for c in calls:
                    for rank in range(P):
                        for s in range(1, P):
                            peer = (rank + s) % P
                            ratios.append(split.get((c, rank, peer), 0) / ENTRY_BYTES / (k / P))
                self.split_ratios[algo] = np.array(ratios)
            # The gathered entries: each rank's own count from its allgatherv of indices.
            totals, imbalance, balanced, shares, guards = [], [], 0, [], []
            for c in calls:
                own = {}
                for r in mine:
                    if r["call"] == c and r["op"] == "allgatherv" and r["phase"] == "allgatherv":
                        # Two allgatherv rows per call (indices, then values): take the first.
                        own.setdefault(r["rank"], r["sent"] / max(P - 1, 1) / 4)
                if own and k > 0:
                    t = sum(own.values())
                    totals.append(t / k)
                    if t > 0:
                        imbalance.append(max(own.values()) / (t / P))
                bal = [r for r in mine if r["call"] == c and r["phase"] == "balance"]
                if bal:
                    balanced += 1
                    per_rank = {}
                    for r in bal:
                        s_, v_ = per_rank.get(r["rank"], (0, 0))
                        per_rank[r["rank"]] = (s_ + r["sent"], v_ + r["received"])
                    t = sum(own.values()) if own else 0
                    if t > 0:
                        shares.append(max(max(v) for v in per_rank.values()) / (ENTRY_BYTES * t / P))
                g = [r for r in mine if r["call"] == c and r["phase"] == "global_select" and r["op"] == "allreduce"]
                guards.append(len(g) / P)
            if totals:
                self.gathered_total_ratio[algo] = float(np.mean(totals))
                self.gather_imbalance[algo] = float(np.mean(imbalance)) if imbalance else 1.0
                if algo == "topkdsa" and n > 0:
                    self.union_fraction[algo] = float(np.mean(totals)) * k / n
            self.balance_fraction[algo] = balanced / len(calls) if calls else 0.0
            self.balance_share[algo] = float(np.mean(shares)) if shares else 0.0
            self.guard_allreduces[algo] = float(np.mean(guards)) if guards else 0.0
        self.gaussiank_ratios = None
        if "gaussiank" in by_algo and bench["gaussiank"]["k"] > 0:
            k = bench["gaussiank"]["k"]
            P = bench["gaussiank"]["P"]
            own = [r["sent"] / max(P - 1, 1) / 4 / k for r in by_algo["gaussiank"]
                   if r["op"] == "allgatherv"]
            self.gaussiank_ratios = np.array(own[::2]) if own else None

    def describe(self):
        lines = [f"# count distributions from {self.source}"]
        for algo, ratios in sorted(self.split_ratios.items()):
            lines.append(f"#   {algo}: split counts / (k/P): mean {ratios.mean():.3f}, "
                         f"max {ratios.max():.3f}, {len(ratios)} samples")
        for algo, t in sorted(self.gathered_total_ratio.items()):
            lines.append(f"#   {algo}: gathered entries / k {t:.3f}, max/mean per rank "
                         f"{self.gather_imbalance[algo]:.3f}, balanced in "
                         f"{100 * self.balance_fraction.get(algo, 0):.0f}% of calls, "
                         f"guard allreduces {self.guard_allreduces.get(algo, 0):.2f} per call")
        return "\n".join(lines)


# ---- collective schedules -------------------------------------------------------------------
# Each returns seconds under (alpha, beta).


def step(alpha, beta, messages, nbytes):
    return alpha * messages + beta * nbytes


def allreduce(P, nbytes, alpha, beta):
    if P <= 1 or nbytes <= 0:
        return 0.0
    doubling = math.ceil(math.log2(P)) * step(alpha, beta, 1, nbytes)
    ring = 2 * (P - 1) * step(alpha, beta, 1, math.ceil(nbytes / P))
    return min(doubling, ring)


def alltoall(P, nbytes_per_peer, alpha, beta):
    if P <= 1:
        return 0.0
    pairwise = (P - 1) * step(alpha, beta, 1, nbytes_per_peer)
    bruck = math.ceil(math.log2(P)) * step(alpha, beta, 1, nbytes_per_peer * P / 2)
    return min(pairwise, bruck)


ALLGATHERV = {"algorithm": "min"}  # set from the command line: ring, doubling or min


def allgatherv(blocks, alpha, beta):
    """blocks: bytes contributed by each rank (numpy array of length P)."""
    P = len(blocks)
    if P <= 1 or blocks.sum() <= 0:
        return 0.0
    ring = (P - 1) * step(alpha, beta, 1, float(blocks.max()))
    if ALLGATHERV["algorithm"] != "ring" and P & (P - 1) == 0:
        doubling, group = 0.0, blocks.astype(float)
        while len(group) > 1:
            doubling += step(alpha, beta, 1, float(group.max()))
            group = group.reshape(-1, 2).sum(axis=1)
        return doubling if ALLGATHERV["algorithm"] == "doubling" else min(ring, doubling)
    return ring


def bcast(P, nbytes, alpha, beta):
    if P <= 1 or nbytes <= 0:
        return 0.0
    rounds = math.ceil(math.log2(P))
    binomial = rounds * step(alpha, beta, 1, nbytes)
    scatter = sum(step(alpha, beta, 1, nbytes / 2 ** (i + 1)) for i in range(rounds))
    return min(binomial, scatter + (P - 1) * step(alpha, beta, 1, nbytes / P))


def split_and_reduce(P, k, ratios, throttle, alpha, beta, rng):
    """Alltoall of counts, then P-1 rotated steps in groups of `throttle`: step s, rank r sends
    c(r -> r+s) entries (2 messages) and receives c(r-s -> r). Counts = (k/P) * ratios drawn
    from the measured distribution (or exactly k/P without one)."""
    if P <= 1:
        return 0.0
    cost = alltoall(P, 8, alpha, beta)
    group = max(1, min(throttle, P - 1))
    ranks = np.arange(P)
    for first in range(1, P, group):
        steps = np.arange(first, min(P - 1, first + group - 1) + 1)
        if ratios is None:
            counts = np.full((P, len(steps)), k / P)
        else:
            counts = rng.choice(ratios, size=(P, len(steps))) * (k / P)
        out = counts.sum(axis=1)
        # Rank r receives from r - s what that rank sent in step s.
        into = np.zeros(P)
        for j, s in enumerate(steps):
            into[(ranks + s) % P] += counts[:, j]
        # The group's messages are in flight together: one latency, then the bytes.
        cost += alpha + beta * ENTRY_BYTES * float(np.maximum(out, into).max())
    return cost


# ---- method schedules -----------------------------------------------------------------------


def communication(algo, P, n, k, density, alpha, beta, dist, options):
    """(typical call seconds, extra seconds amortized over calls) for one method."""
    rng = np.random.default_rng(options.get("seed", 1))
    check = allreduce(P, CHECK_BYTES, alpha, beta)
    extra = 0.0
    throttle = options.get("throttle", 4)
    if algo in ("dense", "mpi_allreduce"):
        t = allreduce(P, 4 * n, alpha, beta)
        return (t if algo == "mpi_allreduce" else check + t), 0.0
    if algo in ("topka", "gaussiank"):
        counts = np.full(P, float(k))
        if algo == "gaussiank" and dist is not None and dist.gaussiank_ratios is not None:
            counts = rng.choice(dist.gaussiank_ratios, size=P) * k
        t = check + allgatherv(np.full(P, 8.0), alpha, beta)
        t += 2 * allgatherv(4 * counts, alpha, beta)
        return t, 0.0
    if algo == "topkdsa":
        ratios = dist.split_ratios.get("topkdsa") if dist is not None else None
        t = check + split_and_reduce(P, k, ratios, throttle, alpha, beta, rng)
        t += allgatherv(np.full(P, 8.0), alpha, beta)
        region_nnz = (n / P) * (1.0 - (1.0 - k / n) ** P) if n > 0 else 0.0
        if 2 * region_nnz * P < n:
            t += 2 * allgatherv(np.full(P, 4 * region_nnz), alpha, beta)
        else:
            t += allgatherv(np.full(P, 4 * n / P), alpha, beta)
        return t, 0.0
    if algo == "gtopk":
        rounds = math.ceil(math.log2(P)) if P > 1 else 0
        # Per round: the count message, then indices and values together.
        tree = rounds * (step(alpha, beta, 1, 8) + step(alpha, beta, 1, ENTRY_BYTES * k))
        t = check + tree + bcast(P, 16, alpha, beta) + 2 * bcast(P, 4 * k, alpha, beta)
        return t, 0.0
    if algo == "oktopk":
        ratios = dist.split_ratios.get("oktopk") if dist is not None else None
        total = k * (dist.gathered_total_ratio.get("oktopk", 1.0) if dist is not None else 1.0)
        guards = dist.guard_allreduces.get("oktopk", 1.0) if dist is not None else 1.0
        t = check + split_and_reduce(P, k, ratios, throttle, alpha, beta, rng)
        t += guards * allreduce(P, 8, alpha, beta)
        t += allgatherv(np.full(P, 8.0), alpha, beta)
        balanced = dist is not None and dist.balance_fraction.get("oktopk", 0.0) >= 0.5
        if balanced:
            share = dist.balance_share.get("oktopk", 1.0)
            t += step(alpha, beta, 1, ENTRY_BYTES * total / P * share)
            blocks = np.full(P, 4 * total / P)
        else:
            imbalance = dist.gather_imbalance.get("oktopk", 1.0) if dist is not None else 1.0
            blocks = np.full(P, 4 * total / P)
            blocks[0] *= imbalance  # the largest block sets the ring's steps
        t += 2 * allgatherv(blocks, alpha, beta)
        # Every threshold_period calls: the distributed radix select's allreduces, the total
        # and one histogram per digit (instead of the guard's); every repartition_period calls:
        # one allreduce of P-1 boundaries.
        histograms = (4 * (1 << bits) for bits in distributed_radix_digits(k))
        exact = sum(allreduce(P, b, alpha, beta) for b in (8, *histograms)) - guards * allreduce(P, 8, alpha, beta)
        extra = exact / options.get("threshold_period", 32) + allreduce(P, 8 * (P - 1), alpha, beta) / options.get("repartition_period", 8)
        return t, extra
    if algo == "s2":
        rows = options.get("s2_rows", 3)
        columns = math.ceil(2 * density * n)
        t = check + allreduce(P, 4 * rows * columns, alpha, beta) + allreduce(P, math.ceil(n / 64), alpha, beta)
        return t, 0.0
    raise ModelError(f"unknown method '{algo}' (valid: {' '.join(METHODS)} mpi_allreduce)")


def distributed_radix_digits(k):
    """Digit widths of Ok-Topk's exact global threshold for k, as
    oktopk::impl::distributed_radix_schedule: the fewest digits over the 31 key bits with at
    most max(16, k // 32) bins each (at most 2^11), as equal as can be, wider ones first."""
    budget = max(16, k // 32)
    width = 4
    while width < 11 and (1 << (width + 1)) <= budget:
        width += 1
    passes = -(-31 // width)
    return [31 // passes + (1 if p < 31 % passes else 0) for p in range(passes)]


def compute(algo, P, n, k, params, cores, mem_bw=None, merge_passes=8.0):
    """Seconds of computation per call: measured passes over 4n bytes at mem_bw, times the
    share of a core each rank gets when P ranks share `cores` (the bed; None elsewhere)."""
    if algo == "mpi_allreduce":
        return 0.0
    comp = params.get("compute")
    if not comp:
        return 0.0
    bw = mem_bw or comp["mem_bw"]
    passes = comp["passes"].get(algo)
    if passes is None:
        raise ModelError(f"the parameters have no compute passes for {algo}; rerun fit with --compute")
    t = passes * 4 * n / bw
    if algo == "gtopk" and P > 1:
        t += math.ceil(math.log2(P)) * merge_passes * 2 * ENTRY_BYTES * k / bw
    if cores:
        t *= max(1.0, P / cores)
    return t


def predict_row(algo, P, n, density, alpha, beta, params, dist, cores, mem_bw=None, options=None):
    options = options or {}
    k = int(math.floor(density * n))
    comm, extra = communication(algo, P, n, k, density, alpha, beta, dist, options)
    comp = compute(algo, P, n, k, params, cores, mem_bw)
    return dict(algo=algo, P=P, n=n, k=k, comm_s=comm, compute_s=comp, time_s=comm + comp,
                amortized_extra_s=extra)


# ---- the counted floor of a measured call ---------------------------------------------------

# Passes over n floats each method's definition needs. Error feedback: the accumulate pass
# reads residual and gradient and writes acc (3), the output writes n floats (1). Dense and
# the bare MPI_Allreduce read the gradient and write the output. S2 (no error feedback by
# default): its sketch reads the gradient, its decode writes the output.
FLOOR_PASSES = {"dense": 2, "mpi_allreduce": 2, "topka": 4, "topkdsa": 4, "gtopk": 4,
                "gaussiank": 4, "oktopk": 4, "s2": 2}


def floor_rounds(algo, P):
    """Message rounds of one call, in sequence. A collective counts its fewest rounds among the
    schedules above (its function at alpha = 1, beta = 0: log2 P for P a power of two, whatever
    the bytes); point-to-point steps count as the code posts them. The gathers move (index,
    value) pairs in one allgatherv. Ok-Topk: a call that reuses its thresholds, its global
    guard's counts riding on the allgather of counts."""
    if P <= 1:
        return 0
    allreduce_rounds = int(allreduce(P, 1, 1.0, 0.0))
    gather_rounds = int(allgatherv(np.ones(P), 1.0, 0.0))
    check = allreduce_rounds
    if algo == "mpi_allreduce":
        return allreduce_rounds
    if algo == "dense":
        # The agreement allreduce, the allreduce itself, then the non-finite averages' count.
        return 3 * allreduce_rounds
    if algo in ("topka", "gaussiank"):
        return check + 2 * gather_rounds  # counts, (index, value) pairs
    if algo in ("topkdsa", "oktopk"):
        # Alltoall of counts, then P - 1 rotated steps (spec §2.5, Eq. 1: (P - 1) alpha).
        split = int(alltoall(P, 1, 1.0, 0.0)) + (P - 1)
        # The counts, then the (index, value) pairs (TopkDSA: or its dense regions).
        return check + split + 2 * gather_rounds
    if algo == "gtopk":
        # Per tree round the count, then the entries; the bcasts of count and of the k entries.
        return check + 2 * math.ceil(math.log2(P)) + 3 * int(bcast(P, 1, 1.0, 0.0))
    if algo == "s2":
        return check + 2 * allreduce_rounds  # the sketch, the bitmap
    raise ModelError(f"no floor for method '{algo}'")


def floor_terms(row, alpha, mem_share, link):
    """{latency, memory, wire} seconds of a measured row: its rounds at the bed's alpha, its
    passes over 4n bytes at the rank's share of the copy bandwidth, and its bytes at the link
    rate (dense: the ring's 2(P-1)/P 4n, the fewest any allreduce sends; the others: the bytes
    the row moved). The three do not overlap in these implementations (the passes counted run
    before or after the messages, not during them), so the floor is their sum."""
    algo, P, n = row["algo"], row["P"], row["n"]
    if algo in ("dense", "mpi_allreduce"):
        wire = 2 * (P - 1) / P * 4 * n
    else:
        wire = row["bytes_per_rank_avg"]
    return dict(latency=floor_rounds(algo, P) * alpha,
                memory=FLOOR_PASSES[algo] * 4 * n / mem_share, wire=wire / link)


# ---- two levels: nodes of several ranks -----------------------------------------------------
# Ranks sit on the nodes in consecutive blocks of L (rank r on node r // L), as MPI launchers
# place them by default. A step is as in the one-level model (its messages in flight together,
# one latency, then the bytes), but each message is inside a node or between two, and the two
# kinds travel on different links at the same time; the step costs the slower of:
#   between nodes: alpha_inter + max(a rank's largest bytes out or in / nic_bw (one rank's flow
#     goes through one NIC), a node's largest bytes out or in, all its ranks together /
#     (nics * nic_bw)): L ranks sending at once share the node's NICs, so each gets
#     min(nic_bw, nics * nic_bw / L);
#   inside a node: alpha_intra + max(the largest bytes to one peer / pair_bw, a rank's largest
#     bytes out or in / rank_bw).


@dataclass(frozen=True)
class Machine:
    """Nodes of L ranks: latencies (s), bandwidths (bytes/s each way) of the links inside a
    node and of the NICs between nodes, the memory bandwidth of the compute term, and how much
    slower a rank computes than alone (the bed, whose ranks share cores; 1 elsewhere)."""
    L: int
    alpha_intra: float
    pair_bw: float
    rank_bw: float
    alpha_inter: float
    nics: int
    nic_bw: float
    mem_bw: float
    compute_slowdown: float = 1.0


@dataclass(frozen=True)
class Ranks:
    """The P ranks of one communicator, per_node of them on each node in consecutive blocks,
    while `sharing` communicators like it run the same schedule at once on every node (the
    hierarchical mode's L calls across the nodes, one rank per node each, share the NICs)."""
    P: int
    per_node: int
    sharing: int = 1

    @property
    def nodes(self):
        return self.P // self.per_node


def power_of_two(P):
    return P > 0 and P & (P - 1) == 0


def step2(m, inter=None, intra=None):
    """One step: inter = (a rank's largest bytes, a node's largest bytes) between nodes; intra =
    (the largest bytes to one peer, a rank's largest bytes) inside a node; None where the step
    has no such messages."""
    cost = 0.0
    if inter is not None:
        rank_bytes, node_bytes = inter
        cost = m.alpha_inter + max(rank_bytes / m.nic_bw, node_bytes / (m.nics * m.nic_bw))
    if intra is not None:
        pair_bytes, rank_bytes = intra
        cost = max(cost, m.alpha_intra + max(pair_bytes / m.pair_bw, rank_bytes / m.rank_bw))
    return cost


def off_node(g, shift):
    """How many of a node's ranks have their peer r + shift on another node."""
    if g.nodes == 1:
        return 0
    return sum(1 for local in range(g.per_node) if ((local + shift) // g.per_node) % g.nodes)


def shift_step(m, g, shift, nbytes):
    """Every rank sends nbytes to rank r + shift and receives as much from r - shift."""
    off = off_node(g, shift)
    inter = (nbytes, off * nbytes * g.sharing) if off else None
    intra = (nbytes, nbytes) if off < g.per_node else None
    return step2(m, inter, intra)


def xor_step(m, g, distance, nbytes):
    """Every rank exchanges nbytes with rank r XOR distance: with a power of two of ranks per
    node, all of a node's ranks go off the node or none do."""
    if distance >= g.per_node:
        return step2(m, inter=(nbytes, g.per_node * nbytes * g.sharing))
    return step2(m, intra=(nbytes, nbytes))


ALLREDUCE_SCHEDULES = ("doubling", "halving", "ring")


def allreduce2(m, g, nbytes, schedules=ALLREDUCE_SCHEDULES):
    """The cheapest of `schedules`: recursive doubling (log2 P exchanges of the whole buffer),
    recursive halving and doubling (a reduce-scatter exchanging B/2, B/4, ... at distances 1,
    2, 4, ..., then the allgather back: Open MPI's order), ring (2(P - 1) steps of B/P)."""
    P = g.P
    if P <= 1 or nbytes <= 0:
        return 0.0
    costs = []
    if "ring" in schedules or not power_of_two(P):
        costs.append(2 * (P - 1) * shift_step(m, g, 1, math.ceil(nbytes / P)))
    if power_of_two(P):
        rounds = int(math.log2(P))
        if "doubling" in schedules:
            costs.append(sum(xor_step(m, g, 1 << i, nbytes) for i in range(rounds)))
        if "halving" in schedules:
            costs.append(2 * sum(xor_step(m, g, 1 << i, nbytes / 2 ** (i + 1)) for i in range(rounds)))
    return min(costs)


def alltoall2(m, g, nbytes_per_peer):
    """Pairwise (P - 1 steps to r + s) or Bruck (steps of P/2 blocks to r + 2^i)."""
    P = g.P
    if P <= 1:
        return 0.0
    pairwise = sum(shift_step(m, g, s, nbytes_per_peer) for s in range(1, P))
    bruck = sum(shift_step(m, g, 1 << i, nbytes_per_peer * P / 2) for i in range(math.ceil(math.log2(P))))
    return min(pairwise, bruck)


def allgatherv2(m, g, blocks):
    """blocks: bytes each rank contributes. Ring (P - 1 steps of the largest block to r + 1) or,
    for P a power of two, recursive doubling (step i: the largest sum of 2^i consecutive blocks
    with rank r XOR 2^i); --allgatherv chooses as in the one-level model."""
    P = len(blocks)
    if P <= 1 or blocks.sum() <= 0:
        return 0.0
    ring = (P - 1) * shift_step(m, g, 1, float(blocks.max()))
    if ALLGATHERV["algorithm"] != "ring" and power_of_two(P):
        doubling, group, distance = 0.0, blocks.astype(float), 1
        while len(group) > 1:
            doubling += xor_step(m, g, distance, float(group.max()))
            group = group.reshape(-1, 2).sum(axis=1)
            distance *= 2
        return doubling if ALLGATHERV["algorithm"] == "doubling" else min(ring, doubling)
    return ring


def split_and_reduce2(m, g, k, ratios, throttle, rng):
    """split_and_reduce on placed ranks: the same groups of rotated steps and the same draws of
    the counts, each group's messages split into those inside a node and those between."""
    P = g.P
    if P <= 1:
        return 0.0
    cost = alltoall2(m, g, 8)
    group = max(1, min(throttle, P - 1))
    ranks = np.arange(P)
    node = ranks // g.per_node
    for first in range(1, P, group):
        steps = np.arange(first, min(P - 1, first + group - 1) + 1)
        if ratios is None:
            counts = np.full((P, len(steps)), k / P)
        else:
            counts = rng.choice(ratios, size=(P, len(steps))) * (k / P)
        nbytes = ENTRY_BYTES * counts
        peer = (ranks[:, None] + steps[None, :]) % P
        off = (peer // g.per_node) != node[:, None]
        inter = intra = None
        if off.any():
            out = (nbytes * off).sum(axis=1)
            into = np.bincount(peer[off], weights=nbytes[off], minlength=P)
            by_node = np.maximum(out.reshape(-1, g.per_node).sum(axis=1),
                                 into.reshape(-1, g.per_node).sum(axis=1))
            inter = (float(np.maximum(out, into).max()), float(by_node.max()) * g.sharing)
        if not off.all():
            out = (nbytes * ~off).sum(axis=1)
            into = np.bincount(peer[~off], weights=nbytes[~off], minlength=P)
            intra = (float(nbytes[~off].max()), float(np.maximum(out, into).max()))
        cost += step2(m, inter, intra)
    return cost


def communication2(algo, m, g, n, k, dist, options):
    """(typical call seconds, amortized extra seconds) of a flat method on placed ranks: the
    schedules of communication(), with two differences that follow the current code: dense
    makes a second small allreduce (the count of non-finite averages), and Ok-Topk's global
    guard costs no allreduce unless --counts measured some (the default ladder's counts ride on
    the allgather of counts)."""
    rng = np.random.default_rng(options.get("seed", 1))
    check = allreduce2(m, g, CHECK_BYTES)
    if algo == "dense":
        schedules = options.get("dense_schedules", ALLREDUCE_SCHEDULES)
        return check + allreduce2(m, g, 8) + allreduce2(m, g, 4 * n, schedules), 0.0
    if algo == "topka":
        t = check + allgatherv2(m, g, np.full(g.P, 8.0))
        return t + 2 * allgatherv2(m, g, np.full(g.P, 4.0 * k)), 0.0
    if algo == "oktopk":
        ratios = dist.split_ratios.get("oktopk") if dist is not None else None
        total = k * (dist.gathered_total_ratio.get("oktopk", 1.0) if dist is not None else 1.0)
        guards = dist.guard_allreduces.get("oktopk", 0.0) if dist is not None else 0.0
        t = check + split_and_reduce2(m, g, k, ratios, options.get("throttle", 4), rng)
        t += guards * allreduce2(m, g, 8)
        t += allgatherv2(m, g, np.full(g.P, 8.0))
        blocks = np.full(g.P, 4 * total / g.P)
        if dist is not None and dist.balance_fraction.get("oktopk", 0.0) >= 0.5:
            share = dist.balance_share.get("oktopk", 1.0)
            t += shift_step(m, g, 1, ENTRY_BYTES * total / g.P * share)
        elif dist is not None:
            blocks[0] *= dist.gather_imbalance.get("oktopk", 1.0)
        t += 2 * allgatherv2(m, g, blocks)
        histograms = (4 * (1 << bits) for bits in distributed_radix_digits(k))
        exact = sum(allreduce2(m, g, b) for b in (8, *histograms)) - guards * allreduce2(m, g, 8)
        extra = (exact / options.get("threshold_period", 32)
                 + allreduce2(m, g, 8 * (g.P - 1)) / options.get("repartition_period", 8))
        return t, extra
    raise ModelError(f"the two-level model has no method '{algo}' (it has {', '.join(METHODS2)})")


def node_streams(L):
    """Streams of n/L floats (each a read or a write) the hierarchical mode adds per call: the
    node's sum reads the L - 1 parts received and the rank's residual and gradient and writes
    the shard's sum (L + 2); the division by L reads and writes the shard (2); the shard's
    residual is copied back (2)."""
    return L + 6


def predict2(algo, m, P, n, density, passes, dist, hierarchical, options=None):
    """Time per call of a method on P ranks of machine m, flat or hierarchical (dense outputs:
    the node's allgather moves n/L floats per rank)."""
    options = options or {}
    if P % m.L:
        raise ModelError(f"P = {P} is not a multiple of {m.L} ranks per node")
    if algo not in passes:
        raise ModelError(f"no compute passes for {algo}")
    k = int(math.floor(density * n))
    dist = None if algo == "dense" else dist
    if not hierarchical:
        comm, extra = communication2(algo, m, Ranks(P, m.L), n, k, dist, options)
        streams = passes[algo] * n
    else:
        L = m.L
        shard = n // L
        everyone = Ranks(P, L)
        # Over all P ranks: the agreement (6 integers) and the node sums' finiteness (1); dense
        # also agrees on a rejection by its call across the nodes (2).
        comm = allreduce2(m, everyone, 48) + allreduce2(m, everyone, 8)
        if algo == "dense":
            comm += allreduce2(m, everyone, 16)
        if L > 1:
            piece = 4.0 * shard
            # The node's reduce-scatter sends each of the L - 1 peers its shard, all at once.
            direct = step2(m, intra=(piece, (L - 1) * piece))
            comm += direct
            # Its allgather is the same exchange, each shard to every peer at once, as the code
            # makes it; options["node_allgather"] = "mpi" asks what MPI_Allgatherv (ring or
            # recursive doubling, one peer a step) would cost instead.
            if options.get("node_allgather", "direct") == "direct":
                comm += direct
            else:
                comm += allgatherv2(m, Ranks(L, L), np.full(L, piece))
        across, extra = communication2(algo, m, Ranks(P // L, 1, sharing=L), shard,
                                       int(math.floor(density * shard)), dist, options)
        comm += across
        streams = (passes[algo] + node_streams(L)) * shard
    return dict(algo=algo, mode="hier" if hierarchical else "flat", P=P, n=n, k=k, comm_s=comm,
                compute_s=streams * 4 / m.mem_bw * m.compute_slowdown,
                amortized_extra_s=extra)


def read_node_run(path):
    """One run of data/link-data/hierarchical/run.sh: oktopk-bench's text output (--phases)
    under scripts/netbench.sh --ranks-per-host. Returns the method's row, its phases (seconds
    and bytes per rank), the bed (hosts, ranks per host, rate), whether hierarchical=on, and
    netbench's validation allreduce where this run made it (the first run of a bed)."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ModelError(f"cannot read {path}: {e.strerror}")
    run = dict(file=path, phases={}, phase_bytes={}, hierarchical=False, validation=None)
    header = None
    for line in lines:
        fields = line.split()
        if line.startswith("[oktopk] netbench:") and " ranks at " in line:
            # [oktopk] netbench: 2 hosts x 2 ranks at 1gbit (MTU 1500), subnet ...
            run.update(hosts=int(fields[2]), per_host=int(fields[5]), rate=fields[8])
        elif line.startswith("[oktopk] netbench: validated: dense allreduce of"):
            # ... validated: dense allreduce of 4194304 floats 2.496910e-01 s per call >= ...
            run["validation"] = (int(fields[6]), float(fields[8]))
        elif line.startswith("# options:"):
            run["hierarchical"] = "hierarchical=on" in fields
        elif fields[:2] == ["algo", "P"]:
            header = fields
        elif header is not None and len(fields) == len(header) and fields[1].isdigit():
            row = dict(zip(header, fields))
            run.update(algo=row["algo"], P=int(row["P"]), n=int(row["n"]),
                       density=float(row["density"]), time_s_med=float(row["time_s_med"]))
            header = None
        elif len(fields) in (5, 6) and fields[0] == run.get("algo") and fields[1] != "phase":
            # algo phase time_s_med share bytes_per_rank_max [between_nodes]
            run["phases"][fields[1]] = float(fields[2])
            run["phase_bytes"][fields[1]] = float(fields[4])
    missing = [key for key in ("hosts", "algo") if key not in run]
    if missing:
        raise ModelError(f"{path}: not a run of data/link-data/hierarchical/run.sh "
                         f"(no {' or '.join(missing)})")
    if run["P"] != run["hosts"] * run["per_host"]:
        raise ModelError(f"{path}: P = {run['P']} is not {run['hosts']} hosts x "
                         f"{run['per_host']} ranks")
    return run


def compute_seconds(run):
    """A run's time in phases that carry no messages (selection, accumulation, reductions)."""
    return sum(t for name, t in run["phases"].items() if run["phase_bytes"][name] == 0)


class Bed:
    """The emulated cluster as a two-level machine, from measurements:
      * between hosts: beta of the one-level fit (--params, at --fit-rate) at the size of the
        communicator that carries the bytes: P ranks for a flat method, the N hosts for the
        hierarchical mode's calls across them (flat and hierarchical dense moved the same link
        bytes at the fit's P = 4 and P = 2 rates: docs/scaling.md). Other rates scale it by
        fit rate / rate: the same fraction of the line rate.
      * alpha, inside and between hosts alike (the bed's latency is that of ranks sharing the
        cores), one per P: fitted by relative least squares on the flat rows (their totals are
        linear in alpha); the hierarchical rows' totals are not fitted on.
      * inside a host (shared memory): one bandwidth, fitted (relative least squares) on the
        node_reduce_scatter phases of the hierarchical rows: alpha + the exchange + the node's
        sums. That phase starts right after an allreduce over all ranks, so it holds little
        waiting for slower ranks.
      * compute: the copy bandwidth and dense's passes from --params (a P = 1 run); TopkA's and
        Ok-Topk's passes from their flat rows' phases that carry no messages. All computation,
        and the copies inside a host, slow by max(1, P / cores): the P ranks share the cores.
    alpha and the bandwidth inside a host depend a little on each other (the flat rows'
    exchanges inside a host, the phase's latency): a few rounds of fitting each given the other
    settle them."""

    def __init__(self, runs, params, fit_rate, cores):
        self.params, self.fit_rate, self.cores = params, fit_rate, cores
        if "compute" not in params or "dense" not in params["compute"]["passes"]:
            raise ModelError("--params has no compute passes (fit it with --compute)")
        self.mem_bw = params["compute"]["mem_bw"]
        self.passes = {"dense": params["compute"]["passes"]["dense"]}
        for algo in ("topka", "oktopk"):
            flat = [compute_seconds(r) * self.mem_bw / (4 * r["n"] * self.slowdown(r["P"]))
                    for r in runs if r["algo"] == algo and not r["hierarchical"]]
            if flat:
                self.passes[algo] = float(np.mean(flat))
        self.flat = [r for r in runs if not r["hierarchical"]]
        self.phases = [r for r in runs if r["hierarchical"] and "node_reduce_scatter" in r["phases"]]
        if not self.phases:
            raise ModelError("no hierarchical run with a node_reduce_scatter phase to fit the "
                             "bandwidth inside a host on")
        self.shm_bw, self.alpha = 1e10, {}
        for _ in range(5):
            self.alpha = self.fit_alpha()
            self.shm_bw = self.fit_shm()

    def slowdown(self, P):
        return max(1.0, P / self.cores) if self.cores else 1.0

    def machine(self, P, L, rate, carriers, alpha=None):
        """The bed at P ranks, L per host, links at `rate`; carriers: the size of the
        communicator whose beta applies."""
        own = self.params.get("per_P", {}).get(str(carriers))
        if own is None:
            raise ModelError(f"--params has no fit at P = {carriers}")
        if alpha is None:
            if P not in self.alpha:
                raise ModelError(f"no flat row at P = {P} to fit alpha on")
            alpha = self.alpha[P]
        link = rate_bytes_per_s(rate) / rate_bytes_per_s(self.fit_rate) / own["beta"]
        slow = self.slowdown(P)
        return Machine(L, alpha, self.shm_bw / slow, self.shm_bw / slow, alpha, 1, link,
                       self.mem_bw, slow)

    def predict(self, algo, P, L, rate, n, density, hierarchical, alpha=None):
        carriers = P // L if hierarchical else P
        return predict2(algo, self.machine(P, L, rate, carriers, alpha), P, n, density,
                        self.passes, None, hierarchical)

    def fit_alpha(self):
        """Per P, the alpha minimizing the flat rows' squared relative errors: a row's
        prediction is t0 + steps * alpha."""
        alpha = {}
        for P in sorted({r["P"] for r in self.flat}):
            num = den = 0.0
            for r in self.flat:
                if r["P"] != P:
                    continue
                t0, t1 = (sum_time(self.predict(r["algo"], P, r["per_host"], r["rate"], r["n"],
                                                r["density"], False, a)) for a in (0.0, 1e-3))
                steps, t = (t1 - t0) / 1e-3, r["time_s_med"]
                num += steps * (t - t0) / t**2
                den += steps**2 / t**2
            alpha[P] = num / den
            if alpha[P] <= 0:
                raise ModelError(f"the flat rows at P = {P} are faster than their bytes and "
                                 "computation alone: no alpha fits")
        return alpha

    def fit_shm(self):
        design, rest, measured = [], [], []
        for r in self.phases:
            P, L = r["P"], r["per_host"]
            shard = r["n"] // L
            slow = self.slowdown(P)
            design.append((L - 1) * 4 * shard * slow)
            rest.append(self.alpha.get(P, 0.0) + (L + 2) * shard * 4 / self.mem_bw * slow)
            measured.append(r["phases"]["node_reduce_scatter"])
        design, rest, measured = map(np.array, (design, rest, measured))
        w = 1.0 / measured
        inverse = float(np.sum(design * (measured - rest) * w * w) / np.sum((design * w) ** 2))
        if inverse <= 0:
            raise ModelError("node_reduce_scatter phases shorter than their computation")
        return 1.0 / inverse


def sum_time(row):
    return row["comm_s"] + row["compute_s"]


# ---- subcommands ----------------------------------------------------------------------------


def read_check_phases(path):
    """(P, seconds) of the 'check' phase (the 32-byte agreement allreduce every call makes) of
    each method in an oktopk-bench --phases CSV: the bed's small-message measurement."""
    P_of = {r["algo"]: r["P"] for r in read_bench_csv(path)}
    with open(path) as f:
        lines = [l for l in f.read().splitlines() if not l.startswith("[")]
    # Since the traffic between nodes is split, the table has one more column.
    headers = ("algo,phase,time_s_med,share,bytes_per_rank_max",
               "algo,phase,time_s_med,share,bytes_per_rank_max,between_nodes_bytes_per_rank_max")
    starts = [i + 1 for i, line in enumerate(lines) if line in headers]
    if not starts:
        raise ModelError(f"{path}: no --phases table (algo,phase,...)")
    rows = []
    for line in lines[starts[0]:]:
        f = line.split(",")
        if len(f) in (5, 6) and f[1] == "check" and f[0] in P_of:
            rows.append((P_of[f[0]], float(f[2])))
    return rows


def least_squares(A, t):
    """alpha, beta >= 0 minimizing the relative error (rows weighted by 1/t), so small and
    large messages count alike."""
    w = 1.0 / t
    (alpha, beta), *_ = np.linalg.lstsq(A * w[:, None], t * w, rcond=None)
    if alpha < 0:  # latency below resolution: the bandwidth alone
        alpha = 0.0
        beta = float(np.sum(A[:, 1] * t * w * w) / np.sum((A[:, 1] * w) ** 2))
    return float(alpha), float(beta)


def cmd_fit(args):
    rows = [r for path in args.network for r in read_bench_csv(path) if r["algo"] == args.algo]
    if len(rows) < 2:
        raise ModelError(f"fit needs at least 2 rows of '{args.algo}' in --network files, got {len(rows)}")
    # Ring allreduce of B = 4n bytes: t = 2(P-1) alpha + 2(P-1)/P B beta; a 32-byte check
    # allreduce (--small): recursive doubling, ceil(log2 P) (alpha + 32 beta).
    samples = [(r["P"], "allreduce", r["n"], r["time_s_med"]) for r in rows]
    for path in args.small or []:
        samples += [(P, "check", 8, t) for P, t in read_check_phases(path)]

    def design(P, kind, n):
        if kind == "check":
            steps = math.ceil(math.log2(P))
            return [steps, steps * CHECK_BYTES]
        return [2 * (P - 1), 2 * (P - 1) / P * 4 * n]

    A = np.array([design(P, kind, n) for P, kind, n, _ in samples], float)
    t = np.array([s[3] for s in samples])
    alpha, beta = least_squares(A, t)
    result = dict(alpha=alpha, beta=beta, bandwidth_bytes_per_s=1.0 / beta, per_P={},
                  fit_rows=[], sources=sorted(set(args.network + (args.small or []))),
                  fitted_on=args.algo + (" + check phases" if args.small else ""))
    print(f"all P: alpha = {alpha:.3e} s per message, beta = {beta:.4e} s per byte "
          f"({8 / beta / 1e9:.3f} Gbit/s), from {len(samples)} rows")
    for P in sorted({s[0] for s in samples}):
        sel = [i for i, s in enumerate(samples) if s[0] == P]
        if len(sel) >= 2:
            a, b = least_squares(A[sel], t[sel])
            result["per_P"][str(P)] = dict(alpha=a, beta=b)
            print(f"P = {P}: alpha = {a:.3e} s, beta = {b:.4e} s/byte ({8 / b / 1e9:.3f} Gbit/s)")
    print("P,kind,n,measured_s,fitted_all_P_s,error_pct,fitted_own_P_s,error_pct")
    for (P, kind, n, measured), a in zip(samples, A):
        fitted = a[0] * alpha + a[1] * beta
        own = result["per_P"].get(str(P), dict(alpha=alpha, beta=beta))
        fitted_own = a[0] * own["alpha"] + a[1] * own["beta"]
        result["fit_rows"].append(dict(P=P, kind=kind, n=n, measured_s=measured, fitted_s=fitted,
                                       fitted_own_P_s=fitted_own))
        print(f"{P},{kind},{n},{measured:.4e},{fitted:.4e},{100 * (fitted - measured) / measured:+.1f},"
              f"{fitted_own:.4e},{100 * (fitted_own - measured) / measured:+.1f}")
    if args.compute:
        if args.mem_bw is None and args.kernel_bench is None:
            raise ModelError("--compute needs --kernel-bench CSV (its copy row) or --mem-bw GB/s")
        mem_bw = args.mem_bw * 1e9 if args.mem_bw else None
        if mem_bw is None:
            with open(args.kernel_bench, newline="") as f:
                # Kokkos may print warnings before the header: start at it.
                lines = f.read().splitlines()
            start = next((i for i, l in enumerate(lines) if l.startswith("kernel,")), len(lines))
            copy = [r for r in csv.DictReader(lines[start:]) if r.get("kernel") == "copy"]
            if not copy:
                raise ModelError(f"{args.kernel_bench}: no 'copy' row")
            mem_bw = float(copy[0]["gb_per_s"]) * 1e9
        comp_rows = [r for r in read_bench_csv(args.compute) if r["algo"] in METHODS]
        bad = [r for r in comp_rows if r["P"] != 1]
        if bad:
            raise ModelError(f"{args.compute}: the compute term needs a P = 1 run, found P = {bad[0]['P']}")
        passes = {r["algo"]: r["time_s_med"] * mem_bw / (4 * r["n"]) for r in comp_rows}
        result["compute"] = dict(mem_bw=mem_bw, passes=passes, source=args.compute)
        print(f"compute: memory bandwidth {mem_bw / 1e9:.2f} GB/s; passes over 4n bytes per call: "
              + ", ".join(f"{a} {p:.1f}" for a, p in passes.items()))
    result["cores"] = args.cores
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


def load_params(path):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise ModelError(f"cannot read {path}: {e.strerror}")
    except json.JSONDecodeError as e:
        raise ModelError(f"{path} is not JSON: {e}")


def network(args, params):
    if getattr(args, "profile", None):
        p = PROFILES[args.profile]
        return p["alpha"], 1.0 / p["bandwidth"]
    if params is None:
        raise ModelError("give --params (from fit) or --profile")
    return params["alpha"], params["beta"]


def distributions(spec):
    if not spec:
        return None
    if ":" not in spec:
        raise ModelError(f"--counts wants TRACE:BENCH_CSV, got '{spec}'")
    trace, bench = spec.split(":", 1)
    return Distributions(trace, bench)


def cmd_predict(args):
    params = load_params(args.params) if args.params else None
    alpha, beta = network(args, params)
    dist = distributions(args.counts)
    if dist is not None:
        print(dist.describe())
    print("algo,P,n,k,comm_s,compute_s,time_s,amortized_extra_s")
    for algo in args.algo.split(","):
        r = predict_row(algo, args.P, args.n, args.density, alpha, beta, params or {}, dist,
                        args.cores, args.mem_bw * 1e9 if args.mem_bw else None)
        print(f"{algo},{r['P']},{r['n']},{r['k']},{r['comm_s']:.4e},{r['compute_s']:.4e},"
              f"{r['time_s']:.4e},{r['amortized_extra_s']:.3e}")


def cmd_validate(args):
    params = load_params(args.params)
    alpha, beta = params["alpha"], params["beta"]
    cores = args.cores if args.cores is not None else params.get("cores")
    dist = distributions(args.counts)
    if dist is not None:
        print(dist.describe())
    wanted = set(args.algo.split(",")) if args.algo else None
    print("algo,P,n,measured_s,predicted_s,comm_s,compute_s,error_pct")
    worst = 0.0
    count = 0
    for path in args.runs:
        for row in read_bench_csv(path):
            if wanted is not None and row["algo"] not in wanted:
                continue
            own = params.get("per_P", {}).get(str(row["P"])) if args.per_p else None
            a, b = (own["alpha"], own["beta"]) if own else (alpha, beta)
            r = predict_row(row["algo"], row["P"], row["n"], row["density"], a, b, params,
                            dist, cores)
            err = 100 * (r["time_s"] - row["time_s_med"]) / row["time_s_med"]
            worst = max(worst, abs(err))
            count += 1
            flag = "" if abs(err) <= args.tolerance else "  <-- over tolerance"
            print(f"{row['algo']},{row['P']},{row['n']},{row['time_s_med']:.4e},{r['time_s']:.4e},"
                  f"{r['comm_s']:.4e},{r['compute_s']:.4e},{err:+.1f}{flag}")
    if count == 0:
        raise ModelError("no rows to validate")
    print(f"# {count} rows, largest |error| {worst:.1f}% (tolerance {args.tolerance:g}%)")
    return 0 if worst <= args.tolerance else 1


def rate_bytes_per_s(rate):
    """tc's rate syntax (1gbit, 100mbit, 10gbit) in bytes per second."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for unit, scale in units.items():
        if rate.lower().endswith(unit):
            try:
                return float(rate[: -len(unit)]) * scale / 8
            except ValueError:
                break
    raise ModelError(f"rate '{rate}' is not NUMBER followed by kbit, mbit or gbit")


def cmd_table(args):
    """Measured time per call beside the alpha-beta prediction (each P's own fit) and the
    counted floor (floor_terms: latency + memory + wire)."""
    params = load_params(args.params)
    cores = args.cores if args.cores is not None else params.get("cores")
    mem_bw = args.mem_bw * 1e9
    link = rate_bytes_per_s(args.rate)
    dist = distributions(args.counts)
    rows = [r for path in args.runs for r in read_bench_csv(path)]
    if not rows:
        raise ModelError("no rows in the runs given")
    dense = {(r["P"], r["n"], r["density"]): r["time_s_med"] for r in rows if r["algo"] == "dense"}
    print("| method | P | n | density | measured s | predicted s | error % | floor s | "
          "measured / floor | dominant | dense / method |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    order = {a: i for i, a in enumerate(METHODS + ["mpi_allreduce"])}
    rows.sort(key=lambda r: (r["P"], r["n"], -r["density"], order.get(r["algo"], 99)))
    for r in rows:
        P, n, density = r["P"], r["n"], r["density"]
        own = params.get("per_P", {}).get(str(P))
        a, b = (own["alpha"], own["beta"]) if own else (params["alpha"], params["beta"])
        pred = predict_row(r["algo"], P, n, density, a, b, params, dist, cores)["time_s"]
        share = mem_bw / max(1.0, P / cores) if cores else mem_bw
        r.update(alpha=a, mem_share=share, floor_terms=floor_terms(r, a, share, link))
        floor = sum(r["floor_terms"].values())
        dominant = max(r["floor_terms"], key=r["floor_terms"].get)
        d = dense.get((P, n, density))
        speedup = f"{d / r['time_s_med']:.1f}" if d else "-"
        err = 100 * (pred - r["time_s_med"]) / r["time_s_med"]
        print(f"| {r['algo']} | {P} | 2^{int(round(math.log2(n)))} | {density:g} | "
              f"{r['time_s_med']:.4f} | {pred:.4f} | {err:+.0f} | {floor:.4f} | "
              f"{r['time_s_med'] / floor:.2f} | {dominant} | {speedup} |")
    if args.note:
        print()
        print(floor_note(rows, link, *args.note))
    return 0


def floor_note(rows, link, P, n, density):
    """A paragraph on Ok-Topk's and dense's floors at one (P, n, density) of the table, wrapped
    as docs/benchmarks.md's text is."""
    at = {r["algo"]: r for r in rows if (r["P"], r["n"], r["density"]) == (P, n, density)}
    if "oktopk" not in at or "dense" not in at:
        raise ModelError(f"--note: no oktopk and dense rows at P = {P}, n = {n}, "
                         f"density {density:g}")
    ok, dn = at["oktopk"], at["dense"]
    terms = ok["floor_terms"]
    floor = {a: sum(at[a]["floor_terms"].values()) for a in ("oktopk", "dense")}
    rounds = floor_rounds("oktopk", P)
    text = (
        f"At P = {P}, n = 2^{int(round(math.log2(n)))}, density {density:g}, Ok-Topk's floor is "
        f"{floor['oktopk'] * 1e3:.1f} ms: latency {terms['latency'] * 1e3:.1f} ms ({rounds} rounds "
        f"at α = {ok['alpha'] * 1e3:.2f} ms), memory {terms['memory'] * 1e3:.1f} ms "
        f"({FLOOR_PASSES['oktopk']} passes of {4 * n / 2**20:g} MiB at "
        f"{ok['mem_share'] / 1e9:.2f} GB/s), wire {terms['wire'] * 1e3:.1f} ms "
        f"({ok['bytes_per_rank_avg']:,.0f} bytes at {link / 1e6:g} MB/s); "
        f"{max(terms, key=terms.get)} dominates. Measured / floor: Ok-Topk "
        f"{ok['time_s_med'] / floor['oktopk']:.2f} ({ok['time_s_med']:.4f} s), dense "
        f"{dn['time_s_med'] / floor['dense']:.2f} ({dn['time_s_med']:.4f} s against "
        f"{floor['dense']:.4f} s, of which {max(dn['floor_terms'], key=dn['floor_terms'].get)} "
        f"{max(dn['floor_terms'].values()):.4f} s).")
    return textwrap.fill(text, width=96, break_on_hyphens=False)


def cmd_scale(args):
    params = load_params(args.params) if args.params else {}
    dist = distributions(args.counts)
    Ps = [2 ** e for e in range(int(math.log2(args.min_p)), int(math.log2(args.max_p)) + 1)]
    methods = args.algo.split(",")
    os.makedirs(args.out_dir, exist_ok=True)
    rows = []
    for model, spec in MODELS.items():
        for profile, net in PROFILES.items():
            alpha, beta = net["alpha"], 1.0 / net["bandwidth"]
            for P in Ps:
                for algo in methods:
                    r = predict_row(algo, P, spec["n"], spec["density"], alpha, beta, params, dist,
                                    None, args.mem_bw * 1e9)
                    r.update(model=model, profile=profile, density=spec["density"])
                    rows.append(r)
    with_dense = {(r["model"], r["profile"], r["P"]): r for r in rows if r["algo"] == "dense"}
    path = os.path.join(args.out_dir, args.prefix + ".csv")
    with open(path, "w") as f:
        f.write("model,n,density,profile,P,algo,k,comm_s,compute_s,time_s,amortized_extra_s,"
                "dense_over_method_comm,dense_over_method_time\n")
        for r in rows:
            d = with_dense.get((r["model"], r["profile"], r["P"]))
            rc = d["comm_s"] / r["comm_s"] if d and r["comm_s"] > 0 else float("nan")
            rt = d["time_s"] / r["time_s"] if d and r["time_s"] > 0 else float("nan")
            f.write(f"{r['model']},{r['n']},{r['density']},{r['profile']},{r['P']},{r['algo']},"
                    f"{r['k']},{r['comm_s']:.5e},{r['compute_s']:.5e},{r['time_s']:.5e},"
                    f"{r['amortized_extra_s']:.3e},{rc:.3f},{rt:.3f}\n")
    print(f"wrote {path}")
    if args.no_plots:
        return 0
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ModelError("PNG plots need matplotlib (Debian: apt-get install python3-matplotlib), "
                         "or pass --no-plots")
    for model, spec in MODELS.items():
        fig, axes = plt.subplots(1, len(PROFILES), figsize=(13, 3.6), sharey=True)
        for ax, profile in zip(axes, PROFILES):
            for algo in methods:
                pts = [r for r in rows if r["model"] == model and r["profile"] == profile and r["algo"] == algo]
                ax.plot([r["P"] for r in pts], [r[args.plot] for r in pts], marker="o", ms=3, label=algo)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{profile}", fontsize=10)
            ax.set_xlabel("P (ranks, one per node)")
            ax.grid(True, which="both", alpha=0.3)
        axes[0].set_ylabel(f"{'communication' if args.plot == 'comm_s' else 'time'} per call (s)")
        axes[-1].legend(fontsize=7, loc="best")
        fig.suptitle(f"{model}: n = {spec['n'] / 1e6:g}M, density {spec['density']:g}, weak scaling "
                     f"(alpha-beta model, scripts/alphabeta.py)", fontsize=10)
        fig.tight_layout()
        png = os.path.join(args.out_dir, f"{args.prefix}-{model}.png")
        fig.savefig(png, dpi=args.dpi)
        plt.close(fig)
        print(f"wrote {png} ({os.path.getsize(png) // 1024} KiB)")
    return 0


def cmd_validate2(args):
    params = load_params(args.params)
    cores = args.cores if args.cores is not None else params.get("cores")
    runs = [read_node_run(path) for path in args.runs]
    bed = Bed(runs, params, args.fit_rate, cores)
    print(f"# the bed: {cores} cores; copy bandwidth {bed.mem_bw / 1e9:.2f} GB/s; inside a host "
          f"{bed.shm_bw / 1e9:.2f} GB/s (fitted on {len(bed.phases)} node_reduce_scatter phases)")
    print("# alpha: " + ", ".join(f"{1e3 * a:.2f} ms at P = {P}" for P, a in sorted(bed.alpha.items()))
          + " (fitted on the flat rows)")
    print("# compute passes over 4n bytes: "
          + ", ".join(f"{algo} {p:.2f}" for algo, p in sorted(bed.passes.items())))
    for r in runs:
        if r["validation"]:
            n, seconds = r["validation"]
            pred = sum_time(bed.predict("dense", r["P"], r["per_host"], r["rate"], n, 0.01, False))
            print(f"# not a row: netbench's validation call on the {r['hosts']} x {r['per_host']} "
                  f"bed at {r['rate']} (dense, n = {n}): measured {seconds:.4f} s, predicted "
                  f"{pred:.4f} s ({100 * (pred - seconds) / seconds:+.1f}%)")
    if args.markdown:
        print("| link | hosts x ranks | method | mode | measured s | predicted s | comm s | "
              "compute s | error % |")
        print("|---|---|---|---|---|---|---|---|---|")
    else:
        print("rate,hosts,ranks_per_host,algo,mode,measured_s,predicted_s,comm_s,compute_s,error_pct")
    worst = 0.0
    for r in runs:
        p = bed.predict(r["algo"], r["P"], r["per_host"], r["rate"], r["n"], r["density"],
                        r["hierarchical"])
        predicted = sum_time(p)
        err = 100 * (predicted - r["time_s_med"]) / r["time_s_med"]
        worst = max(worst, abs(err))
        flag = "" if abs(err) <= args.tolerance else "  <-- over tolerance"
        if args.markdown:
            print(f"| {r['rate']} | {r['hosts']} x {r['per_host']} | {r['algo']} | {p['mode']} | "
                  f"{r['time_s_med']:.4f} | {predicted:.4f} | {p['comm_s']:.4f} | "
                  f"{p['compute_s']:.4f} | {err:+.1f}{' **over**' if flag else ''} |")
        else:
            print(f"{r['rate']},{r['hosts']},{r['per_host']},{r['algo']},{p['mode']},"
                  f"{r['time_s_med']:.4e},{predicted:.4e},{p['comm_s']:.4e},{p['compute_s']:.4e},"
                  f"{err:+.1f}{flag}")
    print(f"# {len(runs)} rows, largest |error| {worst:.1f}% (tolerance {args.tolerance:g}%)")
    return 0 if worst <= args.tolerance else 1


# The curves of scale2: (name, method, hierarchical). Dense is the hierarchical mode with a
# ring across the nodes: with no contention in the model, recursive halving would always beat
# the ring, which large allreduces at scale do not bear out.
CURVES2 = [("dense_hier_ring", "dense", True), ("oktopk_flat", "oktopk", False),
           ("oktopk_hier", "oktopk", True), ("topka_flat", "topka", False),
           ("topka_hier", "topka", True)]


def cmd_scale2(args):
    params = load_params(args.params)
    if "compute" not in params:
        raise ModelError(f"{args.params} has no compute passes (fit it with --compute)")
    passes = params["compute"]["passes"]
    dist = distributions(args.counts)
    Ps = [2 ** e for e in range(int(math.log2(args.min_p)), int(math.log2(args.max_p)) + 1)]
    rows = []
    for model, spec in MODELS2.items():
        for profile, net in NODE_PROFILES.items():
            m = Machine(**net)
            for P in Ps:
                for curve, algo, hierarchical in CURVES2:
                    options = {"node_allgather": args.node_allgather}
                    if algo == "dense":
                        options["dense_schedules"] = ("ring",)
                    r = predict2(algo, m, P, spec["n"], spec["density"], passes, dist,
                                 hierarchical, options)
                    r.update(model=model, profile=profile, curve=curve, density=spec["density"],
                             L=m.L, time_s=sum_time(r))
                    rows.append(r)
    dense = {(r["model"], r["profile"], r["P"]): r for r in rows if r["algo"] == "dense"}
    os.makedirs(os.path.dirname(args.csv) or ".", exist_ok=True)
    with open(args.csv, "w") as f:
        f.write("model,n,density,profile,ranks_per_node,P,nodes,curve,algo,mode,k,comm_s,"
                "compute_s,time_s,amortized_extra_s,dense_over_curve_time\n")
        for r in rows:
            d = dense[(r["model"], r["profile"], r["P"])]
            f.write(f"{r['model']},{r['n']},{r['density']},{r['profile']},{r['L']},{r['P']},"
                    f"{r['P'] // r['L']},{r['curve']},{r['algo']},{r['mode']},{r['k']},"
                    f"{r['comm_s']:.5e},{r['compute_s']:.5e},{r['time_s']:.5e},"
                    f"{r['amortized_extra_s']:.3e},{d['time_s'] / r['time_s']:.3f}\n")
    print(f"wrote {args.csv}")
    if not args.plots:
        return 0
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ModelError("PNG plots need matplotlib (Debian: apt-get install python3-matplotlib), "
                         "or leave out --plots")
    styles = {"dense_hier_ring": ("k", "-"), "oktopk_flat": ("C0", "--"), "oktopk_hier": ("C0", "-"),
              "topka_flat": ("C1", "--"), "topka_hier": ("C1", "-")}
    for model, spec in MODELS2.items():
        fig, axes = plt.subplots(1, len(NODE_PROFILES), figsize=(13, 3.8), sharey=True)
        for ax, (profile, net) in zip(axes, NODE_PROFILES.items()):
            for curve, _, _ in CURVES2:
                pts = [r for r in rows if r["model"] == model and r["profile"] == profile
                       and r["curve"] == curve]
                color, line = styles[curve]
                ax.plot([r["P"] for r in pts], [r[args.plot] for r in pts], color=color,
                        linestyle=line, marker="o", ms=3, label=curve)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{profile} ({net['L']} per node)", fontsize=10)
            ax.set_xlabel("P (ranks)")
            ax.grid(True, which="both", alpha=0.3)
        axes[0].set_ylabel(f"{'communication' if args.plot == 'comm_s' else 'time'} per call (s)")
        axes[-1].legend(fontsize=7, loc="best")
        fig.suptitle(f"{model}: n = {spec['n'] / 1e6:g}M, density {spec['density']:g}, weak "
                     f"scaling, two levels (alpha-beta model, scripts/alphabeta.py scale2)",
                     fontsize=10)
        fig.tight_layout()
        png = f"{args.plots}-{model}.png"
        fig.savefig(png, dpi=args.dpi)
        plt.close(fig)
        print(f"wrote {png} ({os.path.getsize(png) // 1024} KiB)")
    return 0


def note_row(text):
    """--note's P:N:DENSITY, as (int, int, float) to match read_bench_csv's rows."""
    try:
        P, n, density = text.split(":")
        return int(P), int(n), float(density)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not P:N:DENSITY (4:16777216:0.01)")


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="alphabeta.py", description=__doc__.split("\n\n")[0],
        epilog="The model's assumptions are in the script's docstring (python3 -c 'import pydoc; "
               "pydoc.help(\"scripts/alphabeta.py\")' or read the file).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("fit", help="fit alpha, beta (and the compute term) from bed runs")
    p.add_argument("--network", nargs="+", required=True, metavar="CSV",
                   help="oktopk-bench --format csv outputs (runs with --mpi-baseline at several n, P)")
    p.add_argument("--algo", default="mpi_allreduce", help="rows fitted (default mpi_allreduce)")
    p.add_argument("--small", nargs="+", metavar="CSV",
                   help="oktopk-bench --phases CSVs whose 'check' phase (a 32-byte allreduce per "
                        "call) adds small-message rows")
    p.add_argument("--compute", metavar="CSV", help="an oktopk-bench CSV of every method at P = 1")
    p.add_argument("--kernel-bench", metavar="CSV", help="oktopk-kernel-bench CSV (the copy row's GB/s)")
    p.add_argument("--mem-bw", type=float, metavar="GB/s", help="memory bandwidth instead of --kernel-bench")
    p.add_argument("--cores", type=int, default=None,
                   help="cores the bed's ranks share (compute slows by max(1, P/cores))")
    p.add_argument("--out", required=True, help="JSON file to write")

    p = sub.add_parser("predict", help="time per call of each method at one P, n, density")
    p.add_argument("--allgatherv", choices=["ring", "doubling", "min"], default="min",
                   help="allgather(v) schedule (default min: the cheaper, as a tuned MPI picks)")
    p.add_argument("--params", help="JSON from fit (alpha, beta, compute)")
    p.add_argument("--profile", choices=sorted(PROFILES), help="a network profile instead of the fit")
    p.add_argument("--P", type=int, required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--density", type=float, default=0.01)
    p.add_argument("--algo", default=",".join(METHODS))
    p.add_argument("--counts", metavar="TRACE:CSV", help="measured count distributions (a --trace and its CSV)")
    p.add_argument("--cores", type=int, default=None, help="ranks share this many cores (the bed)")
    p.add_argument("--mem-bw", type=float, metavar="GB/s", help="memory bandwidth for the compute term")

    p = sub.add_parser("validate", help="predictions against measured oktopk-bench runs")
    p.add_argument("--allgatherv", choices=["ring", "doubling", "min"], default="min",
                   help="allgather(v) schedule (default min: the cheaper, as a tuned MPI picks)")
    p.add_argument("--params", required=True)
    p.add_argument("--counts", metavar="TRACE:CSV", help="measured count distributions")
    p.add_argument("--algo", help="comma list of methods to compare (default every row)")
    p.add_argument("--cores", type=int, default=None, help="default: the fit's --cores")
    p.add_argument("--tolerance", type=float, default=25.0, help="percent (default 25)")
    p.add_argument("--per-p", action="store_true",
                   help="use the alpha, beta fitted at each run's own P (the bed's links share the "
                        "machine's cores, so its effective network changes with P)")
    p.add_argument("runs", nargs="+", metavar="CSV", help="oktopk-bench CSV outputs of bed runs")

    p = sub.add_parser("table", help="measured bed runs beside their predictions and a counted "
                                     "floor (markdown)")
    p.add_argument("--allgatherv", choices=["ring", "doubling", "min"], default="min",
                   help="allgather(v) schedule (default min: the cheaper, as a tuned MPI picks)")
    p.add_argument("--params", required=True, help="JSON from fit on the same bed and rate")
    p.add_argument("--rate", required=True, help="the links' rate in tc syntax (1gbit, 10gbit)")
    p.add_argument("--mem-bw", type=float, required=True, metavar="GB/s",
                   help="the machine's memory bandwidth (oktopk-kernel-bench's copy row); each "
                        "rank's share is this / max(1, P / cores)")
    p.add_argument("--counts", metavar="TRACE:CSV", help="measured count distributions")
    p.add_argument("--cores", type=int, default=None, help="default: the fit's --cores")
    p.add_argument("--note", type=note_row, metavar="P:N:DENSITY",
                   help="after the table, a paragraph on Ok-Topk's and dense's floors there")
    p.add_argument("runs", nargs="+", metavar="CSV", help="oktopk-bench CSV outputs of bed runs")

    p = sub.add_parser("scale", help="weak-scaling CSV and PNG for VGG-16 and BERT-base sizes")
    p.add_argument("--allgatherv", choices=["ring", "doubling", "min"], default="min",
                   help="allgather(v) schedule (default min: the cheaper, as a tuned MPI picks)")
    p.add_argument("--params", help="JSON from fit (for the compute passes)")
    p.add_argument("--counts", metavar="TRACE:CSV", help="measured count distributions")
    p.add_argument("--algo", default=",".join(METHODS))
    p.add_argument("--min-p", type=int, default=16)
    p.add_argument("--max-p", type=int, default=4096)
    p.add_argument("--mem-bw", type=float, default=500.0, metavar="GB/s",
                   help="device memory bandwidth of the compute term (default 500, a P100's HBM2)")
    p.add_argument("--plot", choices=["comm_s", "time_s"], default="comm_s")
    p.add_argument("--out-dir", default=".")
    p.add_argument("--prefix", default="scaling")
    p.add_argument("--dpi", type=int, default=80)
    p.add_argument("--no-plots", action="store_true")

    p = sub.add_parser("validate2", help="the two-level model against the bed's runs with several "
                                         "ranks per host (flat and hierarchical)")
    p.add_argument("--allgatherv", choices=["ring", "doubling", "min"], default="min",
                   help="allgather(v) schedule (default min: the cheaper, as a tuned MPI picks)")
    p.add_argument("--params", required=True,
                   help="JSON from fit on the same machine, one rank per host (beta per P, the "
                        "compute term)")
    p.add_argument("--fit-rate", required=True, help="the links' rate --params was fitted at (tc syntax)")
    p.add_argument("--cores", type=int, default=None, help="default: the fit's --cores")
    p.add_argument("--tolerance", type=float, default=25.0, help="percent (default 25)")
    p.add_argument("--markdown", action="store_true", help="the rows as a markdown table")
    p.add_argument("runs", nargs="+", metavar="TXT",
                   help="runs of data/link-data/hierarchical/run.sh (oktopk-bench --phases under "
                        "netbench --ranks-per-host), including each bed's first (its validation call)")

    p = sub.add_parser("scale2", help="two-level weak-scaling CSV and PNG: flat and hierarchical "
                                      "modes on nodes of several GPUs")
    p.add_argument("--allgatherv", choices=["ring", "doubling", "min"], default="min",
                   help="allgather(v) schedule (default min: the cheaper, as a tuned MPI picks)")
    p.add_argument("--params", required=True, help="JSON from fit (for the compute passes)")
    p.add_argument("--counts", metavar="TRACE:CSV",
                   help="measured count distributions (default: exactly k/P per destination and "
                        "k entries gathered)")
    p.add_argument("--min-p", type=int, default=16)
    p.add_argument("--max-p", type=int, default=4096)
    p.add_argument("--plot", choices=["comm_s", "time_s"], default="time_s",
                   help="what the plots show (default time_s: the mode changes the computation too)")
    p.add_argument("--node-allgather", choices=["direct", "mpi"], default="direct",
                   help="the hierarchical mode's allgather inside the node: direct (default, as "
                        "the code makes it: every shard to every peer at once, as its "
                        "reduce-scatter) or mpi (MPI_Allgatherv, ring or recursive doubling), "
                        "for comparison")
    p.add_argument("--csv", required=True, metavar="PATH", help="CSV file to write")
    p.add_argument("--plots", metavar="PREFIX", help="write PREFIX-MODEL.png for each model")
    p.add_argument("--dpi", type=int, default=80)

    args = parser.parse_args(argv)
    if hasattr(args, "allgatherv"):
        ALLGATHERV["algorithm"] = args.allgatherv
    try:
        if args.command == "fit":
            return cmd_fit(args) or 0
        if args.command == "table":
            return cmd_table(args)
        if args.command == "predict":
            if args.P < 1 or args.n < 1 or not 0 <= args.density <= 1:
                raise ModelError("need P >= 1, n >= 1, 0 <= density <= 1")
            return cmd_predict(args) or 0
        if args.command == "validate":
            return cmd_validate(args)
        if args.command == "scale":
            if args.min_p < 2 or args.max_p < args.min_p:
                raise ModelError("need 2 <= --min-p <= --max-p")
            return cmd_scale(args)
        if args.command == "validate2":
            return cmd_validate2(args)
        if args.command == "scale2":
            if args.min_p < 16 or args.max_p < args.min_p:
                raise ModelError("need 16 <= --min-p <= --max-p (powers of two)")
            return cmd_scale2(args)
    except ModelError as e:
        print(f"alphabeta.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
