"""The "halka" backend against running workers (HALKA_WORKER), as in the
Compose/Kubernetes deployment: a 3-worker LocalCluster here stands in for
the daemons, and torch rank r uses the worker of halka rank 2-r, so the
torch-to-halka rank mapping is exercised (broadcast roots); and a group
made with new_group runs on the same workers, as a halka group of the
job's ranks (a daemon's job has one size: a second cluster could not be
made); two groups of the same ranks and the default group run at once,
each with its own numbering."""

import datetime
import os
import unittest

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import halka
import halka.torch  # noqa: F401  registers the backend
import halka_testutil as tu

WORLD = 3


def run(rank, world, addresses):
    os.environ["HALKA_WORKER"] = addresses[world - 1 - rank]
    dist.init_process_group("halka", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((1000,), 6.0)), t[:4]
    # Torch ranks 0 and 2 (job ranks 2 and 0): the group's sum, a
    # broadcast from torch rank 2, an all-gather in the group's order, a
    # send and recv by global rank.
    pair = dist.new_group([0, 2])
    if rank in (0, 2):
        s = torch.full((10,), float(rank + 1))
        dist.all_reduce(s, group=pair)
        assert torch.equal(s, torch.full((10,), 4.0)), s
        b = torch.full((5,), float(rank), dtype=torch.float64)
        dist.broadcast(b, src=2, group=pair)
        assert torch.equal(b, torch.full((5,), 2.0, dtype=torch.float64)), b
        out = [torch.zeros(3, dtype=torch.int32) for _ in range(2)]
        dist.all_gather(out, torch.full((3,), rank, dtype=torch.int32),
                        group=pair)
        assert [int(o[0]) for o in out] == [0, 2], out
        if rank == 0:
            dist.send(torch.tensor([7.5]), dst=2, group=pair)
        else:
            m = torch.zeros(1)
            dist.recv(m, src=0, group=pair)
            assert m.item() == 7.5, m
    # Two groups of the same ranks (each new_group call is its own group)
    # and the default group, all three at once: each its own numbering.
    g1, g2 = dist.new_group([0, 1]), dist.new_group([0, 1])
    for i in range(10):
        t = torch.ones(10)
        w3 = dist.all_reduce(t, async_op=True)
        if rank < 2:
            a = torch.full((1000,), float(rank + 1 + i))
            b = torch.full((1000,), float(100 * (rank + 1) + i))
            w1 = dist.all_reduce(a, group=g1, async_op=True)
            w2 = dist.all_reduce(b, group=g2, async_op=True)
            w1.wait()
            w2.wait()
            assert a[0].item() == 3 + 2 * i, (i, a[:2])
            assert b[0].item() == 300 + 2 * i, (i, b[:2])
        w3.wait()
        assert t[0].item() == world, (i, t[:2])
    dist.barrier()
    t = torch.ones(8)
    dist.all_reduce(t)  # the job's numbering is intact
    assert torch.equal(t, torch.full((8,), 3.0)), t
    for root in range(world):
        b = torch.arange(10, dtype=torch.int64) * (rank + 1)
        dist.broadcast(b, src=root)
        want = torch.arange(10, dtype=torch.int64) * (root + 1)
        assert torch.equal(b, want), (root, b, want)
    dist.barrier()
    dist.destroy_process_group()


class DaemonTest(unittest.TestCase):
    def test_ranks_map_to_the_workers_ranks(self):
        with halka.LocalCluster(WORLD, op_timeout=30) as cluster:
            addresses = [cluster.worker_address(r) for r in range(WORLD)]
            tu.set_dist_env(tu.free_port())
            ctx = mp.start_processes(run, args=(WORLD, addresses), nprocs=WORLD,
                                     join=False, start_method="spawn")
            self.assertTrue(tu.join_spawned(ctx, 120), "ranks did not finish")

    def test_a_worker_of_another_size_is_refused(self):
        with halka.LocalCluster(2, op_timeout=30) as cluster:
            os.environ["HALKA_WORKER"] = cluster.worker_address(0)
            try:
                tu.set_dist_env(tu.free_port())
                with self.assertRaisesRegex(RuntimeError, "job of 2 ranks"):
                    dist.init_process_group(
                        "halka", rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=10))
            finally:
                del os.environ["HALKA_WORKER"]


if __name__ == "__main__":
    unittest.main()
