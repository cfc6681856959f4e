#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Fashion-MNIST with PyTorch DistributedDataParallel and OkTopk's communication hook.

    mpirun -np 4 python3 train.py --hook oktopk --density 0.01 --epochs 5

Every rank trains a 784-256-128-10 MLP on its own shard of the training set; DDP averages the
gradients over the ranks through the hook chosen with --hook: an OkTopk method (oktopk, topka,
... or dense, OkTopk's dense allreduce) through oktopk.torch.oktopk_hook, or none (DDP's own
allreduce). With SGD and a hook, momentum correction is on by default: the hook keeps each
rank's velocity and averages velocities, and the optimizer is plain SGD (--momentum-correction
off: SGD with momentum applies momentum to the averaged gradient; --momentum-masking on: the
hook also clears a rank's velocity where the reduce sent the rank's entry). Rank 0 prints one
line per epoch (test accuracy, seconds, bytes sent per rank per step) and a final line
"final test_acc=0.XXXX bytes_per_step=N".

The processes find each other through MPI (mpi4py), not torch.distributed.run: rank 0 makes a
store file for gloo and broadcasts its path, so no port is fixed.
"""

import argparse
import gzip
import os
import shutil
import sys
import tempfile
import time

import numpy as np
from mpi4py import MPI

PROGRAM = "train.py"
HOOKS = ("oktopk", "topka", "topkdsa", "gtopk", "gaussiank", "s2", "dense", "none")
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()


class UsageError(Exception):
    """A bad command line: every rank sees the same one."""


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (on rank 0) instead of exiting."""

    def error(self, message):
        raise UsageError(message)

    def print_help(self, file=None):
        if rank == 0:
            super().print_help(file)


def parse_arguments(argv):
    parser = Parser(
        prog=f"mpirun -np P python3 {PROGRAM}",
        description="Trains a Fashion-MNIST MLP (784-256-128-10) with PyTorch DDP, the "
                    "gradients averaged through OkTopk's communication hook.")
    parser.add_argument("--hook", default="oktopk", choices=HOOKS,
                        help="OkTopk method of the hook, or none for DDP's own allreduce "
                             "(default oktopk)")
    parser.add_argument("--density", type=float, default=0.01,
                        help="fraction of each gradient the sparse methods keep, (0, 1] "
                             "(default 0.01)")
    parser.add_argument("--epochs", type=int, default=5, help="passes over the training set "
                        "(default 5)")
    parser.add_argument("--batch", type=int, default=64, help="mini-batch per rank "
                        "(default 64)")
    parser.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (default 0.1)")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum, [0, 1) "
                        "(default 0.9)")
    parser.add_argument("--weight-decay", type=float, default=0.0,
                        help="L2 weight decay, >= 0 (default 0)")
    parser.add_argument("--optimizer", default="sgd", choices=("sgd", "adam"),
                        help="sgd (with --momentum) or adam (torch.optim.Adam, --lr its step "
                             "size; the hook reduces gradients) (default sgd)")
    parser.add_argument("--momentum-correction", default="on", choices=("on", "off"),
                        help="with sgd and a hook: on, the hook keeps each rank's velocity and "
                             "averages velocities (the optimizer is plain SGD); off, momentum "
                             "is applied to the averaged gradient (default on)")
    parser.add_argument("--momentum-masking", default="off", choices=("on", "off"),
                        help="with momentum correction: on, the hook clears a rank's velocity "
                             "where the reduce sent the rank's entry (default off)")
    parser.add_argument("--start-iter", type=int, default=2,
                        help="steps made with DDP's dense allreduce before the hook's method "
                             "starts (default 2: DDP rebuilds its buckets after step 1)")
    parser.add_argument("--whole-model", action="store_true",
                        help="one OkTopk handle over all buckets (global top-k selection)")
    parser.add_argument("--limit", type=int, default=0,
                        help="train on the first LIMIT images only (default: all 60000)")
    parser.add_argument("--seed", type=int, default=1, help="initialisation and shuffling "
                        "(default 1)")
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist",
                        help="folder of the gzip IDX files (default "
                             "/usr/share/datasets/fashion-mnist)")
    args = parser.parse_args(argv)
    if not 0 < args.density <= 1:
        parser.error(f"--density must be in (0, 1], not {args.density}")
    if args.epochs < 1:
        parser.error(f"--epochs must be >= 1, not {args.epochs}")
    if args.batch < 1:
        parser.error(f"--batch must be >= 1, not {args.batch}")
    if not args.lr > 0:
        parser.error(f"--lr must be > 0, not {args.lr}")
    if not 0 <= args.momentum < 1:
        parser.error(f"--momentum must be in [0, 1), not {args.momentum}")
    if not 0 <= args.weight_decay < float("inf"):
        parser.error(f"--weight-decay must be a finite number >= 0, not {args.weight_decay}")
    if args.start_iter < 0:
        parser.error(f"--start-iter must be >= 0, not {args.start_iter}")
    if args.limit < 0:
        parser.error(f"--limit must be >= 0, not {args.limit}")
    return args


class DataError(Exception):
    """A missing or damaged dataset file (every rank reads the same files)."""


def read_idx(path, magic, item_shape):
    """The items of a gzip IDX file (big-endian header: magic, counts, dimensions) as uint8."""
    if not os.path.isfile(path):
        raise DataError(f"dataset not found: {path} is missing")
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as error:
        raise DataError(f"{path}: {error}") from None
    dims = len(item_shape) + 1
    header = 4 + 4 * dims
    if len(data) < header or int.from_bytes(data[:4], "big") != magic:
        raise DataError(f"{path}: not an IDX file of the expected kind")
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    if shape[1:] != item_shape or len(data) != header + int(np.prod(shape)):
        raise DataError(f"{path}: {shape} does not match its size or the expected items")
    return np.frombuffer(data, np.uint8, offset=header).reshape(shape)


def load(directory, split):
    """(images as float32 in [0, 1], flattened, normalised; labels as int64)."""
    images = read_idx(os.path.join(directory, f"{split}-images-idx3-ubyte.gz"), 2051, (28, 28))
    labels = read_idx(os.path.join(directory, f"{split}-labels-idx1-ubyte.gz"), 2049, ())
    if len(images) != len(labels):
        raise DataError(f"{directory}: {split} has {len(images)} images but {len(labels)} "
                        "labels")
    x = (images.reshape(len(images), -1).astype(np.float32) / 255.0 - 0.2860) / 0.3530
    return x, labels.astype(np.int64)


def make_model(torch):
    return torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 10))


def uses_momentum_correction(args):
    """Whether the hook keeps the velocity (SGD through a hook, correction on)."""
    return (args.optimizer == "sgd" and args.hook != "none"
            and args.momentum_correction == "on")


def make_optimizer(torch, parameters, args, corrected):
    """Plain SGD when the hook applies momentum and weight decay, else the chosen optimizer."""
    if args.optimizer == "adam":
        return torch.optim.Adam(parameters, lr=args.lr, weight_decay=args.weight_decay)
    if corrected:
        return torch.optim.SGD(parameters, lr=args.lr)
    return torch.optim.SGD(parameters, lr=args.lr, momentum=args.momentum,
                           weight_decay=args.weight_decay)


def describe_optimizer(args, corrected):
    if args.optimizer == "adam":
        return f"Adam lr {args.lr} weight decay {args.weight_decay}"
    where = "in the hook (momentum correction)" if corrected else "in the optimizer"
    return (f"SGD lr {args.lr}, momentum {args.momentum} and weight decay {args.weight_decay} "
            f"{where}")


def accuracy(torch, model, x, y):
    """Test accuracy over all ranks: each evaluates a shard (the models are identical)."""
    shard = slice(rank * len(x) // size, (rank + 1) * len(x) // size)
    with torch.no_grad():
        predicted = model(torch.from_numpy(x[shard])).argmax(1).numpy()
    correct = comm.allreduce(int(np.sum(predicted == y[shard])))
    return correct / len(x)


def train(args):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import oktopk.torch as okt

    x_train, y_train = load(args.data, "train")
    x_test, y_test = load(args.data, "t10k")
    if args.limit:
        x_train, y_train = x_train[:args.limit], y_train[:args.limit]
    steps = len(x_train) // (size * args.batch)
    if steps == 0:
        raise UsageError(f"{len(x_train)} training images make no step of {args.batch} per "
                         f"rank on {size} ranks")

    torch.set_num_threads(1)  # ranks share the cores
    torch.manual_seed(args.seed)
    directory = tempfile.mkdtemp(prefix="oktopk_mnist_") if rank == 0 else None
    directory = comm.bcast(directory, root=0)
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(directory, 'store')}",
                            rank=rank, world_size=size)
    # An exception from here on may be this rank's alone: main() then ends the job, so there
    # is no cleanup to make on the way out (a barrier would wait for peers that never come).
    model = DDP(make_model(torch))
    n = sum(p.numel() for p in model.parameters())
    state = None
    corrected = uses_momentum_correction(args)
    if args.hook != "none":
        correction = (dict(momentum=args.momentum, weight_decay=args.weight_decay,
                           momentum_masking=args.momentum_masking == "on")
                      if corrected else {})
        state = okt.OkTopkHookState(algorithm=args.hook, density=args.density,
                                    start_iter=args.start_iter,
                                    whole_model=args.whole_model, **correction)
        model.register_comm_hook(state, okt.oktopk_hook)
    optimizer = make_optimizer(torch, model.parameters(), args, corrected)
    # What a dense ring allreduce sends per rank: 2 (P - 1) / P of the gradient's bytes.
    dense_bytes = 2 * (size - 1) / size * 4 * n
    shuffle = np.random.default_rng(args.seed)
    if rank == 0:
        print(f"# {args.hook} on {size} ranks: {n} parameters, {steps} steps per epoch of "
              f"{args.batch} images per rank; {describe_optimizer(args, corrected)}",
              flush=True)
        print("epoch  train_loss  test_acc  seconds  bytes_per_step", flush=True)
    iteration = 0
    bytes_total = 0.0
    test_acc = 0.0
    for epoch in range(1, args.epochs + 1):
        order = shuffle.permutation(len(x_train))
        start = time.perf_counter()
        loss_sum = 0.0
        epoch_bytes = 0.0
        model.train()
        for step in range(steps):
            first = (step * size + rank) * args.batch
            chosen = order[first:first + args.batch]
            xb = torch.from_numpy(x_train[chosen])
            yb = torch.from_numpy(y_train[chosen])
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            loss_sum += float(loss)
            sparse = (state is not None and args.hook != "dense"
                      and iteration >= args.start_iter)
            epoch_bytes += state.bytes_sent_last_iteration() if sparse else dense_bytes
            iteration += 1
        seconds = time.perf_counter() - start
        model.eval()
        test_acc = accuracy(torch, model.module, x_test, y_test)
        train_loss = comm.allreduce(loss_sum) / (size * steps)
        per_step = comm.allreduce(epoch_bytes) / (size * steps)
        bytes_total += per_step
        if rank == 0:
            print(f"{epoch:5d}  {train_loss:10.4f}  {test_acc:8.4f}  {seconds:7.2f}  "
                  f"{per_step:14.0f}", flush=True)
    if rank == 0:
        print(f"final test_acc={test_acc:.4f} bytes_per_step={bytes_total / args.epochs:.0f}",
              flush=True)
    comm.Barrier()
    dist.destroy_process_group()
    if rank == 0:
        shutil.rmtree(directory, ignore_errors=True)


def main(argv):
    try:
        args = parse_arguments(argv)
        train(args)
    except SystemExit as done:  # --help
        return done.code or 0
    except (UsageError, DataError) as error:
        # The same on every rank (the same command line and files): rank 0 says it, once.
        if rank == 0:
            print(f"{PROGRAM}: {error}", file=sys.stderr, flush=True)
        return 2 if isinstance(error, UsageError) else 1
    except Exception as error:  # noqa: BLE001 -- possibly this rank's alone: end the job
        print(f"{PROGRAM}: rank {rank}: {type(error).__name__}: {error}", file=sys.stderr,
              flush=True)
        comm.Abort(1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
