# SPDX-License-Identifier: BSD-3-Clause
"""What the Python test scripts share: checks agreed over ranks, and the closing summary.

A check passes only if it passes on every rank (an allreduce of the verdicts), so every rank
counts the same and the ranks never part ways over a test's outcome. Rank 0 prints
"N passed, N failed" at the end; the script exits non-zero on any failure.
"""

import hashlib
import sys
import traceback

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()
passed = 0
failed = 0


def check(ok, what):
    """Counts one check; it fails if it fails on any rank (this rank says why if it did)."""
    global passed, failed
    ok = bool(ok)
    if comm.allreduce(ok, op=MPI.LAND):
        passed += 1
    else:
        failed += 1
        if not ok:
            print(f"rank {rank}: FAILED: {what}", file=sys.stderr, flush=True)


def raises(kind, function, *args, **kwargs):
    """The exception ``function(*args, **kwargs)`` raised if it is a ``kind``, else None (an
    exception of another kind is printed, to explain the failing check)."""
    try:
        function(*args, **kwargs)
    except kind as error:
        return error
    except Exception:  # noqa: BLE001 -- reported, and the check fails
        traceback.print_exc()
    return None


def digest(*arrays):
    """A digest of the arrays' bytes (numpy arrays or torch tensors)."""
    h = hashlib.sha256()
    for a in arrays:
        if hasattr(a, "detach"):
            a = a.detach().cpu()
            if str(a.dtype) == "torch.bfloat16":  # numpy has no bfloat16: its bit patterns
                a = a.view(sys.modules["torch"].int16)
            a = a.numpy()
        h.update(a.tobytes())
    return h.hexdigest()


def identical_on_all_ranks(*arrays):
    """Whether the arrays hold the same bits on every rank."""
    return len(set(comm.allgather(digest(*arrays)))) == 1


def import_torch():
    """torch, or None (after saying so on rank 0) where it cannot be imported."""
    try:
        import torch
    except ImportError:
        if rank == 0:
            print("torch not importable: tensor checks skipped")
        return None
    return torch


def finish():
    """Prints the summary on rank 0 and exits, non-zero if any check failed."""
    if rank == 0:
        print(f"{passed} passed, {failed} failed", flush=True)
    sys.exit(1 if failed else 0)
