# SPDX-License-Identifier: BSD-3-Clause
"""OkTopk from Python: sparse allreduce handles for data-parallel training.

A :class:`Handle` reduces gradient arrays of a fixed length ``n`` and type (float32 by
default; float64, bfloat16 or float16 with ``dtype=``) over an mpi4py communicator with one of
OkTopk's methods (``dense``, ``topka``, ``topkdsa``, ``gtopk``, ``gaussiank``, ``oktopk``,
``s2``): every rank receives the average over ranks of the sparsified gradients, the same bits
on every rank. Arrays are numpy arrays or CPU torch tensors (contiguous, of the handle's type),
reduced in the memory they occupy, without copies; a build for CUDA or HIP also takes tensors
on its GPU, on torch's current stream.

    from mpi4py import MPI
    import numpy as np
    import oktopk

    h = oktopk.Handle(MPI.COMM_WORLD, "oktopk", n=1 << 20, density=0.01)
    grad = np.random.default_rng(MPI.COMM_WORLD.rank).standard_normal(1 << 20, np.float32)
    h.reduce_(grad)                  # in place; collective
    req = h.reduce_async(grad)       # on OkTopk's progress thread; collective
    ...                              # backprop goes on meanwhile
    req.wait()

The PyTorch DistributedDataParallel communication hook is in :mod:`oktopk.torch`.

Every collective call must be made by every rank of the handle's communicator in the same
order. Errors are exceptions: ``ValueError`` for bad arguments (also NaN or Inf in a gradient,
and arguments that differ between ranks, raised on every rank alike), ``TypeError`` for an
array of the wrong kind, ``MemoryError`` and ``RuntimeError`` otherwise. Asynchronous calls
need MPI initialised with ``MPI_THREAD_MULTIPLE``, mpi4py's default.
"""

import atexit as _atexit
import collections as _collections
import numbers as _numbers
import os as _os
import sys as _sys

import numpy as _np

# MPI is initialised here, before any handle exists, and _oktopk.shutdown() (destroy the
# handles, finalise Kokkos) is registered after it: Python's atexit callbacks run before
# mpi4py's MPI_Finalize (a Py_AtExit function, which runs last).
from mpi4py import MPI as _MPI

from . import _oktopk

if int(_np.__version__.split(".")[0]) >= 2 and _oktopk.pybind11_version < (2, 12):
    raise ImportError(
        f"oktopk: this build's extension was compiled with pybind11 "
        f"{'.'.join(map(str, _oktopk.pybind11_version))}, which reads numpy 1's array layout, "
        f"but numpy {_np.__version__} is loaded: install numpy < 2 beside it, or rebuild "
        "oktopk with pybind11 >= 2.12")



def _mpi_family(name):
    """``"Open MPI"``, ``"MPICH"`` (MPICH and the MPIs that share its ABI) or ``None``, from an
    MPI's own name of itself (mpi.h's, or the text of ``MPI_Get_library_version``)."""
    if "Open MPI" in name:
        return "Open MPI"
    if any(mark in name for mark in ("MPICH", "MVAPICH", "Intel(R) MPI")):
        return "MPICH"
    return None


def _check_mpi_library():
    # Two MPI libraries in one process (the one liboktopk links, the one mpi4py loaded) give
    # crashes or wrong communicators at the first call, not an error: refuse at import.
    compiled = _oktopk.mpi_library()
    loaded = " ".join(_MPI.Get_library_version().strip().splitlines()[0].split())
    if None not in (_mpi_family(compiled), _mpi_family(loaded)) and \
            _mpi_family(compiled) != _mpi_family(loaded):
        raise ImportError(
            f"oktopk: the library was compiled against {compiled}, but mpi4py has loaded "
            f"another MPI ({loaded}); one process cannot use both. Install mpi4py built for "
            f"{compiled} (with that MPI's mpicc on PATH: pip install --no-binary=mpi4py mpi4py), "
            "or build oktopk against mpi4py's MPI")


_check_mpi_library()

_atexit.register(_oktopk.shutdown)

__all__ = ["Handle", "Request", "ALGORITHMS", "DTYPES", "initialize", "version", "mpi_library",
           "backend", "device", "equal_shard_offsets"]

#: The methods a handle can run.
ALGORITHMS = ("dense", "topka", "topkdsa", "gtopk", "gaussiank", "oktopk", "s2")

#: The gradient types a handle can reduce.
DTYPES = ("float32", "float64", "bfloat16", "float16")

# The numpy arrays of each type (numpy has no bfloat16: its bit patterns, as uint16).
_NUMPY_DTYPES = {"float32": _np.float32, "float64": _np.float64, "bfloat16": _np.uint16,
                 "float16": _np.float16}


def version():
    """The OkTopk library's version, ``"MAJOR.MINOR.PATCH"``."""
    return _oktopk.version()


def mpi_library():
    """The MPI the library was compiled against, as its ``mpi.h`` names it (``"Open MPI
    4.1.4"``, ``"MPICH 4.0.2"``; ``""`` for another MPI). Importing oktopk fails with
    ``ImportError`` when mpi4py has loaded an MPI of the other family."""
    return _oktopk.mpi_library()


def backend():
    """The Kokkos execution space this build's handles run on: ``"OpenMP"`` or ``"Serial"``
    (CPUs), ``"Cuda"`` or ``"HIP"`` (a GPU, whose tensors the handles then take)."""
    return _oktopk.backend()


def gpu_aware_mpi():
    """``(device_pointers, reason)``: whether this process hands MPI the GPU tensors' memory as it
    is (True) or page-locked host copies of it (False), and why: ``OKTOPK_GPU_AWARE_MPI`` (on,
    off or auto, read once) or what the MPI said of itself. False in a build for CPUs. Needs MPI
    initialised (``import mpi4py.MPI`` or ``torch.distributed`` with MPI do it)."""
    with _Prefixed("oktopk.gpu_aware_mpi"):
        return _oktopk.gpu_aware_mpi()


def device():
    """The index of the GPU this process's handles run on (``torch.device("cuda", index)``),
    or -1 in a build for CPUs. Initialises OkTopk first if no handle has (see
    :func:`initialize` for how the GPU is chosen)."""
    _initialize_for_torch()
    with _Prefixed("oktopk.device"):
        return _oktopk.device()


# Kokkos execution spaces that run on a GPU, whose memory torch calls "cuda" (ROCm included).
_GPU_BACKENDS = ("Cuda", "HIP")


# Environment variables by which a user chooses Kokkos's GPU: torch's choice then stands back.
_KOKKOS_DEVICE_VARIABLES = ("KOKKOS_DEVICE_ID", "KOKKOS_MAP_DEVICE_ID_BY",
                            "KOKKOS_VISIBLE_DEVICES")


def equal_shard_offsets(n, parts):
    """The ``parts + 1`` boundaries of nearly equal shards of ``n`` entries, shard r being
    ``[r * n // parts, (r + 1) * n // parts)``: what :meth:`Handle.reduce_scatter` uses when it
    is given no offsets (``oktopk::equal_shard_offsets``)."""
    if n < 0 or parts < 1:
        raise ValueError(f"oktopk.equal_shard_offsets: need n >= 0 and parts >= 1, "
                         f"got n = {n}, parts = {parts}")
    return [r * n // parts for r in range(parts + 1)]


def _initialize_for_torch():
    """Before the first handle of a GPU build, when the user has not initialised OkTopk: runs
    Kokkos on torch's current GPU (``torch.cuda.set_device``), the one whose tensors the
    program will hand over, if torch has started using a GPU and the environment chooses none
    for Kokkos; Kokkos's own choice (a GPU per local rank) otherwise."""
    if _oktopk.initialized() or _oktopk.backend() not in _GPU_BACKENDS:
        return
    torch = _sys.modules.get("torch")
    args = []
    if (torch is not None and torch.cuda.is_initialized()
            and not any(name in _os.environ for name in _KOKKOS_DEVICE_VARIABLES)):
        args.append(f"--kokkos-device-id={torch.cuda.current_device()}")
    with _Prefixed("oktopk.initialize"):
        _oktopk.initialize(args)


def initialize(*kokkos_args):
    """Initialises Kokkos with command-line arguments of its own (``"--kokkos-num-threads=4"``,
    ``"--kokkos-disable-warnings"``, ``"--kokkos-device-id=1"``). Optional: the first
    :class:`Handle` initialises Kokkos otherwise, so call it before making one. Not
    collective. Kokkos is finalised at exit, before MPI, unless it was initialised outside
    OkTopk.

    The GPU of a build for CUDA or HIP: pass ``"--kokkos-device-id=N"`` here to choose it.
    Without a call to this function, the first handle (or :func:`device`) initialises Kokkos
    on torch's current device (``torch.cuda.current_device()``, set with
    ``torch.cuda.set_device(local_rank)``) when torch has started using a GPU and the
    environment sets none of ``KOKKOS_DEVICE_ID``, ``KOKKOS_MAP_DEVICE_ID_BY`` and
    ``KOKKOS_VISIBLE_DEVICES``; Kokkos chooses otherwise, a GPU per local rank
    (docs/reference.md, "GPU users")."""
    for arg in kokkos_args:
        if not isinstance(arg, str):
            raise TypeError(f"oktopk.initialize: arguments must be str, not "
                            f"{type(arg).__name__}")
    with _Prefixed("oktopk.initialize"):
        _oktopk.initialize(list(kokkos_args))


class _Prefixed:
    """Re-raises an error of the compiled module with the public function's name in front."""

    __slots__ = ("where",)

    def __init__(self, where):
        self.where = where

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if error is None or not isinstance(error, (ValueError, TypeError, RuntimeError,
                                                   MemoryError)):
            return False
        raise type(error)(f"{self.where}: {error}") from None


def _options_string(where, options):
    """The C interface's options text: ``{"density": 0.01, "s2_error_feedback": True}`` ->
    ``"density=0.01 s2_error_feedback=on"``."""
    items = []
    for key, value in options.items():
        if isinstance(value, bool):
            text = "on" if value else "off"
        elif isinstance(value, _numbers.Integral):
            text = str(int(value))
        elif isinstance(value, _numbers.Real):
            # repr: the shortest text that reads back as the same double.
            text = repr(float(value))
        elif isinstance(value, str):
            text = value
        else:
            raise TypeError(f"{where}: option {key}={value!r}: expected a number, a bool or a "
                            f"string, not {type(value).__name__}")
        if not text or any(c in text for c in " \t\n,="):
            raise ValueError(f"{where}: option {key}={value!r}: the value must be non-empty and "
                             "hold no spaces, commas or '='")
        items.append(f"{key}={text}")
    return " ".join(items)


def _int64(where, what, value):
    """value as an int, if it is one a C int64_t holds."""
    if isinstance(value, bool) or not isinstance(value, _numbers.Integral):
        raise TypeError(f"{where}: {what} must be an int, not {type(value).__name__}")
    if not -(1 << 63) <= int(value) < (1 << 63):
        raise ValueError(f"{where}: {what} = {value} does not fit in 64 bits")
    return int(value)


def _layout_segments(where, layout):
    """The segments of a ``layout`` argument, normalised: ``("rows", length, row_width, name)``
    or ``("dense", length, name)`` each. Their values (lengths >= 0 summing to n, row widths
    >= 1) are the C interface's to check, on every rank alike."""
    if layout is None:
        return []
    if isinstance(layout, (str, bytes)) or not hasattr(layout, "__iter__"):
        raise TypeError(f"{where}: layout must be a list of segments, not "
                        f"{type(layout).__name__}")
    segments = []
    for i, segment in enumerate(layout):
        what = f"layout[{i}]"
        if not isinstance(segment, (tuple, list)) or not segment:
            raise TypeError(f"{where}: {what} must be a tuple (\"rows\", length, row_width"
                            f"[, name]) or (\"dense\", length[, name]), not {segment!r}")
        kind, fields = segment[0], list(segment[1:])
        if kind not in ("rows", "dense"):
            raise ValueError(f"{where}: {what}: the kind must be \"rows\" or \"dense\", not "
                             f"{kind!r}")
        numbers = 2 if kind == "rows" else 1
        if not numbers <= len(fields) <= numbers + 1:
            raise TypeError(f"{where}: {what}: a \"{kind}\" segment is ({kind!r}, length"
                            f"{', row_width' if kind == 'rows' else ''}[, name]), not "
                            f"{segment!r}")
        name = fields[numbers] if len(fields) > numbers else ""
        if not isinstance(name, str):
            raise TypeError(f"{where}: {what}: the name must be a str, not "
                            f"{type(name).__name__}")
        if "\0" in name:
            raise ValueError(f"{where}: {what}: the name must not contain NUL characters")
        length = _int64(where, f"{what}'s length", fields[0])
        if kind == "rows":
            segments.append(("rows", length, _int64(where, f"{what}'s row_width", fields[1]),
                             name))
        else:
            segments.append(("dense", length, name))
    return segments


def _dtype_name(where, dtype):
    """The name in DTYPES of a ``dtype`` argument: one of those names, a numpy type or dtype
    (float32, float64, float16), or a torch dtype (also torch.bfloat16); None is float32."""
    if dtype is None:
        return "float32"
    if isinstance(dtype, str):
        if dtype in DTYPES:
            return dtype
        raise ValueError(f"{where}: dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    torch = _sys.modules.get("torch")
    if torch is not None and isinstance(dtype, torch.dtype):
        name = str(dtype).replace("torch.", "")
        if name in DTYPES:
            return name
        raise ValueError(f"{where}: dtype {dtype} is not one OkTopk reduces ({', '.join(DTYPES)})")
    try:
        name = _np.dtype(dtype).name
    except TypeError:
        raise TypeError(f"{where}: dtype must be a str, a numpy or a torch dtype, not "
                        f"{type(dtype).__name__}") from None
    if name in ("float32", "float64", "float16"):
        return name
    raise ValueError(f"{where}: dtype {name} is not one OkTopk reduces ({', '.join(DTYPES)}; "
                     "bfloat16 by name or as torch.bfloat16)")


def _is_torch_tensor(obj):
    """Whether obj is a torch.Tensor, without importing torch if the program has not."""
    torch = _sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _on_device(obj):
    """Whether obj is a torch tensor outside host memory (CUDA, ROCm, meta, ...)."""
    return _is_torch_tensor(obj) and obj.device.type != "cpu"


def _tensor_problem(obj, name, dtype):
    """Why a torch tensor cannot be a handle's array of type ``dtype`` whatever its device;
    None if it can."""
    torch = _sys.modules["torch"]
    # The layout first: other layouts' tensors may raise where asked about contiguity.
    if obj.layout != torch.strided:
        return f"{name} must be a dense tensor, not a {obj.layout} one"
    if obj.is_conj() or obj.is_neg():
        return f"{name} must be a plain tensor, not a lazy conjugate or negation view"
    if obj.dtype != getattr(torch, dtype):
        return f"{name} must have dtype torch.{dtype}, the handle's, not {obj.dtype}"
    if not obj.is_contiguous():
        return f"{name} must be contiguous (use .contiguous())"
    return None


def _device_tensor_problem(obj, name, dtype, n):
    """Why a tensor off the host cannot be reduced on this build's GPU: (TypeError or
    ValueError, reason), or None if it can (a GPU build, the handle's GPU, type and length)."""
    if not _is_torch_tensor(obj):
        return TypeError, (f"{name} must be a torch tensor on the GPU as the other array is, "
                           f"not {type(obj).__name__}")
    place = obj.device
    if place.type != "cuda":
        return TypeError, (f"{name} is a tensor on {place}: OkTopk reduces CPU tensors, and "
                           "CUDA or ROCm tensors in a build for CUDA or HIP")
    built_for = _oktopk.backend()
    if built_for not in _GPU_BACKENDS:
        return TypeError, (f"{name} is a tensor on {place}, but this OkTopk was built for "
                           f"{built_for}, without a GPU: pass {name}.cpu(), or use a build for "
                           "CUDA or HIP")
    gpu = _oktopk.device()
    if place.index != gpu:
        return TypeError, (f"{name} is a tensor on {place}, but this process's handles run on "
                           f"cuda:{gpu} (oktopk.device(); see oktopk.initialize)")
    problem = _tensor_problem(obj, name, dtype)
    if problem is not None:
        return TypeError, problem
    if obj.numel() != n:
        return ValueError, f"{name} has {obj.numel()} elements, the handle's n is {n}"
    return None


# What a reduce hands the compiled module: numpy views of host arrays (stream None), or the
# addresses of device tensors and torch's current stream on their GPU.
_Arrays = _collections.namedtuple("_Arrays", "grad out stream")


def _as_array(obj, name, dtype="float32"):
    """The numpy array that shares obj's memory, or (None, reason) if obj cannot be reduced by
    a handle of type ``dtype``.

    numpy arrays go through unchanged (the compiled module checks dtype, contiguity and length
    itself), as does anything that is no buffer (it then says what it got); other buffers
    (``array.array("f")``, a memoryview) become arrays over their memory. A torch tensor must
    be a contiguous CPU tensor of the handle's type (tensors elsewhere take
    ``_device_tensor_problem``'s way), whose memory numpy then shares (``detach()`` drops
    autograd's view of it, not the memory; a bfloat16 tensor is seen as its int16 bit
    patterns).
    """
    if isinstance(obj, _np.ndarray):
        return obj, None
    if not _is_torch_tensor(obj):
        try:
            memoryview(obj).release()
        except TypeError:
            return obj, None
        return _np.asarray(obj), None
    torch = _sys.modules["torch"]
    problem = _tensor_problem(obj, name, dtype)
    if problem is not None:
        return None, problem
    if dtype == "bfloat16":
        return obj.detach().view(torch.int16).numpy(), None
    return obj.detach().numpy(), None


class Request:
    """An asynchronous reduce in flight (:meth:`Handle.reduce_async`).

    The arrays of the call stay referenced, and must not be touched, until it completes.
    Dropping the last reference to an unfinished request waits for it (the call is
    collective and runs to its end on every rank).
    """

    __slots__ = ("_request", "_out", "_where")

    def __init__(self, request, out, where):
        self._request = request
        self._out = out
        self._where = where

    def test(self):
        """True if the call has completed, without waiting.

        Once it has, raises the call's error, if any (every time it is asked), like
        :meth:`wait`. Calls complete in launch order, over every handle of this process.
        """
        with _Prefixed(self._where):
            return self._request.test()

    def wait(self):
        """Waits until the call completes (releasing the GIL) and returns its output array
        (or tensor); raises the call's error if it failed."""
        with _Prefixed(self._where):
            self._request.wait()
        return self._out

    @property
    def done(self):
        """Whether the call has completed (without raising its error)."""
        return self._request.done

    def __repr__(self):
        return f"<oktopk.Request {'done' if self.done else 'in flight'}>"


class Handle:
    """A sparse allreduce handle over an mpi4py communicator.

    ``Handle(comm=MPI.COMM_WORLD, algorithm="oktopk", n=..., **options)`` is collective: every
    rank of ``comm`` passes the same algorithm, ``n`` and options (otherwise every rank raises
    ``ValueError``). ``options`` are the fields of OkTopk's ``Options`` (docs/reference.md), for
    instance ``density=0.01, threshold_period=32, warmup_iterations=10, balancing="adaptive",
    s2_error_feedback=True``; booleans become on/off. The handle works on a duplicate of
    ``comm``. It keeps state between calls (error feedback residual, thresholds): reduce each
    gradient stream with its own handle.

    ``layout`` describes a fused buffer (a DDP bucket, say; docs/reference.md, "Fused
    buffers: layouts") as a list of segments, consecutive from offset 0 and covering ``n``:
    ``("rows", length, row_width[, name])`` for embedding-like rows of ``row_width`` entries,
    most of them zero, and ``("dense", length[, name])`` for everything else. ``s2`` then
    sketches only the rows and averages the dense segments exactly; the other methods compute
    what they compute without a layout. Either way :meth:`stats` counts the output's non-zeros
    per segment. Every rank must pass the same layout, names included; a bad segment on any
    rank raises ``ValueError`` on every rank (``TypeError`` for a malformed entry).

    ``dtype`` is the gradients' type: ``"float32"`` (the default), ``"float64"``,
    ``"bfloat16"`` or ``"float16"``, or the numpy or torch dtype of one (``torch.bfloat16``).
    Every rank must pass the same. Sums, averages and the residual are float64 for float64
    gradients and float32 for the others (docs/reference.md, "Gradient types").

    Arrays: numpy arrays or CPU torch tensors of n values of the handle's type, C-contiguous
    (bfloat16: torch.bfloat16 tensors, or numpy uint16 or int16 arrays of its bit patterns,
    since numpy has no bfloat16). In a build for CUDA or HIP (:func:`backend`), also CUDA or
    ROCm tensors on the handles' GPU (:func:`device`): the reduce then runs on torch's current
    stream of that GPU, after the work queued there (the kernels that wrote the gradient), and
    later work on that stream sees the result; :meth:`reduce_sparse` copies such a gradient
    to the host and its result back. A wrong kind of array (a tensor on another device, or on
    a GPU in a build for CPUs) is ``TypeError``, a wrong length ``ValueError``, on this rank;
    the peers' call then fails with ``ValueError`` naming this rank and its reason instead of
    waiting for it.
    """

    def __init__(self, comm=None, algorithm="oktopk", n=None, layout=None, dtype="float32",
                 **options):
        where = "oktopk.Handle"
        if comm is None:
            comm = _MPI.COMM_WORLD
        if not isinstance(comm, _MPI.Comm):
            raise TypeError(f"{where}: comm must be an mpi4py communicator, "
                            f"not {type(comm).__name__}")
        if comm == _MPI.COMM_NULL:
            raise ValueError(f"{where}: comm is MPI.COMM_NULL")
        # Past this point comm works: an argument error on some ranks is agreed on before the
        # collective create, so that every rank raises instead of the others waiting in it.
        problem = None
        try:
            if not isinstance(algorithm, str):
                raise TypeError(f"{where}: algorithm must be a str, "
                                f"not {type(algorithm).__name__}")
            if n is None:
                raise TypeError(f"{where}: missing the gradient length n")
            if isinstance(n, bool) or not isinstance(n, _numbers.Integral):
                raise TypeError(f"{where}: n must be an int, not {type(n).__name__}")
            text = _options_string(where, options)
            segments = _layout_segments(where, layout)
            dtype_name = _dtype_name(where, dtype)
        except (TypeError, ValueError) as error:
            problem = error
        failing = comm.allreduce(comm.Get_rank() if problem is not None else -1, op=_MPI.MAX)
        if problem is not None:
            raise problem
        if failing >= 0:
            raise ValueError(f"{where}: rank {failing} passed an invalid argument "
                             "(its own error says which)")
        self._comm = comm
        self._options = dict(options)
        self._layout = segments
        compiled = [(_oktopk.SEGMENT_ROWS, s[1], s[2], s[3]) if s[0] == "rows"
                    else (_oktopk.SEGMENT_DENSE, s[1], 1, s[2]) for s in segments]
        _initialize_for_torch()
        with _Prefixed(where):
            self._handle = _oktopk.Handle(comm.py2f(), algorithm, int(n), text, compiled,
                                          dtype_name)

    # ---- reduces

    def reduce(self, grad, out=None):
        """Collective. Writes into ``out`` the average over ranks of the sparsified ``grad``
        (mostly zeros; the same bits on every rank) and returns ``out``.

        ``grad`` is only read. ``out`` defaults to a new numpy array (a new tensor if ``grad``
        is a tensor); ``out`` may be ``grad`` itself (see :meth:`reduce_`), with the same
        result as separate arrays. Releases the GIL while it runs.
        """
        where = "oktopk.Handle.reduce"
        out = self._default_out(grad, out)
        self._reduce(where, grad, out)
        return out

    def reduce_(self, array):
        """Collective. :meth:`reduce` in place: ``array`` is replaced by the reduced gradient.
        Returns ``array``."""
        self._reduce("oktopk.Handle.reduce_", array, array)
        return array

    def reduce_sparse(self, grad):
        """Collective. The result of :meth:`reduce` in sparse form, ``(indices, values)``:
        int32 indices ascending and the averages at them, of the handle's type (the same on
        every rank); :meth:`reduce` would write zeros everywhere else. New numpy arrays, or
        CPU tensors if ``grad`` is a tensor. Method ``"oktopk"`` makes them without a pass
        over n, so that an optimizer step can apply them to its k entries only. Releases the
        GIL while it runs.
        """
        where = "oktopk.Handle.reduce_sparse"
        source = grad
        if _on_device(grad):
            # The sparse result lives on the host: the gradient goes there first (a copy of n
            # values, after torch's current stream), the result back to grad's GPU.
            self._refuse(where, _device_tensor_problem(grad, "grad", self.dtype, self.n), False)
            grad = grad.detach().cpu()
        g, problem = _as_array(grad, "grad", self.dtype)
        self._refuse(where, None if problem is None else (TypeError, problem), False)
        with _Prefixed(where):
            indices, values = self._handle.reduce_sparse(g)
        if _is_torch_tensor(source):
            torch = _sys.modules["torch"]
            if self.dtype == "bfloat16":
                pair = (torch.from_numpy(indices),
                        torch.from_numpy(values.view(_np.int16)).view(torch.bfloat16))
            else:
                pair = torch.from_numpy(indices), torch.from_numpy(values)
            return tuple(t.to(source.device) for t in pair)
        return indices, values

    def reduce_scatter(self, grad, shard=None, shard_offsets=None):
        """Collective. For sharded data parallelism (ZeRO, FSDP): writes into ``shard`` this
        rank's part, entries ``shard_offsets[rank]`` to ``shard_offsets[rank + 1]``, of what
        :meth:`reduce` would write on the same gradients, with the same error feedback, and
        returns ``shard``; no rank receives the others' parts.

        ``shard_offsets``: P + 1 boundaries from 0 to n, never decreasing, the same on every
        rank; None for equal shards (:func:`equal_shard_offsets`). ``shard`` defaults to a new
        numpy array (a new tensor on grad's device if ``grad`` is a tensor). Methods
        ``"oktopk"``, ``"topka"``, ``"topkdsa"`` and ``"gaussiank"`` (bit for bit
        :meth:`reduce`'s slice) and ``"dense"``; ``"gtopk"`` and ``"s2"``, and bad offsets or
        lengths on any rank, raise ValueError on every rank. A tensor on a GPU goes
        through the host (a copy of n values there, of the shard back). Releases the GIL.
        """
        where = "oktopk.Handle.reduce_scatter"
        size = self._comm.Get_size()
        rank = self._comm.Get_rank()
        problem = None
        if shard_offsets is None:
            offsets = equal_shard_offsets(self.n, size)
        else:
            offsets = list(shard_offsets)
            if not all(isinstance(v, _numbers.Integral) and not isinstance(v, bool)
                       and -(1 << 63) <= int(v) < (1 << 63) for v in offsets):
                problem = (TypeError, "shard_offsets must hold ints of 64 bits")
            elif len(offsets) != size + 1:
                problem = (ValueError, f"shard_offsets has {len(offsets)} entries, "
                                       f"P + 1 = {size + 1} expected")
            offsets = [int(v) for v in offsets] if problem is None else [0] * (size + 1)
        self._refuse(where, problem, False)
        begin, end = offsets[rank], offsets[rank + 1]
        length = end - begin if 0 <= begin <= end <= self.n else 0
        source, target = grad, shard
        if _on_device(grad):
            self._refuse(where, _device_tensor_problem(grad, "grad", self.dtype, self.n), False)
            grad = grad.detach().cpu()
        if shard is None:
            if _is_torch_tensor(source):
                torch = _sys.modules["torch"]
                shard = torch.empty(length, dtype=getattr(torch, self.dtype))
            else:
                shard = _np.empty(length, dtype=_NUMPY_DTYPES[self.dtype])
        elif _on_device(shard):
            shard = _sys.modules["torch"].empty(shard.shape, dtype=shard.dtype)
        g, problem = _as_array(grad, "grad", self.dtype)
        if problem is None:
            s, problem = _as_array(shard, "shard", self.dtype)
        self._refuse(where, None if problem is None else (TypeError, problem), False)
        with _Prefixed(where):
            self._handle.reduce_scatter(g, s, [] if shard_offsets is None else offsets)
        if target is not None and _on_device(target):
            target.copy_(shard)
            return target
        if target is None and _is_torch_tensor(source) and _on_device(source):
            return shard.to(source.device)
        return shard

    def reduce_async(self, grad, out=None):
        """Collective. Launches ``reduce(grad, out)`` (in place if ``out`` is omitted) and
        returns a :class:`Request` at once; ``request.wait()`` returns ``out``.

        Calls run one at a time on OkTopk's progress thread, in launch order over every handle
        of this process, while Python goes on. Every rank must launch its calls in the same
        order. ``grad`` and ``out`` must stay untouched until the request completes.

        GPU tensors: the call's kernels and copies go to torch's current stream at launch,
        when the progress thread reaches the call, so they follow whatever the caller queued
        there by then; the request completes once that stream has finished the call.
        """
        where = "oktopk.Handle.reduce_async"
        if out is None:
            out = grad
        arrays = self._arrays(where, grad, out, True)
        with _Prefixed(where):
            if arrays.stream is None:
                request = self._handle.reduce_async(arrays.grad, arrays.out)
            else:
                request = self._handle.reduce_on_stream_async(arrays.grad, arrays.out,
                                                              arrays.stream, grad, out)
        return Request(request, out, "oktopk.Request")

    def _reduce(self, where, grad, out):
        arrays = self._arrays(where, grad, out, False)
        with _Prefixed(where):
            if arrays.stream is None:
                self._handle.reduce(arrays.grad, arrays.out)
            else:
                self._handle.reduce_on_stream(arrays.grad, arrays.out, arrays.stream)

    def _default_out(self, grad, out):
        if out is not None:
            return out
        if _is_torch_tensor(grad):
            torch = _sys.modules["torch"]
            return torch.empty(grad.shape, dtype=getattr(torch, self.dtype), device=grad.device)
        return _np.empty(_np.shape(grad), dtype=_NUMPY_DTYPES[self.dtype])

    def _refuse(self, where, problem, asynchronous):
        """With a problem ``(TypeError or ValueError, reason)`` on this rank: fails the
        collective call the peers are making (so that they do not wait, and report this
        rank's reason) and raises it here."""
        if problem is None:
            return
        kind, reason = problem
        with _Prefixed(where):
            self._handle.fail_reduce(reason, asynchronous, kind is TypeError)

    def _arrays(self, where, grad, out, asynchronous):
        """What the compiled module reduces (_Arrays): numpy views of host arrays, or for
        tensors on the GPU their addresses and torch's current stream there, the stream whose
        work wrote them. Arrays this rank cannot reduce fail the collective call (see
        _refuse)."""
        if _on_device(grad) or _on_device(out):
            return self._device_arrays(where, grad, out, asynchronous)
        g, problem = _as_array(grad, "grad", self.dtype)
        if problem is None:
            o, problem = (g, None) if out is grad else _as_array(out, "out", self.dtype)
        self._refuse(where, None if problem is None else (TypeError, problem), asynchronous)
        return _Arrays(g, o, None)

    def _device_arrays(self, where, grad, out, asynchronous):
        problem = None
        if _is_torch_tensor(grad) and _is_torch_tensor(out) and grad.device != out.device:
            problem = TypeError, (f"grad is a tensor on {grad.device} and out one on "
                                  f"{out.device}: both must be on one device")
        if problem is None:
            problem = _device_tensor_problem(grad, "grad", self.dtype, self.n)
        if problem is None and out is not grad:
            problem = _device_tensor_problem(out, "out", self.dtype, self.n)
        if problem is None:
            g, o = grad.data_ptr(), out.data_ptr()
            size = self.n * grad.element_size()
            if g != o and g < o + size and o < g + size:
                problem = ValueError, "grad and out overlap without being the same tensor"
        self._refuse(where, problem, asynchronous)
        torch = _sys.modules["torch"]
        return _Arrays(g, o, torch.cuda.current_stream(grad.device).cuda_stream)

    # ---- information and state

    def stats(self):
        """Statistics of this rank's last reduce (all zero before the first), as a dict:
        iteration, k, local_selected, global_selected, bytes_sent, bytes_received,
        messages_sent, messages_received, seconds, local_threshold, global_threshold, dense,
        bytes_sent_between_nodes and bytes_received_between_nodes (of the bytes, those to and
        from ranks on other nodes: the handle's nodes, option node_size), selected_nothing
        (a top-k method selected nothing on any rank although some rank's input had a non-zero
        entry), reduce_scatter (the call was a :meth:`reduce_scatter`), phases: {phase name:
        dict of seconds, bytes_sent, bytes_received, messages_sent, messages_received,
        bytes_sent_between_nodes, bytes_received_between_nodes} (they sum to the call's), and
        segments: per segment of the layout (none without one), a dict of name, kind
        ("rows" or "dense"), offset, length, row_width (1 for dense) and nonzeros, the last
        output's non-zeros in the segment (they sum to the output's). Call it once the reduce
        has completed."""
        with _Prefixed("oktopk.Handle.stats"):
            return self._handle.stats()

    def residual(self):
        """A copy of this rank's residual, the error feedback (numpy array of n values of
        :attr:`residual_dtype`): what the calls so far held back; zero where the last call sent
        this rank's entry. Waits for the calls launched before it. Not collective."""
        with _Prefixed("oktopk.Handle.residual"):
            return self._handle.residual()

    def state_dict(self):
        """This rank's state (residual, thresholds, region boundaries, call counter), as
        bytes. Not collective; each rank has its own. Call it when no request is in flight."""
        with _Prefixed("oktopk.Handle.state_dict"):
            return self._handle.save_state()

    def load_state_dict(self, state):
        """Collective. Restores what :meth:`state_dict` returned on this rank, into a handle
        made with the same communicator size, algorithm, n and options; later reduces then
        return exactly what the saved handle's would have. A bad state on any rank raises on
        every rank (ValueError: another handle's; RuntimeError: damaged) and leaves the handle
        unchanged."""
        where = "oktopk.Handle.load_state_dict"
        if not isinstance(state, (bytes, bytearray, memoryview)):
            # An empty state fails on every rank, so the peers do not wait for this one.
            try:
                self._handle.restore_state(b"")
            except (ValueError, RuntimeError):
                pass
            raise TypeError(f"{where}: state must be bytes, not {type(state).__name__}")
        with _Prefixed(where):
            self._handle.restore_state(bytes(state))

    def close(self):
        """Destroys the handle now (after its requests in flight complete). Not collective.
        Later calls raise ValueError. Handles are also destroyed when garbage collected and,
        at the latest, at exit."""
        self._handle.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @property
    def closed(self):
        """Whether :meth:`close` was called."""
        return self._handle.closed

    @property
    def algorithm(self):
        """The method's name."""
        return self._handle.algorithm

    @property
    def n(self):
        """The gradient length."""
        return self._handle.n

    @property
    def k(self):
        """The number of entries each call aims at: floor(density * n)."""
        return self._handle.k

    @property
    def dtype(self):
        """The gradients' type, one of DTYPES."""
        return self._handle.dtype

    @property
    def residual_dtype(self):
        """The type the handle sums in and keeps its residual in: "float64" for float64
        gradients, "float32" for the others."""
        return self._handle.residual_dtype

    @property
    def comm(self):
        """The communicator the handle was made from (it works on a duplicate)."""
        return self._comm

    @property
    def options(self):
        """The options given at construction."""
        return dict(self._options)

    @property
    def layout(self):
        """The layout given at construction, normalised: ``("rows", length, row_width, name)``
        and ``("dense", length, name)`` tuples (``[]`` for none)."""
        return list(self._layout)

    def __repr__(self):
        state = "closed" if self.closed else f"n={self.n} k={self.k}"
        return (f"<oktopk.Handle {self.algorithm} {self.dtype} {state} on "
                f"{self._comm.Get_size()} ranks>")
