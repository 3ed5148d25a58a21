#!/usr/bin/python3
"""DDP training of a small MLP on scikit-learn's 8x8 digits (python3-sklearn,
1797 images, 10 classes) with torch.distributed, over halka or gloo:

    torchrun --nproc_per_node=4 --redirects=2 --tee=2 \
        client/python/examples/train_ddp.py --backend=halka   # or =gloo

(with PYTHONPATH=build/client/python for halka; --redirects=2 --tee=2 only
works around Debian's torch 1.13 on Python 3.11, whose torchrun crashes on
its default "0"). Rank 0 prints, per epoch,
the mean training loss, the held-out accuracy, the epoch's time and the
time spent in communication: the summed latency of DDP's bucket
all-reduces (issue to completion, measured in the communication hook; they
overlap the backward pass, so they can add up to more than the time the
step waited for them).
"""

import argparse
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def load_digits_split(seed=0):
    """(x_train, y_train, x_test, y_test) as tensors: 80/20, pixels in [0, 1]."""
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[perm], y[perm]
    cut = int(0.8 * len(x))
    return x[:cut], y[:cut], x[cut:], y[cut:]


def make_model(hidden=128, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(),
                         nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 10))


def wrap(model, group, bucket_kib):
    """DDP over `group` with buckets of bucket_kib KiB (the first one too)."""
    dist._DEFAULT_FIRST_BUCKET_BYTES = bucket_kib * 1024
    return DDP(model, process_group=group, bucket_cap_mb=bucket_kib / 1024.0)


class CommTimer:
    """A DDP communication hook: all-reduce (average) each bucket, timed."""

    def __init__(self, group):
        self.group = group
        self.world = dist.get_world_size(group)
        self.seconds = 0.0

    def hook(self, state, bucket):
        t0 = time.perf_counter()
        buf = bucket.buffer().div_(self.world)
        fut = dist.all_reduce(buf, group=self.group, async_op=True).get_future()

        def done(f):
            self.seconds += time.perf_counter() - t0
            return f.value()[0]
        return fut.then(done)


def shard(x, y, rank, world):
    return x[rank::world], y[rank::world]


def steps(x, y, batch, epoch_seed):
    """The shuffled mini-batches of one epoch (the same on every run)."""
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch_seed))
    for i in range(0, len(x) - batch + 1, batch):
        idx = perm[i:i + batch]
        yield x[idx], y[idx]


def train(ddp, x, y, epochs, batch, lr, max_steps=None, on_epoch=None):
    """SGD with momentum; returns this rank's loss at every step."""
    opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    for epoch in range(epochs):
        t0 = time.perf_counter()
        for xb, yb in steps(x, y, batch, epoch):
            opt.zero_grad()
            loss = loss_fn(ddp(xb), yb)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if max_steps is not None and len(losses) >= max_steps:
                return losses
        if on_epoch is not None:
            on_epoch(epoch, losses, time.perf_counter() - t0)
    return losses


def accuracy(model, x, y):
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="halka", choices=["halka", "gloo"])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--bucket-kib", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=60, help="seconds")
    args = ap.parse_args()

    if args.backend == "halka":
        import halka.torch  # noqa: F401  registers the backend
    torch.set_num_threads(1)
    dist.init_process_group(args.backend,
                            timeout=__import__("datetime").timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y, xt, yt = load_digits_split()
    xs, ys = shard(x, y, rank, world)
    model = make_model(args.hidden)
    ddp = wrap(model, None, args.bucket_kib)
    timer = CommTimer(None)
    ddp.register_comm_hook(None, timer.hook)
    if rank == 0:
        print(f"# backend={args.backend} world={world} train={len(x)} "
              f"test={len(xt)} batch/rank={args.batch} "
              f"params={sum(p.numel() for p in model.parameters())} "
              f"bucket={args.bucket_kib} KiB", flush=True)
        print(f"{'epoch':>5} {'loss':>8} {'test acc':>8} {'epoch s':>8} {'comm s':>8}",
              flush=True)
    totals = {"wall": 0.0, "comm": 0.0}
    done = [0]

    def report(epoch, losses, seconds):
        n = len(losses) - done[0]
        mean = sum(losses[done[0]:]) / max(n, 1)
        done[0] = len(losses)
        totals["wall"] += seconds
        comm = timer.seconds - totals["comm"]
        totals["comm"] = timer.seconds
        if rank == 0:
            print(f"{epoch:5d} {mean:8.4f} {accuracy(model, xt, yt):8.4f} "
                  f"{seconds:8.3f} {comm:8.3f}", flush=True)

    train(ddp, xs, ys, args.epochs, args.batch, args.lr, on_epoch=report)
    if rank == 0:
        print(f"# total: {totals['wall']:.3f} s training, {totals['comm']:.3f} s "
              f"in bucket all-reduces; final test accuracy "
              f"{accuracy(model, xt, yt):.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
