"""Runs selections of PyTorch's own distributed test suite
(torch.testing._internal.distributed.distributed_test, the file PyTorch's
test_distributed_spawn.py runs) against gloo or halka, and writes each
test's outcome to a JSON file (compare_suite.py compares two of them).

    python3 run_suite.py --backend halka --world-size 3 \
        --select all_reduce broadcast ... --out halka.json

The suite skips most tests for a backend not named gloo, nccl or ucc (it
reads the BACKEND variable at import). So the suite always sees
BACKEND=gloo, and with --backend halka every process group a test makes
with gloo (init_process_group, new_group, new_subgroups) is made with halka
instead: the name checks pass, the collectives are halka's (and
torch.distributed.monitored_barrier, which refuses any backend not named
gloo, is halka.torch.monitored_barrier). Each test
process asserts that its default group really is halka's (a test that
quietly ran on gloo would prove nothing).

Processes are forked, not spawned (the suite's own runner spawns; forking
saves the import of torch per process and rank), and every test is bounded
by the suite's own timeout (DISTRIBUTED_TESTS_DEFAULT_TIMEOUT, set here).
"""

import argparse
import json
import os
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["gloo", "halka"], required=True)
    p.add_argument("--world-size", type=int, default=3)
    p.add_argument("--select", nargs="+", required=True,
                   help="test name parts: test_<part>* is run")
    p.add_argument("--out", required=True, help="JSON file of outcomes")
    p.add_argument("--timeout", type=int, default=120,
                   help="seconds one test may take (all its processes)")
    p.add_argument("--list", action="store_true",
                   help="print the selected test names and exit")
    return p.parse_args()


ARGS = parse_args() if __name__ == "__main__" else None

if ARGS is not None:
    os.environ["BACKEND"] = "gloo"
    os.environ["WORLD_SIZE"] = str(ARGS.world_size)
    os.environ["HALKA_SUITE_BACKEND"] = ARGS.backend
    os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(ARGS.timeout)
    os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="halka-suite-"))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("USE_LIBUV", "0")  # trixie's torch 2.6 has no libuv
    os.environ.pop("HALKA_WORKER", None)
    # A test process that dies of a fatal signal prints its native stack
    # (client/python/fatal_backtrace.h) and exits at once, instead of
    # hanging in torch's own fatal-signal handler until the test's deadline
    # (below, the harness's call that installs that handler does nothing).
    os.environ.setdefault("HALKA_NATIVE_BACKTRACE", "1")

try:
    import expecttest  # noqa: F401  (PyTorch's test harness imports it)
except ImportError:
    # Debian bookworm does not package expecttest: the stand-in next to
    # this file is enough for the tests here (none of them uses
    # assertExpectedInline).
    sys.path.append(os.path.join(HERE, "stand_in"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

TORCH_MAJOR = int(torch.__version__.split(".")[0])

if (ARGS is not None and os.environ.get("HALKA_NATIVE_BACKTRACE") == "1"
        and hasattr(torch._C, "_set_print_stack_traces_on_fatal_signal")):
    torch._C._set_print_stack_traces_on_fatal_signal = lambda on: None


def _to_halka(backend):
    """gloo's name (alone or in a "cpu:gloo,cuda:..." list) -> halka's."""
    if backend is None:
        return None
    s = str(backend)
    if s == "gloo":
        return "halka"
    if ":" in s:
        return ",".join(
            part.replace(":gloo", ":halka") for part in s.split(","))
    return backend


def install_halka():
    """In a test process: every group made with gloo is made with halka."""
    import halka.torch  # registers "halka"
    c10d = dist.distributed_c10d
    real_init = c10d.init_process_group
    real_new_group = c10d.new_group

    def init_process_group(*args, **kwargs):
        if args:
            args = (_to_halka(args[0]),) + tuple(args[1:])
        if "backend" in kwargs:
            kwargs["backend"] = _to_halka(kwargs["backend"])
        out = real_init(*args, **kwargs)
        name = str(dist.get_backend())
        assert "halka" in name, f"the default group runs {name}, not halka"
        return out

    def new_group(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = _to_halka(kwargs["backend"])
        elif len(args) >= 3:
            args = args[:2] + (_to_halka(args[2]),) + tuple(args[3:])
        return real_new_group(*args, **kwargs)

    for mod in (c10d, dist):
        mod.init_process_group = init_process_group
        mod.new_group = new_group
        # torch's own refuses every backend not named gloo; halka's has
        # gloo's semantics (halka.torch.monitored_barrier).
        mod.monitored_barrier = halka.torch.monitored_barrier


def turn_off_replicated_tensor():
    """torch 1.13's harness trains DDP through ReplicatedTensor, which on
    Python 3.11 fails for every backend, gloo included; the mode is off by
    default in torch and removed in 2.x."""
    try:
        from torch.nn.parallel import _replicated_tensor_ddp_utils as u
    except ImportError:
        return
    real = u._set_ddp_with_replicated_tensor
    u._set_ddp_with_replicated_tensor = lambda _value: real(False)


def make_case():
    from torch.testing._internal.distributed.distributed_test import (
        DistributedTest, TestDistBackend)

    class HalkaSuite(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._start_processes(
                torch.multiprocessing.get_context("fork").Process)

        @classmethod
        def _run(cls, *args, **kwargs):
            # A test process still alive 10 s before the test's deadline
            # prints every thread's Python stack (the harness then ends
            # it), so that a hang names where it waits.
            import faulthandler
            faulthandler.dump_traceback_later(
                max(ARGS.timeout - 10, 1), exit=False)
            turn_off_replicated_tensor()
            if os.environ.get("HALKA_SUITE_BACKEND") == "halka":
                install_halka()
            return super()._run(*args, **kwargs)

    return HalkaSuite


class Recorder(unittest.TextTestResult):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.outcomes = {}
        self._t0 = {}

    def _name(self, test):
        return test.id().split(".")[-1]

    def startTest(self, test):
        self._t0[self._name(test)] = time.monotonic()
        super().startTest(test)

    def _put(self, test, outcome, detail=""):
        n = self._name(test)
        secs = time.monotonic() - self._t0.get(n, time.monotonic())
        self.outcomes[n] = {"outcome": outcome, "seconds": round(secs, 2),
                            "detail": detail[-2000:]}

    def addSuccess(self, test):
        super().addSuccess(test)
        self._put(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._put(test, "fail", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._put(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._put(test, "skip", str(reason))

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._put(test, "pass", "expected failure")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._put(test, "fail", "unexpected success")


def main():
    case = make_case()
    loader = unittest.TestLoader()
    loader.testNamePatterns = [f"*.test_{s}*" for s in ARGS.select]
    suite = loader.loadTestsFromTestCase(case)
    names = [t.id().split(".")[-1] for t in suite]
    if ARGS.list:
        print("\n".join(names))
        return 0
    runner = unittest.TextTestRunner(verbosity=2, resultclass=Recorder,
                                     stream=sys.stdout)
    t0 = time.monotonic()
    result = runner.run(suite)
    report = {"backend": ARGS.backend, "torch": torch.__version__,
              "python": sys.version.split()[0],
              "world_size": ARGS.world_size, "select": ARGS.select,
              "seconds": round(time.monotonic() - t0, 1),
              "tests": result.outcomes}
    with open(ARGS.out, "w") as f:
        json.dump(report, f, indent=1, sort_keys=True)
    counts = {}
    for o in result.outcomes.values():
        counts[o["outcome"]] = counts.get(o["outcome"], 0) + 1
    print(f"{ARGS.backend} on torch {torch.__version__}: {counts} "
          f"in {report['seconds']} s -> {ARGS.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
