"""One rank of the DDP equality test (test_ddp.py): the same seeded
training (train_ddp.py's model and data) over halka and over gloo, in the
same processes, once in float32 and once in float64; writes this rank's
losses and parameter digests to OUT_DIR/rank<R>.json. Runs under torchrun
(env) or mp.spawn (run())."""

import datetime
import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python", "examples"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import halka.torch  # noqa: E402,F401
import train_ddp  # noqa: E402

STEPS = 200
# 26 K parameters in 6 tensors; DDP never splits a tensor, so a 16 KiB cap
# makes 2-3 buckets a step, the largest the 128 x 128 weight with what
# closes it (about 70 KB in float32, 140 KB in float64): above eager_bytes,
# so 2 ranks on one host reduce it with the ring and 4 with recursive
# doubling, the smaller ones with recursive doubling.
BUCKET_KIB = 16


def digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


DTYPES = ("float32", "float64")


def one_backend(group, x, y, dtype):
    model = train_ddp.make_model(hidden=128, seed=1).to(dtype)
    x = x.to(dtype)
    ddp = train_ddp.wrap(model, group, BUCKET_KIB)
    losses = train_ddp.train(ddp, x, y, epochs=100, batch=8, lr=0.05,
                             max_steps=STEPS)
    return losses, digest(model)


def run(rank, world, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("halka", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    x, y, _, _ = train_ddp.load_digits_split()
    x, y = train_ddp.shard(x, y, rank, world)
    out = {"backend": dist.get_backend()}
    for name in DTYPES:
        dtype = getattr(torch, name)
        h_losses, h_digest = one_backend(None, x, y, dtype)
        g_losses, g_digest = one_backend(gloo, x, y, dtype)
        out[name] = {"halka": h_losses, "gloo": g_losses,
                     "halka_digest": h_digest, "gloo_digest": g_digest}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), sys.argv[1])
