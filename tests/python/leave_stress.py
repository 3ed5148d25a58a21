"""Ends many world-4 torch jobs the way scripts end, and counts the ones in
which a rank failed or did not exit: each round forks 4 processes that
init_process_group("halka") (embedded workers), make a subgroup, send and
receive, all-reduce in the subgroup, barrier, destroy_process_group and
exit. Not run by CTest (minutes per hundred rounds): it measures that a
rank leaving right after a collective fails no peer still finishing it
(README, "Failures and elastic jobs"; before Member.left, 6 of 35 rounds
did, with ABORTED ... left), and counts the rare process that dies at
exit; --store-wait makes every rank wait on the store after its last
collective first.

    PYTHONPATH=build/client/python python3 tests/python/leave_stress.py 300
    PYTHONPATH=build/client/python python3 tests/python/leave_stress.py 300 --store-wait

Exits 1 when any round had a rank that failed or did not exit within 20 s
(it is then left alive 40 s more, so that a debugger can attach).
"""

import argparse
import faulthandler
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import halka.torch  # noqa: F401  (registers the backend)

WORLD = 4


def child(rank, path, store_wait):
    faulthandler.dump_traceback_later(15, exit=False)
    store = dist.FileStore(path, WORLD)
    dist.init_process_group("halka", store=store, rank=rank, world_size=WORLD)
    group = dist.new_group(list(range(WORLD)))
    t = torch.ones(8) * rank
    if rank % 2 == 0:
        dist.send(t, rank + 1)
    else:
        dist.recv(t, rank - 1)
    dist.all_reduce(t, group=group)
    dist.barrier()
    if store_wait:
        store.add("done", 1)
        while store.add("done", 0) < WORLD:
            time.sleep(0.001)
    dist.destroy_process_group()
    sys.exit(0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("rounds", type=int)
    p.add_argument("--store-wait", action="store_true")
    args = p.parse_args()
    bad = 0
    for i in range(args.rounds):
        fd, path = tempfile.mkstemp(prefix="halka-leave-")
        os.close(fd)
        os.unlink(path)
        pids = []
        for r in range(WORLD):
            pid = os.fork()
            if pid == 0:
                try:
                    child(r, path, args.store_wait)
                except SystemExit:
                    raise
                except BaseException as e:  # the rank's failure, named
                    print(f"round {i} rank {r}: {e}", flush=True)
                    os._exit(3)
            pids.append(pid)
        t0 = time.time()
        left, codes = set(pids), {}
        while left and time.time() - t0 < 20:
            for pid in list(left):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    left.discard(pid)
                    codes[pid] = os.waitstatus_to_exitcode(status)
            time.sleep(0.01)
        if left or any(codes.values()):
            bad += 1
            print(f"round {i}: not exited {sorted(left)}, exit codes "
                  f"{sorted(codes.values())}", flush=True)
            if left:
                time.sleep(40)
            for pid in left:
                try:
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                except OSError:
                    pass
        try:
            os.unlink(path)
        except OSError:
            pass
    print(f"{args.rounds} rounds ({'store wait' if args.store_wait else 'barrier, then leave'}): "
          f"{bad} with a failed or stuck rank", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
