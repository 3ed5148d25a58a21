"""The "halka" backend against running workers (HALKA_WORKER), as in the
Compose/Kubernetes deployment: a 2-worker LocalCluster here stands in for
the daemons, and torch rank r uses the worker of halka rank 1-r, so the
torch-to-halka rank mapping is exercised (broadcast roots)."""

import datetime
import os
import unittest

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import halka
import halka.torch  # noqa: F401  registers the backend
import halka_testutil as tu

WORLD = 2


def run(rank, world, addresses):
    os.environ["HALKA_WORKER"] = addresses[world - 1 - rank]
    dist.init_process_group("halka", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((1000,), 3.0)), t[:4]
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
        with halka.LocalCluster(3, op_timeout=30) as cluster:
            os.environ["HALKA_WORKER"] = cluster.worker_address(0)
            try:
                tu.set_dist_env(tu.free_port())
                with self.assertRaisesRegex(RuntimeError, "job of 3 ranks"):
                    dist.init_process_group(
                        "halka", rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=10))
            finally:
                del os.environ["HALKA_WORKER"]


if __name__ == "__main__":
    unittest.main()
