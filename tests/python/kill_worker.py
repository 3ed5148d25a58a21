"""One rank of the kill test (test_kill.py): data-parallel training over
halka (each gradient all-reduced asynchronously, then waited for); rank
VICTIM kills itself (SIGKILL) at step KILL_AT. The survivors write what they
raised, and how long after the kill, to OUT_DIR/rank<R>.json and exit."""

import datetime
import json
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python", "examples"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import halka.torch  # noqa: E402,F401
import train_ddp  # noqa: E402

VICTIM = 1
KILL_AT = 30
DEADLINE_S = 20


def run(rank, world, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("halka", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=DEADLINE_S))
    x, y, _, _ = train_ddp.load_digits_split()
    x, y = train_ddp.shard(x, y, rank, world)
    model = train_ddp.make_model(seed=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    result = {"error": None}
    try:
        for step in range(10_000):  # bounded; the kill comes at KILL_AT
            if rank == VICTIM and step == KILL_AT:
                os.kill(os.getpid(), signal.SIGKILL)
            if step == KILL_AT:
                result["kill_time"] = time.time()
            xb, yb = x[:16], y[:16]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            works = [dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, async_op=True)
                     for p in model.parameters()]
            for w in works:
                w.wait()
            opt.step()
    except RuntimeError as e:
        result.update(error=str(e), type=type(e).__name__, step=step,
                      raised_at=time.time())
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), sys.argv[1])
