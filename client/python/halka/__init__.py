"""halka for Python: collectives through a halka worker.

    import numpy as np, halka
    with halka.LocalCluster(2) as cluster:          # or a running worker:
        c = halka.Client(cluster.worker_address(0))  # halka.Client("unix:/run/halka.sock")
        x = np.ones(1024, np.float32)
        c.all_reduce(x, op="sum")                    # in place

Arrays are NumPy arrays or torch tensors (C-contiguous; writable where the
collective writes). The worker reads and writes their memory where it lies
(through shared memory on the same host): nothing is copied through Python.
CUDA tensors go through the worker's device path (a CUDA build of halka).
Every failed call raises a subclass of halka.Error (halka._errors) named
after its status code, carrying the worker's message. ``import halka.torch``
registers the torch.distributed backend "halka".
"""

import enum
import json

from . import _halka
from ._errors import *  # noqa: F401,F403  (the exception classes)
from ._errors import Error, InvalidArgumentError

__all__ = ["Client", "LocalCluster", "ReduceOp", "DType", "Error", "OpInfo"]

OpInfo = _halka.OpInfo


class DType(enum.IntEnum):
    """halka's element types (values as in halka/types.h)."""
    FLOAT32 = 1
    FLOAT64 = 2
    FLOAT16 = 3
    BFLOAT16 = 4
    INT32 = 5
    INT64 = 6
    INT8 = 7
    UINT8 = 8
    BOOL = 9
    INT16 = 10


class ReduceOp(enum.IntEnum):
    """halka's reduction operators (values as in halka/types.h)."""
    SUM = 1
    AVG = 2
    MIN = 3
    MAX = 4
    PROD = 5


_ALGORITHMS = {"auto": 0, "ring": 1, "naive": 2, "ps": 3, "two_level": 4,
               "tree": 5, "recursive_doubling": 6, "halving_doubling": 7}
_NUMPY_DTYPES = {"float32": DType.FLOAT32, "float64": DType.FLOAT64,
                 "float16": DType.FLOAT16, "int32": DType.INT32,
                 "int64": DType.INT64, "int8": DType.INT8,
                 "uint8": DType.UINT8, "bool": DType.BOOL,
                 "int16": DType.INT16}
_TORCH_DTYPES = {"torch.float32": DType.FLOAT32,
                 "torch.float64": DType.FLOAT64,
                 "torch.float16": DType.FLOAT16,
                 "torch.bfloat16": DType.BFLOAT16,
                 "torch.int32": DType.INT32, "torch.int64": DType.INT64,
                 "torch.int8": DType.INT8, "torch.uint8": DType.UINT8,
                 "torch.bool": DType.BOOL, "torch.int16": DType.INT16}


def _op(op):
    if isinstance(op, ReduceOp):
        return int(op)
    name = str(op).lower()
    if name == "product":
        name = "prod"
    try:
        return int(ReduceOp[name.upper()])
    except KeyError:
        raise InvalidArgumentError(
            f"unknown reduce op {op!r}; halka has sum, avg, min, max, prod"
        ) from None


def _algorithm(name):
    if name not in _ALGORITHMS:
        raise InvalidArgumentError(
            f"unknown algorithm {name!r}; one of {list(_ALGORITHMS)}")
    return _ALGORITHMS[name]


def _is_torch(x):
    return type(x).__module__.split(".")[0] == "torch"


def _tensor(x, what, writable=True):
    """(address, element count, dtype code, on a CUDA device) of x."""
    if _is_torch(x):
        dtype = _TORCH_DTYPES.get(str(x.dtype))
        if dtype is None:
            raise InvalidArgumentError(
                f"{what}: dtype {x.dtype} is not one halka has "
                f"({', '.join(_TORCH_DTYPES)})")
        if not x.is_contiguous():
            raise InvalidArgumentError(f"{what}: the tensor is not contiguous")
        if x.requires_grad and x.is_leaf and writable:
            raise InvalidArgumentError(
                f"{what}: the tensor requires grad; pass tensor.detach()")
        return x.data_ptr(), x.numel(), int(dtype), bool(x.is_cuda)
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy ships with the package deps
        numpy = None
    if numpy is None or not isinstance(x, numpy.ndarray):
        raise InvalidArgumentError(
            f"{what}: expected a numpy.ndarray or a torch.Tensor, "
            f"got {type(x).__name__}")
    dtype = _NUMPY_DTYPES.get(x.dtype.name)
    if dtype is None or not x.dtype.isnative:
        raise InvalidArgumentError(
            f"{what}: dtype {x.dtype} is not one halka has "
            f"({', '.join(_NUMPY_DTYPES)}; bfloat16 through torch)")
    if not x.flags.c_contiguous:
        raise InvalidArgumentError(f"{what}: the array is not C-contiguous")
    if writable and not x.flags.writeable:
        raise InvalidArgumentError(f"{what}: the array is read-only")
    return x.ctypes.data, x.size, int(dtype), False


def _empty_like(x, n):
    if _is_torch(x):
        import torch
        return torch.empty(n, dtype=x.dtype, device=x.device)
    import numpy
    return numpy.empty(n, dtype=x.dtype)


def _same_kind(what, send_dtype, recv_dtype, send_dev, recv_dev):
    if send_dtype != recv_dtype or send_dev != recv_dev:
        raise InvalidArgumentError(
            f"{what}: send and recv differ in dtype or device")


def _host_only(what, device):
    if device:
        raise InvalidArgumentError(
            f"{what}: host memory only (copy a CUDA tensor with .cpu())")


def _timeout(timeout):
    if timeout is None:
        return 0.0
    if hasattr(timeout, "total_seconds"):
        timeout = timeout.total_seconds()
    if timeout <= 0:
        raise InvalidArgumentError(f"timeout must be positive, got {timeout}")
    return float(timeout)


class Client:
    """A connection to the local halka worker ("host:port" or "unix:/path").

    Thread-safe; the worker runs one operation at a time, in arrival order.
    ``timeout`` (seconds or a timedelta) is each operation's deadline; None
    means the worker's default.
    """

    def __init__(self, address):
        self._c = _halka.Client.connect(address)
        self.address = address
        # The job ranks of this view's group (group()); None: the job.
        self.ranks = None
        # The OpInfo of the last call that returns its result instead.
        self.last_info = None

    def group(self, ranks, tag=0):
        """This connection's view of a group of the job's ranks (as torch's
        new_group): `ranks` are job ranks in the group's order, this
        rank's among them, and every member names the same list. The
        view's collectives run on the group alone (roots, slices and
        OpInfo.rank/world_size are the group's), numbered by the group,
        beside the job's; its send/recv peers are group ranks. Host
        memory only (a device tensor is refused). Issue a group's calls
        one after another. `tag` tells apart groups of the same ranks
        (each numbers its calls on its own): the same on every member."""
        ranks = tuple(int(r) for r in ranks)
        view = object.__new__(type(self))
        view.__dict__.update(self.__dict__)
        view._c = self._c.with_group(list(ranks), int(tag))
        view.ranks = ranks
        view.last_info = None
        return view

    def all_reduce(self, x, op="sum", timeout=None, algorithm="auto"):
        """Reduces x over all ranks, in place. Returns an OpInfo."""
        a = _algorithm(algorithm)
        p, n, d, dev = _tensor(x, "all_reduce")
        return self._c.all_reduce(p, n, d, _op(op), dev, _timeout(timeout), a)

    def broadcast(self, x, root=0, timeout=None, algorithm="auto"):
        """Copies rank root's x into every rank's x, in place. algorithm:
        "auto", "ring" (the chain) or "tree"."""
        a = _algorithm(algorithm)
        p, n, d, dev = _tensor(x, "broadcast")
        return self._c.broadcast(p, n, d, int(root), dev, _timeout(timeout), a)

    def send(self, x, dst, tag=0, timeout=None):
        """Sends x (host memory) to rank dst; only dst calls recv for it.
        Returns once the bytes left this worker. Messages to one rank
        arrive in the order sent. Returns an OpInfo (peer: dst)."""
        p, n, d, dev = _tensor(x, "send", writable=False)
        _host_only("send", dev)
        return self._c.send(p, n, d, int(dst), int(tag), _timeout(timeout))

    def recv(self, x, src=-1, tag=0, timeout=None):
        """Receives rank src's next message into x (host memory), which must
        have its size and tag; src -1: the first message from any rank.
        Returns an OpInfo whose peer is the sender."""
        p, n, d, dev = _tensor(x, "recv")
        _host_only("recv", dev)
        return self._c.recv(p, n, d, int(src), int(tag), _timeout(timeout))

    def barrier(self, timeout=None):
        """Returns once every rank has called barrier."""
        return self._c.barrier(_timeout(timeout))

    def all_gather(self, send, recv=None, timeout=None):
        """Gathers every rank's send into recv (world x send's size): rank
        r's send lands at [r*n, (r+1)*n) on every rank. recv None: a new
        array (or tensor) like send. In place when send is this rank's slice
        of recv. Returns recv."""
        sp, sn, sd, sdev = _tensor(send, "all_gather send", writable=False)
        if recv is None:
            recv = _empty_like(send, sn * self.world_size)
        rp, rn, rd, rdev = _tensor(recv, "all_gather recv")
        _same_kind("all_gather", sd, rd, sdev, rdev)
        self.last_info = self._c.all_gather(sp, sn, rp, rn, sd, sdev,
                                            _timeout(timeout))
        return recv

    def reduce_scatter(self, send, recv=None, op="sum", timeout=None):
        """Reduces send (world x n elements) over all ranks; rank r's recv
        (n elements) gets the reduction of slice r. recv None: a new array
        (or tensor) like send. Returns recv."""
        sp, sn, sd, sdev = _tensor(send, "reduce_scatter send", writable=False)
        if recv is None:
            world = self.world_size
            if sn % world:
                raise InvalidArgumentError(
                    f"reduce_scatter: {sn} elements do not split over "
                    f"{world} ranks")
            recv = _empty_like(send, sn // world)
        rp, rn, rd, rdev = _tensor(recv, "reduce_scatter recv")
        _same_kind("reduce_scatter", sd, rd, sdev, rdev)
        self.last_info = self._c.reduce_scatter(sp, sn, rp, rn, sd, _op(op),
                                                sdev, _timeout(timeout))
        return recv

    def reduce(self, send, recv=None, op="sum", root=0, timeout=None,
               algorithm="auto"):
        """Reduces every rank's send (host memory, unchanged) into the root's
        recv (send's size; None: a new array or tensor like send). Returns
        recv on the root and None on the other ranks, whose recv is not
        written."""
        sp, sn, sd, sdev = _tensor(send, "reduce send", writable=False)
        _host_only("reduce", sdev)
        if recv is None:
            recv = _empty_like(send, sn)
        rp, rn, rd, rdev = _tensor(recv, "reduce recv")
        _same_kind("reduce", sd, rd, sdev, rdev)
        if rn != sn:
            raise InvalidArgumentError(
                f"reduce: recv has {rn} elements, send {sn}")
        a = _algorithm(algorithm)
        self.last_info = self._c.reduce(sp, rp, sn, sd, _op(op), int(root),
                                        _timeout(timeout), a)
        return recv if self.last_info.rank == int(root) else None

    def gather(self, send, recv=None, root=0, timeout=None):
        """Gathers every rank's send (host memory) to the root: its recv
        (world x send's size; None: a new array or tensor like send) holds
        rank r's send at [r*n, (r+1)*n). Returns recv on the root and None on
        the other ranks."""
        sp, sn, sd, sdev = _tensor(send, "gather send", writable=False)
        _host_only("gather", sdev)
        if recv is None:
            recv = _empty_like(send, sn * self.world_size)
        rp, rn, rd, rdev = _tensor(recv, "gather recv")
        _same_kind("gather", sd, rd, sdev, rdev)
        self.last_info = self._c.gather(sp, sn, rp, rn, sd, int(root),
                                        _timeout(timeout))
        return recv if self.last_info.rank == int(root) else None

    def scatter(self, recv, send=None, root=0, timeout=None):
        """The root's send (host memory, world x recv's size; None on the
        other ranks) is cut into world slices; rank r's recv gets slice r.
        Returns recv."""
        rp, rn, rd, rdev = _tensor(recv, "scatter recv")
        _host_only("scatter", rdev)
        send_n = rn * self.world_size
        sp = 0
        if send is not None:
            sp, sn, sd, sdev = _tensor(send, "scatter send", writable=False)
            _same_kind("scatter", sd, rd, sdev, rdev)
            if sn != send_n:
                raise InvalidArgumentError(
                    f"scatter: send has {sn} elements; the world "
                    f"({self.world_size}) x recv's {rn} is {send_n}")
        self.last_info = self._c.scatter(sp, send_n, rp, rn, rd, int(root),
                                         _timeout(timeout))
        return recv

    def all_to_all(self, send, recv=None, timeout=None):
        """send (host memory, world x n elements): slice k goes to rank k;
        recv's slice k gets rank k's slice of this rank. recv None: a new
        array or tensor like send; recv may be send itself (in place).
        Returns recv."""
        sp, sn, sd, sdev = _tensor(send, "all_to_all send", writable=False)
        _host_only("all_to_all", sdev)
        if recv is None:
            recv = _empty_like(send, sn)
        rp, rn, rd, rdev = _tensor(recv, "all_to_all recv")
        _same_kind("all_to_all", sd, rd, sdev, rdev)
        if rn != sn:
            raise InvalidArgumentError(
                f"all_to_all: recv has {rn} elements, send {sn}")
        self.last_info = self._c.all_to_all(sp, rp, sn, sd, _timeout(timeout))
        return recv

    def info(self):
        """This worker's rank, world, generation and members (a dict)."""
        return json.loads(self._c.info_json())

    @property
    def rank(self):
        """This rank: in a group's view (group()), its rank in the group."""
        job_rank = int(self.info().get("rank", 0))
        return job_rank if self.ranks is None else self.ranks.index(job_rank)

    @property
    def world_size(self):
        """The job's world: in a group's view, the group's size."""
        if self.ranks is not None:
            return len(self.ranks)
        return int(self.info().get("world_size", 0))

    def ring_health(self):
        """The job's health as a dict: what `halkactl health --json` prints."""
        return json.loads(self._c.ring_health_json())


class LocalCluster:
    """An embedded cluster: a rendezvous and n workers in this process, on
    loopback (like the C++ halka::LocalCluster). Use as a context manager or
    call close()."""

    def __init__(self, n=4, op_timeout=None, chunk_bytes=0,
                 heartbeat_timeout=None):
        if not isinstance(n, int) or not 1 <= n <= 64:
            raise InvalidArgumentError(f"LocalCluster: n must be 1..64, got {n!r}")
        self._c = _halka.LocalCluster(
            n, _timeout(op_timeout), int(chunk_bytes),
            _timeout(heartbeat_timeout))

    @property
    def size(self):
        return self._c.size()

    @property
    def rendezvous_address(self):
        return self._c.rendezvous_address()

    def worker_address(self, rank):
        return self._c.worker_address(rank)

    def connect(self, rank):
        """A Client of rank's worker."""
        return Client(self.worker_address(rank))

    def kill_worker(self, rank):
        """Stops rank's worker abruptly (no leave): its peers see it die."""
        self._c.kill_worker(rank)

    def close(self):
        self._c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
