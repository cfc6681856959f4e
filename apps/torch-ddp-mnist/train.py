#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Fashion-MNIST with PyTorch DistributedDataParallel and OkTopk's communication hook.

    mpirun -np 4 python3 train.py --hook oktopk --density 0.01 --epochs 5

Every rank trains a 784-256-128-10 MLP, float32 or (--dtype bfloat16) cast to bfloat16, on its
own shard of the training set; DDP averages the gradients over the ranks through the hook
chosen with --hook: an OkTopk method (oktopk, topka, ... or dense, OkTopk's dense allreduce)
through oktopk.torch.oktopk_hook, its values sent in the model's type or as --wire says; or none
(DDP's own allreduce), or DDP's bf16_compress_hook or fp16_compress_hook, the 16-bit dense
baselines, or powersgd (PyTorch's PowerSGD hook, rank --powersgd-rank, error feedback and warm
start, the momentum in the optimizer). With SGD and an OkTopk hook, momentum correction is
on by default: the hook's state takes the optimizer's momentum and weight decay over, keeps
each rank's velocity and averages velocities, and at densities up to 0.01 clears the
velocity of the entries a reduce released from the residual (--momentum-masking: auto, the
default; held, always so; sent, of every entry the rank sent; off). --momentum-correction off
leaves the momentum to the optimizer, which applies it to the averaged gradient. Rank 0 prints
one line per epoch (test accuracy, seconds, bytes sent per rank per step), checks at the end
that the ranks' parameters are the same bits, and prints a final line "final test_acc=0.XXXX
bytes_per_step=N".

gloo in PyTorch 1.13 can neither broadcast nor sum bfloat16: with such a backend, DDP's
broadcast of a bfloat16 model goes through MPI as bit patterns, and a bfloat16 mean of DDP's
own hooks is summed as float32 and rounded once (apps/common/torch_ddp.py).

With --fsdp the model is sharded by FSDP2's fully_shard instead (one unit, or with --fsdp-units
layers each Linear layer a unit and the Sequential the root) and each unit's gradient is
reduce-scattered by OkTopk (oktopk.fsdp; --hook oktopk, topka, topkdsa, gaussiank or dense):
each rank keeps and updates only its shard of the parameters, and the accuracy uses the shards
gathered (there are no replicas to check at the end).

The processes find each other through MPI (mpi4py), not torch.distributed.run: rank 0 makes a
store file for gloo and broadcasts its path, so no port is fixed (apps/common/torch_ddp.py).
"""

import gzip
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                                "common"))
import torch_ddp as common  # noqa: E402 -- the programs' shared part, found through sys.path
from torch_ddp import DataError, UsageError, comm, rank, size  # noqa: E402

PROGRAM = "train.py"
DEFAULT_LR = {"sgd": 0.1, "adam": 0.001}
DTYPES = ("float32", "bfloat16")


def parse_arguments(argv):
    parser = common.Parser(
        prog=f"mpirun -np P python3 {PROGRAM}",
        description="Trains a Fashion-MNIST MLP (784-256-128-10) with PyTorch DDP, the "
                    "gradients averaged through OkTopk's communication hook.")
    common.add_training_arguments(parser, DEFAULT_LR)
    parser.add_argument("--epochs", type=int, default=5, help="passes over the training set "
                        "(default 5)")
    parser.add_argument("--batch", type=int, default=64, help="mini-batch per rank "
                        "(default 64)")
    parser.add_argument("--limit", type=int, default=0,
                        help="train on the first LIMIT images only (default: all 60000)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES,
                        help="the model's parameters, gradients and inputs: float32 or "
                             "bfloat16 (net.to(torch.bfloat16)) (default float32)")
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist",
                        help="folder of the gzip IDX files (default "
                             "/usr/share/datasets/fashion-mnist)")
    args = parser.parse_args(argv)
    common.check_training_arguments(parser, args, DEFAULT_LR)
    if args.epochs < 1:
        parser.error(f"--epochs must be >= 1, not {args.epochs}")
    if args.batch < 1:
        parser.error(f"--batch must be >= 1, not {args.batch}")
    if args.limit < 0:
        parser.error(f"--limit must be >= 0, not {args.limit}")
    if args.dtype != "float32" and args.wire != "native":
        parser.error(f"--wire {args.wire} narrows a float32 model's values; a {args.dtype} "
                     "model's travel in its own type (--wire native)")
    return args


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


def accuracy(torch, model, x, y, dtype):
    """Test accuracy over all ranks: each evaluates a shard (the models are identical)."""
    shard = slice(rank * len(x) // size, (rank + 1) * len(x) // size)
    with torch.no_grad():
        predicted = model(torch.from_numpy(x[shard]).to(dtype)).argmax(1).numpy()
    correct = comm.allreduce(int(np.sum(predicted == y[shard])))
    return correct / len(x)


def train(args):
    import torch

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
    directory = common.init_process_group("oktopk_mnist_")
    # An exception from here on may be this rank's alone: common.run ends the job, so there
    # is no cleanup to make on the way out (a barrier would wait for peers that never come).
    dtype = getattr(torch, args.dtype)
    net = make_model(torch).to(dtype)
    model = common.make_parallel(net, args, [m for m in net if len(list(m.parameters()))])
    n = sum(p.numel() for p in model.parameters())
    optimizer = common.make_optimizer(torch, model.parameters(), args)
    state = common.register_hook(model, optimizer, args)
    value_bytes = next(model.parameters()).element_size()
    shuffle = np.random.default_rng(args.seed)
    if rank == 0:
        wire = f", wire {args.wire}" if args.wire != "native" else ""
        print(f"# {args.hook}{wire} on {size} ranks: {n} {args.dtype} parameters, {steps} "
              f"steps per epoch of {args.batch} images per rank; "
              f"{common.describe_optimizer(args)}", flush=True)
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
            xb = torch.from_numpy(x_train[chosen]).to(dtype)
            yb = torch.from_numpy(y_train[chosen])
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            loss_sum += float(loss)
            epoch_bytes += common.bytes_sent(state, args, n, value_bytes, iteration)
            iteration += 1
        seconds = time.perf_counter() - start
        model.eval()
        whole = common.whole_model(model, args, lambda: make_model(torch).to(dtype))
        test_acc = accuracy(torch, whole, x_test, y_test, dtype)
        train_loss = comm.allreduce(loss_sum) / (size * steps)
        per_step = comm.allreduce(epoch_bytes) / (size * steps)
        bytes_total += per_step
        if rank == 0:
            print(f"{epoch:5d}  {train_loss:10.4f}  {test_acc:8.4f}  {seconds:7.2f}  "
                  f"{per_step:14.0f}", flush=True)
    parameters = common.check_parameters(model, args)
    if rank == 0:
        print(parameters, flush=True)
        print(f"final test_acc={test_acc:.4f} bytes_per_step={bytes_total / args.epochs:.0f}",
              flush=True)
    common.destroy_process_group(directory)


if __name__ == "__main__":
    sys.exit(common.run(PROGRAM, parse_arguments, train, sys.argv[1:]))
