"""Runs a script or a module with torch's TCPStore made without libuv:
    python3 no_libuv.py -m torch.distributed.run ARGS...
    python3 no_libuv.py SCRIPT ARGS...
Debian's torch 2.6 (trixie) is built without libuv, yet torchrun's stores
(the agent's, and its workers' env:// clients) ask for it whatever USE_LIBUV
says. Tests only (halka_testutil.torchrun); torch 1.13 does not need it."""

import runpy
import sys

import torch.distributed as dist

_Store = dist.TCPStore


class _TCPStore(_Store):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("use_libuv", False)
        super().__init__(*args, **kwargs)


# Modules that imported the name already (torch.distributed.rendezvous), and
# the ones that will.
for _m in list(sys.modules.values()):
    if getattr(_m, "TCPStore", None) is _Store:
        _m.TCPStore = _TCPStore
dist.TCPStore = _TCPStore

if __name__ == "__main__":
    if sys.argv[1] == "-m":
        module = sys.argv[2]
        sys.argv = [module] + sys.argv[3:]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        sys.argv = sys.argv[1:]
        runpy.run_path(sys.argv[0], run_name="__main__")
