"""halka.Error and one subclass per status code (absl/gRPC codes).

Every failed call raises the subclass of its code with the worker's message,
which names the peer, the phase and the step where one is known, e.g.
``UnavailableError: rank 2 (127.0.0.1:4711) unreachable during reduce-scatter
step 3 ...``.
"""


class Error(Exception):
    """A failed halka call. ``code`` is the status code's name."""

    code = "UNKNOWN"

    def __init__(self, message):
        super().__init__(message)
        self.message = message

    def __str__(self):
        return f"{self.code}: {self.message}"


def _subclass(name, code, *bases):
    return type(name, (Error,) + bases, {"code": code, "__module__": __name__})


# One subclass per numeric code (absl::StatusCode == grpc::StatusCode);
# some also derive from the builtin exception that means the same.
BY_CODE = {}
for _num, _name, _code, _bases in [
        (1, "CancelledError", "CANCELLED", ()),
        (2, "UnknownError", "UNKNOWN", ()),
        (3, "InvalidArgumentError", "INVALID_ARGUMENT", (ValueError,)),
        (4, "DeadlineExceededError", "DEADLINE_EXCEEDED", (TimeoutError,)),
        (5, "NotFoundError", "NOT_FOUND", ()),
        (6, "AlreadyExistsError", "ALREADY_EXISTS", ()),
        (7, "PermissionDeniedError", "PERMISSION_DENIED", ()),
        (8, "ResourceExhaustedError", "RESOURCE_EXHAUSTED", ()),
        (9, "FailedPreconditionError", "FAILED_PRECONDITION", ()),
        (10, "AbortedError", "ABORTED", ()),
        (11, "OutOfRangeError", "OUT_OF_RANGE", ()),
        (12, "UnimplementedError", "UNIMPLEMENTED", (NotImplementedError,)),
        (13, "InternalError", "INTERNAL", ()),
        (14, "UnavailableError", "UNAVAILABLE", ()),
        (15, "DataLossError", "DATA_LOSS", ()),
        (16, "UnauthenticatedError", "UNAUTHENTICATED", ())]:
    BY_CODE[_num] = globals()[_name] = _subclass(_name, _code, *_bases)

__all__ = ["Error", "from_status"] + [c.__name__ for c in BY_CODE.values()]


def from_status(code, message):
    """The exception for a failed status (called by the C++ module)."""
    return BY_CODE.get(code, globals()["UnknownError"])(message)
