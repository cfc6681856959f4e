# SPDX-License-Identifier: BSD-3-Clause
"""OkTopk's sparse allreduce as the communication hook of a PyTorch DDP model.

The processes are an MPI job (OkTopk's handles live on mpi4py's MPI.COMM_WORLD); gloo's process
group, which DDP needs as well, spans the same ranks through a file store that rank 0 makes.
The hook's state is given the optimizer: it takes the optimizer's momentum and weight decay
over (momentum correction), so the optimizer stays the one the script would use without it.

    mpirun -np 2 python3 ddp_hook.py
"""
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
from mpi4py import MPI

import oktopk.torch


def main():
    comm = MPI.COMM_WORLD
    store = tempfile.mkdtemp(prefix="oktopk_example_") if comm.rank == 0 else None
    store = comm.bcast(store, root=0)
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(store, 'store')}",
                            rank=comm.rank, world_size=comm.size)

    torch.manual_seed(0)  # the same initial weights on every rank
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    model = torch.nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = oktopk.torch.OkTopkHookState(algorithm="oktopk", density=0.05, optimizer=optimizer)
    model.register_comm_hook(state, oktopk.torch.oktopk_hook)

    # Each rank its own shard of a fixed random classification problem.
    data = torch.Generator().manual_seed(1 + comm.rank)
    inputs = torch.randn(512, 64, generator=data)
    labels = (inputs[:, :4].argmax(dim=1))
    loss_fn = torch.nn.CrossEntropyLoss()
    losses = []
    for _ in range(60):
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())

    # The replicas stay identical: the hook's output is the same bits on every rank.
    first = torch.cat([p.detach().flatten() for p in model.parameters()])
    lowest = comm.allreduce(float(first.sum()), op=MPI.MIN)
    highest = comm.allreduce(float(first.sum()), op=MPI.MAX)
    same = lowest == highest
    if comm.rank == 0:
        print(f"ddp_hook: {comm.size} ranks, torch {torch.__version__}: loss {losses[0]:.3f} -> "
              f"{losses[-1]:.3f}, replicas {'identical' if same else 'DIFFERENT'}")
    comm.Barrier()
    dist.destroy_process_group()
    if comm.rank == 0:
        shutil.rmtree(store, ignore_errors=True)
    return 0 if same and losses[-1] < losses[0] else 1


if __name__ == "__main__":
    raise SystemExit(main())
