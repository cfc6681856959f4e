# SPDX-License-Identifier: BSD-3-Clause
"""What the PyTorch DDP example programs (apps/torch-ddp-*/train.py) share: the command line of
the hook and the optimizer, the gloo process group over mpi4py's ranks, and how an error ends
the job.

The processes find each other through MPI (mpi4py), not torch.distributed.run: rank 0 makes a
store file for gloo and broadcasts its path, so no port is fixed.
"""

import argparse
import os
import shutil
import sys
import tempfile

from mpi4py import MPI

HOOKS = ("oktopk", "topka", "topkdsa", "gtopk", "gaussiank", "s2", "dense", "none")
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
                        help="OkTopk method of the hook, or none for DDP's own allreduce "
                             "(default oktopk)")
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
                        help="with sgd and a hook: on, the hook keeps each rank's velocity "
                             "(momentum and weight decay) and averages velocities (the "
                             "optimizer is plain SGD); off, momentum is applied to the "
                             "averaged gradient (default on)")
    parser.add_argument("--momentum-masking", default="off", choices=("on", "off"),
                        help="with momentum correction: on, the hook clears a rank's velocity "
                             "where the reduce sent the rank's entry (default off)")
    parser.add_argument("--start-iter", type=int, default=2,
                        help="steps made with DDP's dense allreduce before the hook's method "
                             "starts (default 2: DDP rebuilds its buckets after step 1)")
    parser.add_argument("--whole-model", action="store_true",
                        help="one OkTopk handle over all buckets (global top-k selection)")
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


def uses_momentum_correction(args):
    """Whether the hook keeps the velocity (SGD through a hook, correction on)."""
    return (args.optimizer == "sgd" and args.hook != "none"
            and args.momentum_correction == "on")


def register_hook(model, args, sparse_rows=None):
    """Registers OkTopk's hook on the DDP ``model`` as the flags say; returns its state, or None
    for --hook none."""
    import oktopk.torch as okt

    if args.hook == "none":
        return None
    settings = {}
    if uses_momentum_correction(args):
        settings.update(momentum=args.momentum, weight_decay=args.weight_decay,
                        momentum_masking=args.momentum_masking == "on")
    if sparse_rows is not None:
        settings.update(sparse_rows=sparse_rows)
    state = okt.OkTopkHookState(algorithm=args.hook, density=args.density,
                                start_iter=args.start_iter, whole_model=args.whole_model,
                                **settings)
    model.register_comm_hook(state, okt.oktopk_hook)
    return state


def make_optimizer(torch, parameters, args):
    """Plain SGD when the hook applies momentum and weight decay, else the chosen optimizer."""
    if args.optimizer == "adam":
        return torch.optim.Adam(parameters, lr=args.lr, weight_decay=args.weight_decay)
    if uses_momentum_correction(args):
        return torch.optim.SGD(parameters, lr=args.lr)
    return torch.optim.SGD(parameters, lr=args.lr, momentum=args.momentum,
                           weight_decay=args.weight_decay)


def describe_optimizer(args):
    """The optimizer and where its momentum lives, for the header line."""
    if args.optimizer == "adam":
        return f"Adam lr {args.lr} weight decay {args.weight_decay}"
    where = (f"in the hook (momentum correction, masking {args.momentum_masking})"
             if uses_momentum_correction(args) else "in the optimizer")
    return (f"SGD lr {args.lr}, momentum {args.momentum} and weight decay {args.weight_decay} "
            f"{where}")


def dense_bytes_per_step(n):
    """What a dense ring allreduce of n float32 sends per rank: 2 (P - 1) / P of the bytes."""
    return 2 * (size - 1) / size * 4 * n


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
