#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""A King James Bible language model with PyTorch DistributedDataParallel and OkTopk's hook.

    mpirun -np 4 python3 -m mpi4py train.py --hook oktopk --density 0.01 --steps 300

Every rank trains the same small word-level causal Transformer (token embedding, learned
positional embedding, two encoder layers, an output layer of its own: untied, so the embedding's
gradient keeps only the rows of the words a step saw) on its own sequences of each step's batch;
DDP averages the gradients over the ranks through the hook chosen with --hook: an OkTopk method
(oktopk, topka, ... or dense, OkTopk's dense allreduce) through oktopk.torch.oktopk_hook, its
values sent in the model's type or as --wire says; or none (DDP's own allreduce), or DDP's
bf16_compress_hook or fp16_compress_hook, or powersgd (PyTorch's PowerSGD hook, rank
--powersgd-rank, error feedback and warm start, the momentum in the optimizer). With
--optimizer sgd and an OkTopk hook, the hook's state takes the optimizer's momentum and weight
decay over and reduces each rank's velocity (--momentum-correction on, the default), and at
densities up to 0.01 clears the velocity of the entries a reduce released from the residual
(--momentum-masking: auto, the default; held, always so; sent, of every entry the rank sent;
off).

With --fsdp the model is sharded by FSDP2's fully_shard instead (one unit, or with --fsdp-units
layers each encoder layer a unit and the model the root) and each unit's gradient is
reduce-scattered by OkTopk (oktopk.fsdp; --hook oktopk, topka, topkdsa, gaussiank or dense);
the validation loss uses the shards gathered.

The text is scripts/kjv-corpus.sh's: one verse a line, led by its reference ("Ge1:1 In the
beginning ..."), which is dropped. Words are lowercased runs of letters (an apostrophe between
letters stays inside a word); every verse ends with "</s>"; the vocabulary is the most frequent
words of the whole text, the others "<unk>". The last 5% of the verses are held out.

Rank 0 prints a progress line every --log-every steps (step, mean training loss over those steps
and all ranks, seconds, bytes sent per rank per step) and a final line
"final train_loss_last20=X.XXXX val_loss=X.XXXX bytes_per_step=N": the mean training loss of
the last 20 steps over all ranks, the loss on --val-seqs held-out sequences, and the mean bytes
sent per rank per step.

The processes find each other through MPI (mpi4py), not torch.distributed.run: rank 0 makes a
store file for gloo and broadcasts its path, so no port is fixed (apps/common/torch_ddp.py).
"""

import collections
import os
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                                "common"))
import torch_ddp as common  # noqa: E402 -- the programs' shared part, found through sys.path
from torch_ddp import DataError, UsageError, comm, rank, size  # noqa: E402

PROGRAM = "train.py"
DEFAULT_LR = {"sgd": 0.2, "adam": 0.002}
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_DATA = os.path.join(REPOSITORY, "build", "data", "kjv-verses.txt")
HELD_OUT = 0.05  # the fraction of the verses, at the end, held out for the validation loss
LAST = 20        # the final line's training loss is the mean over this many last steps


def parse_arguments(argv):
    parser = common.Parser(
        prog=f"mpirun -np P python3 -m mpi4py {PROGRAM}",
        description="Trains a word-level Transformer language model of the King James Bible "
                    "with PyTorch DDP, the gradients averaged through OkTopk's communication "
                    "hook.")
    common.add_training_arguments(parser, DEFAULT_LR)
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    parser.add_argument("--batch", type=int, default=16, help="sequences per rank per step "
                        "(default 16)")
    parser.add_argument("--seq-len", type=int, default=32, help="tokens per sequence "
                        "(default 32)")
    parser.add_argument("--sparse-rows", default="off", choices=("on", "off"),
                        help="on: the hook's handles know the token embedding's gradient as "
                             "rows (OkTopkHookState(sparse_rows=embedding_weights(model))) "
                             "(default off)")
    parser.add_argument("--vocab", type=int, default=4000,
                        help="vocabulary: the most frequent words, <unk> and </s> included, "
                             ">= 3 (default 4000)")
    parser.add_argument("--d-model", type=int, default=128, help="model width (default 128)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads, dividing "
                        "--d-model (default 4)")
    parser.add_argument("--val-seqs", type=int, default=256,
                        help="held-out sequences the validation loss is taken over "
                             "(default 256)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="where the model and its gradients live: cpu, or cuda (rank r on "
                             "GPU r mod the GPUs torch sees, so ranks may share one; the hook "
                             "then needs OkTopk built for CUDA) (default cpu)")
    parser.add_argument("--log-every", type=int, default=25,
                        help="steps per progress line (default 25)")
    parser.add_argument("--data", default=DEFAULT_DATA,
                        help="the King James Bible, one verse a line, as scripts/kjv-corpus.sh "
                             "writes it (default build/data/kjv-verses.txt in the repository)")
    args = parser.parse_args(argv)
    common.check_training_arguments(parser, args, DEFAULT_LR)
    for flag in ("steps", "batch", "seq_len", "d_model", "heads", "val_seqs", "log_every"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1, not {getattr(args, flag)}")
    if args.d_model % args.heads:
        parser.error(f"--heads ({args.heads}) must divide --d-model ({args.d_model})")
    if args.vocab < 3:
        parser.error(f"--vocab must be >= 3, not {args.vocab}")
    if args.sparse_rows == "on" and args.hook not in common.OKTOPK_HOOKS:
        parser.error(f"--sparse-rows on needs an OkTopk hook (not --hook {args.hook})")
    if args.sparse_rows == "on" and args.fsdp:
        parser.error("--sparse-rows on is for the DDP hook: an FSDP unit's gradient interleaves "
                     "the shards of its parameters, so it has no rows")
    return args


REFERENCE = re.compile(r"[1-3]?[A-Za-z]+[0-9]+:[0-9]+ ")
WORD = re.compile(r"[a-z]+(?:'[a-z]+)*")


def read_verses(path):
    """Each verse's words, lowercased, its reference dropped."""
    hint = f"make it with scripts/kjv-corpus.sh {path}"
    if not os.path.isfile(path):
        raise DataError(f"text not found: {path} is missing ({hint})")
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise DataError(f"{path}: {error}") from None
    verses = []
    for number, line in enumerate(lines, 1):
        reference = REFERENCE.match(line)
        if reference is None:
            raise DataError(f"{path}:{number}: not a verse led by its reference (\"Ge1:1 In "
                            f"the beginning ...\"; {hint})")
        verses.append(WORD.findall(line[reference.end():].lower()))
    if len(verses) < 40:
        raise DataError(f"{path}: {len(verses)} verses are too few to hold {HELD_OUT:.0%} "
                        f"out ({hint})")
    return verses


def encode(verses, vocab):
    """(token ids of the training verses, of the held-out ones, the vocabulary's size): ids 0
    <unk>, 1 </s> (each verse's end), then the vocab - 2 most frequent words of the whole text,
    most frequent first, ties alphabetically, so every rank numbers them alike."""
    counts = collections.Counter(word for verse in verses for word in verse)
    frequent = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:vocab - 2]
    ids = {word: i for i, (word, _) in enumerate(frequent, 2)}

    def stream(part):
        tokens = [i for verse in part for i in [ids.get(w, 0) for w in verse] + [1]]
        return np.array(tokens, dtype=np.int64)

    held = len(verses) - int(round(HELD_OUT * len(verses)))
    return stream(verses[:held]), stream(verses[held:]), len(ids) + 2


def windows(tokens, length):
    """Start offsets of the stream's non-overlapping windows of length + 1 tokens (input and
    next-token target)."""
    return np.arange((len(tokens) - 1) // length, dtype=np.int64) * length


def sequences(torch, tokens, starts, length):
    """(inputs, targets) of the windows at ``starts``, each [len(starts), length]."""
    index = starts[:, None] + np.arange(length + 1)[None, :]
    chunk = torch.from_numpy(tokens[index])
    return chunk[:, :-1], chunk[:, 1:]


def make_model(torch, vocab, d_model, heads, seq_len):
    nn = torch.nn

    class LanguageModel(nn.Module):
        """Token and learned positional embeddings, two pre-norm causal encoder layers, a final
        layer norm and an untied output layer over the vocabulary."""

        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(vocab, d_model)
            self.position = nn.Parameter(torch.randn(seq_len, d_model) * 0.02)
            layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=4 * d_model,
                                               dropout=0.0, batch_first=True, norm_first=True)
            self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(d_model)
            self.output = nn.Linear(d_model, vocab)
            # Not a buffer, which DDP would broadcast every step: the same on every rank.
            self.mask = torch.triu(torch.full((seq_len, seq_len), float("-inf")), diagonal=1)

        def forward(self, tokens):
            length = tokens.shape[1]
            x = self.embedding(tokens) + self.position[:length]
            x = self.encoder(x, mask=self.mask[:length, :length])
            return self.output(self.norm(x))

    return LanguageModel()


def fresh_model(torch, args, vocab, device):
    net = make_model(torch, vocab, args.d_model, args.heads, args.seq_len).to(device)
    net.mask = net.mask.to(device)  # not a buffer: to() leaves it
    return net


def validation_loss(torch, model, tokens, starts, length, device):
    """Mean loss per token over the held-out windows at ``starts``, each rank taking a shard
    (the models are identical)."""
    shard = starts[rank * len(starts) // size:(rank + 1) * len(starts) // size]
    total = 0.0
    with torch.no_grad():
        for first in range(0, len(shard), 64):
            x, y = (t.to(device) for t in sequences(torch, tokens, shard[first:first + 64],
                                                     length))
            logits = model(x)
            total += float(torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum"))
    return comm.allreduce(total) / (len(starts) * length)


def train(args):
    import torch

    import oktopk.torch as okt

    train_tokens, val_tokens, vocab = encode(read_verses(args.data), args.vocab)
    train_starts = windows(train_tokens, args.seq_len)
    val_starts = windows(val_tokens, args.seq_len)
    per_step = size * args.batch
    if len(train_starts) < per_step:
        raise UsageError(f"{len(train_tokens)} training tokens make no step of {args.batch} "
                         f"sequences of {args.seq_len} per rank on {size} ranks")
    if len(val_starts) < args.val_seqs:
        raise UsageError(f"{len(val_tokens)} held-out tokens make only {len(val_starts)} "
                         f"sequences of {args.seq_len}, fewer than --val-seqs {args.val_seqs}")
    # Spread evenly over the held-out text, the same on every rank.
    val_starts = val_starts[np.linspace(0, len(val_starts) - 1, args.val_seqs).astype(np.int64)]

    torch.set_num_threads(1)  # ranks share the cores
    torch.manual_seed(args.seed)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("--device cuda, but torch sees no GPU")
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)  # before the hook's first handle: OkTopk's GPU is this
    else:
        device = torch.device("cpu")
    directory = common.init_process_group("oktopk_lm_")
    # An exception from here on may be this rank's alone: common.run ends the job, so there
    # is no cleanup to make on the way out (a barrier would wait for peers that never come).
    net = fresh_model(torch, args, vocab, device)
    model = common.make_parallel(net, args, list(net.encoder.layers))
    n = sum(p.numel() for p in model.parameters())
    optimizer = common.make_optimizer(torch, model.parameters(), args)
    state = common.register_hook(
        model, optimizer, args, okt.embedding_weights(net) if args.sparse_rows == "on" else None)
    value_bytes = next(net.parameters()).element_size()
    shuffle = np.random.default_rng(args.seed)
    if rank == 0:
        print(f"# {args.hook} on {size} ranks: {n} parameters ({vocab} x {args.d_model} token "
              f"embedding), {len(train_tokens)} training and {len(val_tokens)} held-out "
              f"tokens, {args.batch} sequences of {args.seq_len} tokens per rank per step "
              f"on {device.type}; {common.describe_optimizer(args)}", flush=True)
        print(" step  train_loss  seconds  bytes_per_step", flush=True)
    losses = []
    bytes_total = 0.0
    order = shuffle.permutation(train_starts)
    taken = 0
    interval_loss = 0.0
    interval_bytes = 0.0
    start = time.perf_counter()
    model.train()
    for iteration in range(args.steps):
        if taken + per_step > len(order):  # a new pass over the training text
            order = shuffle.permutation(train_starts)
            taken = 0
        mine = order[taken + rank * args.batch:taken + (rank + 1) * args.batch]
        taken += per_step
        x, y = (t.to(device) for t in sequences(torch, train_tokens, mine, args.seq_len))
        optimizer.zero_grad()
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
        interval_loss += losses[-1]
        sent = common.bytes_sent(state, args, n, value_bytes, iteration)
        interval_bytes += sent
        bytes_total += sent
        step = iteration + 1
        if step % args.log_every == 0 or step == args.steps:
            count = (step - 1) % args.log_every + 1
            train_loss = comm.allreduce(interval_loss) / (size * count)
            sent_per_step = comm.allreduce(interval_bytes) / (size * count)
            seconds = time.perf_counter() - start
            if rank == 0:
                print(f"{step:5d}  {train_loss:10.4f}  {seconds:7.2f}  {sent_per_step:14.0f}",
                      flush=True)
            interval_loss = 0.0
            interval_bytes = 0.0
            start = time.perf_counter()
    last = losses[-LAST:]
    train_loss_last = comm.allreduce(sum(last)) / (size * len(last))
    bytes_per_step = comm.allreduce(bytes_total) / (size * args.steps)
    model.eval()
    whole = common.whole_model(model, args, lambda: fresh_model(torch, args, vocab, device))
    val_loss = validation_loss(torch, whole, val_tokens, val_starts, args.seq_len, device)
    parameters = common.check_parameters(model, args)
    if rank == 0:
        print(parameters, flush=True)
        print(f"final train_loss_last{LAST}={train_loss_last:.4f} val_loss={val_loss:.4f} "
              f"bytes_per_step={bytes_per_step:.0f}", flush=True)
    common.destroy_process_group(directory)


if __name__ == "__main__":
    sys.exit(common.run(PROGRAM, parse_arguments, train, sys.argv[1:]))
