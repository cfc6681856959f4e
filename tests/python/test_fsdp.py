# SPDX-License-Identifier: BSD-3-Clause
"""FSDP2 (fully_shard) through OkTopk's reduce-scatter (oktopk.fsdp) at P >= 2, on a small MLP
and deterministic synthetic data: every unit's shard is, bit for bit, the matching slice of what
a twin handle's reduce() gives on the same gradients, and the ranks together send fewer bytes
(at P >= 4); FSDP's summed reduce-scatter is the averaged one times P; method dense with momentum correction trains as SGD with momentum on the whole
batch, within rounding; a checkpoint (shards, state) resumed in fresh objects continues
bit-identically (with momentum masking "held" and "sent", and through TopkA, Gaussian-k and
TopkDSA); bad settings, a gradient divide factor, a checkpoint of another model or on some
ranks only, and an optimizer the state cannot take over are refused on every rank. Skipped (rank 0 says so) in a
PyTorch whose fully_shard takes no custom reduce-scatter.

Run: mpiexec -n P python3 -m mpi4py test_fsdp.py (PYTHONPATH: the build's python folder)."""

import io
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist

import oktopk
from harness import check, comm, finish, raises, rank, size

try:
    from torch.distributed.fsdp import FSDPModule, fully_shard
except Exception:  # noqa: BLE001 -- torch 1.13's FSDP raises ValueError on Python 3.11
    FSDPModule = None
if FSDPModule is None or not hasattr(FSDPModule, "set_custom_reduce_scatter"):
    if rank == 0:
        print(f"test_fsdp.py: skipped: torch {torch.__version__} has no FSDP2 custom "
              "reduce-scatter", flush=True)
    sys.exit(0)

from oktopk.fsdp import OkTopkShardState  # noqa: E402 -- needs the FSDP2 just checked

IN, HIDDEN, CLASSES, BATCH = 64, 96, 10, 8
LR, MOMENTUM = 0.05, 0.9
_teacher = np.random.default_rng(7).standard_normal((IN, CLASSES)).astype(np.float32)


def make_model(seed=0, hidden=HIDDEN):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(IN, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, CLASSES))


def batch(step, of_rank=None):
    """A rank's batch of a step: the same on every run, distinct per rank and step."""
    rng = np.random.default_rng([4321, step, rank if of_rank is None else of_rank])
    x = rng.standard_normal((BATCH, IN)).astype(np.float32)
    return torch.from_numpy(x), torch.from_numpy(np.argmax(x @ _teacher, axis=1))


class Sharded:
    """An MLP sharded by fully_shard (each Linear a unit, the Sequential the root), SGD, and
    OkTopk's reduce-scatter."""

    def __init__(self, state, seed=0, hidden=HIDDEN, momentum=0.0):
        self.model = make_model(seed, hidden)
        for layer in (self.model[0], self.model[2]):
            fully_shard(layer)
        fully_shard(self.model)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LR, momentum=momentum)
        self.state = state
        if state is not None:
            self.names = state.attach(self.model)

    def step(self, step):
        x, y = batch(step)
        self.optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        self.optimizer.step()

    def shards(self):
        return [p.to_local().detach().clone() for p in self.model.parameters()]


class Twin:
    """Wraps a unit's reduce-scatter: before it runs, a twin handle reduces a copy of the same
    gradient; afterwards the shard must be the twin's slice, bit for bit."""

    checks = []

    def __init__(self, inner, density, start_iter):
        self.inner = inner
        self.density = density
        self.start_iter = start_iter
        self.handle = None
        self.twin_bytes = 0

    def allocate(self, shape, *, dtype, device):
        return self.inner.allocate(shape, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        if self.handle is None:
            self.handle = oktopk.Handle(comm, "oktopk", n=input_tensor.numel(),
                                        density=self.density,
                                        warmup_iterations=self.start_iter)
        expected = self.handle.reduce(input_tensor.clone())
        self.twin_bytes += self.handle.stats()["bytes_sent"]
        self.inner(output_tensor, input_tensor, group, op, async_op)
        length = output_tensor.numel()
        Twin.checks.append(torch.equal(output_tensor, expected[rank * length:
                                                               (rank + 1) * length]))


def test_shards_match_reduce():
    """Each unit's shard against a twin handle's reduce, at warm-up and after; bytes."""
    start_iter, steps = 1, 5
    state = OkTopkShardState(density=0.05, start_iter=start_iter)
    original = FSDPModule.set_custom_reduce_scatter
    twins = []

    def wrap(module, comm_object):
        twins.append(Twin(comm_object, 0.05, start_iter))
        original(module, twins[-1])

    Twin.checks = []
    FSDPModule.set_custom_reduce_scatter = wrap
    try:
        run = Sharded(state)
    finally:
        FSDPModule.set_custom_reduce_scatter = original
    sent = 0
    for step in range(steps):
        run.step(step)
        if step >= start_iter:
            sent += state.bytes_sent_last_iteration()
    check(run.names == ["", "0", "2"], f"attach's units: {run.names}")
    check(len(Twin.checks) == 2 * steps and all(Twin.checks),
          f"shards equal to reduce's slices: {Twin.checks}")
    stats = state.stats()
    check(sorted(stats) == ["0", "2"] and all(s["reduce_scatter"] and not s["dense"]
                                              for s in stats.values()),
          f"one handle per unit with parameters, its last call a sparse reduce-scatter: "
          f"{ {k: (s['reduce_scatter'], s['dense']) for k, s in stats.items()} }")
    twin_sent = sum(t.twin_bytes for t in twins)
    check(state.bytes_sent_last_iteration() == sum(s["bytes_sent"] for s in stats.values()),
          "bytes_sent_last_iteration sums the units")
    if size >= 4:
        total, twin_total = comm.allreduce(sent), comm.allreduce(twin_sent)
        check(total < twin_total, f"reduce-scatters sent {total} bytes over the ranks, "
                                  f"reduce {twin_total} (warm-up included)")


def test_dense_momentum_is_sgd():
    """Method dense with the optimizer's momentum taken over: SGD with momentum on the whole
    batch of every rank, within float32 rounding."""
    steps = 4
    optimizer_momentum = MOMENTUM
    run = Sharded(None, momentum=optimizer_momentum)
    state = OkTopkShardState(algorithm="dense", start_iter=0, optimizer=run.optimizer)
    run.state = state
    state.attach(run.model)
    check(all(g["momentum"] == 0.0 for g in run.optimizer.param_groups),
          "the optimizer's momentum is taken over")
    reference = make_model()
    sgd = torch.optim.SGD(reference.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(steps):
        run.step(step)
        sgd.zero_grad()
        losses = [torch.nn.functional.cross_entropy(reference(x), y)
                  for x, y in (batch(step, r) for r in range(size))]
        (sum(losses) / size).backward()
        sgd.step()
    full = [p.full_tensor() for p in run.model.parameters()]
    worst = max(float((a - b).detach().abs().max())
                for a, b in zip(full, reference.parameters()))
    check(worst < 1e-5, f"dense reduce-scatter with momentum correction off SGD by {worst}")
    check(all(s["reduce_scatter"] for s in state.stats().values()), "reduce_scatter stats")


def test_forced_sum():
    """FSDP's summed reduce-scatter (set_force_sum_reduction_for_comms, then its own division
    by P) trains as the averaged one, within rounding."""
    averaged, summed = Sharded(OkTopkShardState(density=0.05, start_iter=1)), \
        Sharded(OkTopkShardState(density=0.05, start_iter=1))
    for module in summed.model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)
    for step in range(3):
        averaged.step(step)
        summed.step(step)
    worst = max(float((a - b).abs().max()) for a, b in zip(averaged.shards(), summed.shards()))
    check(worst < 1e-6, f"summed and averaged reduce-scatters differ by {worst}")


def test_checkpoint(momentum, masking="auto", algorithm="oktopk"):
    """Train, save, train on; a fresh model and state loaded from the save train the same."""
    def make(seed=0):
        run = Sharded(None, seed=seed, momentum=momentum)
        settings = dict(optimizer=run.optimizer, momentum_masking=masking) if momentum else {}
        run.state = OkTopkShardState(algorithm=algorithm, density=0.05, start_iter=1,
                                     **settings)
        run.state.attach(run.model)
        return run

    first = make()
    for step in range(3):
        first.step(step)
    buffer = io.BytesIO()
    torch.save({"shards": first.shards(), "state": first.state.state_dict()}, buffer)
    for step in range(3, 6):
        first.step(step)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    second = make(seed=1)  # other initial values: all must come from the checkpoint
    with torch.no_grad():
        for parameter, shard in zip(second.model.parameters(), saved["shards"]):
            parameter.to_local().copy_(shard)
    second.state.load_state_dict(saved["state"])
    for step in range(3, 6):
        second.step(step)
    same = all(torch.equal(a, b) for a, b in zip(first.shards(), second.shards()))
    check(same, f"resumed from a checkpoint ({algorithm}, momentum {momentum}, masking "
                f"{masking}): the same shards")


def test_errors():
    for kind, call, what in (
            (ValueError, lambda: OkTopkShardState(algorithm="gtopk"), "gtopk"),
            (ValueError, lambda: OkTopkShardState(algorithm="s2"), "s2"),
            (ValueError, lambda: OkTopkShardState(density=0), "density 0"),
            (ValueError, lambda: OkTopkShardState(start_iter=-1), "start_iter -1"),
            (ValueError, lambda: OkTopkShardState(warmup_iterations=3), "warmup_iterations"),
            (ValueError, lambda: OkTopkShardState(momentum=1.0), "momentum 1"),
            (ValueError, lambda: OkTopkShardState().attach(make_model()), "no FSDP module"),
            (ValueError, lambda: OkTopkShardState().load_state_dict({"units": {}}),
             "not a state"),
            (ValueError, lambda: OkTopkShardState(density=0.1).load_state_dict(
                OkTopkShardState(density=0.2).state_dict()), "other settings")):
        error = raises(kind, call)
        check(error is not None and str(error).startswith("oktopk.fsdp.OkTopkShardState"),
              f"{what}: {error!r}")
    nesterov = torch.optim.SGD(make_model().parameters(), lr=LR, momentum=MOMENTUM,
                               nesterov=True)
    check(raises(ValueError, OkTopkShardState, optimizer=nesterov) is not None
          and nesterov.param_groups[0]["momentum"] == MOMENTUM,
          "nesterov refused, the optimizer left as it was")
    # A divide factor makes FSDP ask for a pre-multiplied sum: refused on every rank, also
    # after calls that were taken.
    run = Sharded(OkTopkShardState())
    run.step(0)
    for module in run.model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(size + 1.5)
    error = raises(RuntimeError, run.step, 1)
    check(error is not None and "reduce op" in str(error), f"divide factor: {error!r}")
    # A checkpoint of a model of other sizes: refused on every rank at the unit's first call.
    small = Sharded(OkTopkShardState(density=0.05))
    small.step(0)
    saved = small.state.state_dict()
    other = Sharded(OkTopkShardState(density=0.05), hidden=HIDDEN + 2 * size)
    other.state.load_state_dict(saved)
    error = raises(RuntimeError, other.step, 0)
    check(error is not None and "not the model the state was saved from" in str(error),
          f"another model's checkpoint: {error!r}")
    # A checkpoint loaded on rank 0 only: every rank raises at the unit's first call.
    if size > 1:
        partial = Sharded(OkTopkShardState(density=0.05))
        if rank == 0:
            partial.state.load_state_dict(saved)
        error = raises(RuntimeError, partial.step, 0)
        check(error is not None and "on some ranks only" in str(error),
              f"a checkpoint on rank 0 only: {error!r}")


def main():
    torch.set_num_threads(1)
    directory = tempfile.mkdtemp(prefix="oktopk_fsdp_") if rank == 0 else None
    directory = comm.bcast(directory, root=0)
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(directory, 'store')}",
                            rank=rank, world_size=size)
    try:
        test_shards_match_reduce()
        test_dense_momentum_is_sgd()
        test_forced_sum()
        test_checkpoint(momentum=0.0)
        test_checkpoint(momentum=MOMENTUM)
        test_checkpoint(momentum=MOMENTUM, masking="held")
        test_checkpoint(momentum=MOMENTUM, masking="sent")
        test_checkpoint(momentum=MOMENTUM, algorithm="topka")
        test_checkpoint(momentum=0.0, algorithm="gaussiank")
        test_checkpoint(momentum=MOMENTUM, masking="held", algorithm="topkdsa")
        test_errors()
    finally:
        comm.Barrier()
        dist.destroy_process_group()
        if rank == 0:
            shutil.rmtree(directory, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
