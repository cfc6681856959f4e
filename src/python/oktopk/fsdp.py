# SPDX-License-Identifier: BSD-3-Clause
"""Sharded data parallelism: PyTorch FSDP2 (``fully_shard``) with OkTopk's reduce-scatter.

    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from oktopk.fsdp import OkTopkShardState

    dist.init_process_group("gloo", ...)          # over the ranks of MPI.COMM_WORLD
    for block in net.blocks:
        fully_shard(block)
    fully_shard(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    state = OkTopkShardState(algorithm="oktopk", density=0.01, optimizer=optimizer)
    state.attach(net)

FSDP keeps on each rank one shard of every parameter, of its gradient and of the optimizer's
state. After backward it lays each unit's gradients out as P rows, row r holding every
parameter's r-th shard, and reduce-scatters them: rank r receives the average of row r.
:meth:`OkTopkShardState.attach` gives each FSDP unit of a model (``fully_shard``'s
``set_custom_reduce_scatter``) a reduce-scatter of its own that runs
``oktopk.Handle.reduce_scatter`` on that flat gradient, with equal shards: rank r receives the
part of the sparsified average that ``Handle.reduce`` would give every rank, and nothing else.
Ok-Topk then sends no allgather: about 0.57 of the allreduce's bytes per rank at P = 4 and 8
(docs/benchmarks.md). One handle per unit, made on the unit's first reduce-scatter, keeps that
unit's error feedback residual; methods ``oktopk``, ``topka``, ``topkdsa``, ``gaussiank`` and
``dense`` take reduce-scatters, ``gtopk`` and ``s2`` are refused.

The first ``start_iter`` calls of each handle are dense (the handle's ``warmup_iterations``),
as the DDP hook's warm-up is. FSDP calls the reduce-scatter only when the group has more than
one rank.

Momentum correction: given a ``torch.optim.SGD``, the state takes its momentum over (the
optimizer's momentum becomes 0) and reduces this rank's velocity ``v = momentum * v + grad``
of each unit's flat gradient instead of the gradient, as the DDP hook does, with the same
momentum factor masking (``momentum_masking``). Weight decay stays in the optimizer, which
applies it to the shards: the hook's velocity carries it, this one does not. Velocity and
residual are each as long as the unit's whole gradient on every rank: error feedback is per
rank, so the memory of sharding is saved on parameters, gradients after the reduce-scatter and
optimizer state, not on these two.

:meth:`OkTopkShardState.state_dict` holds every unit's handle state and velocity; a state
loaded into a fresh ``OkTopkShardState`` attached to a fresh FSDP model of the same units
continues bit for bit (its handles are restored on their first call).

Needs a PyTorch whose ``fully_shard`` has ``set_custom_reduce_scatter`` (2.15 is tested, on
CPUs with gloo); the process group must span the ranks of ``MPI.COMM_WORLD`` in the same order.
A unit's gradient on a GPU goes through the host (``Handle.reduce_scatter``).
"""

import numpy as _np
import torch as _torch
import torch.distributed as _dist
from mpi4py import MPI as _MPI

from . import Handle as _Handle
from .torch import (_DENSE_AVERAGES, _HELD_MASKING_MAX_DENSITY, _check_momentum, _host_copy,
                    _masking_rule, _optimizer_settings, _velocity_dtype)

__all__ = ["OkTopkShardState"]

_STATE_KIND = "oktopk.fsdp.OkTopkShardState"
_STATE_VERSION = 1
_REDUCING_METHODS = ("oktopk", "topka", "topkdsa", "gaussiank", "dense")


def _fsdp_module_class():
    """FSDP2's module class, or None in a PyTorch without a custom reduce-scatter."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except Exception:  # noqa: BLE001 -- torch 1.13's FSDP raises ValueError on Python 3.11
        return None
    return FSDPModule if hasattr(FSDPModule, "set_custom_reduce_scatter") else None


class _UnitReduceScatter:
    """FSDP2's ReduceScatter interface for one unit: allocates plain tensors and hands the
    reduce-scatter to the state."""

    def __init__(self, state, key):
        self._state = state
        self._key = key

    def allocate(self, size, *, dtype, device):
        return _torch.empty(size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        self._state._reduce_scatter(self._key, output_tensor, input_tensor, group, op,
                                    async_op)


class _Unit:
    """A unit's handle, velocity and where its residual held entries back."""

    def __init__(self, handle, velocity, held):
        self.handle = handle
        self.velocity = velocity
        self.held = held


class OkTopkShardState:
    """OkTopk's reduce-scatter for the FSDP units of a model (see the module's notes).

    Args:
        algorithm: ``"oktopk"`` (the default), ``"topka"``, ``"topkdsa"``, ``"gaussiank"`` or
            ``"dense"`` (the ring's reduce-scatter, or an MPI_Reduce_scatter: as the
            handle's ``reduce`` would run its allreduce).
        density: k / n of each unit's gradient, (0, 1] (default 0.01).
        start_iter: each handle's first calls that are dense, >= 0 (default 2).
        optimizer: a ``torch.optim.SGD`` hands its momentum over (momentum correction); any
            other optimizer is left alone and the gradients are reduced with error feedback.
            Make the state right after the optimizer, before loading its checkpoint.
        momentum: momentum correction's momentum, [0, 1), without an optimizer (default 0).
        momentum_masking: as for ``oktopk.torch.OkTopkHookState`` (default ``"auto"``).
        **options: further fields of OkTopk's Options (``wire="bf16"``, ...).
    """

    def __init__(self, algorithm="oktopk", density=0.01, start_iter=2, optimizer=None,
                 momentum=0.0, momentum_masking="auto", **options):
        where = "oktopk.fsdp.OkTopkShardState"
        if algorithm not in _REDUCING_METHODS:
            raise ValueError(f"{where}: algorithm {algorithm!r} has no reduce-scatter; "
                             f"one of {_REDUCING_METHODS}")
        if isinstance(density, bool) or not isinstance(density, (int, float)) \
                or not 0 < density <= 1:
            raise ValueError(f"{where}: density must be in (0, 1], not {density!r}")
        if isinstance(start_iter, bool) or not isinstance(start_iter, int) or start_iter < 0:
            raise ValueError(f"{where}: start_iter must be an int >= 0, not {start_iter!r}")
        if "warmup_iterations" in options:
            raise ValueError(f"{where}: start_iter sets the handles' warmup_iterations; "
                             "give start_iter only")
        _check_momentum(where, momentum, 0.0)
        self.momentum_masking = _masking_rule(where, momentum_masking)
        if optimizer is not None:
            if momentum != 0.0:
                raise ValueError(f"{where}: give the optimizer or momentum, not both: the "
                                 "optimizer's is taken over")
            momentum = _optimizer_settings(where, optimizer)[0]
        self.algorithm = algorithm
        self.density = float(density)
        self.start_iter = start_iter
        self.momentum = float(momentum)
        self.options = dict(options)
        self._comm = _MPI.COMM_WORLD
        self._units = {}       # unit name -> _Unit
        self._pending = {}     # unit name -> its saved entry, restored on the unit's next call
        if isinstance(optimizer, _torch.optim.SGD):  # last: a refused state changes nothing
            for group in optimizer.param_groups:
                group["momentum"] = 0.0

    def attach(self, model):
        """Gives every FSDP unit of ``model`` (itself included) this state's reduce-scatter;
        returns their names (``""`` for ``model``). Not collective."""
        where = "oktopk.fsdp.OkTopkShardState.attach"
        fsdp_module = _fsdp_module_class()
        if fsdp_module is None:
            raise RuntimeError(f"{where}: this PyTorch ({_torch.__version__}) has no FSDP2 "
                               "fully_shard with set_custom_reduce_scatter")
        names = [name for name, m in model.named_modules() if isinstance(m, fsdp_module)]
        if not names:
            raise ValueError(f"{where}: {type(model).__name__} holds no module made with "
                             "torch.distributed.fsdp.fully_shard")
        for name, m in model.named_modules():
            if isinstance(m, fsdp_module):
                m.set_custom_reduce_scatter(_UnitReduceScatter(self, name))
        return names

    # ---- checkpoints

    def _settings(self):
        return {"algorithm": self.algorithm, "density": self.density,
                "start_iter": self.start_iter, "momentum": self.momentum,
                "momentum_masking": self.momentum_masking if self.momentum != 0.0 else "off",
                "options": dict(self.options)}

    def state_dict(self):
        """This rank's state, for ``torch.save`` (``torch.load`` reads it with
        ``weights_only=True``): the settings and, per unit, its gradient's length and type,
        its handle's state (bytes), its velocity and where its residual held entries back
        (flat CPU tensors, or None). Every rank has its own."""
        units = dict(self._pending)
        for name, unit in self._units.items():
            units[name] = {
                "n": unit.handle.n, "dtype": unit.handle.dtype,
                "state": unit.handle.state_dict(),
                "velocity": None if unit.velocity is None else _host_copy(unit.velocity),
                "held": None if unit.held is None else _host_copy(unit.held)}
        return {"kind": _STATE_KIND, "version": _STATE_VERSION, "settings": self._settings(),
                "units": units}

    def load_state_dict(self, state_dict):
        """Restores what :meth:`state_dict` returned on this rank. Each unit's handle is made
        and restored (collective) on the unit's next reduce-scatter, which raises on every rank
        if a rank's saved unit does not match its gradient. The settings must be the saved
        ones (ValueError otherwise)."""
        where = "oktopk.fsdp.OkTopkShardState.load_state_dict"
        if not isinstance(state_dict, dict) or state_dict.get("kind") != _STATE_KIND:
            raise ValueError(f"{where}: not a state_dict of an OkTopkShardState")
        if state_dict.get("version") != _STATE_VERSION:
            raise ValueError(f"{where}: state version {state_dict.get('version')!r}; this one "
                             f"reads {_STATE_VERSION}")
        if state_dict["settings"] != self._settings():
            raise ValueError(f"{where}: the state was saved with {state_dict['settings']}, "
                             f"this state has {self._settings()}")
        for unit in self._units.values():
            unit.handle.close()
        self._units = {}
        self._pending = {name: dict(entry) for name, entry in state_dict["units"].items()}

    # ---- introspection

    def stats(self):
        """Each unit's handle statistics of its last reduce-scatter on this rank: {unit name:
        dict as oktopk.Handle.stats()}."""
        return {name: unit.handle.stats() for name, unit in self._units.items()}

    def bytes_sent_last_iteration(self):
        """The bytes this rank sent in the last reduce-scatter of every unit (the dense
        warm-up's included)."""
        return sum(s["bytes_sent"] for s in self.stats().values())

    # ---- the reduce-scatter

    @property
    def _masks_momentum(self):
        rule = self.momentum_masking
        if rule == "auto":
            rule = "held" if self.density <= _HELD_MASKING_MAX_DENSITY else "off"
        if self.momentum == 0.0 or rule == "off" or self.algorithm in _DENSE_AVERAGES:
            return None
        return rule

    def _reduce_scatter(self, name, output, grad, group, op, async_op):
        where = "oktopk.fsdp.OkTopkShardState"
        size = self._comm.Get_size()
        # FSDP asks every rank alike: every rank raises here.
        if async_op:
            raise RuntimeError(f"{where}: FSDP asked for an asynchronous reduce-scatter, which "
                               "this one is not")
        if op not in (_dist.ReduceOp.AVG, _dist.ReduceOp.SUM):
            raise RuntimeError(f"{where}: reduce op {op} (a gradient divide factor?): only AVG "
                               "and SUM are taken")
        unit = self._units.get(name)
        if unit is None:
            unit = self._make_unit(where, name, output, grad, group)
        elif grad.numel() != unit.handle.n:
            # FSDP lays a unit out alike on every rank: every rank raises here.
            raise RuntimeError(f"{where}: unit {name!r} reduce-scatters {grad.numel()} "
                               f"entries, its handle {unit.handle.n}")
        flat = grad.view(-1)
        if unit.velocity is not None:
            with _torch.no_grad():
                term = flat if unit.velocity.dtype == flat.dtype else flat.float()
                unit.velocity.mul_(self.momentum).add_(term)
                flat.copy_(unit.velocity)
        unit.handle.reduce_scatter(flat, output.view(-1))
        if op == _dist.ReduceOp.SUM:
            output.mul_(size)
        rule = self._masks_momentum
        if rule is not None:
            self._mask(unit, rule)

    def _mask(self, unit, rule):
        """Momentum factor masking after a reduce-scatter, by the DDP hook's rules: clears the
        velocity where this rank's entry was sent (its residual is zero), under rule "held"
        only where the residual had held it back before; nothing after a dense warm-up call."""
        dense = unit.handle.stats()["dense"]
        if dense and rule == "sent":
            return
        sent = _torch.from_numpy(unit.handle.residual() == 0).to(unit.velocity.device)
        with _torch.no_grad():
            if rule == "sent":
                unit.velocity.masked_fill_(sent, 0)
                return
            if not dense:
                unit.velocity.masked_fill_(sent & unit.held, 0)
            _torch.logical_not(sent, out=unit.held)

    def _saved_problem(self, name, saved, n, dtype):
        """What is wrong with a unit's saved entry for a gradient of n entries of dtype (None:
        nothing)."""
        if not isinstance(saved, dict) or not {"n", "dtype", "state", "velocity",
                                               "held"} <= set(saved):
            return f"unit {name!r}'s saved entry is not one that state_dict wrote"
        if saved["n"] != n or saved["dtype"] != dtype:
            return (f"unit {name!r} was saved with {saved['n']} {saved['dtype']} entries, its "
                    f"gradient has {n} {dtype}: not the model the state was saved from")
        for key in ("velocity", "held"):
            value = saved[key]
            expected = self.momentum != 0.0
            if (value is not None) != expected or (
                    expected and (not isinstance(value, _torch.Tensor) or value.numel() != n)):
                return (f"unit {name!r}'s saved {key} is not {n} entries"
                        if expected else f"unit {name!r} has a saved {key} without momentum")
        return None

    def _make_unit(self, where, name, output, grad, group):
        """The unit's handle on its first call, restored from a loaded state if there is
        one. Checks first, agreed over every rank (whether a rank restores the unit included),
        so that a problem of one rank's raises on all instead of leaving the others in the
        handle's collectives."""
        comm = self._comm
        size = comm.Get_size()
        problem = None
        saved = self._pending.get(name)
        dtype = str(grad.dtype).replace("torch.", "")
        if _dist.get_world_size(group) != size or _dist.get_rank(group) != comm.Get_rank():
            problem = (f"the process group's rank {_dist.get_rank(group)} of "
                       f"{_dist.get_world_size(group)} is MPI.COMM_WORLD's "
                       f"{comm.Get_rank()} of {size}: the handles work over MPI.COMM_WORLD, "
                       "so the group must hold the same processes in the same order")
        elif output.numel() * size != grad.numel() or not grad.is_contiguous() \
                or not output.is_contiguous():
            problem = (f"a reduce-scatter of {grad.numel()} entries into {output.numel()} on "
                       f"{size} ranks, or not contiguous: FSDP's equal shards were expected")
        elif saved is not None:
            problem = self._saved_problem(name, saved, grad.numel(), dtype)
        restoring = saved is not None
        agreed = _np.array([comm.Get_rank() if problem is not None else -1, restoring,
                            not restoring], dtype=_np.int64)
        comm.Allreduce(_MPI.IN_PLACE, agreed, op=_MPI.MAX)
        if problem is None and agreed[1] and agreed[2]:
            problem = (f"unit {name!r} is restored from a checkpoint on some ranks only "
                       "(load_state_dict on every rank, or on none)")
        if problem is not None:
            raise RuntimeError(f"{where}: {problem}")
        if agreed[0] >= 0:
            raise RuntimeError(f"{where}: rank {agreed[0]} cannot reduce-scatter unit {name!r} "
                               "(its own error says why)")
        handle = _Handle(comm, self.algorithm, n=grad.numel(), dtype=dtype,
                         density=self.density, warmup_iterations=self.start_iter,
                         **self.options)
        velocity = held = None
        if self.momentum != 0.0:
            velocity = _torch.zeros(grad.numel(), dtype=_velocity_dtype(grad.dtype),
                                    device=grad.device)
            held = _torch.zeros(grad.numel(), dtype=_torch.bool, device=grad.device)
        if restoring:
            handle.load_state_dict(saved["state"])  # collective: a bad state fails everywhere
            if velocity is not None:
                velocity.copy_(saved["velocity"].reshape(-1))
                held.copy_(saved["held"].reshape(-1))
            del self._pending[name]
        unit = _Unit(handle, velocity, held)
        self._units[name] = unit
        return unit
