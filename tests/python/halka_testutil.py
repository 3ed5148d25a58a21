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
    # torch >= 2.4's TCPStore asks for libuv by default, which Debian's
    # torch 2.6 (trixie) is built without; 1.13 ignores the variable.
    env.setdefault("USE_LIBUV", "0")
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


def torchrun(script, *args):
    """torchrun's command line before its own options, and the worker's
    script and arguments after them: (launcher, worker). On torch >= 2 both
    run under no_libuv.py (Debian's torch 2.6 has no libuv, which torchrun's
    stores ask for)."""
    import torch
    if int(torch.__version__.split(".")[0]) >= 2:
        shim = os.path.join(os.path.dirname(os.path.abspath(__file__)), "no_libuv.py")
        return ([python(), shim, "-m", "torch.distributed.run"],
                [shim, script, *args])
    return [python(), "-m", "torch.distributed.run"], [script, *args]
