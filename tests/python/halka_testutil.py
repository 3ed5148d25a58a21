"""Helpers the Python tests share (loopback only; bounded waits)."""

import os
import socket
import sys


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dist_env(port):
    """The environment torch.distributed's env:// init reads (loopback)."""
    env = dict(os.environ)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               OMP_NUM_THREADS="1")
    env.pop("HALKA_WORKER", None)
    return env


def set_dist_env(port):
    os.environ.update(dist_env(port))


def python():
    """Debian's interpreter (python3-torch, python3-numpy live there)."""
    return "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def join_spawned(ctx, seconds):
    """Joins torch.multiprocessing processes within `seconds` (a child's
    exception is raised here); kills the ones still alive, by pid, if not."""
    import time
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ctx.join(timeout=1):
            return True
    for p in ctx.processes:
        if p.is_alive():
            p.kill()
    return False
