# SPDX-License-Identifier: BSD-3-Clause
"""oktopk.Handle from Python at any number of ranks: every method's result is the same bits on
every rank, in place equals out of place, dense is the mean, errors are exceptions (the same
kind on every rank where the library agrees on them, and never a hang when one rank alone passes
a bad array), torch tensors are reduced in place, states round-trip, and asynchronous calls on
four handles at once, completed out of order, equal the same calls made blocking; sparse
results are the entries of the dense ones, and reduce_scatter returns their slices; gradients
whose magnitudes tie still keep k entries.

Run: mpiexec -n P python3 -m mpi4py test_handle.py (PYTHONPATH: the build's python folder)."""

import array
import gc
import math

import numpy as np
from mpi4py import MPI

import oktopk
from harness import (check, comm, finish, identical_on_all_ranks, import_torch, raises, rank,
                     size)

OPTIONS = {"density": 0.02, "threshold_period": 4, "repartition_period": 8}


def gradient(r, n, call):
    """Rank r's gradient for a call: small noise over a few large entries, distinct per rank
    and call (deterministic)."""
    rng = np.random.default_rng([r, call, n])
    g = rng.uniform(-0.5, 0.5, n).astype(np.float32)
    big = rng.random(n) < 1.0 / 37
    g[big] = (8.0 * g[big] + np.sign(g[big]) * 4.0).astype(np.float32)
    return g


def test_method(method, n):
    a = oktopk.Handle(comm, method, n, **OPTIONS)
    b = oktopk.Handle(comm, method, n, **OPTIONS)
    check(a.algorithm == method and a.n == n and a.k == math.floor(0.02 * n),
          f"{method}: algorithm, n, k")
    check(repr(a).startswith(f"<oktopk.Handle {method} float32 n={n}"), f"{method}: repr")
    same = identical = mean_ok = sparse_ok = True
    calls = 6
    for call in range(calls):
        grad = gradient(rank, n, call)
        kept = grad.copy()
        residual_before = a.residual()
        out = a.reduce(grad)
        if call < 2:
            # The residual is what the call held back: the average is the mean over ranks of
            # what each sent (residual before + gradient - residual after), for the methods
            # that sum what they select. Dense holds nothing back.
            residual = a.residual()
            sent = (residual_before.astype(np.float64) + grad) - residual
            mean = comm.allreduce(sent) / size
            if method == "dense":
                ok = residual.dtype == np.float32 and residual.shape == (n,) and not residual.any()
            elif method in ("topka", "topkdsa", "gaussiank", "oktopk"):
                ok = bool(np.all(np.abs(out - mean) <= 1e-5 * (1 + np.abs(mean))))
                ok &= bool(np.any(residual == 0))
            else:
                ok = residual.shape == (n,)
            check(ok, f"{method} n={n}: residual() after call {call}: what the call held back")
        inplace = grad.copy()
        returned = b.reduce_(inplace)
        same &= returned is inplace and np.array_equal(out.view(np.uint32),
                                                       inplace.view(np.uint32))
        same &= np.array_equal(grad, kept)  # grad only read
        identical &= identical_on_all_ranks(out)
        if method == "dense":
            mean = np.mean([gradient(r, n, call).astype(np.float64) for r in range(size)], 0)
            mean_ok &= bool(np.all(np.abs(out - mean) <= 1e-5 * (1 + np.abs(mean))))
        elif method != "s2":
            nonzeros = int(np.count_nonzero(out))
            sparse_ok &= 0 < nonzeros <= 2 * size * a.k
    check(same, f"{method}: in place equals out of place, grad unchanged")
    check(identical, f"{method}: the same bits on every rank")
    check(mean_ok and sparse_ok, f"{method}: dense is the mean, sparse keeps at most 2 P k")

    stats = a.stats()
    keys = {"iteration", "k", "local_selected", "global_selected", "bytes_sent",
            "bytes_received", "messages_sent", "messages_received", "seconds",
            "local_threshold", "global_threshold", "dense", "bytes_sent_between_nodes",
            "bytes_received_between_nodes", "selected_nothing", "reduce_scatter", "phases",
            "segments"}
    check(set(stats) == keys and stats["iteration"] == calls and stats["k"] == a.k
          and (size == 1 or stats["bytes_sent"] > 0) and stats["seconds"] >= 0
          and isinstance(stats["dense"], bool) and stats["dense"] == (method == "dense")
          and stats["segments"] == [],
          f"{method}: stats {stats}")
    check(phases_add_up(stats), f"{method}: the phases add up to the call's stats")

    # Save, reduce, restore, reduce the same gradient: the same output; then into the twin.
    grad = gradient(rank, n, calls)
    state = a.state_dict()
    first = a.reduce(grad)
    a.load_state_dict(state)
    again = a.reduce(grad)
    check(isinstance(state, bytes) and len(state) > 0 and np.array_equal(first, again),
          f"{method}: state_dict, reduce, load_state_dict, reduce gives the same output")
    b.load_state_dict(bytearray(a.state_dict()))
    grad = gradient(rank, n, calls + 1)
    check(np.array_equal(a.reduce(grad), b.reduce(grad)),
          f"{method}: a state moves to another handle")
    a.close()
    b.close()
    check(a.closed and raises(ValueError, a.reduce_, grad) is not None,
          f"{method}: a closed handle raises ValueError")


ROWS, WIDTH, DENSE = 30, 40, 801
LAYOUT = [("rows", ROWS * WIDTH, WIDTH, "embedding"), ("dense", DENSE)]


TOP_K_METHODS = ("topka", "topkdsa", "gtopk", "gaussiank", "oktopk")


def test_ties():
    """Gradients whose magnitudes tie: all ones on every rank, and values drawn from
    {-2, -1, 1, 2} per rank. Every call of a top-k method keeps entries from the first call on
    (all ones: exactly k, the first k indices on every rank), and stats() never reports an
    empty selection."""
    for method in TOP_K_METHODS:
        for n, density, dtype in ((1000, 0.1, np.float32), (10000, 0.01, np.float64)):
            k = math.floor(density * n)
            for inputs in ("ones", "levels"):
                h = oktopk.Handle(comm, method, n, density=density, dtype=dtype.__name__)
                counts = []
                for call in range(6):
                    if inputs == "ones":
                        grad = np.ones(n, dtype=dtype)
                    else:
                        draw = np.random.default_rng(1000 * rank + call)
                        grad = draw.choice(np.array([-2, -1, 1, 2], dtype=dtype), n)
                    out = h.reduce(grad)
                    counts.append(int(np.count_nonzero(out)))
                    stats = h.stats()
                    check(not stats["selected_nothing"] and stats["local_selected"] > 0,
                          f"{method} n={n} {inputs} call {call}: stats {stats}")
                wanted = all(c == k for c in counts) if inputs == "ones" else min(counts) > 0
                check(wanted, f"{method} n={n} density={density} {inputs}: non-zeros per call "
                              f"{counts} (k = {k})")
                h.close()


def fused_gradient(r, call):
    """A fused buffer's gradient: rank r touches one row in five (rows shifting with r and
    call), and every dense entry."""
    g = gradient(r, ROWS * WIDTH + DENSE, call)
    rows = np.arange(ROWS * WIDTH) // WIDTH
    g[:ROWS * WIDTH][(rows * 7 + r * 3 + call) % 5 != 0] = 0
    return g


PHASE_KEYS = ("bytes_sent", "bytes_received", "messages_sent", "messages_received",
              "bytes_sent_between_nodes", "bytes_received_between_nodes")


def phases_add_up(stats):
    """Whether the call's phases are named, each within range, and sum to the call's
    traffic, inside and between nodes."""
    phases = stats["phases"]
    ok = len(phases) > 0 and all(isinstance(name, str) and name for name in phases)
    for phase in phases.values():
        ok &= set(phase) == set(PHASE_KEYS) | {"seconds"} and phase["seconds"] >= 0
        ok &= 0 <= phase["bytes_sent_between_nodes"] <= phase["bytes_sent"]
        ok &= 0 <= phase["bytes_received_between_nodes"] <= phase["bytes_received"]
    return ok and all(sum(p[key] for p in phases.values()) == stats[key] for key in PHASE_KEYS)


def test_node_traffic():
    """Traffic inside and between nodes: nodes of one rank send every byte between nodes, one
    node none; with two ranks a node, the hierarchical mode's node phases stay inside the node
    and its method's phases cross between nodes only."""
    n = 4001
    settings = [{"node_size": 1}, {"node_size": size}]
    if size % 2 == 0:
        settings.append({"node_size": 2, "hierarchical": "on"})
    for setting in settings:
        handle = oktopk.Handle(comm, "oktopk", n, density=0.01, **setting)
        for call in range(3):
            handle.reduce(gradient(rank, n, call))
        stats = handle.stats()
        ok = phases_add_up(stats) and (size == 1 or stats["bytes_sent"] > 0)
        between = (stats["bytes_sent_between_nodes"], stats["bytes_received_between_nodes"])
        if setting["node_size"] == 1:
            ok &= between == (stats["bytes_sent"], stats["bytes_received"])
        elif "hierarchical" not in setting:
            ok &= between == (0, 0)
        else:
            node = {name: p for name, p in stats["phases"].items() if name.startswith("node_")}
            ok &= set(node) == {"node_allgather", "node_reduce_scatter"}
            ok &= all(p["bytes_sent"] > 0 and p["bytes_sent_between_nodes"] == 0
                      and p["bytes_received_between_nodes"] == 0 for p in node.values())
            across = [p for name, p in stats["phases"].items()
                      if name not in node and name != "hierarchy_check"]
            ok &= all(p["bytes_sent_between_nodes"] == p["bytes_sent"]
                      and p["bytes_received_between_nodes"] == p["bytes_received"]
                      for p in across)
        check(ok, f"traffic inside and between nodes with {setting}: {stats}")
        handle.close()


def test_layout(method):
    """A handle with a layout: s2 averages the dense segment exactly, every other method gives
    the bits it gives without one; per-segment counts add up to the output's."""
    n = ROWS * WIDTH + DENSE
    fused = oktopk.Handle(comm, method, n, layout=LAYOUT, **OPTIONS)
    plain = oktopk.Handle(comm, method, n, **OPTIONS)
    check(fused.layout == [("rows", ROWS * WIDTH, WIDTH, "embedding"), ("dense", DENSE, "")]
          and plain.layout == [], f"{method}: the layout, normalised")
    before = fused.stats()["segments"]
    check([(s["name"], s["kind"], s["offset"], s["length"], s["row_width"], s["nonzeros"])
           for s in before] == [("embedding", "rows", 0, ROWS * WIDTH, WIDTH, 0),
                                ("", "dense", ROWS * WIDTH, DENSE, 1, 0)],
          f"{method}: segment stats before the first call {before}")
    values_ok = counts_ok = identical = True
    for call in range(5):
        grad = fused_gradient(rank, call)
        with_layout = fused.reduce(grad)
        without = plain.reduce(grad)
        identical &= identical_on_all_ranks(with_layout)
        if method == "s2":
            mean = np.mean([fused_gradient(r, call).astype(np.float64) for r in range(size)], 0)
            tail = slice(ROWS * WIDTH, n)
            values_ok &= bool(np.all(np.abs(with_layout[tail] - mean[tail])
                                     <= 1e-5 * (1 + np.abs(mean[tail]))))
        else:
            values_ok &= np.array_equal(with_layout.view(np.uint32), without.view(np.uint32))
        segments = fused.stats()["segments"]
        counts_ok &= [s["nonzeros"] for s in segments] == [
            int(np.count_nonzero(with_layout[:ROWS * WIDTH])),
            int(np.count_nonzero(with_layout[ROWS * WIDTH:]))]
        counts_ok &= sum(s["nonzeros"] for s in segments) == int(np.count_nonzero(with_layout))
    check(identical, f"{method} with a layout: the same bits on every rank")
    check(values_ok, f"{method} with a layout: " + (
        "the dense segment is the exact mean" if method == "s2" else "the bits without one"))
    check(counts_ok, f"{method} with a layout: per-segment non-zeros sum to the output's")
    fused.close()
    plain.close()


def test_layout_errors():
    """Bad layouts: ValueError or TypeError on every rank, also when one rank alone is wrong;
    layouts that differ across ranks: ValueError on every rank."""
    n = 100
    last = rank == size - 1
    good = [("rows", 60, 10), ("dense", 40)]
    bad_on_last = [
        (ValueError, [("rows", 60, 10), ("dense", -40)],
         f"oktopk.Handle: oktopk_create_typed: rank {size - 1}: segment 1: length must "
         "be >= 0, got -40"),
        (ValueError, [("rows", 60, 0), ("dense", 40)],
         f"oktopk.Handle: oktopk_create_typed: rank {size - 1}: segment 0: row width must "
         "be >= 1, got 0"),
        (ValueError, [("rows", 60, 10), ("dense", 39)],
         f"oktopk.Handle: oktopk_create_typed: rank {size - 1}: the segments cover "
         "[0, 99), not [0, n = 100)"),
        (ValueError, [("sparse", 60, 10), ("dense", 40)],
         "oktopk.Handle: layout[0]: the kind must be \"rows\" or \"dense\", not 'sparse'"),
        (TypeError, [("rows", 60), ("dense", 40)],
         "oktopk.Handle: layout[0]: a \"rows\" segment is ('rows', length, row_width[, name]), "
         "not ('rows', 60)"),
        (TypeError, [("rows", 60, 10.0), ("dense", 40)],
         "oktopk.Handle: layout[0]'s row_width must be an int, not float"),
        (TypeError, "rows", "oktopk.Handle: layout must be a list of segments, not str"),
    ]
    for kind, bad, message in bad_on_last:
        e = raises((TypeError, ValueError), oktopk.Handle, comm, "s2", n,
                   layout=bad if last else good)
        if last:
            ok = type(e) is kind and str(e) == message
        else:
            # The peers learn of it: C's own message, or the Python side's agreement.
            ok = isinstance(e, ValueError) and (
                str(e) == message or "rank " + str(size - 1) in str(e))
        check(ok, f"bad layout {bad!r} on the last rank: {e!r} on every rank")
    e = raises(ValueError, oktopk.Handle, comm, "topka", n,
               layout=[("rows", 60, 10, f"rank{rank}"), ("dense", 40)])
    if size > 1:
        check(e is not None and "layout" in str(e) and str(e).startswith("oktopk.Handle: "),
              f"layouts that differ across ranks: ValueError on every rank ({e})")


def test_arguments():
    n = 1000
    h = oktopk.Handle(n=n, algorithm="topka", density=0.05)  # comm defaults to COMM_WORLD
    check(h.comm is MPI.COMM_WORLD and h.n == n, "comm defaults to MPI.COMM_WORLD")
    good = gradient(rank, n, 0)

    # The wrong kind of array: TypeError, on every rank.
    for what, bad in [("float64", good.astype(np.float64)),
                      ("non-contiguous", np.repeat(good, 2)[::2]),
                      ("a list", list(good)),
                      ("big-endian float32", good.astype(">f4"))]:
        e = raises(TypeError, h.reduce_, bad)
        check(e is not None and str(e).startswith("oktopk.Handle.reduce_: "),
              f"reduce_ of {what} raises TypeError ({e})")
    e = raises(TypeError, h.reduce, good, good.astype(np.float64))
    check(e is not None and "out" in str(e), f"reduce into a float64 out raises TypeError ({e})")
    e = raises(ValueError, h.reduce_, good[:-1])
    check(e is not None and "elements" in str(e), f"a short array raises ValueError ({e})")
    readonly = good.copy()
    readonly.flags.writeable = False
    check(raises(ValueError, h.reduce_, readonly) is not None, "a read-only array: ValueError")
    out = h.reduce(readonly, np.empty((10, n // 10), np.float32))
    check(out.shape == (10, n // 10) and identical_on_all_ranks(out),
          "a read-only grad reduces into a 2-D out of n elements")
    buffer = array.array("f", good)
    h.reduce_(buffer)
    check(identical_on_all_ranks(np.asarray(buffer)) and np.count_nonzero(buffer) > 0,
          "an array.array of floats is reduced in place")
    overlap = np.zeros(n + 1, np.float32)
    check(raises(ValueError, h.reduce, overlap[1:], overlap[:-1]) is not None,
          "overlapping grad and out: ValueError")

    # One rank alone with a bad array: it gets TypeError, its peers ValueError, nobody hangs.
    if size > 1:
        bad = good.astype(np.float64) if rank == 0 else good.copy()
        kind = TypeError if rank == 0 else ValueError
        e = raises(kind, h.reduce_, bad)
        check(e is not None, f"rank 0 alone passing float64: {kind.__name__} here ({e})")
        bad = good[:-1].copy() if rank == size - 1 else good.copy()
        check(raises(ValueError, h.reduce_, bad) is not None,
              "the last rank alone passing a short array: ValueError everywhere")
        req = None
        bad = good.astype(np.float64) if rank == 0 else good.copy()
        try:
            req = h.reduce_async(bad)
            req.wait()
            ok = False
        except (TypeError, ValueError):
            ok = True
        check(ok, "reduce_async: rank 0 alone passing float64 fails everywhere")

    # NaN on one rank: ValueError on every rank, and the handle stays usable.
    grad = good.copy()
    if rank == size - 1:
        grad[n // 2] = np.nan
    e = raises(ValueError, h.reduce_, grad)
    check(e is not None and str(e).startswith("oktopk.Handle.reduce_: "),
          f"NaN on the last rank: ValueError on every rank ({e})")
    check(identical_on_all_ranks(h.reduce(good)), "the handle works after the NaN")
    grad = good.copy()
    if rank == 0:
        grad[3] = np.inf
    req = h.reduce_async(grad)
    e = raises(ValueError, req.wait)
    check(e is not None and str(e).startswith("oktopk.Request: "),
          f"Inf through reduce_async: ValueError from wait() on every rank ({e})")
    check(raises(ValueError, req.test) is not None and req.done,
          "test() of a failed request raises too")

    # Bad handles: ValueError on every rank.
    e = raises(ValueError, oktopk.Handle, comm, "nosuch", n)
    check(e is not None and str(e).startswith("oktopk.Handle: "), f"unknown method ({e})")
    check(raises(ValueError, oktopk.Handle, comm, "topka", n, no_such_option=1) is not None,
          "unknown option: ValueError")
    check(raises(ValueError, oktopk.Handle, comm, "topka", n, density=2.0) is not None,
          "density out of range: ValueError")
    if size > 1:
        e = raises(ValueError, oktopk.Handle, comm, "oktopk", n + rank)
        check(e is not None, f"n differing between ranks: ValueError on every rank ({e})")
        e = raises(ValueError, oktopk.Handle, comm, "topka", n, density=0.01 * (1 + rank))
        check(e is not None, f"options differing between ranks: ValueError ({e})")
    check(raises(TypeError, oktopk.Handle, comm, "topka") is not None, "n missing: TypeError")
    check(raises(TypeError, oktopk.Handle, "COMM_WORLD", "topka", n) is not None,
          "comm not a communicator: TypeError")
    check(raises(ValueError, oktopk.Handle, comm, "topka", n, balancing="on off") is not None,
          "an option value with a space: ValueError")
    if size > 1:
        # Argument errors Python finds itself, on the last rank only: every rank raises.
        last = rank == size - 1
        e = raises(ValueError, oktopk.Handle, comm, "topka", n,
                   balancing="on off" if last else "adaptive")
        check(e is not None and (last or f"rank {size - 1}" in str(e)),
              f"an option value with a space on rank {size - 1} alone: ValueError everywhere ({e})")
        e = raises((TypeError, ValueError), oktopk.Handle, comm, "topka", "n" if last else n)
        check(e is not None and isinstance(e, TypeError) == last,
              f"n of the wrong type on rank {size - 1} alone: TypeError there, ValueError "
              f"elsewhere ({e!r})")
    s2 = oktopk.Handle(comm, "s2", n, density=0.1, s2_error_feedback=True, seed=7)
    check(s2.algorithm == "s2", "a bool option becomes on/off")
    s2.close()

    # Bad states: an error on every rank, the handle unchanged.
    saved = h.state_dict()
    check(raises((ValueError, RuntimeError), h.load_state_dict, b"not a state") is not None,
          "a damaged state raises on every rank")
    check(raises(TypeError, h.load_state_dict, "text") is not None, "a str state: TypeError")
    if size > 1:
        state = b"garbage" if rank == 1 else saved
        check(raises((ValueError, RuntimeError), h.load_state_dict, state) is not None,
              "rank 1 alone with a damaged state: every rank raises")
    other = oktopk.Handle(comm, "topka", n + 1, density=0.05)
    check(raises(ValueError, other.load_state_dict, saved) is not None,
          "another handle's state: ValueError")
    h.load_state_dict(saved)
    other.close()
    h.close()


def test_torch():
    torch = import_torch()
    if torch is None:
        return
    n = 3000
    a = oktopk.Handle(comm, "oktopk", n, **OPTIONS)
    b = oktopk.Handle(comm, "oktopk", n, **OPTIONS)
    ok = True
    for call in range(4):
        grad = gradient(rank, n, call)
        t = torch.from_numpy(grad.copy()).requires_grad_(False)
        returned = a.reduce_(t)
        expected = b.reduce(grad)
        ok &= returned is t and np.array_equal(t.numpy(), expected)
    check(ok, "a float32 CPU tensor is reduced in place, as its numpy twin")
    grad = gradient(rank, n, 9)
    t = torch.from_numpy(grad.copy())
    out = a.reduce(t)
    check(isinstance(out, torch.Tensor) and identical_on_all_ranks(out),
          "reduce of a tensor returns a new tensor")
    e = raises(TypeError, a.reduce_, t.double())
    check(e is not None and "torch.float32" in str(e), f"a float64 tensor: TypeError ({e})")
    e = raises(TypeError, a.reduce_, torch.zeros(2 * n)[::2])
    check(e is not None and "contiguous" in str(e), f"a non-contiguous tensor: TypeError ({e})")
    req = a.reduce_async(torch.from_numpy(grad.copy()))
    check(isinstance(req.wait(), torch.Tensor), "reduce_async of a tensor returns the tensor")
    a.close()
    b.close()


def test_device_tensors():
    """Tensors off the host. This build's GPU, if any, takes tensors on it; a meta tensor, which
    has no memory, is refused everywhere, and in a CPU build so is a CUDA tensor (a stand-in:
    CPU torch makes none), as are sparse tensors: the rank that passes one raises TypeError,
    its peers ValueError naming that rank and the reason, in every form of reduce, and the
    handle is unchanged. In a CPU build the compiled stream entry, which CUDA tensors take,
    reduces host addresses on stream 0 to the bits of reduce."""
    torch = import_torch()
    if torch is None:
        return
    gpu_build = oktopk.backend() in ("Cuda", "HIP")
    check(oktopk.backend() in ("Serial", "OpenMP", "Threads", "Cuda", "HIP"),
          f"backend() names an execution space ({oktopk.backend()})")
    check((oktopk.device() >= 0) == gpu_build, f"device() is {oktopk.device()}, -1 without a GPU")
    device_pointers, reason = oktopk.gpu_aware_mpi()
    check(isinstance(device_pointers, bool) and isinstance(reason, str) and reason != "",
          f"gpu_aware_mpi() is (bool, reason): {(device_pointers, reason)}")
    cpu_build = oktopk.backend() in ("Serial", "OpenMP", "Threads")
    check(not cpu_build or (not device_pointers and "no GPU backend" in reason),
          f"gpu_aware_mpi() without a GPU: host memory as it is ({reason})")
    n = 2000
    h = oktopk.Handle(comm, "oktopk", n, **OPTIONS)
    twin = oktopk.Handle(comm, "oktopk", n, **OPTIONS)
    grad = torch.from_numpy(gradient(rank, n, 0))
    meta = torch.empty(n, device="meta")
    last = size - 1

    def refused_everywhere(what, bad_rank, reason, call):
        e = raises((TypeError, ValueError), call)
        if rank == bad_rank:
            ok = isinstance(e, TypeError) and reason in str(e)
        else:
            ok = isinstance(e, ValueError) and f"rank {bad_rank}: {reason}" in str(e)
        check(ok, f"{what}: TypeError on rank {bad_rank}, its reason on every rank ({e})")

    refused_everywhere("a meta grad on the last rank", last,
                       "grad is a tensor on meta: OkTopk reduces CPU tensors, and CUDA",
                       lambda: h.reduce_(meta if rank == last else grad.clone()))
    refused_everywhere("reduce_async of a meta tensor on rank 0", 0, "grad is a tensor on meta",
                       lambda: h.reduce_async(meta if rank == 0 else grad.clone()).wait())
    refused_everywhere("reduce_sparse of a meta grad on rank 0", 0, "grad is a tensor on meta",
                       lambda: h.reduce_sparse(meta if rank == 0 else grad.clone()))
    refused_everywhere("a CPU grad and a meta out on the last rank", last,
                       "grad is a tensor on cpu and out one on meta",
                       lambda: h.reduce(grad.clone(), meta if rank == last else None))
    refused_everywhere("a numpy grad and a meta out on rank 0", 0,
                       "grad must be a torch tensor on the GPU",
                       lambda: h.reduce(grad.numpy(), meta if rank == 0 else None))
    refused_everywhere("a sparse tensor on the last rank", last,
                       "grad must be a dense tensor, not a torch.sparse_coo one",
                       lambda: h.reduce_(grad.to_sparse() if rank == last else grad.clone()))
    out = h.reduce(grad)
    check(np.array_equal(out.numpy(), twin.reduce(grad.numpy())),
          "the handle is unchanged after the refused calls")
    if not gpu_build:
        # CPU torch makes no CUDA tensor: a host tensor that says it is on cuda:0 stands in.
        class OnGpu(torch.Tensor):
            @property
            def device(self):
                return torch.device("cuda", 0)

        on_gpu = torch.Tensor._make_subclass(OnGpu, grad.clone())
        refused_everywhere("a CUDA tensor in a CPU build on rank 0", 0,
                           f"grad is a tensor on cuda:0, but this OkTopk was built for "
                           f"{oktopk.backend()}, without a GPU",
                           lambda: h.reduce_(on_gpu if rank == 0 else grad.clone()))
        same = True
        for call in range(1, 4):
            g = gradient(rank, n, call)
            o = np.empty_like(g)
            if call < 3:
                h._handle.reduce_on_stream(g.ctypes.data, o.ctypes.data, 0)
            else:
                h._handle.reduce_on_stream_async(g.ctypes.data, o.ctypes.data, 0, g, o).wait()
            same &= np.array_equal(o, twin.reduce(g))
        check(same, "the stream entry on host addresses and stream 0, sync and async: the bits "
                    "of reduce")
        g = gradient(rank, n, 4)
        e = raises(ValueError, h._handle.reduce_on_stream, g.ctypes.data, g.ctypes.data,
                   1 if rank == last else 0)
        check(e is not None and f"rank {last}: " in str(e) and "stream" in str(e),
              f"a stream in a CPU build on the last rank: ValueError naming it ({e})")
    h.close()
    twin.close()


def test_sparse():
    """reduce_sparse returns the entries reduce writes, for every method, on arrays and on
    tensors; a bad array on one rank fails every rank's call."""
    n = 3001
    for method in oktopk.ALGORITHMS:
        a = oktopk.Handle(comm, method, n, **OPTIONS)
        b = oktopk.Handle(comm, method, n, **OPTIONS)
        ok = True
        for call in range(5):
            grad = gradient(rank, n, call)
            indices, values = a.reduce_sparse(grad)
            expected = b.reduce(grad)
            scattered = np.zeros(n, np.float32)
            scattered[indices] = values
            ok &= indices.dtype == np.int32 and values.dtype == np.float32
            ok &= bool(np.all(np.diff(indices) > 0)) and np.array_equal(scattered, expected)
            ok &= identical_on_all_ranks(scattered)
        check(ok, f"{method}: reduce_sparse returns reduce's entries, indices ascending")
        check(np.array_equal(a.residual(), b.residual()), f"{method}: reduce_sparse's residual")
        a.close()
        b.close()
    h = oktopk.Handle(comm, "oktopk", n, **OPTIONS)
    bad = np.zeros(n - 1 if rank == size - 1 else n, np.float32)
    e = raises(ValueError, h.reduce_sparse, bad)
    check(e is not None and str(e).startswith("oktopk.Handle.reduce_sparse: "),
          f"reduce_sparse of a short array on one rank: ValueError on every rank ({e})")
    torch = import_torch()
    if torch is None:
        h.close()
        return
    indices, values = h.reduce_sparse(torch.from_numpy(gradient(rank, n, 7)))
    check(isinstance(indices, torch.Tensor) and indices.dtype == torch.int32 and
          isinstance(values, torch.Tensor) and values.dtype == torch.float32,
          "reduce_sparse of a tensor returns tensors")
    h.close()


def test_async():
    """Four handles with calls in flight at once, completed out of order; their results equal
    the same calls made blocking on twin handles."""
    sizes = [4096, 1000, 2500, 777]
    methods = ["oktopk", "topka", "gaussiank", "dense"]
    handles = [oktopk.Handle(comm, m, n, **OPTIONS) for m, n in zip(methods, sizes)]
    twins = [oktopk.Handle(comm, m, n, **OPTIONS) for m, n in zip(methods, sizes)]
    equal = True
    order_ok = True
    for call in range(5):
        grads = [gradient(rank, n, call + 10 * i) for i, n in enumerate(sizes)]
        outs = [np.empty(n, np.float32) for n in sizes]
        inplace = [g.copy() for g in grads]
        reqs = [h.reduce_async(g, o) for h, g, o in zip(handles, grads, outs)]
        reqs.append(handles[0].reduce_async(inplace[0]))  # a second call on one handle
        # Out of order: the last first by wait(), one by polling test(), then the rest.
        order_ok &= reqs[4].wait() is inplace[0]
        while not reqs[2].test():
            pass
        order_ok &= reqs[2].done and reqs[2].test()
        for i in (3, 0, 1):
            order_ok &= reqs[i].wait() is outs[i]
        blocking = [t.reduce(g) for t, g in zip(twins, grads)]
        second = twins[0].reduce(grads[0])
        for o, e in zip(outs, blocking):
            equal &= np.array_equal(o.view(np.uint32), e.view(np.uint32))
        equal &= np.array_equal(inplace[0].view(np.uint32), second.view(np.uint32))
    check(order_ok, "requests complete out of order through test() and wait()")
    check(equal, "asynchronous results equal the blocking ones bit for bit")
    check(all(h.stats()["iteration"] == t.stats()["iteration"] for h, t in zip(handles, twins)),
          "the asynchronous handles counted the same calls")

    # A request keeps its array alive: nothing else refers to it here.
    req = handles[1].reduce_async(gradient(rank, sizes[1], 99))
    gc.collect()
    result = req.wait()
    expected = twins[1].reduce(gradient(rank, sizes[1], 99))
    check(np.array_equal(result, expected), "a request holds its array until it completes")
    # A request dropped unfinished completes anyway (its destructor waits).
    handles[2].reduce_async(gradient(rank, sizes[2], 98))
    twins[2].reduce(gradient(rank, sizes[2], 98))
    check(handles[2].state_dict() == twins[2].state_dict(),
          "a request dropped in flight completes (the handles' states agree)")
    for h in handles + twins:
        h.close()


def bfloat16_rounded(x):
    """float32 values rounded to bfloat16 (nearest, ties to even) and back; no NaN in x."""
    u = x.view(np.uint32).astype(np.uint64)
    kept = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return kept.astype(np.uint32).view(np.float32)


def test_wire():
    """wire="bf16" on the dense method: bfloat16 values, the same on every rank, within the
    documented bound of the mean; gtopk on it: the same on every rank, k entries; a wire that
    does not exist is refused on every rank."""
    n = 3001
    h = oktopk.Handle(comm, "dense", n, wire="bf16")
    grad = gradient(rank, n, 0)
    out = h.reduce(grad)
    grads = [gradient(r, n, 0).astype(np.float64) for r in range(size)]
    mean = np.mean(grads, 0)
    magnitude = np.mean(np.abs(grads), 0)
    check(np.array_equal(bfloat16_rounded(out), out) and identical_on_all_ranks(out),
          "wire=bf16: bfloat16 values, the same bits on every rank")
    # P roundings to bfloat16 and P in float per term, first order plus room (docs/reference.md,
    # "Values on the wire").
    bound = 1.01 * size * (2.0**-8 + 2.0**-24) * magnitude
    check(bool(np.all(np.abs(out - mean) <= bound)), "wire=bf16 within its bound of the mean")
    if size == 1:
        check(np.array_equal(out, bfloat16_rounded(grad)), "wire=bf16 at one rank: the rounding")
    h.close()
    h = oktopk.Handle(comm, "gtopk", n, wire="bf16", density=0.01)
    out = h.reduce(grad)
    check(identical_on_all_ranks(out) and np.count_nonzero(out) == h.stats()["global_selected"]
          and 0 < np.count_nonzero(out) <= int(0.01 * n), "gtopk on wire=bf16: k entries, the same "
          "on every rank")
    if size == 1:
        check(np.array_equal(out[out != 0], bfloat16_rounded(out[out != 0])),
              "gtopk on wire=bf16 at one rank: bfloat16 values")
    h.close()
    e = raises(ValueError, oktopk.Handle, comm, "gtopk", n, wire="fp8")
    check(e is not None and "wire='fp8' is not native, fp32, bf16 or fp16" in str(e),
          f"wire=fp8: {e}")


def test_reduce_scatter():
    """reduce_scatter returns reduce's slice, bit for bit for oktopk, for equal shards and given
    offsets, on arrays and CPU tensors; other methods and bad offsets fail on every rank."""
    n = 4000
    given = [r * (n // (2 * size)) for r in range(size)] + [n]
    check(oktopk.equal_shard_offsets(10, 4) == [0, 2, 5, 7, 10], "equal_shard_offsets")
    for method in ("oktopk", "topka", "topkdsa", "gaussiank", "dense"):
        a = oktopk.Handle(comm, method, n, **OPTIONS)
        b = oktopk.Handle(comm, method, n, **OPTIONS)
        ok = True
        for call in range(6):
            offsets = oktopk.equal_shard_offsets(n, size) if call % 2 == 0 else given
            grad = gradient(rank, n, call)
            out = a.reduce(grad)
            shard = b.reduce_scatter(grad, shard_offsets=None if call % 2 == 0 else offsets)
            part = out[offsets[rank]:offsets[rank + 1]]
            if method != "dense":
                ok &= shard.dtype == np.float32 and np.array_equal(shard.view(np.uint32),
                                                                   part.view(np.uint32))
            else:
                ok &= bool(np.all(np.abs(shard - part) <= 1e-5 * (1 + np.abs(part))))
        check(ok, f"{method}: reduce_scatter returns reduce's slice")
        check(b.stats()["reduce_scatter"] and not a.stats()["reduce_scatter"],
              f"{method}: stats()['reduce_scatter'] tells the calls apart")
    torch = import_torch()
    if torch is not None:
        h = oktopk.Handle(comm, "oktopk", n, **OPTIONS)
        twin = oktopk.Handle(comm, "oktopk", n, **OPTIONS)
        grad = torch.from_numpy(gradient(rank, n, 0))
        shard = h.reduce_scatter(grad)
        begin, end = oktopk.equal_shard_offsets(n, size)[rank:rank + 2]
        check(isinstance(shard, torch.Tensor) and
              torch.equal(shard, twin.reduce(grad.clone())[begin:end]),
              "reduce_scatter of a tensor: a tensor, reduce's slice")
    gtopk = oktopk.Handle(comm, "gtopk", n, **OPTIONS)
    e = raises(ValueError, gtopk.reduce_scatter, gradient(rank, n, 0))
    check(e is not None and "has no reduce-scatter" in str(e),
          f"reduce_scatter of gtopk: ValueError on every rank ({e})")
    h = oktopk.Handle(comm, "oktopk", n, **OPTIONS)
    if size > 1:
        bad = given if rank == size - 1 else oktopk.equal_shard_offsets(n, size)
        e = raises(ValueError, h.reduce_scatter, gradient(rank, n, 0), None, bad)
        check(e is not None and "different shard offsets" in str(e),
              f"reduce_scatter with offsets that differ: ValueError on every rank ({e})")
    short = [0, n] if rank == 0 else oktopk.equal_shard_offsets(n, size)
    e = raises((TypeError, ValueError), h.reduce_scatter, gradient(rank, n, 0), None, short)
    check(size == 1 and e is None or e is not None and "expected" in str(e),
          f"reduce_scatter with too few offsets on rank 0: an error on every rank ({e})")


def main():
    check(oktopk.version().count(".") == 2, "version")
    # The MPI compiled against is of the family mpi4py loaded (the import refuses others).
    loaded = MPI.Get_library_version()
    check(oktopk._mpi_family(oktopk.mpi_library()) is not None and
          oktopk._mpi_family(oktopk.mpi_library()) == oktopk._mpi_family(loaded),
          f"mpi_library: {oktopk.mpi_library()!r} against mpi4py's {loaded.splitlines()[0]!r}")
    check(oktopk._mpi_family("MPICH Version:\t4.0.2") == "MPICH" and
          oktopk._mpi_family("Open MPI v4.1.4, package: Debian") == "Open MPI" and
          oktopk._mpi_family("SMPI 3.32") is None, "the MPI families' names")
    # Kokkos' arguments go before the first handle, and only then.
    oktopk.initialize("--kokkos-disable-warnings")
    e = raises(RuntimeError, oktopk.initialize, "--kokkos-num-threads=1")
    check(e is not None and str(e).startswith("oktopk.initialize: "),
          f"Kokkos arguments once Kokkos runs: RuntimeError ({e})")
    for method in oktopk.ALGORITHMS:
        test_method(method, 5000)
    for method in oktopk.ALGORITHMS:
        test_layout(method)
    test_ties()
    test_layout_errors()
    test_node_traffic()
    test_arguments()
    test_torch()
    test_device_tensors()
    test_sparse()
    test_reduce_scatter()
    test_wire()
    test_async()
    # A handle left open: destroyed at exit, before MPI_Finalize.
    global leftover
    leftover = oktopk.Handle(comm, "topka", 100, density=0.1)
    finish()


if __name__ == "__main__":
    main()
