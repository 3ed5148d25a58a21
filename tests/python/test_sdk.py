"""halka's Python SDK against NumPy: every dtype and op, on a 4-rank
LocalCluster in this process (one thread per rank)."""

import concurrent.futures as cf
import unittest

import numpy as np

import halka

WORLD = 4
N = 1000  # elements per rank: small enough for the naive path
NUMPY_DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64,
                np.int16, np.int8, np.uint8, np.bool_]
OPS = ["sum", "avg", "min", "max", "prod"]


def rank_data(rank, dtype, n=N):
    # Small integers: every sum, product and quarter (avg over 4 ranks) is
    # exact in every dtype, so results compare bit for bit.
    base = (np.arange(n) * 7 + rank * 3) % 5 + 1
    if dtype == np.bool_:
        return base % 2 == 0
    if np.issubdtype(dtype, np.signedinteger):
        base = base - 2  # negatives too
    return base.astype(dtype)


def reference(op, inputs):
    dtype = inputs[0].dtype
    if dtype == np.bool_:  # sum/max: or; prod/min: and
        stacked = np.stack(inputs)
        return stacked.any(0) if op in ("sum", "max") else stacked.all(0)
    if np.issubdtype(dtype, np.integer):
        # Integers wrap in their own width (uint8 products do), as halka's
        # do; avg divides the wrapped sum.
        wide = np.stack([x.astype(np.int64) for x in inputs])
        if op == "avg":
            total = wide.sum(0).astype(dtype).astype(np.int64)
            return np.trunc(total / len(inputs)).astype(dtype)
        r = {"sum": lambda: wide.sum(0), "min": lambda: wide.min(0),
             "max": lambda: wide.max(0), "prod": lambda: wide.prod(0)}[op]()
        return r.astype(dtype)
    wide = np.stack([x.astype(np.float64) for x in inputs])
    if op == "sum":
        r = wide.sum(0)
    elif op == "avg":  # integer avg truncates toward zero
        r = wide.sum(0) / len(inputs)
        if np.issubdtype(inputs[0].dtype, np.integer):
            r = np.trunc(r)
    elif op == "min":
        r = wide.min(0)
    elif op == "max":
        r = wide.max(0)
    else:
        r = wide.prod(0)
    return r.astype(inputs[0].dtype)


def _raised(fn):
    """The halka error fn raises, or None."""
    try:
        fn()
    except halka.Error as e:
        return e
    return None


class SdkTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = halka.LocalCluster(WORLD, op_timeout=30)
        cls.clients = [cls.cluster.connect(r) for r in range(WORLD)]
        cls.pool = cf.ThreadPoolExecutor(WORLD)

    @classmethod
    def tearDownClass(cls):
        cls.pool.shutdown()
        cls.cluster.close()

    def on_all(self, fn):
        """fn(rank, client) on every rank at once; the results by rank."""
        futures = [self.pool.submit(fn, r, c) for r, c in enumerate(self.clients)]
        return [f.result(timeout=60) for f in futures]

    def test_all_reduce_every_dtype_and_op(self):
        for dtype in NUMPY_DTYPES:
            for op in OPS:
                with self.subTest(dtype=np.dtype(dtype).name, op=op):
                    inputs = [rank_data(r, dtype) for r in range(WORLD)]
                    bufs = [x.copy() for x in inputs]
                    if dtype == np.bool_ and op == "avg":
                        with self.assertRaisesRegex(halka.InvalidArgumentError,
                                                    "avg is not defined for bool"):
                            self.clients[0].all_reduce(bufs[0], op=op)
                        continue
                    infos = self.on_all(lambda r, c: c.all_reduce(bufs[r], op=op))
                    want = reference(op, inputs)
                    for r in range(WORLD):
                        np.testing.assert_array_equal(bufs[r], want)
                        self.assertEqual(infos[r].rank, r)
                        self.assertEqual(infos[r].world_size, WORLD)

    def test_all_reduce_ring_on_a_large_buffer(self):
        n = 300_000
        inputs = [rank_data(r, np.float32, n) for r in range(WORLD)]
        bufs = [x.copy() for x in inputs]
        infos = self.on_all(lambda r, c: c.all_reduce(bufs[r], algorithm="ring"))
        for r in range(WORLD):
            np.testing.assert_array_equal(bufs[r], reference("sum", inputs))
            self.assertEqual(infos[r].algorithm, "ring")

    def test_torch_tensors_in_place_bfloat16_included(self):
        try:
            import torch
        except ImportError:
            self.skipTest("python3-torch is not installed")
        for dtype in [torch.float32, torch.bfloat16, torch.int64]:
            with self.subTest(dtype=str(dtype)):
                ts = [torch.arange(64, dtype=torch.float32).add(r).to(dtype)
                      for r in range(WORLD)]
                ptrs = [t.data_ptr() for t in ts]
                self.on_all(lambda r, c: c.all_reduce(ts[r], op="max"))
                want = torch.arange(64, dtype=torch.float32).add(WORLD - 1).to(dtype)
                for r in range(WORLD):
                    self.assertTrue(torch.equal(ts[r], want))
                    self.assertEqual(ts[r].data_ptr(), ptrs[r])  # in place

    def test_broadcast_every_dtype_and_root(self):
        for dtype in NUMPY_DTYPES:
            for root in range(WORLD):
                with self.subTest(dtype=np.dtype(dtype).name, root=root):
                    bufs = [rank_data(r, dtype) for r in range(WORLD)]
                    want = bufs[root].copy()
                    self.on_all(lambda r, c: c.broadcast(bufs[r], root=root))
                    for r in range(WORLD):
                        np.testing.assert_array_equal(bufs[r], want)

    def test_broadcast_chain_and_tree_by_name(self):
        for algorithm in ("ring", "tree"):
            with self.subTest(algorithm=algorithm):
                bufs = [rank_data(r, np.float32) for r in range(WORLD)]
                want = bufs[1].copy()
                infos = self.on_all(lambda r, c: c.broadcast(
                    bufs[r], root=1, algorithm=algorithm))
                for r in range(WORLD):
                    np.testing.assert_array_equal(bufs[r], want)
                    self.assertEqual(infos[r].algorithm, algorithm)
        with self.assertRaises(ValueError):
            self.clients[0].broadcast(bufs[0], algorithm="nonesuch")

    def test_all_gather_every_dtype(self):
        for dtype in NUMPY_DTYPES:
            with self.subTest(dtype=np.dtype(dtype).name):
                inputs = [rank_data(r, dtype, 257) for r in range(WORLD)]
                outs = self.on_all(lambda r, c: c.all_gather(inputs[r]))
                for r in range(WORLD):
                    np.testing.assert_array_equal(outs[r], np.concatenate(inputs))

    def test_all_gather_in_place_and_into_torch(self):
        n = 100
        recvs = [np.zeros(WORLD * n, np.float64) for _ in range(WORLD)]
        for r in range(WORLD):
            recvs[r][r * n:(r + 1) * n] = rank_data(r, np.float64, n)
        # send is this rank's slice of recv: in place.
        self.on_all(lambda r, c: c.all_gather(recvs[r][r * n:(r + 1) * n],
                                              recvs[r]))
        want = np.concatenate([rank_data(r, np.float64, n) for r in range(WORLD)])
        for r in range(WORLD):
            np.testing.assert_array_equal(recvs[r], want)

    def test_reduce_scatter_every_dtype_and_op(self):
        n = 129  # per rank
        for dtype in NUMPY_DTYPES:
            for op in OPS:
                if dtype == np.bool_ and op == "avg":
                    continue  # refused: test_all_reduce_every_dtype_and_op
                with self.subTest(dtype=np.dtype(dtype).name, op=op):
                    sends = [rank_data(r, dtype, WORLD * n) for r in range(WORLD)]
                    outs = self.on_all(
                        lambda r, c: c.reduce_scatter(sends[r], op=op))
                    full = reference(op, sends)
                    for r in range(WORLD):
                        np.testing.assert_array_equal(
                            outs[r], full[r * n:(r + 1) * n])

    def test_reduce_to_every_root_every_dtype_and_op(self):
        n = 131
        for dtype in NUMPY_DTYPES:
            for op in OPS:
                if dtype == np.bool_ and op == "avg":
                    continue  # refused: test_all_reduce_every_dtype_and_op
                root = (NUMPY_DTYPES.index(dtype) + OPS.index(op)) % WORLD
                with self.subTest(dtype=np.dtype(dtype).name, op=op, root=root):
                    sends = [rank_data(r, dtype, n) for r in range(WORLD)]
                    kept = [x.copy() for x in sends]
                    outs = self.on_all(
                        lambda r, c: c.reduce(sends[r], op=op, root=root))
                    np.testing.assert_array_equal(outs[root], reference(op, sends))
                    for r in range(WORLD):
                        if r != root:
                            self.assertIsNone(outs[r])
                        np.testing.assert_array_equal(sends[r], kept[r])

    def test_gather_scatter_all_to_all_every_dtype(self):
        n = 97
        for i, dtype in enumerate(NUMPY_DTYPES):
            root = i % WORLD
            with self.subTest(dtype=np.dtype(dtype).name, root=root):
                mine = [rank_data(r, dtype, n) for r in range(WORLD)]
                got = self.on_all(lambda r, c: c.gather(mine[r], root=root))
                np.testing.assert_array_equal(got[root], np.concatenate(mine))
                self.assertTrue(all(got[r] is None for r in range(WORLD)
                                    if r != root))
                whole = rank_data(root, dtype, WORLD * n)
                parts = self.on_all(lambda r, c: c.scatter(
                    np.zeros(n, dtype), whole if r == root else None, root=root))
                for r in range(WORLD):
                    np.testing.assert_array_equal(parts[r],
                                                  whole[r * n:(r + 1) * n])
                sends = [rank_data(r, dtype, WORLD * n) for r in range(WORLD)]
                swapped = self.on_all(lambda r, c: c.all_to_all(sends[r]))
                for r in range(WORLD):
                    want = np.concatenate([sends[k][r * n:(r + 1) * n]
                                           for k in range(WORLD)])
                    np.testing.assert_array_equal(swapped[r], want)
        # torch tensors, in place (where torch is installed).
        try:
            import torch
        except ImportError:
            return
        xs = [torch.arange(WORLD * 4, dtype=torch.int64) + 100 * r
              for r in range(WORLD)]
        self.on_all(lambda r, c: c.all_to_all(xs[r], xs[r]))
        for r in range(WORLD):
            want = torch.cat([torch.arange(r * 4, r * 4 + 4) + 100 * k
                              for k in range(WORLD)])
            self.assertTrue(torch.equal(xs[r], want))

    def test_rooted_errors(self):
        c = self.clients[0]
        with self.assertRaises(halka.InvalidArgumentError):
            c.reduce(np.zeros(4, np.float32), np.zeros(3, np.float32))
        with self.assertRaises(halka.InvalidArgumentError):
            c.scatter(np.zeros(4, np.float32), np.zeros(5, np.float32))
        with self.assertRaises(halka.InvalidArgumentError):
            c.all_to_all(np.zeros(4, np.float32), np.zeros(8, np.float32))
        # A root outside the world: every rank raises, the refused one
        # naming it; the next call runs.
        errs = self.on_all(lambda r, c: _raised(
            lambda: c.gather(np.zeros(2, np.float32), root=WORLD + 1 if r == 0 else 0,
                             timeout=10)))
        self.assertTrue(all(e is not None for e in errs), errs)
        self.assertIsInstance(errs[0], halka.InvalidArgumentError)
        self.assertIn(f"root {WORLD + 1} is outside", str(errs[0]))
        self.on_all(lambda r, c: c.barrier())

    def test_collective_shape_errors(self):
        c = self.clients[0]
        with self.assertRaises(halka.InvalidArgumentError):
            c.all_gather(np.zeros(4, np.float32), np.zeros(4, np.float64))
        with self.assertRaises(halka.InvalidArgumentError):
            c.reduce_scatter(np.zeros(WORLD + 1, np.float32))  # does not split

    def test_send_recv_every_dtype_any_source_and_errors(self):
        # Rank r sends to (r + 1) % WORLD; rank 0 also takes a message
        # from any rank and learns whose it is.
        for dtype in NUMPY_DTYPES:
            with self.subTest(dtype=np.dtype(dtype).name):
                def ring(rank, c):
                    c.send(rank_data(rank, dtype), (rank + 1) % WORLD, tag=3)
                    got = np.zeros(N, dtype)
                    info = c.recv(got, (rank - 1) % WORLD, tag=3)
                    return got, info.peer
                out = self.on_all(ring)
                for r, (got, peer) in enumerate(out):
                    self.assertEqual(peer, (r - 1) % WORLD)
                    np.testing.assert_array_equal(
                        got, rank_data((r - 1) % WORLD, dtype))

        def any_source(rank, c):
            if rank == 2:
                c.send(np.full(5, 2.5, np.float64), 0)
            if rank != 0:
                return None
            got = np.zeros(5, np.float64)
            return c.recv(got, timeout=20).peer, got
        peer, got = self.on_all(any_source)[0]
        self.assertEqual(peer, 2)
        np.testing.assert_array_equal(got, np.full(5, 2.5))

        def wrong(rank, c):
            if rank == 1:
                c.send(np.arange(4, dtype=np.int32), 3, tag=1)
            if rank != 3:
                return None
            with self.assertRaisesRegex(halka.FailedPreconditionError,
                                        "tag 1.*tag 2"):
                c.recv(np.zeros(4, np.int32), 1, tag=2)
            with self.assertRaisesRegex(halka.DeadlineExceededError, "rank 2"):
                c.recv(np.zeros(4, np.int32), 2, timeout=0.2)
            with self.assertRaisesRegex(halka.InvalidArgumentError, "rank 3"):
                c.send(np.zeros(4, np.int32), 3)
            return True
        self.assertTrue(self.on_all(wrong)[3])

    def test_groups_run_their_own_collectives(self):
        # Groups [2, 0] and [1, 3] at once: each one's all-reduce, broadcast
        # (group root 0: job ranks 2 and 1), all-gather (group order) and
        # send/recv by group rank; then the job's own all-reduce.
        groups = ([2, 0], [1, 3])
        # The worker says it runs groups (the SDK refuses a group's call
        # to one that does not: it would run it as the job's).
        self.assertIs(self.clients[0].info().get("groups"), True)
        views = {r: self.clients[r].group(g) for g in groups for r in g}

        def body(rank, c):
            v = views[rank]
            x = np.full(N, rank + 1, np.int64)
            info = v.all_reduce(x)
            b = np.full(7, float(rank), np.float32)
            v.broadcast(b, root=0)
            gathered = v.all_gather(np.full(3, rank, np.int32))
            me = v.ranks.index(rank)
            msg = np.zeros(2, np.float64)
            if me == 0:
                v.send(np.full(2, 9.5), 1, tag=4)
            else:
                self.assertEqual(v.recv(msg, 0, tag=4).peer, 0)
            return x, info, b, gathered, msg
        out = self.on_all(body)
        for r in range(WORLD):
            g = next(g for g in groups if r in g)
            x, info, b, gathered, msg = out[r]
            np.testing.assert_array_equal(x, np.full(N, sum(m + 1 for m in g)))
            self.assertEqual((info.rank, info.world_size), (g.index(r), 2))
            np.testing.assert_array_equal(b, np.full(7, float(g[0])))
            np.testing.assert_array_equal(
                np.asarray(gathered).reshape(2, 3)[:, 0], np.array(g))
            if g.index(r) == 1:
                np.testing.assert_array_equal(msg, np.full(2, 9.5))
        with self.assertRaisesRegex(halka.InvalidArgumentError,
                                    "does not hold this worker's rank 0"):
            self.clients[0].group([1, 2]).all_reduce(np.ones(3, np.float32),
                                                     timeout=5)
        with self.assertRaisesRegex(halka.InvalidArgumentError, "rank 5"):
            views[0].send(np.ones(2), 5)
        ones = self.on_all(lambda r, c: c.all_reduce(np.ones(N, np.float32)))
        self.assertTrue(all(i.world_size == WORLD for i in ones))

    def test_barrier(self):
        infos = self.on_all(lambda r, c: c.barrier(timeout=10))
        self.assertEqual(sorted(i.rank for i in infos), list(range(WORLD)))

    def test_info_and_ring_health(self):
        info = self.clients[2].info()
        self.assertEqual(info["rank"], 2)
        self.assertEqual(info["world_size"], WORLD)
        health = self.clients[0].ring_health()
        # The keys and words `halkactl health --json` prints.
        self.assertEqual(health["state"], "healthy")
        self.assertEqual(health["job_state"], "JOB_STATE_HEALTHY")
        self.assertEqual(len(health["members"]), WORLD)

    def test_bad_input_raises_invalid_argument(self):
        c = self.clients[0]
        with self.assertRaises(halka.InvalidArgumentError):
            c.all_reduce(np.zeros(4, np.complex64))  # no such halka dtype
        with self.assertRaises(halka.InvalidArgumentError):
            c.all_reduce(np.zeros((4, 4), np.float32)[:, 1])  # not contiguous
        ro = np.zeros(4, np.float32)
        ro.flags.writeable = False
        with self.assertRaises(halka.InvalidArgumentError):
            c.broadcast(ro)
        with self.assertRaises(halka.InvalidArgumentError):
            c.all_reduce(np.zeros(4, np.float32), op="xor")
        with self.assertRaises(halka.InvalidArgumentError):
            c.all_reduce([1.0, 2.0])
        with self.assertRaises(halka.InvalidArgumentError):
            c.barrier(timeout=-1)

    def test_worker_error_is_a_status_subclass_with_its_message(self):
        # A root outside the ring: the worker refuses the call on every rank.
        bufs = [np.zeros(8, np.float32) for _ in range(WORLD)]

        def call(r, c):
            try:
                c.broadcast(bufs[r], root=WORLD + 3, timeout=10)
            except halka.Error as e:
                return e
            return None

        errors = self.on_all(call)
        for e in errors:
            self.assertIsInstance(e, halka.InvalidArgumentError)
            self.assertIn("root", e.message)


class DeadWorkerTest(unittest.TestCase):
    def test_peers_of_a_killed_worker_raise_naming_it(self):
        with halka.LocalCluster(3, op_timeout=20, heartbeat_timeout=2) as cluster:
            clients = [cluster.connect(r) for r in range(3)]
            cluster.kill_worker(2)
            bufs = [np.ones(4096, np.float32) for _ in range(2)]
            with cf.ThreadPoolExecutor(2) as pool:
                futures = [pool.submit(clients[r].all_reduce, bufs[r], "sum", 15)
                           for r in range(2)]
                for f in futures:
                    # UNAVAILABLE (the link broke) or ABORTED (the
                    # rendezvous declared rank 2 lost first), naming the
                    # peer, the phase and the step.
                    with self.assertRaises((halka.UnavailableError,
                                            halka.AbortedError)) as ctx:
                        f.result(timeout=60)
                    self.assertIn("rank 2 (worker-2", ctx.exception.message)
                    self.assertIn("step", ctx.exception.message)
            with self.assertRaises(halka.InvalidArgumentError):
                cluster.worker_address(2)


if __name__ == "__main__":
    unittest.main()
