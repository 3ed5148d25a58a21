"""Kill one rank's process mid-training (DDP over halka, 3 processes,
embedded workers): every other rank raises RuntimeError naming the dead
rank within the deadline, and every process exits; nothing hangs."""

import json
import os
import subprocess
import tempfile
import time
import unittest

import halka_testutil as tu
import kill_worker

HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = 3


class KillTest(unittest.TestCase):
    def test_survivors_raise_naming_the_dead_rank(self):
        with tempfile.TemporaryDirectory() as out:
            env = tu.dist_env(tu.free_port())
            procs = []
            for r in range(WORLD):
                e = dict(env, RANK=str(r), WORLD_SIZE=str(WORLD),
                         LOCAL_RANK=str(r))
                procs.append(subprocess.Popen(
                    [tu.python(), os.path.join(HERE, "kill_worker.py"), out],
                    env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
            deadline = time.monotonic() + 180
            outputs = []
            for p in procs:
                try:
                    outputs.append(p.communicate(
                        timeout=max(1, deadline - time.monotonic()))[0].decode())
                except subprocess.TimeoutExpired:
                    for q in procs:
                        if q.poll() is None:
                            q.kill()
                    self.fail(f"rank process {p.pid} still running after 180 s")
            self.assertEqual(procs[kill_worker.VICTIM].returncode, -9)
            for r in range(WORLD):
                if r == kill_worker.VICTIM:
                    continue
                self.assertEqual(procs[r].returncode, 0, outputs[r][-3000:])
                with open(os.path.join(out, f"rank{r}.json")) as f:
                    res = json.load(f)
                print(f"rank {r}: raised after {res['raised_at'] - res['kill_time']:.2f} s: {res['error'][:300]}")
                self.assertEqual(res["type"], "RuntimeError", res)
                self.assertIn(f"rank {kill_worker.VICTIM}", res["error"])
                self.assertLess(res["raised_at"] - res["kill_time"],
                                kill_worker.DEADLINE_S + 5, res)


if __name__ == "__main__":
    unittest.main()
