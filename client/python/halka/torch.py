"""The torch.distributed backend "halka".

    import halka.torch  # registers the backend
    torch.distributed.init_process_group("halka", ...)  # instead of "gloo"

Works with torch 1.13 (Debian bookworm's python3-torch), whose third-party
backends are c10d ProcessGroups, and torch 2.x (Debian trixie's 2.6), whose
third-party backends are c10d Backends registered per device: "halka" serves
"cpu" and "cuda", so init_process_group("halka") and ("cpu:halka") both
work. Each process starts its own halka worker
in-process (rank 0 hosts the rendezvous, whose address travels through
torch's store; HALKA_HOST picks the address to listen on, default
127.0.0.1), unless HALKA_WORKER names a running worker daemon
("unix:/run/halka.sock" or "host:port"). Supported: allreduce (SUM, AVG,
MIN, MAX, PRODUCT), broadcast, allgather, reduce_scatter, barrier, reduce,
gather, scatter, all_to_all(_single); reductions on float32, float64,
float16, bfloat16, int64, int32, int16, int8, uint8, bool (SUM/MAX or,
PRODUCT/MIN and) and complex (SUM/AVG); data movement on any dtype (as
bytes where halka has no element type). Anything else raises
RuntimeError naming the operation. A failed operation raises RuntimeError
with halka's message (which rank, which phase).
"""

import atexit as _atexit

import torch.distributed as _dist

from . import _halka_torch

# Groups torch did not destroy stop before the interpreter finalizes (their
# threads must not outlive it); operations still queued then fail.
_atexit.register(_halka_torch._shutdown_all)

ProcessGroupHalka = _halka_torch.ProcessGroupHalka


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """torch.distributed.monitored_barrier for a halka group, with gloo's
    semantics: rank 0 waits for every other rank within `timeout` and names
    the first that did not arrive ("Rank 2 failed to pass
    monitoredBarrier"), or every one with wait_all_ranks; the other ranks
    then fail too, saying rank 0 did. torch's own monitored_barrier refuses
    every backend not named gloo. `group`: None for the default group; a
    rank outside it returns at once. `timeout`: a timedelta or seconds;
    None: the group's own timeout."""
    c10d = _dist.distributed_c10d
    if group is not None and c10d._rank_not_in_group(group):
        return None
    pg = c10d._get_default_group() if group is None else group
    if timeout is None:
        return pg.monitored_barrier(wait_all_ranks=wait_all_ranks)
    return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


def _in_halka_job():
    """Whether a default process group of halka's runs: a group made now
    (new_group, new_subgroups) is then a halka group of its ranks."""
    try:
        return _dist.is_initialized() and "halka" in str(_dist.get_backend())
    except RuntimeError:
        return False


def _create_process_group(store, rank, world_size, timeout):
    # A group inside halka's default group runs on its connection, as a
    # group of the job's ranks; otherwise the group is a job of its own.
    return ProcessGroupHalka(store, rank, world_size, timeout.total_seconds(),
                             subgroup=_in_halka_job())


if not hasattr(_dist.Backend, "HALKA"):
    if _halka_torch.TORCH_VERSION_MAJOR >= 2:
        # A c10d::Backend, which torch's ProcessGroup calls for these devices.
        _dist.Backend.register_backend("halka", _create_process_group,
                                       extended_api=False,
                                       devices=["cpu", "cuda"])
    else:
        # torch 1.13: the c10d::ProcessGroup itself (no per-device backends).
        _dist.Backend.register_backend("halka", _create_process_group)
