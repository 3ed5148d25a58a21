"""dist.all_reduce (SUM, AVG, MIN, MAX, PRODUCT), broadcast, all_gather,
reduce_scatter and barrier over the "halka" backend, per dtype (float32,
float64, float16, bfloat16, int64, int32, int16, int8, uint8, bool), against
gloo and against the reference; complex sums, complex and uint16 tensors
moved as bytes, the object collectives; reduce, gather, scatter (every root),
all_to_all_single (even and uneven splits) and all_to_all against the
inputs; Work.wait(timeout); unsupported calls (send, a bad split) raise
RuntimeError naming the operation. 3 processes (mp.spawn), embedded
workers."""

import unittest

import torch
import torch.multiprocessing as mp

import halka_testutil as tu
import torch_ops_worker

WORLD = 3


class TorchOpsTest(unittest.TestCase):
    def test_collectives_per_dtype_and_op(self):
        tu.set_dist_env(tu.free_port())
        ctx = mp.start_processes(torch_ops_worker.run, args=(WORLD,),
                                 nprocs=WORLD, join=False, start_method="spawn")
        self.assertTrue(tu.join_spawned(ctx, 240), "ranks did not finish in 240 s")

    @unittest.skipIf(int(torch.__version__.split(".")[0]) < 2,
                     "device:backend strings are torch 2.x")
    def test_device_backend_string(self):
        for backend in ("cpu:halka", "cpu:halka,cuda:halka"):
            with self.subTest(backend=backend):
                tu.set_dist_env(tu.free_port())
                ctx = mp.start_processes(torch_ops_worker.run_backend_string,
                                         args=(2, backend), nprocs=2,
                                         join=False, start_method="spawn")
                self.assertTrue(tu.join_spawned(ctx, 120),
                                f"{backend}: ranks did not finish in 120 s")


if __name__ == "__main__":
    unittest.main()
