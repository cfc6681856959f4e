# SPDX-License-Identifier: BSD-3-Clause
"""What the PyTorch DDP example programs (apps/torch-ddp-*/train.py) share: the command line of
the hook and the optimizer, the gloo process group over mpi4py's ranks, DDP's own hooks on
bfloat16 where gloo cannot send it, the bytes a step sends, the check that the replicas agree,
and how an error ends the job.

The processes find each other through MPI (mpi4py), not torch.distributed.run: rank 0 makes a
store file for gloo and broadcasts its path, so no port is fixed.
"""

import argparse
import functools
import hashlib
import os
import shutil
import sys
import tempfile

from mpi4py import MPI

OKTOPK_HOOKS = ("oktopk", "topka", "topkdsa", "gtopk", "gaussiank", "s2", "dense")
# PyTorch's own: DDP's allreduce, its hooks that send the values as 16-bit floats, and
# PowerSGD (low-rank compression with error feedback and warm start).
DDP_HOOKS = ("none", "bf16_compress", "fp16_compress", "powersgd")
# The OkTopk methods with a reduce-scatter, for --fsdp.
FSDP_HOOKS = ("oktopk", "topka", "topkdsa", "gaussiank", "dense")
HOOKS = OKTOPK_HOOKS + DDP_HOOKS
# The values' type on an OkTopk hook's wire, and its bytes (native: the model's own type).
WIRE_BYTES = {"native": None, "bf16": 2, "fp16": 2}
OPTIMIZERS = ("sgd", "adam")
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()


class SameOnEveryRank(Exception):
    """An error every rank meets alike (the same command line, files, digests): rank 0 reports
    it and every rank exits, with no MPI_Abort."""


class UsageError(SameOnEveryRank):
    """A bad command line."""


class DataError(SameOnEveryRank):
    """A missing or damaged data file."""


class ReplicaError(SameOnEveryRank):
    """The ranks' parameters differ at the end (every rank sees the same digests)."""


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (on rank 0) instead of exiting."""

    def error(self, message):
        raise UsageError(message)

    def print_help(self, file=None):
        if rank == 0:
            super().print_help(file)


def add_training_arguments(parser, default_lr):
    """The flags of the hook and the optimizer; ``default_lr``: {"sgd": lr, "adam": lr}."""
    parser.add_argument("--hook", default="oktopk", choices=HOOKS,
                        help="OkTopk method of the hook; none for DDP's own allreduce; "
                             "bf16_compress or fp16_compress for DDP's hooks that send the "
                             "values as 16-bit floats; powersgd for PyTorch's PowerSGD hook "
                             "(rank --powersgd-rank, error feedback, warm start, dense for "
                             "the first --start-iter steps) (default oktopk)")
    parser.add_argument("--powersgd-rank", type=int, default=4,
                        help="the rank of PowerSGD's approximation, >= 1 (default 4)")
    parser.add_argument("--wire", default="native", choices=tuple(WIRE_BYTES),
                        help="the values' type on an OkTopk hook's wire: native (the model's "
                             "own), bf16 or fp16 (a float32 model's values rounded to 16 bits "
                             "when sent, the rounding error kept in the residual) (default "
                             "native)")
    parser.add_argument("--density", type=float, default=0.01,
                        help="fraction of each gradient the sparse methods keep, (0, 1] "
                             "(default 0.01)")
    parser.add_argument("--optimizer", default="sgd", choices=OPTIMIZERS,
                        help="sgd (with --momentum and --weight-decay) or adam "
                             "(torch.optim.Adam; the hook reduces gradients) (default sgd)")
    parser.add_argument("--lr", type=float, default=None,
                        help=f"learning rate (default {default_lr['sgd']} for sgd, "
                             f"{default_lr['adam']} for adam)")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum, [0, 1) "
                        "(default 0.9)")
    parser.add_argument("--weight-decay", type=float, default=0.0,
                        help="L2 weight decay, >= 0 (default 0)")
    parser.add_argument("--momentum-correction", default="on", choices=("on", "off"),
                        help="with sgd and an OkTopk hook: on, the hook's state takes the "
                             "optimizer's momentum and weight decay over, keeps each rank's "
                             "velocity and averages velocities; off, the optimizer applies "
                             "momentum to the averaged gradient (default on)")
    parser.add_argument("--momentum-masking", default="auto",
                        choices=("auto", "held", "sent", "off"),
                        help="with momentum correction, the velocity entries the hook clears "
                             "after a reduce: held, those sent after the residual held them "
                             "back; sent, every entry the rank sent (DGC's rule); off, none; "
                             "auto, held at densities up to 0.01, off above (default auto)")
    parser.add_argument("--start-iter", type=int, default=2,
                        help="steps made with DDP's dense allreduce before the hook's method "
                             "(OkTopk's or PowerSGD) starts, >= 2 for powersgd (default 2: "
                             "DDP rebuilds its buckets after step 1)")
    parser.add_argument("--whole-model", action="store_true",
                        help="one OkTopk handle over all buckets (global top-k selection)")
    parser.add_argument("--fsdp", action="store_true",
                        help="shard the model with FSDP2's fully_shard instead of DDP, each "
                             "unit's gradient reduce-scattered by OkTopk (oktopk.fsdp; --hook "
                             "oktopk, topka, topkdsa, gaussiank or dense; needs a PyTorch whose "
                             "fully_shard takes a custom reduce-scatter)")
    parser.add_argument("--fsdp-units", default="model", choices=("model", "layers"),
                        help="with --fsdp: model, one unit over the whole model (one handle, "
                             "as DDP's one bucket of these models); layers, a unit per layer "
                             "and the root, each selecting its own top entries (default model)")
    parser.add_argument("--seed", type=int, default=1, help="initialisation and shuffling "
                        "(default 1)")


def check_training_arguments(parser, args, default_lr):
    """Checks the flags of add_training_arguments and fills in --lr's default."""
    if args.lr is None:
        args.lr = default_lr[args.optimizer]
    if not 0 < args.density <= 1:
        parser.error(f"--density must be in (0, 1], not {args.density}")
    if not args.lr > 0:
        parser.error(f"--lr must be > 0, not {args.lr}")
    if not 0 <= args.momentum < 1:
        parser.error(f"--momentum must be in [0, 1), not {args.momentum}")
    if not 0 <= args.weight_decay < float("inf"):
        parser.error(f"--weight-decay must be a finite number >= 0, not {args.weight_decay}")
    if args.start_iter < 0:
        parser.error(f"--start-iter must be >= 0, not {args.start_iter}")
    if args.hook == "powersgd" and args.start_iter < 2:
        parser.error(f"--hook powersgd needs --start-iter >= 2 (PowerSGD's error feedback and "
                     f"warm start start after DDP's bucket rebuild), not {args.start_iter}")
    if args.powersgd_rank < 1:
        parser.error(f"--powersgd-rank must be >= 1, not {args.powersgd_rank}")
    if args.wire != "native" and args.hook not in OKTOPK_HOOKS:
        parser.error(f"--wire {args.wire} is for an OkTopk hook, not --hook {args.hook}")
    if args.fsdp and args.hook not in FSDP_HOOKS:
        parser.error(f"--fsdp reduce-scatters through --hook {' or '.join(FSDP_HOOKS)}, not "
                     f"--hook {args.hook}")
    if args.fsdp and args.whole_model:
        parser.error("--fsdp makes one handle per FSDP unit; --whole-model is for DDP")


def uses_momentum_correction(args):
    """Whether the hook keeps the velocity (SGD through a hook, correction on)."""
    return (args.optimizer == "sgd" and args.hook in OKTOPK_HOOKS
            and args.momentum_correction == "on")


def register_hook(model, optimizer, args, sparse_rows=None):
    """Registers the hook the flags name on the DDP ``model`` trained by ``optimizer``;
    returns OkTopk's hook state, a PowerSGDCount, or None for DDP's other hooks."""
    import oktopk.torch as okt

    if args.fsdp:
        return _attach_fsdp_state(model, optimizer, args)
    if args.hook == "powersgd":
        return _register_powersgd(model, args)
    if args.hook in DDP_HOOKS:
        _register_ddp_hook(model, args.hook)
        return None
    settings = {}
    if uses_momentum_correction(args):
        settings.update(optimizer=optimizer, momentum_masking=args.momentum_masking)
    if sparse_rows is not None:
        settings.update(sparse_rows=sparse_rows)
    if args.wire != "native":
        settings.update(wire=args.wire)
    state = okt.OkTopkHookState(algorithm=args.hook, density=args.density,
                                start_iter=args.start_iter, whole_model=args.whole_model,
                                **settings)
    model.register_comm_hook(state, okt.oktopk_hook)
    return state


def _attach_fsdp_state(model, optimizer, args):
    """OkTopk's reduce-scatter for every FSDP unit of ``model``; returns its state."""
    from oktopk.fsdp import OkTopkShardState

    settings = {}
    if uses_momentum_correction(args):
        settings.update(optimizer=optimizer, momentum_masking=args.momentum_masking)
    if args.wire != "native":
        settings.update(wire=args.wire)
    state = OkTopkShardState(algorithm=args.hook, density=args.density,
                             start_iter=args.start_iter, **settings)
    state.attach(model)
    return state


def make_parallel(module, args, layers):
    """The data-parallel model the flags name: DDP over ``module``, or with --fsdp ``module``
    itself sharded by FSDP2's fully_shard, the root unit, with each of ``layers`` a unit of its
    own under --fsdp-units layers. Every rank made ``module`` alike (the same seed), and FSDP keeps
    each rank's shard of it, so the replicas start equal without a broadcast."""
    if not args.fsdp:
        return make_ddp(module)
    import torch

    try:
        from torch.distributed.fsdp import FSDPModule, fully_shard
    except Exception:  # noqa: BLE001 -- torch 1.13's FSDP raises ValueError on Python 3.11
        FSDPModule = None
    if FSDPModule is None or not hasattr(FSDPModule, "set_custom_reduce_scatter"):
        raise UsageError(f"--fsdp needs FSDP2's fully_shard with a custom reduce-scatter, "
                         f"which this PyTorch ({torch.__version__}) lacks")
    if args.fsdp_units == "layers":
        for layer in layers:
            fully_shard(layer)
    fully_shard(module)
    return module


def whole_model(model, args, fresh):
    """Collective with --fsdp: a module with all of the trained parameters, for evaluation and
    the replicas' check. DDP's own module; with --fsdp, ``fresh()`` (a new module of the same
    kind) loaded with every shard gathered, in the same order on every rank."""
    if not args.fsdp:
        return model.module
    full = {name: value.full_tensor() if hasattr(value, "full_tensor") else value
            for name, value in model.state_dict().items()}
    replica = fresh()
    replica.load_state_dict(full)
    return replica


@functools.lru_cache(maxsize=None)
def backend_takes_bfloat16():
    """Collective on its first call: whether the default group's backend broadcasts and sums
    bfloat16 tensors (gloo in PyTorch 1.13 does neither: "Invalid scalar type", raised before
    anything is sent, alike on every rank). Later calls return the first answer: make_ddp and
    register_hook both ask, and every rank asks in the same order."""
    import torch
    import torch.distributed as dist

    probe = torch.zeros(1, dtype=torch.bfloat16)
    try:
        dist.broadcast(probe, 0)
        dist.all_reduce(probe)
    except RuntimeError:
        return False
    return True


def make_ddp(module):
    """DistributedDataParallel over ``module``. Building it broadcasts rank 0's parameters and
    buffers; where the backend cannot send bfloat16 and the module has some, every tensor goes
    as its bit pattern through MPI.COMM_WORLD instead (exact; the group's ranks are
    COMM_WORLD's, in the same order: init_process_group)."""
    import torch
    import torch.nn.parallel.distributed as ddp_module

    tensors = list(module.parameters()) + list(module.buffers())
    if all(t.dtype != torch.bfloat16 for t in tensors) or backend_takes_bfloat16():
        return ddp_module.DistributedDataParallel(module)

    def broadcast_bits(module, process_group, broadcast_bucket_size, src,
                       params_and_buffers_to_ignore):
        named = list(module.named_parameters()) + list(module.named_buffers())
        with torch.no_grad():
            for name, tensor in named:
                if name in params_and_buffers_to_ignore:
                    continue
                staged = tensor.detach().cpu().contiguous()  # MPI reads host memory here
                comm.Bcast(_bits(torch, staged).numpy(), root=src)
                if staged.data_ptr() != tensor.data_ptr():
                    tensor.copy_(staged)

    # PyTorch 1.13's DDP broadcasts through this module-level function (private; a backend
    # that sends bfloat16 never comes here).
    original = ddp_module._sync_module_states
    ddp_module._sync_module_states = broadcast_bits
    try:
        return ddp_module.DistributedDataParallel(module)
    finally:
        ddp_module._sync_module_states = original


class PowerSGDCount:
    """PowerSGD's state and the elements counted so far of those its hook allreduced (its P and
    Q factors and the tensors it sends uncompressed: the state's own running count)."""

    def __init__(self, state):
        self.state = state
        self.counted = 0

    def elements_since_last(self):
        total = self.state.compression_stats()[2]
        elements, self.counted = total - self.counted, total
        return elements


def _register_powersgd(model, args):
    """PyTorch's PowerSGD hook as its docs recommend it: error feedback and warm start on, DDP's
    allreduce for the first --start-iter steps. Returns its PowerSGDCount."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    state = powersgd.PowerSGDState(process_group=None,
                                   matrix_approximation_rank=args.powersgd_rank,
                                   start_powerSGD_iter=args.start_iter,
                                   use_error_feedback=True, warm_start=True)
    model.register_comm_hook(state, _one_bucket_at_a_time)
    return PowerSGDCount(state)


def _one_bucket_at_a_time(state, bucket):
    """PowerSGD's hook, each bucket's allreduces done before the next bucket's start. Its
    allreduces of a bucket are chained in callbacks, and with several buckets in flight gloo
    meets them in another order on each rank (at P = 4: "op.preamble.length <= op.nbytes" and
    an abort); NCCL orders them on one stream."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    future = powersgd.powerSGD_hook(state, bucket)
    future.wait()
    return future


def _bits(torch, tensor):
    """A contiguous tensor's elements as integers of the same width (a view: same storage)."""
    kinds = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return tensor.view(kinds[tensor.element_size()])


def _register_ddp_hook(model, hook):
    """DDP's own: its allreduce (none), or its bf16_compress_hook / fp16_compress_hook. Where
    the backend cannot sum bfloat16, a bfloat16 mean (either hook's on a bfloat16 bucket, and
    bf16_compress's on any) goes through float32 instead: the values divided by P in bfloat16
    as DDP divides them, summed as float32 and rounded to bfloat16 once, where a backend that
    sums bfloat16 (NCCL's ring) rounds after each of its P - 1 steps."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if hook == "fp16_compress":  # gloo sums float16
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return
    import torch

    model_has_bfloat16 = any(p.dtype == torch.bfloat16 for p in model.parameters())
    if (hook == "bf16_compress" or model_has_bfloat16) and not backend_takes_bfloat16():
        model.register_comm_hook(hook == "bf16_compress", _bfloat16_mean_through_float32)
    elif hook == "bf16_compress":
        model.register_comm_hook(None, default_hooks.bf16_compress_hook)


def _bfloat16_mean_through_float32(compress, bucket):
    """The comm hook of _register_ddp_hook's fallback; ``compress``: bf16_compress's (every
    bucket rounded to bfloat16), else DDP's allreduce (only bfloat16 buckets)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    buffer = bucket.buffer()
    if not compress and buffer.dtype != torch.bfloat16:
        return default_hooks.allreduce_hook(None, bucket)
    # A bfloat16 buffer is itself here (to() returns it) and is divided in place, as DDP does.
    values = buffer.to(torch.bfloat16).div_(dist.get_world_size()).float()
    future = dist.all_reduce(values, async_op=True).get_future()

    def unpack(done):
        buffer.copy_(done.value()[0].to(torch.bfloat16))
        return buffer

    return future.then(unpack)


def make_optimizer(torch, parameters, args):
    """The optimizer the flags name (with momentum correction, register_hook hands its
    momentum and weight decay to the hook)."""
    if args.optimizer == "adam":
        return torch.optim.Adam(parameters, lr=args.lr, weight_decay=args.weight_decay)
    return torch.optim.SGD(parameters, lr=args.lr, momentum=args.momentum,
                           weight_decay=args.weight_decay)


def describe_optimizer(args):
    """The optimizer and where its momentum lives, for the header line."""
    if args.optimizer == "adam":
        return f"Adam lr {args.lr} weight decay {args.weight_decay}"
    if args.hook == "powersgd":
        return (f"SGD lr {args.lr}, momentum {args.momentum} and weight decay "
                f"{args.weight_decay} in the optimizer; PowerSGD rank {args.powersgd_rank}")
    if args.fsdp and uses_momentum_correction(args):
        return (f"SGD lr {args.lr}, momentum {args.momentum} in the reduce-scatter (momentum "
                f"correction, masking {args.momentum_masking}), weight decay "
                f"{args.weight_decay} in the optimizer; FSDP")
    where = (f"in the hook (momentum correction, masking {args.momentum_masking})"
             if uses_momentum_correction(args) else "in the optimizer")
    sharding = "; FSDP" if args.fsdp else ""
    return (f"SGD lr {args.lr}, momentum {args.momentum} and weight decay {args.weight_decay} "
            f"{where}{sharding}")


def bytes_sent(state, args, n, value_bytes, iteration):
    """What this rank sent in step ``iteration`` of a model of n parameters of value_bytes
    each: the OkTopk hook's own count for its sparse methods, else the dense ring's
    2 (P - 1) / P of the n values in the width they travel in: 2 bytes with DDP's compression
    hooks, the wire's with OkTopk's dense method, the model's with DDP's allreduce and in the
    hook's warm-up. PowerSGD's: the ring's 2 (P - 1) / P of the elements it allreduced. With
    --fsdp, the reduce-scatters' own count, their dense warm-up included."""
    if args.fsdp:
        return state.bytes_sent_last_iteration()
    if args.hook == "powersgd" and iteration >= args.start_iter:
        return 2 * (size - 1) / size * value_bytes * state.elements_since_last()
    if args.hook in ("bf16_compress", "fp16_compress"):
        width = 2
    elif args.hook == "none" or iteration < args.start_iter:
        width = value_bytes
    elif args.hook == "dense":
        width = WIRE_BYTES[args.wire] or value_bytes
    else:
        return state.bytes_sent_last_iteration()
    return 2 * (size - 1) / size * width * n


def check_parameters(model, args):
    """Collective: the line rank 0 prints about the parameters at the end. DDP's replicas must
    be the same bits (ReplicaError otherwise); FSDP keeps shards, which nothing replicates."""
    if args.fsdp:
        return f"(parameters sharded over {size} ranks, gathered for the evaluation)"
    check_replicas(model.module)
    return f"(parameters identical on all {size} ranks)"


def check_replicas(model):
    """Collective: raises ReplicaError unless every rank's parameters are the same bits."""
    import torch

    digest = hashlib.sha256()
    with torch.no_grad():
        for parameter in model.parameters():
            digest.update(_bits(torch, parameter.detach().cpu().contiguous()).numpy().tobytes())
    digests = comm.allgather(digest.hexdigest())
    if len(set(digests)) != 1:
        raise ReplicaError(f"the ranks' parameters differ at the end: digests {digests}")


def init_process_group(prefix):
    """Starts gloo's process group over MPI.COMM_WORLD's ranks; returns the store's folder, for
    destroy_process_group."""
    import torch.distributed as dist

    directory = tempfile.mkdtemp(prefix=prefix) if rank == 0 else None
    directory = comm.bcast(directory, root=0)
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(directory, 'store')}",
                            rank=rank, world_size=size)
    return directory


def destroy_process_group(directory):
    """Collective: ends the process group and removes the store's folder."""
    import torch.distributed as dist

    comm.Barrier()
    dist.destroy_process_group()
    if rank == 0:
        shutil.rmtree(directory, ignore_errors=True)


def run(program, parse_arguments, train, argv):
    """The program's exit status: parse, train, and turn errors into it. An error every rank
    meets alike is said once, by rank 0; any other may be this rank's alone, so it ends the
    job (MPI_Abort) rather than leave the peers waiting."""
    try:
        train(parse_arguments(argv))
    except SystemExit as done:  # --help
        return done.code or 0
    except SameOnEveryRank as error:
        if rank == 0:
            print(f"{program}: {error}", file=sys.stderr, flush=True)
        return 2 if isinstance(error, UsageError) else 1
    except Exception as error:  # noqa: BLE001 -- possibly this rank's alone: end the job
        print(f"{program}: rank {rank}: {type(error).__name__}: {error}", file=sys.stderr,
              flush=True)
        comm.Abort(1)
    return 0
