"""One rank of test_torch_ops.py: torch.distributed collectives over halka
(the default group) against gloo (a second group) and against the result
computed here from every rank's (deterministic) input."""

import datetime
import time

import torch
import torch.distributed as dist

import halka.torch  # noqa: F401

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
          torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8,
          torch.bool]
OPS = {"SUM": dist.ReduceOp.SUM, "AVG": dist.ReduceOp.AVG,
       "MIN": dist.ReduceOp.MIN, "MAX": dist.ReduceOp.MAX,
       "PRODUCT": dist.ReduceOp.PRODUCT}
N = 300


def data(rank, dtype, n=N):
    # Small integers (negatives for the signed types): exact sums and
    # products in every dtype.
    v = (torch.arange(n) * 7 + rank * 3) % 5 + 1
    if dtype == torch.bool:
        return v % 2 == 0
    if dtype.is_floating_point or dtype == torch.uint8:
        return v.to(dtype)
    return (v - 2).to(dtype)


def reference(op, inputs):
    if inputs[0].dtype == torch.bool:  # SUM/MAX: or; PRODUCT/MIN: and
        stacked = torch.stack(inputs)
        return stacked.any(0) if op in ("SUM", "MAX") else stacked.all(0)
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
            if d == torch.bool and name == "AVG":
                expect_error(lambda: dist.all_reduce(t, op=op), "allreduce",
                             "AVG is not defined for bool")
                continue
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
    check_rooted_and_all_to_all(rank, world, gloo)
    check_bytes_and_objects(rank, world, gloo)
    check_coalesced(rank, world)
    check_non_contiguous(rank, world)
    check_subgroups(rank, world)
    check_wait_timeout(rank, world)
    check_point_to_point(rank, world, gloo)
    # What halka does not do raises RuntimeError naming it.
    # (torch itself refuses MAX on complex before the backend sees it:
    # RuntimeError on 1.13, ValueError on 2.x)
    expect_error(lambda: dist.all_reduce(torch.zeros(4, dtype=torch.complex64),
                                         op=dist.ReduceOp.MAX), "complex",
                 errors=(RuntimeError, ValueError))
    expect_error(lambda: dist.all_reduce(torch.zeros(4), op=dist.ReduceOp.BAND),
                 "allreduce", "reduce op")
    # Sending to itself: refused (by halka on 1.13, by torch on 2.x).
    expect_error(lambda: dist.send(torch.zeros(4), dst=rank), "rank",
                 errors=(RuntimeError, ValueError))
    expect_error(lambda: dist.all_to_all_single(torch.zeros(world + 1),
                                                torch.zeros(world + 1)),
                 "alltoall_base", "split evenly")
    dist.barrier()
    check_timeout_wording(rank)
    dist.barrier()
    dist.destroy_process_group()


def check_timeout_wording(rank):
    """An operation past its own deadline (300 ms: rank 1 comes 1 s late)
    raises with " Timed out ", the words torch's tests match; the group
    goes on afterwards."""
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    opts.timeout = datetime.timedelta(milliseconds=300)
    if rank == 1:
        time.sleep(1.0)
    work = dist.distributed_c10d._get_default_group().allreduce(
        [data(rank, torch.float32)], opts)
    try:
        work.wait()
    except RuntimeError as e:
        if rank != 1 and " Timed out " not in str(e):
            raise AssertionError(f"a deadline without ' Timed out ': {e}") from e
        return
    if rank != 1:
        raise AssertionError("an all_reduce whose peer came 1 s late "
                             "outlived its 300 ms deadline")


def check_rooted_and_all_to_all(rank, world, gloo):
    """reduce, gather, scatter (every root), all_to_all_single (even and
    uneven splits, rows of 2) and all_to_all against the inputs; reduce
    against gloo too."""
    for d in (torch.float32, torch.float64, torch.bfloat16, torch.int64):
        mine = data(rank, d)
        everyone = [data(r, d) for r in range(world)]
        for root in range(world):
            for name in ("SUM", "MAX", "AVG"):
                t = mine.clone()
                dist.reduce(t, dst=root, op=OPS[name])
                if rank == root:
                    same(t, reference(name, everyone),
                         f"reduce {d} {name} root {root}", name)
                    g = mine.clone()
                    if gloo_supports(lambda: dist.reduce(g, dst=root, op=OPS[name],
                                                         group=gloo)):
                        same(t, g, f"reduce {d} {name} root {root} vs gloo", name)
                else:
                    same(t, mine, f"reduce {d} {name}: a non-root tensor stays")
                    gloo_supports(lambda: dist.reduce(mine.clone(), dst=root,
                                                      op=OPS[name], group=gloo))
            outs = ([torch.empty(N, dtype=d) for _ in range(world)]
                    if rank == root else None)
            dist.gather(mine, gather_list=outs, dst=root)
            if rank == root:
                for r in range(world):
                    same(outs[r], everyone[r], f"gather {d} root {root} slot {r}")
            out = torch.empty(N, dtype=d)
            ins = ([data(root * world + k, d) for k in range(world)]
                   if rank == root else None)
            dist.scatter(out, scatter_list=ins, src=root)
            same(out, data(root * world + rank, d), f"scatter {d} root {root}")
        # Even splits: rank s's chunk k goes to rank k.
        inp = torch.cat([data(s_k(rank, k, world), d, 5) for k in range(world)])
        out = torch.empty(world * 5, dtype=d)
        dist.all_to_all_single(out, inp)
        same(out, torch.cat([data(s_k(s, rank, world), d, 5) for s in range(world)]),
             f"all_to_all_single {d}")
        # Uneven splits in rows of 2: rank s sends s + k + 1 rows to rank k.
        sends = [rank + k + 1 for k in range(world)]
        recvs = [s + rank + 1 for s in range(world)]
        inp = torch.cat([data(100 + s_k(rank, k, world), d, 2 * sends[k]).view(-1, 2)
                         for k in range(world)])
        out = torch.empty(sum(recvs), 2, dtype=d)
        dist.all_to_all_single(out, inp, output_split_sizes=recvs,
                               input_split_sizes=sends)
        want = torch.cat([data(100 + s_k(s, rank, world), d, 2 * recvs[s]).view(-1, 2)
                          for s in range(world)])
        same(out, want, f"all_to_all_single {d} uneven")
        # Lists: rank s sends k + 2 elements to rank k.
        ins = [data(200 + s_k(rank, k, world), d, k + 2) for k in range(world)]
        outs = [torch.empty(rank + 2, dtype=d) for _ in range(world)]
        dist.all_to_all(outs, ins)
        for s in range(world):
            same(outs[s], data(200 + s_k(s, rank, world), d, rank + 2),
                 f"all_to_all {d} from {s}")


def check_bytes_and_objects(rank, world, gloo):
    """Types halka has no element type for travel as bytes (complex, uint16
    where torch has it); complex sums reduce as pairs of reals; object
    collectives (pickles in uint8 tensors) work as on gloo."""
    cx = torch.complex(data(rank, torch.float32), -data(rank + 1, torch.float32))
    everyone = [torch.complex(data(r, torch.float32), -data(r + 1, torch.float32))
                for r in range(world)]
    t = cx.clone()
    dist.all_reduce(t)
    same(t, sum(everyone), "all_reduce complex64 SUM")
    g = cx.clone()
    if gloo_supports(lambda: dist.all_reduce(g, group=gloo)):
        same(t, g, "all_reduce complex64 SUM vs gloo")
    for root in range(world):
        t = cx.clone()
        dist.broadcast(t, src=root)
        same(t, everyone[root], f"broadcast complex64 root {root}")
    outs = [torch.empty(N, dtype=torch.complex128) for _ in range(world)]
    dist.all_gather(outs, cx.to(torch.complex128))
    for r in range(world):
        same(outs[r], everyone[r].to(torch.complex128), f"all_gather complex128 slot {r}")
    if hasattr(torch, "uint16"):
        u = (data(rank, torch.int32) + 3).to(torch.uint16)
        dist.broadcast(u, src=world - 1)
        same(u.to(torch.int32), data(world - 1, torch.int32) + 3, "broadcast uint16")
    objs = [{"rank": rank, "name": f"r{rank}", "data": list(range(rank + 2))}
            if rank == 1 else None]
    dist.broadcast_object_list(objs, src=1)
    if objs[0] != {"rank": 1, "name": "r1", "data": [0, 1, 2]}:
        raise AssertionError(f"broadcast_object_list: {objs[0]!r}")
    gathered = [None] * world
    dist.all_gather_object(gathered, ("rank", rank, "x" * rank))
    if gathered != [("rank", r, "x" * r) for r in range(world)]:
        raise AssertionError(f"all_gather_object: {gathered!r}")
    at_root = [None] * world if rank == 0 else None
    dist.gather_object(rank * 10, at_root, dst=0)
    if rank == 0 and at_root != [r * 10 for r in range(world)]:
        raise AssertionError(f"gather_object: {at_root!r}")
    mine = [None]
    dist.scatter_object_list(mine, [f"for {r}" for r in range(world)]
                             if rank == 2 % world else None, src=2 % world)
    if mine[0] != f"for {rank}":
        raise AssertionError(f"scatter_object_list: {mine[0]!r}")


def check_point_to_point(rank, world, gloo):
    """send/recv on every dtype (and complex, as bytes) around the ring,
    as gloo moves them; isend/irecv with every recv posted first
    (batch_isend_irecv); a recv from any source names its sender; tags
    and sizes that differ raise naming both; monitored_barrier passes."""
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for d in DTYPES + [torch.complex64]:
        mine = data(rank, d) if d != torch.complex64 else torch.complex(
            data(rank, torch.float32), data(rank + 1, torch.float32))
        want = data(prv, d) if d != torch.complex64 else torch.complex(
            data(prv, torch.float32), data(prv + 1, torch.float32))
        got = torch.zeros_like(mine)
        if rank % 2 == 0:
            dist.send(mine, nxt, tag=5)
            dist.recv(got, prv, tag=5)
        else:
            dist.recv(got, prv, tag=5)
            dist.send(mine, nxt, tag=5)
        same(got, want, f"send/recv {d}")
        g = torch.zeros_like(mine)
        ops = [dist.P2POp(dist.irecv, g, prv, group=gloo),
               dist.P2POp(dist.isend, mine, nxt, group=gloo)]
        if gloo_supports(lambda: [w.wait() for w in dist.batch_isend_irecv(ops)]):
            same(got, g, f"send/recv {d} vs gloo")
    # Every recv posted before any send.
    outs = [torch.full((7,), -1.0) for _ in range(world)]
    ops = [dist.P2POp(dist.irecv, outs[p], p) for p in range(world) if p != rank]
    ops += [dist.P2POp(dist.isend, torch.full((7,), float(rank)), p)
            for p in range(world) if p != rank]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    for p in range(world):
        if p != rank:
            same(outs[p], torch.full((7,), float(p)), f"batch_isend_irecv from {p}")
    # Rank 0 takes one message from each other rank, in arrival order.
    if rank == 0:
        senders = set()
        for _ in range(world - 1):
            t = torch.zeros(3, dtype=torch.int64)
            src = dist.recv(t)
            same(t, torch.full((3,), src * 11, dtype=torch.int64), f"recv from any ({src})")
            senders.add(src)
        if senders != set(range(1, world)):
            raise AssertionError(f"recv from any source heard {senders}")
    else:
        dist.send(torch.full((3,), rank * 11, dtype=torch.int64), 0)
    # A recv whose tag or size differs raises naming both.
    if rank == 1:
        dist.send(torch.zeros(4), 0, tag=1)
        dist.send(torch.zeros(4), 0, tag=2)
    elif rank == 0:
        expect_error(lambda: dist.recv(torch.zeros(4), 1, tag=9), "recv",
                     "tag 1", "tag 9")
        expect_error(lambda: dist.recv(torch.zeros(5), 1, tag=2), "recv",
                     "16 bytes", "20 bytes")
    halka.torch.monitored_barrier(timeout=datetime.timedelta(seconds=30))
    dist.barrier()


def check_subgroups(rank, world):
    """new_group on a subset (ranks 0 and 1) and one group per rank, as
    new_subgroups makes them: each group's collectives see its members only.
    (Each group is an embedded halka cluster of its own today, not a
    sub-ring of the job's.)"""
    pair = dist.new_group([0, 1])
    singles = [dist.new_group([r]) for r in range(world)]
    t = data(rank, torch.int64)
    if rank in (0, 1):
        dist.all_reduce(t, group=pair)
        same(t, data(0, torch.int64) + data(1, torch.int64), "all_reduce in new_group([0, 1])")
        dist.broadcast(t, src=1, group=pair)
    alone = data(rank, torch.float32)
    dist.all_reduce(alone, group=singles[rank])
    same(alone, data(rank, torch.float32), "all_reduce in a group of one")
    dist.barrier()


def check_non_contiguous(rank, world):
    """Views that are not contiguous (a column, a transpose), as gloo takes
    them: the result lands in the view, the rest of the base is untouched."""
    base = torch.stack([data(rank, torch.float64, 6), data(rank + 7, torch.float64, 6)], 1)
    col = base[:, 1]  # stride 2
    before = base[:, 0].clone()
    dist.all_reduce(col)
    same(col, sum(data(r + 7, torch.float64, 6) for r in range(world)),
         "all_reduce of a column")
    same(base[:, 0], before, "all_reduce of a column: the other column stays")
    t = data(rank, torch.int32, 12).view(3, 4).t()  # a transpose
    dist.broadcast(t, src=world - 1)
    same(t, data(world - 1, torch.int32, 12).view(3, 4).t(), "broadcast of a transpose")
    outs = [torch.zeros(4, 3, dtype=torch.int32).t() for _ in range(world)]
    dist.all_gather(outs, data(rank, torch.int32, 12).view(4, 3).t())
    for r in range(world):
        same(outs[r], data(r, torch.int32, 12).view(4, 3).t(), f"all_gather of transposes, slot {r}")
    out = torch.zeros(5, 2, dtype=torch.int64)[:, 0]
    dist.reduce_scatter(out, [data(10 * k + rank, torch.int64, 5) for k in range(world)])
    same(out, sum(data(10 * rank + q, torch.int64, 5) for q in range(world)),
         "reduce_scatter into a column")


def check_coalesced(rank, world):
    """all_reduce_coalesced and all_gather_coalesced (tensors of several
    shapes, one operation each); on torch 2.x, the coalescing manager's
    fast paths (allreduce_coalesced, allgather_into_tensor_coalesced,
    reduce_scatter_tensor_coalesced)."""
    shapes = [(3,), (2, 5), (1,), (4, 1, 2)]
    d = torch.int64

    def mine(r, i):
        n = 1
        for s in shapes[i]:
            n *= s
        return data(10 * r + i, d, n).view(shapes[i])

    ts = [mine(rank, i) for i in range(len(shapes))]
    dist.all_reduce_coalesced(ts)
    for i, t in enumerate(ts):
        same(t, sum(mine(r, i) for r in range(world)), f"all_reduce_coalesced {i}")
    outs = [[torch.empty(s, dtype=d) for s in shapes] for _ in range(world)]
    dist.all_gather_coalesced(outs, [mine(rank, i) for i in range(len(shapes))])
    for r in range(world):
        for i in range(len(shapes)):
            same(outs[r][i], mine(r, i), f"all_gather_coalesced rank {r} tensor {i}")
    if int(torch.__version__.split(".")[0]) < 2:
        return
    sizes = [3, 7, 1]
    ins = [data(20 + rank, d, n) for n in sizes]
    outs = [torch.empty(world * n, dtype=d) for n in sizes]
    with dist._coalescing_manager():
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    for o, n in zip(outs, sizes):
        same(o, torch.cat([data(20 + r, d, n) for r in range(world)]),
             f"coalesced all_gather_into_tensor of {n}")
    ins = [data(30 + rank, d, world * n) for n in sizes]
    outs = [torch.empty(n, dtype=d) for n in sizes]
    with dist._coalescing_manager():
        for o, i in zip(outs, ins):
            dist.reduce_scatter_tensor(o, i)
    for o, n in zip(outs, sizes):
        want = sum(data(30 + r, d, world * n) for r in range(world))
        same(o, want[rank * n:(rank + 1) * n], f"coalesced reduce_scatter_tensor of {n}")
    ts = [data(40 + rank, d, n) for n in sizes]
    with dist._coalescing_manager():
        for t in ts:
            dist.all_reduce(t)
    for t, n in zip(ts, sizes):
        same(t, sum(data(40 + r, d, n) for r in range(world)), f"coalesced all_reduce of {n}")


def s_k(sender, receiver, world):
    return sender * world + receiver


def check_wait_timeout(rank, world):
    """Work.wait(timeout): rank 0's wait for an all_reduce its peers join
    1.5 s late times out naming the operation; a second wait gets the
    result."""
    t = data(rank, torch.float32)
    if rank != 0:
        time.sleep(1.5)
    w = dist.all_reduce(t, async_op=True)
    if rank == 0:
        t0 = time.monotonic()
        expect_error(lambda: w.wait(timeout=datetime.timedelta(milliseconds=200)),
                     "allreduce", " Timed out ")
        waited = time.monotonic() - t0
        if waited > 1.2:
            raise AssertionError(f"wait(200 ms) returned after {waited:.2f} s")
    w.wait()
    same(t, reference("SUM", [data(r, torch.float32) for r in range(world)]),
         "all_reduce after a timed-out wait")


def expect_error(fn, *words, errors=RuntimeError):
    try:
        fn()
    except errors as e:
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
