# SPDX-License-Identifier: BSD-3-Clause
"""A PyTorch DistributedDataParallel communication hook that runs OkTopk's sparse allreduce.

    import torch.distributed as dist
    from mpi4py import MPI
    from oktopk.torch import OkTopkHookState, oktopk_hook

    dist.init_process_group("gloo", rank=MPI.COMM_WORLD.rank, world_size=MPI.COMM_WORLD.size,
                            init_method="file:///shared/path")
    model = torch.nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    state = OkTopkHookState(algorithm="oktopk", density=0.01, optimizer=optimizer)
    model.register_comm_hook(state, oktopk_hook)

Given the optimizer, the state takes over its momentum and weight decay (momentum correction,
below); train with the optimizer as usual.

DDP hands the hook its gradient buckets one at a time during backward. For each, the hook
launches ``Handle.reduce_async`` on the bucket's buffer (in place) and returns a
``torch.futures.Future`` at once; a completion thread sets the future's result when OkTopk's
progress thread has finished the call, so communication overlaps with the rest of backprop.
The result is the average over ranks of the sparsified gradients, the same bits on every rank,
so the replicas stay identical.

A model on a GPU needs OkTopk built for CUDA (or HIP, for ROCm torch): its buckets are then
reduced where they are, on a stream of the hook's own on their GPU that first waits for
torch's current stream there (the one backward wrote the bucket on) as it stood at the launch,
so that the reduce waits for the bucket's gradients only, not for the rest of backward queued
after them. Each future is a CUDA future whose completion event DDP's wait puts on its own
stream; the host never waits for the GPU in the hook. ``torch.cuda.set_device(local_rank)``
before the first handle runs OkTopk on the same GPU (``oktopk.initialize``). A build for CPUs
refuses GPU buckets on every rank with a ``TypeError`` that says so.

Handles are OkTopk handles over mpi4py's ``MPI.COMM_WORLD``; the process group DDP uses (gloo,
or NCCL for a model on GPUs) must span the same processes. Launch with mpiexec (``python -m
torch.distributed.run`` starts no MPI job).

Two modes:

* per bucket (default): one handle per DDP bucket, each selecting its own top-k entries.
* ``whole_model=True``: the buckets of an iteration are gathered until the last one, and one
  handle reduces their concatenation (the paper's global selection over the whole model);
  every bucket's future then completes together, so there is no overlap with backprop.

DDP builds its buckets anew after the first iteration (one bucket over every parameter in
iteration 0, smaller ones after). A handle carries state between calls (error feedback
residual, thresholds) for one layout of parameters, so in per-bucket mode a bucket whose
parameters change gets a new handle, with a warning, and its residual starts from zero. The
default ``start_iter=2`` (two dense allreduces first) makes the handles after the rebuild, so
nothing is lost. In whole-model mode the handle's layout never changes: each iteration's
buckets are permuted into it.

Momentum correction: given a ``torch.optim.SGD`` (``optimizer=``), the state takes its
momentum and weight decay per parameter group and sets them to 0 in the optimizer, which then
applies plain SGD steps (``momentum=`` and ``weight_decay=`` do the same for a plain SGD the
user made). The hook keeps this rank's velocity of every parameter, ``v = momentum * v + grad
+ weight_decay * w``, and reduces the velocities instead of the gradients, so that the error
feedback residual holds back velocity rather than gradient (DGC's momentum correction). The
averaged velocity is what the optimizer applies, so dense allreduces (the warm-up, method
``dense``) give the update of SGD with momentum. At densities up to 0.01 the hook also clears,
after each sparse reduce, the velocity of the entries the reduce released from the residual
(momentum factor masking: ``momentum_masking``).
Velocities belong to parameters, not buckets: they survive DDP's bucket rebuild and are part
of :meth:`OkTopkHookState.state_dict`. With another optimizer (Adam, ...) the hook reduces
gradients with error feedback and the optimizer keeps its own state.

Embeddings: ``OkTopkHookState(..., sparse_rows=embedding_weights(net))`` makes every handle
with a layout (docs/reference.md, "Fused buffers: layouts") built from its parameters: each
parameter of ``sparse_rows`` a ``rows`` segment (rows along its first dimension: ``row_width`` = the
embedding dimension for ``nn.Embedding``), runs of the other parameters one ``dense`` segment.
``s2`` then sketches only the embedding rows and averages the rest exactly, and every method's
``stats()`` counts the output's non-zeros per segment.

Value types: each handle reduces its bucket in the bucket's own dtype, float32, float64,
bfloat16 or float16 (a model cast with ``net.to(torch.bfloat16)`` gives bfloat16 buckets), with
sums and the residual in float32 (float64 for float64 buckets), and momentum correction's
velocity of a 16-bit parameter in float32 too; a 16-bit bucket's values travel
as its type. ``wire="bf16"`` (an Options field) sends a float32 model's values as bfloat16,
``wire="fp32"`` a float64 model's as float32, with every method. gloo in PyTorch 1.13 has no
bfloat16 allreduce: the warm-up's dense iterations of a bfloat16 bucket then go through gloo in
float32 and are rounded back. In whole-model mode every bucket must have the same dtype; per bucket, a model may mix
them (DDP buckets by dtype), and a checkpoint restores each handle with its own.
"""

import contextlib as _contextlib
import queue as _queue
import threading as _threading
import warnings as _warnings
import weakref as _weakref

import numpy as _np
import torch as _torch
import torch.distributed as _dist
from mpi4py import MPI as _MPI
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as _default_hooks

from . import Handle as _Handle

__all__ = ["OkTopkHookState", "oktopk_hook", "embedding_weights"]

# The key of the whole-model handle among the per-bucket ones (bucket indices are ints).
_WHOLE_MODEL = "model"
_STATE_VERSION = 3
# The settings a version 1 state (from before momentum correction) was saved with.
_VERSION_1_SETTINGS = {"momentum": 0.0, "weight_decay": 0.0, "momentum_masking": "off"}
# Version 2 states saved momentum factor masking as a bool.
_VERSION_2_MASKING = {False: "off", True: "sent"}
# momentum_masking's rules: none; clear every entry a reduce sent (DGC's); clear an entry sent
# after the residual held it back; "held" up to _HELD_MASKING_MAX_DENSITY, "off" above.
_MASKING_RULES = ("off", "sent", "held", "auto")
# Where "auto" stops masking: on the Transformer language model "held" lowered the loss at
# density 0.01 and raised it from 0.015 on (docs/benchmarks.md, "Momentum factor masking").
_HELD_MASKING_MAX_DENSITY = 0.01
# The methods whose average is dense: momentum factor masking would clear every velocity.
_DENSE_AVERAGES = ("dense", "s2")


class _Slot:
    """A handle and the parameter layout it reduces: the tuple of the parameters' indices
    (see ``OkTopkHookState._layout``) in the order their gradients lie in the array."""

    __slots__ = ("handle", "layout")

    def __init__(self, handle, layout):
        self.handle = handle
        self.layout = layout


class _Completer:
    """Completes torch futures as OkTopk requests finish, on a daemon thread of its own, so that
    the hook returns at once. Requests complete in launch order, so one FIFO suffices."""

    def __init__(self):
        self._queue = _queue.Queue()
        self._thread = None

    def submit(self, requests, finish, futures):
        """After every request of ``requests`` completed, runs ``finish()`` (which sets the
        futures' results); if either raises, every future gets the exception."""
        if self._thread is None:
            self._thread = _threading.Thread(target=self._run, name="oktopk-hook-completer",
                                             daemon=True)
            self._thread.start()
        self._queue.put((requests, finish, futures))

    def drain(self):
        """Waits until everything submitted has completed."""
        self._queue.join()

    def _run(self):
        while True:
            requests, finish, futures = self._queue.get()
            try:
                for request in requests:
                    request.wait()  # releases the GIL while it waits
                finish()
            except BaseException as error:  # noqa: B902 -- the futures must hear of anything
                for future in futures:
                    if not future.done():
                        future.set_exception(error)
            finally:
                self._queue.task_done()


def _velocity_dtype(dtype):
    """The type momentum correction keeps a velocity in: float32 for a 16-bit parameter (as the
    handles keep the residual), so that gradients small beside the velocity are not rounded
    away; the parameter's own type otherwise."""
    return _torch.float32 if dtype in (_torch.bfloat16, _torch.float16) else dtype


def _host_copy(tensor):
    """A flat copy of a tensor's values on the host, a tensor of its own dtype: what
    ``torch.load`` reads with its default ``weights_only=True`` (numpy arrays it refuses)."""
    return tensor.detach().reshape(-1).to("cpu", copy=True)


def _future_on(buffer):
    """A future for a bucket whose gradient lives where ``buffer`` does: on a GPU, a CUDA
    future of that device, which records an event on the current stream when its result is
    set, and makes a waiter's stream wait for that event rather than the host."""
    if buffer.device.type == "cuda":
        return _torch.futures.Future(devices=[buffer.device])
    return _torch.futures.Future()


def _on_stream(stream):
    """A context in which torch's work goes to ``stream`` (None: the host, no context). On the
    completion thread: the copies and masks after a reduce, and the event a CUDA future records
    when its result is set, so that DDP's wait orders its stream after them. The thread's
    current device becomes the stream's first, so that leaving the context switches no device
    (which would make a CUDA context on GPU 0 in every process)."""
    if stream is None:
        return _contextlib.nullcontext()
    if _torch.cuda.current_device() != stream.device.index:
        _torch.cuda.set_device(stream.device)
    return _torch.cuda.stream(stream)


def embedding_weights(module):
    """The weights of the ``nn.Embedding`` and ``nn.EmbeddingBag`` modules in ``module``, for
    ``OkTopkHookState(sparse_rows=...)``."""
    return [m.weight for m in module.modules()
            if isinstance(m, (_torch.nn.Embedding, _torch.nn.EmbeddingBag))]


def _check_momentum(where, momentum, weight_decay):
    if not isinstance(momentum, (int, float)) or not 0 <= momentum < 1:
        raise ValueError(f"{where}: momentum must be a number in [0, 1), not {momentum!r}")
    if not isinstance(weight_decay, (int, float)) or not 0 <= weight_decay < float("inf"):
        raise ValueError(f"{where}: weight_decay must be a finite number >= 0, not "
                         f"{weight_decay!r}")


def _masking_rule(where, value):
    """momentum_masking's rule by name; the bools of earlier versions name "sent" and "off"."""
    if isinstance(value, bool):
        return _VERSION_2_MASKING[value]
    if value not in _MASKING_RULES:
        raise ValueError(f"{where}: momentum_masking must be one of {_MASKING_RULES}, not "
                         f"{value!r}")
    return value


def _optimizer_settings(where, optimizer):
    """(momentum, weight decay, {id: (weak reference, decay)} per parameter) that the state
    takes over from ``optimizer``, a torch.optim.SGD; (0, 0, None) for any other optimizer,
    which is left as it is. Changes nothing (_take_over does)."""
    if not isinstance(optimizer, _torch.optim.Optimizer):
        raise TypeError(f"{where}: optimizer must be a torch.optim.Optimizer, not "
                        f"{type(optimizer).__name__}")
    if not isinstance(optimizer, _torch.optim.SGD):
        return 0.0, 0.0, None
    groups = optimizer.param_groups
    for number, group in enumerate(groups):
        for setting in ("nesterov", "maximize"):
            if group.get(setting, False):
                raise ValueError(f"{where}: the optimizer's parameter group {number} has "
                                 f"{setting}=True, which momentum correction does not model")
        if group.get("dampening", 0) != 0:
            raise ValueError(f"{where}: the optimizer's parameter group {number} has dampening "
                             f"{group['dampening']}, which momentum correction does not model")
    momenta = sorted({float(group["momentum"]) for group in groups})
    if len(momenta) > 1:
        raise ValueError(f"{where}: the optimizer's parameter groups have momenta {momenta}; "
                         "the hook keeps one momentum for every parameter")
    decays = [float(group["weight_decay"]) for group in groups]
    momentum = momenta[0] if momenta else 0.0
    _check_momentum(where, momentum, max(decays, default=0.0))
    per_parameter = {id(p): (_weakref.ref(p), decay)
                     for group, decay in zip(groups, decays) for p in group["params"]}
    if len(set(decays)) > 1:
        return momentum, tuple(decays), per_parameter
    return momentum, decays[0] if decays else 0.0, per_parameter


def _take_over(optimizer):
    """Leaves a torch.optim.SGD with neither momentum nor weight decay (the hook applies them)."""
    if isinstance(optimizer, _torch.optim.SGD):
        for group in optimizer.param_groups:
            group["momentum"] = 0.0
            group["weight_decay"] = 0.0


class OkTopkHookState:
    """The state of :func:`oktopk_hook`: settings, iteration counter, and OkTopk handles.

    Args:
        process_group: the process group DDP reduces over (None: the default group). It must
            have as many ranks as ``MPI.COMM_WORLD``, over which the handles work. The dense
            iterations before ``start_iter`` run over it (DDP's own allreduce hook).
        algorithm: OkTopk's method: ``oktopk``, ``topka``, ``topkdsa``, ``gtopk``,
            ``gaussiank``, ``s2`` or ``dense``.
        density: k / n, the fraction of each gradient's entries kept.
        start_iter: iterations 0 .. start_iter - 1 are dense allreduces, as DDP's default
            hook makes them; iterations are counted by the last bucket of each. The default, 2,
            lets DDP rebuild its buckets (after iteration 0) before the first handle is made.
        whole_model: one handle over all buckets of an iteration (see the module's notes).
        sparse_rows: parameters whose gradients are rows, most of them zero (embedding
            weights: :func:`embedding_weights`), each with rows along its first dimension.
            Given, every handle is made with a layout of the parameters it reduces (see the
            module's notes); None (the default) makes handles without one. Not pickled.
        optimizer: the training's optimizer. A ``torch.optim.SGD`` hands its momentum and
            weight decay over to the state, which sets them to 0 in the optimizer's parameter
            groups: the hook then keeps the velocities (momentum correction, see the module's
            notes) and the optimizer applies the averaged velocity. Its groups must share one
            momentum (weight decays may differ) and use neither nesterov, dampening nor
            maximize. Any other optimizer (Adam, ...) is left as it is, and the hook reduces
            gradients with error feedback. Make the state right after the optimizer, before
            loading the optimizer's checkpoint (which holds the zeroed momentum). Not pickled.
        momentum: momentum correction's momentum, [0, 1), without an optimizer: with momentum
            or weight_decay non-zero the hook reduces this rank's velocity ``v = momentum * v
            + grad + weight_decay * w`` instead of the gradient; pair it with plain SGD. 0
            (the default) with weight_decay 0: the gradient, as DDP reduces it.
        weight_decay: L2 weight decay folded into the velocity, >= 0 (default 0), without an
            optimizer.
        momentum_masking: with momentum, which entries of this rank's velocity a sparse
            reduce clears (momentum factor masking): ``"held"`` those the reduce sent after the
            residual had held them back, ``"sent"`` every entry it sent (DGC's rule; ``True``
            means it too), ``"off"`` (or ``False``) none; ``"auto"`` (the default) is
            ``"held"`` at densities up to 0.01 and ``"off"`` above. An entry sent at every
            step keeps its momentum under ``"held"``; one released from the residual has had
            its held-back momentum applied in that release. At higher densities entries leave
            the residual more often, and masking leaves more of the model without momentum:
            docs/benchmarks.md ("Momentum factor masking") has the measurements behind the
            default. Not for methods ``dense`` and ``s2``, whose averages are dense, nor in
            the warm-up.
        **options: further fields of OkTopk's Options (``threshold_period=32``, ...).

    :meth:`state_dict` and :meth:`load_state_dict` save and restore the iteration counter,
    every handle's state and the velocities, so that training resumed from a checkpoint
    (model, optimizer and this state) continues bit-identically. Handles belong to layouts of
    parameters, which are told apart by the order in which the first iteration the state sees
    lists them. So load the
    state either into a fresh state registered on a fresh DDP model (a restart: DDP's first
    iteration, whose single bucket does not match the saved buckets, is then reduced through
    the saved handles, without overlap, and the next ones match again), or back into the
    state in use with the same model (a roll-back). Anything else raises RuntimeError in the
    hook, when the parameters' sizes show it.
    """

    def __init__(self, process_group=None, algorithm="oktopk", density=0.01, start_iter=2,
                 whole_model=False, sparse_rows=None, optimizer=None, momentum=0.0,
                 weight_decay=0.0, momentum_masking="auto", **options):
        where = "oktopk.torch.OkTopkHookState"
        if not isinstance(start_iter, int) or start_iter < 0:
            raise ValueError(f"{where}: start_iter must be an int >= 0, not {start_iter!r}")
        _check_momentum(where, momentum, weight_decay)
        self.momentum_masking = _masking_rule(where, momentum_masking)
        # id -> (weak reference, weight decay) from the optimizer; None: weight_decay for all.
        self._decays = None
        if optimizer is not None:
            if momentum != 0.0 or weight_decay != 0.0:
                raise ValueError(f"{where}: give the optimizer or momentum and weight_decay, "
                                 "not both: the optimizer's are taken over")
            momentum, weight_decay, self._decays = _optimizer_settings(where, optimizer)
        # id -> (weak reference, row width): identity, not equality, picks the parameters.
        self._sparse_rows = None
        if sparse_rows is not None:
            self._sparse_rows = {}
            for parameter in sparse_rows:
                if not isinstance(parameter, _torch.Tensor) or parameter.dim() < 1:
                    raise TypeError(f"{where}: sparse_rows must hold parameters of at least one "
                                    f"dimension, not {parameter!r:.60}")
                rows = parameter.shape[0]
                width = parameter.numel() // rows if rows > 0 else 1
                self._sparse_rows[id(parameter)] = (_weakref.ref(parameter), width)
        self.process_group = process_group
        self.algorithm = algorithm
        self.density = density
        self.start_iter = start_iter
        self.whole_model = bool(whole_model)
        self.momentum = float(momentum)
        # A float, or with an optimizer whose groups decay differently, their decays in order.
        self.weight_decay = weight_decay
        self.options = dict(options)
        self.iteration = 0
        self._reset()
        if _dist.is_available() and _dist.is_initialized():
            self._check_group(where)
        if optimizer is not None:  # last: a state refused leaves the optimizer as it was
            _take_over(optimizer)

    def _reset(self):
        """The process-local part: handles, parameter indices, buckets in flight."""
        self._comm = _MPI.COMM_WORLD
        self._slots = {}        # bucket index (or _WHOLE_MODEL) -> _Slot
        # A parameter's data_ptr -> (its index, in first-seen order; a weak reference to it).
        self._param_index = {}
        self._numels = []       # index -> the parameter's number of elements
        self._row_widths = []   # index -> its row width if it is in sparse_rows, else 0
        # restored, not yet made: key -> (layout, handle state, gradient dtype name)
        self._pending = None
        self._saved_numels = None
        self._remap = False     # this iteration goes through the restored layouts
        # (buffer, layout, future, velocities to mask) of this iteration, whole model/remap
        self._gathered = []
        self._permutations = {}
        self._device_permutations = {}  # (target, layouts, device) -> the index on the device
        self._checked = False
        self._velocities = {}   # parameter index -> this rank's velocity (momentum correction)
        # restored, not yet claimed by a parameter: index -> flat CPU tensor
        self._saved_velocities = {}
        # parameter index -> where its residual held entries back after the last reduce (flat
        # bools beside the velocity; masking rule "held")
        self._held = {}
        self._saved_held = {}
        if getattr(self, "_completer", None) is None:
            self._completer = _Completer()
        if getattr(self, "_streams", None) is None:
            self._streams = {}  # GPU index -> the stream the hook's reduces run on there

    def _reduce_stream(self, tensors):
        """For tensors on a GPU: the hook's stream there, made to wait for the work torch's
        current stream holds now (the kernels that wrote them) and marked as a user of their
        memory; None on the host."""
        place = tensors[0].device
        if place.type != "cuda":
            return None
        stream = self._streams.get(place.index)
        if stream is None:
            stream = _torch.cuda.Stream(place)
            self._streams[place.index] = stream
        stream.wait_stream(_torch.cuda.current_stream(place))
        for tensor in tensors:
            tensor.record_stream(stream)
        return stream

    def _check_group(self, where):
        group_size = _dist.get_world_size(self.process_group)
        if group_size != self._comm.Get_size():
            raise RuntimeError(f"{where}: the process group has {group_size} ranks, "
                               f"MPI.COMM_WORLD {self._comm.Get_size()}: OkTopk's handles work "
                               "over MPI.COMM_WORLD, so the group must span the same processes")
        self._checked = True

    # ---- pickling and checkpoints

    def __getstate__(self):
        """The settings and the iteration counter; not the process group and not the handles
        (use :meth:`state_dict` for a checkpoint)."""
        return {"algorithm": self.algorithm, "density": self.density,
                "start_iter": self.start_iter, "whole_model": self.whole_model,
                "momentum": self.momentum, "weight_decay": self.weight_decay,
                "momentum_masking": self.momentum_masking,
                "options": dict(self.options), "iteration": self.iteration}

    def __setstate__(self, state):
        self.process_group = None
        self._sparse_rows = None
        self._decays = None
        self.algorithm = state["algorithm"]
        self.density = state["density"]
        self.start_iter = state["start_iter"]
        self.whole_model = state["whole_model"]
        self.momentum = state.get("momentum", 0.0)
        self.weight_decay = state.get("weight_decay", 0.0)
        self.momentum_masking = _masking_rule("oktopk.torch.OkTopkHookState.__setstate__",
                                              state.get("momentum_masking", False))
        self.options = dict(state["options"])
        self.iteration = state["iteration"]
        self._reset()

    @property
    def _corrects_momentum(self):
        """Whether the hook reduces velocities rather than gradients."""
        return self.momentum != 0.0 or self.weight_decay != 0.0

    @property
    def _masking(self):
        """The masking rule in force: momentum_masking, with "auto" resolved by the density."""
        if self.momentum_masking != "auto":
            return self.momentum_masking
        return "held" if self.density <= _HELD_MASKING_MAX_DENSITY else "off"

    @property
    def _masks_momentum(self):
        return (self.momentum != 0.0 and self._masking != "off"
                and self.algorithm not in _DENSE_AVERAGES)

    def _settings(self):
        return {"algorithm": self.algorithm, "density": self.density,
                "whole_model": self.whole_model, "momentum": self.momentum,
                "weight_decay": (list(self.weight_decay) if isinstance(self.weight_decay, tuple)
                                 else self.weight_decay),
                # Only where it can change anything.
                "momentum_masking": self.momentum_masking if self.momentum != 0.0 else "off",
                "options": dict(self.options)}

    def state_dict(self):
        """This rank's state, for ``torch.save``: the settings, the iteration counter, the
        parameters' sizes, per handle its layout and OkTopk state (bytes), the velocities of
        momentum correction and where the residual held entries back (flat CPU tensors by
        parameter index), all of which
        ``torch.load`` reads with ``weights_only=True``. Every rank has its own. Waits for the
        reduces in flight (there are none between optimizer steps)."""
        self._completer.drain()
        slots = {}
        if self._pending is not None:
            slots.update({key: {"layout": list(layout), "state": state, "dtype": dtype}
                          for key, (layout, state, dtype) in self._pending.items()})
        for key, slot in self._slots.items():
            slots[key] = {"layout": list(slot.layout), "state": slot.handle.state_dict(),
                          "dtype": slot.handle.dtype}
        numels = self._numels if self._saved_numels is None else self._saved_numels
        velocities = {index: v.clone() for index, v in self._saved_velocities.items()}
        velocities.update({index: _host_copy(v) for index, v in self._velocities.items()})
        held = {index: h.clone() for index, h in self._saved_held.items()}
        held.update({index: _host_copy(h) for index, h in self._held.items()})
        return {"version": _STATE_VERSION, "settings": self._settings(),
                "iteration": self.iteration, "numels": list(numels), "slots": slots,
                "velocities": velocities, "held": held}

    def load_state_dict(self, state_dict):
        """Restores what :meth:`state_dict` returned on this rank. The handles are made, and
        their states restored (collective), when the hook next needs them. The settings must
        be those of the saved state (ValueError otherwise). States saved before momentum
        correction existed load as saved with momentum 0 and weight decay 0; those saved
        before the "held" masking rule, with the rule their bool named ("sent" or "off")."""
        where = "oktopk.torch.OkTopkHookState.load_state_dict"
        version = state_dict.get("version") if isinstance(state_dict, dict) else None
        if version not in (1, 2, _STATE_VERSION):
            raise ValueError(f"{where}: not a state_dict of an OkTopkHookState (version "
                             f"{version!r}; this one reads 1 to {_STATE_VERSION})")
        saved = dict(state_dict["settings"])
        if version == 1:
            saved.update(_VERSION_1_SETTINGS)
        elif version == 2:
            saved["momentum_masking"] = _VERSION_2_MASKING[saved["momentum_masking"]]
        if saved != self._settings():
            raise ValueError(f"{where}: the state was saved with {saved}, "
                             f"this state has {self._settings()}")
        self._completer.drain()
        for slot in self._slots.values():
            slot.handle.close()
        # The parameters keep their numbers if they are all still alive (a roll-back within
        # the same model); otherwise they are numbered anew by the next iteration.
        numbering = (self._param_index, self._numels, self._row_widths)
        alive = all(ref() is not None for _, ref in self._param_index.values())
        self._reset()
        if alive:
            self._param_index, self._numels, self._row_widths = numbering
        self.iteration = state_dict["iteration"]
        self._saved_numels = list(state_dict["numels"])
        # States saved before handles had a dtype are float32 ones.
        self._pending = {key: (tuple(entry["layout"]), entry["state"],
                               entry.get("dtype", "float32"))
                         for key, entry in state_dict["slots"].items()} or None
        # Tensors; states saved by earlier versions hold numpy arrays.
        self._saved_velocities = {
            int(index): (v if isinstance(v, _torch.Tensor) else _torch.from_numpy(
                _np.asarray(v))).reshape(-1)
            for index, v in state_dict.get("velocities", {}).items()}
        self._saved_held = {int(index): h.reshape(-1)
                            for index, h in state_dict.get("held", {}).items()}

    # ---- introspection

    def stats(self):
        """Each handle's statistics of its last reduce on this rank: {bucket index (or
        "model"): dict as oktopk.Handle.stats()}."""
        self._completer.drain()
        return {key: slot.handle.stats() for key, slot in self._slots.items()}

    def bytes_sent_last_iteration(self):
        """The bytes this rank sent in the last iteration's reduces, over every handle (0 in
        the dense warm-up, which the process group does)."""
        return sum(s["bytes_sent"] for s in self.stats().values())

    # ---- the hook's work

    def _layout(self, bucket):
        """The tuple of the bucket's parameters' indices, numbering parameters in the order the
        hook first sees them (DDP's first iteration lists all, in a fixed order)."""
        layout = []
        for parameter in bucket.parameters():
            key = parameter.data_ptr()
            entry = self._param_index.get(key)
            # A dead reference: the memory of a freed parameter, now another one's.
            if entry is None or entry[1]() is not parameter:
                entry = (len(self._numels), _weakref.ref(parameter))
                self._param_index[key] = entry
                self._numels.append(parameter.numel())
                self._row_widths.append(self._row_width(parameter))
            layout.append(entry[0])
        return tuple(layout)

    def _row_width(self, parameter):
        """The parameter's row width if it is one of sparse_rows, else 0."""
        entry = (self._sparse_rows or {}).get(id(parameter))
        return entry[1] if entry is not None and entry[0]() is parameter else 0

    def _segments(self, layout):
        """oktopk.Handle's layout for the parameters of ``layout``, in that order: a "rows"
        segment per sparse-rows parameter (named after its index, the same on every rank),
        one "dense" segment per run of the others; None without sparse_rows."""
        if self._sparse_rows is None:
            return None
        segments = []
        for i in layout:
            width = self._row_widths[i]
            if width > 0:
                segments.append(("rows", self._numels[i], width, f"param{i}"))
            elif segments and segments[-1][0] == "dense":
                segments[-1] = ("dense", segments[-1][1] + self._numels[i])
            else:
                segments.append(("dense", self._numels[i]))
        return segments

    def _new_slot(self, layout, dtype, state=None):
        """Collective: a handle for the parameters of ``layout``, whose gradients are of torch
        dtype ``dtype`` (restored from ``state``)."""
        n = sum(self._numels[i] for i in layout)
        handle = _Handle(self._comm, self.algorithm, n, layout=self._segments(layout),
                         dtype=dtype, density=self.density, **self.options)
        if state is not None:
            handle.load_state_dict(state)
        return _Slot(handle, layout)

    def _device_permutation(self, target, layouts, place):
        """_permutation as an index tensor on ``place``, made once (a copy from the host)."""
        key = (target, layouts, place)
        index = self._device_permutations.get(key)
        if index is None:
            index = _torch.from_numpy(self._permutation(target, layouts)).to(place)
            self._device_permutations[key] = index
        return index

    def _permutation(self, target, layouts):
        """Element indices p such that ``target``'s array is ``concat(layouts)[p]``."""
        key = (target, layouts)
        permutation = self._permutations.get(key)
        if permutation is None:
            offsets = {}
            offset = 0
            for index in layouts:
                offsets[index] = offset
                offset += self._numels[index]
            permutation = _np.concatenate(
                [_np.arange(offsets[i], offsets[i] + self._numels[i], dtype=_np.int64)
                 for i in target] or [_np.zeros(0, _np.int64)])
            self._permutations[key] = permutation
        return permutation

    def _restore_pending(self, where):
        """Makes the restored handles, each for its saved dtype (collective, in key order on
        every rank)."""
        if self._saved_numels is not None and self._numels != self._saved_numels[:len(
                self._numels)]:
            raise RuntimeError(f"{where}: the model's parameters (sizes {self._numels}) are not "
                               f"those of the checkpoint ({self._saved_numels}); register the "
                               "restored state before the first backward of the same model")
        for key in sorted(self._pending, key=str):
            layout, state, dtype = self._pending[key]
            self._slots[key] = self._new_slot(layout, dtype, state)
        self._pending = None

    def hook(self, bucket):
        """The body of :func:`oktopk_hook`."""
        where = "oktopk.torch.oktopk_hook"
        if not hasattr(bucket, "buffer"):
            # Every rank's DDP calls its hooks alike, so every rank raises here.
            raise TypeError(
                f"{where}: given a {type(bucket).__name__}, not a torch.distributed.GradBucket: "
                "DDP's Python reducer (torch._dynamo.config.optimize_ddp = 'python_reducer', "
                "for compiled autograd) calls comm hooks once per parameter with (grad, "
                "param), and OkTopk selects over whole buckets; keep another optimize_ddp mode "
                "(the default, 'ddp_optimizer', hands the hook buckets)")
        if not self._checked:
            self._check_group(where)
        index = bucket.index()
        last = bucket.is_last()
        iteration = self.iteration
        if last:
            self.iteration += 1
        # Every bucket of every iteration, warm-up included: parameters are numbered by the
        # first iteration, whatever it does.
        layout = self._layout(bucket)
        if self._corrects_momentum:
            self._to_velocity(where, bucket, layout)
        if iteration < self.start_iter:
            return self._dense(bucket)
        if index == 0:
            self._gathered = []
            if self._pending is not None:
                # The first sparse iteration after load_state_dict. A fresh DDP's first
                # iteration lays its buckets out otherwise than the saved run's later ones did:
                # then this iteration reduces through the restored layouts.
                first = self._pending.get(0)
                self._remap = not self.whole_model and (first is None or first[0] != layout)
                if not self._remap:
                    self._restore_pending(where)
        if self.whole_model or self._remap:
            return self._gather(where, bucket, layout, last)
        return self._reduce_bucket(where, bucket, index, layout, last)

    def _dense(self, bucket):
        """A warm-up iteration: DDP's own allreduce over the process group, through float32
        where the group cannot sum the bucket's type (bfloat16 over gloo)."""
        buffer = bucket.buffer()
        if buffer.dtype != _torch.bfloat16 or _dist.get_backend(self.process_group) != "gloo":
            return _default_hooks.allreduce_hook(self.process_group, bucket)
        group = self.process_group if self.process_group is not None else _dist.group.WORLD
        widened = buffer.float().div_(_dist.get_world_size(group))
        work = _dist.all_reduce(widened, group=group, async_op=True)

        def narrow(future):
            buffer.copy_(future.value()[0])
            return buffer

        return work.get_future().then(narrow)

    def _masked_velocities(self, layout):
        """(parameter index, velocity) of the velocities momentum factor masking may clear
        after a sparse reduce of ``layout``'s parameters, in that order; none without
        momentum, or with a method whose average is dense (dense, s2)."""
        if not self._masks_momentum:
            return []
        return [(i, self._velocities[i]) for i in layout]

    def _mask(self, masked, residuals):
        """Momentum factor masking after a reduce: clears this rank's velocity where the reduce
        sent this rank's entry, which is where the handle's residual is zero after it
        (``residuals``: (handle, permutation or None) pairs whose residuals, put in place,
        line up with the velocities of ``masked``), under rule "held" only where the residual
        held the entry back before. Momentum that was sent does not keep pushing the entry on
        later steps; entries still held back keep theirs. Nothing is cleared after a dense
        call of a handle's own warm-up (``warmup_iterations``), which sends every entry."""
        if not masked:
            return
        dense = any(handle.stats()["dense"] for handle, _ in residuals)
        if dense and self._masking == "sent":
            return
        if len(residuals) == 1 and residuals[0][1] is None:
            residual = residuals[0][0].residual()
        else:
            residual = _np.empty(sum(v.numel() for _, v in masked),
                                 residuals[0][0].residual_dtype)
            for handle, permutation in residuals:
                residual[permutation] = handle.residual()
        sent = _torch.from_numpy(residual == 0)
        place = masked[0][1].device
        if place.type == "cuda":
            # Page-locked, so that the copy is queued on the stream instead of waiting for it.
            sent = sent.pin_memory().to(place, non_blocking=True)
        offset = 0
        with _torch.no_grad():
            for index, velocity in masked:
                count = velocity.numel()
                sent_here = sent[offset:offset + count]
                offset += count
                if self._masking == "sent":
                    velocity.view(-1).masked_fill_(sent_here, 0)
                    continue
                held = self._claim_held(index, velocity)
                if not dense:
                    velocity.view(-1).masked_fill_(sent_here & held, 0)
                _torch.logical_not(sent_here, out=held)

    def _claim_held(self, index, velocity):
        """Where parameter ``index``'s residual held entries back after the last reduce: kept,
        restored by load_state_dict, or nowhere (before the first reduce)."""
        held = self._held.get(index)
        if held is None:
            saved = self._saved_held.pop(index, None)
            if saved is not None:  # its velocity's size was checked as it was claimed
                held = saved.to(device=velocity.device, dtype=_torch.bool, copy=True)
            else:
                held = _torch.zeros(velocity.numel(), dtype=_torch.bool, device=velocity.device)
            self._held[index] = held
        return held

    def _to_velocity(self, where, bucket, layout):
        """Momentum correction: replaces each gradient of the bucket by its parameter's
        velocity after this step, ``v = momentum * v + grad + weight_decay * w``."""
        with _torch.no_grad():
            for index, parameter, grad in zip(layout, bucket.parameters(), bucket.gradients()):
                velocity = self._velocities.get(index)
                if velocity is None:
                    velocity = self._claim_velocity(where, index, grad)
                    self._velocities[index] = velocity
                # A 16-bit gradient is widened, so the velocity's sum is formed in float32.
                term = grad if velocity.dtype == grad.dtype else grad.float()
                decay = self._weight_decay_of(where, parameter)
                if decay != 0.0:
                    term.add_(parameter.detach().reshape(grad.shape), alpha=decay)
                velocity.mul_(self.momentum).add_(term)
                grad.copy_(velocity)

    def _weight_decay_of(self, where, parameter):
        """The weight decay of ``parameter``: its optimizer group's, or weight_decay."""
        if self._decays is None:
            if isinstance(self.weight_decay, tuple):
                raise RuntimeError(f"{where}: this state was unpickled from one whose "
                                   "optimizer's groups decay differently, which does not say "
                                   "which parameter has which: make it with the optimizer")
            return self.weight_decay
        entry = self._decays.get(id(parameter))
        return entry[1] if entry is not None and entry[0]() is parameter else 0.0

    def _claim_velocity(self, where, index, grad):
        """A parameter's velocity on its first use: restored by load_state_dict, or zero."""
        saved = self._saved_velocities.pop(index, None)
        dtype = _velocity_dtype(grad.dtype)
        if saved is None:
            return _torch.zeros_like(grad, dtype=dtype)
        if saved.numel() != grad.numel():
            raise RuntimeError(f"{where}: the checkpoint's velocity of parameter {index} has "
                               f"{saved.numel()} elements, the parameter {grad.numel()}: not "
                               "the model the state was saved from")
        return saved.to(device=grad.device, dtype=dtype, copy=True).reshape(grad.shape)

    def _reduce_bucket(self, where, bucket, index, layout, last):
        slot = self._slots.get(index)
        if slot is None or slot.layout != layout:
            if slot is not None:
                n_before = slot.handle.n
                slot.handle.close()
                _warnings.warn(
                    f"{where}: DDP bucket {index} changed (now {bucket.buffer().numel()} "
                    f"elements of {len(layout)} parameters, before {n_before}): a new OkTopk "
                    "handle replaces its handle, and the error feedback residual restarts from "
                    "zero (DDP rebuilds its buckets after the first iteration; the default "
                    "start_iter=2 avoids this)", RuntimeWarning, stacklevel=3)
            slot = self._new_slot(layout, bucket.buffer().dtype)
            self._slots[index] = slot
        if last:
            # Buckets DDP no longer has (it may make fewer after its rebuild).
            for key in [k for k in self._slots if k > index]:
                self._slots.pop(key).handle.close()
        buffer = bucket.buffer()
        stream = self._reduce_stream([buffer])
        with _on_stream(stream):
            request = slot.handle.reduce_async(buffer)
        future = _future_on(buffer)
        masked = self._masked_velocities(layout)

        def finish():
            with _on_stream(stream):
                self._mask(masked, [(slot.handle, None)])
                future.set_result(buffer)

        self._completer.submit([request], finish, [future])
        return future

    def _gather(self, where, bucket, layout, last):
        """Whole model, or a remapped iteration: keeps the bucket until the last one, then
        reduces them together and completes every bucket's future."""
        future = _future_on(bucket.buffer())
        dtype = bucket.buffer().dtype
        if not self._remap and self._gathered and self._gathered[0][0].dtype != dtype:
            # One handle sums one type. The buckets gathered so far fail too, not hang.
            error = RuntimeError(f"{where}: whole_model=True reduces every bucket with one "
                                 f"handle, of one dtype, but the buckets hold "
                                 f"{self._gathered[0][0].dtype} and {dtype} gradients: cast "
                                 "the model to one dtype, or use per-bucket handles")
            for _, _, gathered_future, _ in self._gathered:
                gathered_future.set_exception(error)
            self._gathered = []
            raise error
        self._gathered.append((bucket.buffer(), layout, future,
                               self._masked_velocities(layout)))
        if not last:
            return future
        gathered, self._gathered = self._gathered, []
        buffers = [b for b, _, _, _ in gathered]
        futures = [f for _, _, f, _ in gathered]
        masked = [entry for _, _, _, entries in gathered for entry in entries]
        layouts = tuple(i for _, lay, _, _ in gathered for i in lay)
        if self._remap:
            self._remap = False
            pending = set(i for lay, _, _ in self._pending.values() for i in lay)
            if pending != set(layouts):
                raise RuntimeError(f"{where}: the buckets hold other parameters than the "
                                   "checkpoint's handles")
            self._restore_pending(where)
            targets = [slot for key, slot in sorted(self._slots.items(), key=lambda kv: str(
                kv[0]))]
        else:
            slot = self._slots.get(_WHOLE_MODEL)
            if slot is not None and sorted(slot.layout) != sorted(layouts):
                slot.handle.close()
                _warnings.warn(f"{where}: the model's parameters changed: a new OkTopk handle "
                               "replaces the whole-model handle", RuntimeWarning, stacklevel=3)
                slot = None
            if slot is None:
                slot = self._new_slot(layouts, dtype)
                self._slots[_WHOLE_MODEL] = slot
            targets = [slot]
        # The iteration's gradient, in bucket order, then each handle's part of it in the
        # handle's own layout and dtype (a copy; none needed when both agree). Buckets of
        # several dtypes (restored per-bucket handles) meet in the widest, which holds the
        # others exactly.
        wide = buffers[0].dtype
        for buffer in buffers[1:]:
            wide = _torch.promote_types(wide, buffer.dtype)
        flat = _torch.cat([b.reshape(-1).to(wide) for b in buffers])
        parts = []
        for slot in targets:
            if slot.layout == layouts:
                part, permutation, index = flat, None, None
            else:
                permutation = self._permutation(slot.layout, layouts)
                index = self._device_permutation(slot.layout, layouts, flat.device)
                part = flat[index]
            part = part.to(getattr(_torch, slot.handle.dtype))
            parts.append((part, permutation, index))
        stream = self._reduce_stream(buffers + [flat] + [part for part, _, _ in parts])
        with _on_stream(stream):
            requests = [slot.handle.reduce_async(part)
                        for slot, (part, _, _) in zip(targets, parts)]

        def finish():
            with _on_stream(stream):
                for part, _, index in parts:
                    if index is not None:
                        flat[index] = part.to(flat.dtype)
                    elif part is not flat:
                        flat.copy_(part)
                offset = 0
                for buffer in buffers:
                    count = buffer.numel()
                    buffer.copy_(flat[offset:offset + count])
                    offset += count
                # Before any future completes: DDP's next iteration may follow at once.
                self._mask(masked, [(slot.handle, permutation)
                                    for slot, (_, permutation, _) in zip(targets, parts)])
                for buffer, future in zip(buffers, futures):
                    future.set_result(buffer)

        self._completer.submit(requests, finish, futures)
        return futures[-1]


def oktopk_hook(state: OkTopkHookState, bucket: _dist.GradBucket) -> _torch.futures.Future[
        _torch.Tensor]:
    """DDP communication hook: reduces ``bucket`` with OkTopk, as ``state`` says.

    Register with ``ddp_model.register_comm_hook(state, oktopk_hook)``. Returns a future that
    completes with the bucket's buffer, now holding the average over ranks of the sparsified
    gradients (with momentum correction: velocities), identical on every rank.
    """
    return state.hook(bucket)
