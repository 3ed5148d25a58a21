"""One rank of test_torch_ops.py: torch.distributed collectives over halka
(the default group) against gloo (a second group) and against the result
computed here from every rank's (deterministic) input."""

import datetime

import torch
import torch.distributed as dist

import halka.torch  # noqa: F401

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
          torch.int32, torch.int64]
OPS = {"SUM": dist.ReduceOp.SUM, "AVG": dist.ReduceOp.AVG,
       "MIN": dist.ReduceOp.MIN, "MAX": dist.ReduceOp.MAX,
       "PRODUCT": dist.ReduceOp.PRODUCT}
N = 300


def data(rank, dtype, n=N):
    # Small integers (negatives for the signed types): exact sums and
    # products in every dtype.
    v = (torch.arange(n) * 7 + rank * 3) % 5 + 1
    if not dtype.is_floating_point:
        v = v - 2
    return v.to(dtype)


def reference(op, inputs):
    wide = torch.stack([x.double() for x in inputs])
    if op == "SUM":
        r = wide.sum(0)
    elif op == "AVG":
        r = wide.sum(0) / len(inputs)
        if not inputs[0].dtype.is_floating_point:
            r = r.trunc()
    elif op == "MIN":
        r = wide.min(0).values
    elif op == "MAX":
        r = wide.max(0).values
    else:
        r = wide.prod(0)
    return r.to(inputs[0].dtype)


def same(a, b, what, op=None):
    if op == "AVG" and a.dtype.is_floating_point:
        torch.testing.assert_close(a, b, msg=what)  # one rounding apart
    elif not torch.equal(a, b):
        raise AssertionError(f"{what}: {a[:8]} != {b[:8]}")


def gloo_supports(fn):
    try:
        fn()
        return True
    except RuntimeError:
        return False


def run(rank, world):
    torch.set_num_threads(1)
    dist.init_process_group("halka", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    assert dist.get_backend() == "halka"
    gloo = dist.new_group(backend="gloo")
    inputs = {d: [data(r, d) for r in range(world)] for d in DTYPES}
    for d in DTYPES:
        mine = inputs[d][rank]
        for name, op in OPS.items():
            t = mine.clone()
            dist.all_reduce(t, op=op)
            same(t, reference(name, inputs[d]), f"all_reduce {d} {name}", name)
            g = mine.clone()
            if gloo_supports(lambda: dist.all_reduce(g, op=op, group=gloo)):
                same(t, g, f"all_reduce {d} {name} vs gloo", name)
            # reduce_scatter: rank r gets the reduction of slice r.
            outs = torch.empty(N, dtype=d)
            ins = [data(rank * world + k, d) for k in range(world)]
            dist.reduce_scatter(outs, ins, op=op)
            want = reference(name, [data(q * world + rank, d) for q in range(world)])
            same(outs, want, f"reduce_scatter {d} {name}", name)
        for root in range(world):
            t = mine.clone()
            dist.broadcast(t, src=root)
            same(t, inputs[d][root], f"broadcast {d} root {root}")
        outs = [torch.empty(N, dtype=d) for _ in range(world)]
        dist.all_gather(outs, mine)
        gouts = [torch.empty(N, dtype=d) for _ in range(world)]
        by_gloo = gloo_supports(lambda: dist.all_gather(gouts, mine, group=gloo))
        for r in range(world):
            same(outs[r], inputs[d][r], f"all_gather {d} slot {r}")
            if by_gloo:
                same(outs[r], gouts[r], f"all_gather {d} slot {r} vs gloo")
    # Asynchronous work: futures complete in issue order.
    ts = [data(rank, torch.float32) for _ in range(8)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    futs = [w.get_future() for w in works]
    for t, f in zip(ts, futs):
        f.wait()
        same(t, reference("SUM", inputs[torch.float32]), "async all_reduce")
    dist.barrier()
    # What halka does not do raises RuntimeError naming it.
    expect_error(lambda: dist.all_reduce(torch.zeros(4, dtype=torch.uint8)),
                 "allreduce", "dtype")
    expect_error(lambda: dist.all_reduce(torch.zeros(4), op=dist.ReduceOp.BAND),
                 "allreduce", "reduce op")
    expect_error(lambda: dist.reduce(torch.zeros(4), dst=0), "reduce")
    expect_error(lambda: dist.all_to_all_single(torch.zeros(world), torch.zeros(world)),
                 "alltoall")
    dist.barrier()
    dist.destroy_process_group()


def expect_error(fn, *words):
    try:
        fn()
    except RuntimeError as e:
        for w in words:
            if w not in str(e):
                raise AssertionError(f"{w!r} not in the error: {e}") from e
        return
    raise AssertionError(f"no RuntimeError for {words}")


def run_backend_string(rank, world, backend):
    """torch >= 2: "halka" registered for cpu and cuda; `backend` names it
    per device ("cpu:halka"). One all_reduce and a barrier."""
    torch.set_num_threads(1)
    dist.init_process_group(backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    t = data(rank, torch.float32)
    dist.all_reduce(t)
    same(t, reference("SUM", [data(r, torch.float32) for r in range(world)]),
         f"all_reduce over {backend!r}")
    dist.barrier()
    dist.destroy_process_group()
