"""torch's own distributed test suite against the zcoll backend, as torch ran its mpi backend.

torch/testing/_internal/distributed/distributed_test.py (torch 2.13): every test method of
DistributedTest._DistTestBase, in unittest's (sorted) order, on every rank, each MPI process one
rank. What the adapter does, per test (one harness case each, named after the test):

1. Isolation: the ranks meet on MPI_COMM_WORLD; the default process group (and every group a
   test made) is destroyed and a fresh one created on its own file store, so nothing of an
   earlier test (a leftover message, a broken or re-initialised group, a changed timeout) can
   reach this one; torch's file-based Barrier is reset.
2. The test runs through unittest (its setUp, skips and tearDown included). Skips that torch
   decides by the backend's name and that zcoll claims (tests/torch_dist_policy.py) are lifted,
   and so are the small / odd world size skips, from which torch exempted its mpi runner.
3. Outcome per rank: pass, skip (torch's reason: a unittest skip, or the process exit a
   TEST_SKIPS code stands for) or fail (the traceback). Skips are printed as
   ``ZCOLL-TORCH-SKIP <test> rank <r>: <reason>``; a failure is a failed check with the traceback.

Run: PYTHONPATH=tests mpirun -n 3 python -m mpi4py tests/torch_mpi/dist_suite.py [test_name ...]
"""

import os
import shutil
import tempfile
import traceback
import unittest
from datetime import timedelta

from harness import WORLD, Checks, run_cases, say
from torch_dist_policy import claimed, test_names

RANK, SIZE = WORLD.rank, WORLD.size
PG_TIMEOUT = 60.0  # seconds: a test that hangs fails with zcoll.TimeoutError instead of the job


def _shared_temp_dir() -> str:
    """One TEMP_DIR for all ranks (one machine), laid out as torch's initialize_temp_directories."""
    path = tempfile.mkdtemp(prefix="zcoll-dist-suite-") if RANK == 0 else None
    path = WORLD.bcast(path, root=0)
    if RANK == 0:
        for sub in ("barrier", "test_dir", "init_dir", "stores"):
            os.mkdir(os.path.join(path, sub))
    WORLD.Barrier()
    return path


TEMP_DIR = _shared_temp_dir()
# Read when distributed_test is imported: the backend's name, the world, the init method.
os.environ.update(
    BACKEND="zcoll",
    WORLD_SIZE=str(SIZE),
    TEMP_DIR=TEMP_DIR,
    INIT_METHOD=f"file://{TEMP_DIR}/init_dir/shared_init_file",
)

# isort: split
import torch.distributed as dist  # noqa: E402
import zcoll.torch  # noqa: E402,F401  (registers the backend)
from torch.testing._internal import common_distributed  # noqa: E402
from torch.testing._internal.common_distributed import TEST_SKIPS  # noqa: E402
from torch.testing._internal.common_utils import TestCase  # noqa: E402


def _as_under_the_mpi_runner(func):
    """skip_if_small_worldsize / skip_if_odd_worldsize skip below 8 or at odd world sizes unless
    BACKEND is "mpi": a limit of torch's spawned GPU runs, from which its mpi runner (one process
    per rank, any world size), which this script is, was exempt. Same exemption here."""
    return func


common_distributed.skip_if_small_worldsize = _as_under_the_mpi_runner  # before distributed_test imports them
common_distributed.skip_if_odd_worldsize = _as_under_the_mpi_runner
from torch.testing._internal.distributed import distributed_test as dt  # noqa: E402

SKIP_EXIT_CODES = {s.exit_code: s.message for s in TEST_SKIPS.values()}


class TestZcollBackend(TestCase, dt.DistributedTest._DistTestBase):
    """torch's old TestMPIWithFork: the test base on an already initialised process group."""

    rank = RANK

    @property
    def world_size(self) -> str:
        return os.environ["WORLD_SIZE"]  # a string, as TestDistBackend's


def _lift_claimed_skips() -> None:
    for name in test_names():
        method = getattr(TestZcollBackend, name)
        if getattr(method, "__unittest_skip__", False) and claimed(method.__unittest_skip_why__):
            method.__unittest_skip__ = False


class _Outcome(unittest.TestResult):
    """Keeps the exception of an error, to tell a TEST_SKIPS exit (a skip) from a failure."""

    def __init__(self):
        super().__init__()
        self.skip_reason = None
        self.failure = None

    def addSkip(self, test, reason):
        self.skip_reason = reason

    def addError(self, test, err):
        exc = err[1]
        if isinstance(exc, SystemExit) and exc.code in SKIP_EXIT_CODES:
            self.skip_reason = SKIP_EXIT_CODES[exc.code]
        elif self.failure is None:
            self.failure = "".join(traceback.format_exception(*err))

    addFailure = addError

    def addUnexpectedSuccess(self, test):
        self.failure = "unexpected success"


_fresh_groups = 0


def _fresh_world(name: str) -> None:
    """Destroys every process group and makes a new default group on a store of its own."""
    global _fresh_groups
    if dist.is_initialized():
        dist.destroy_process_group()
    _fresh_groups += 1
    store = f"file://{TEMP_DIR}/stores/world{_fresh_groups}"
    timeout = dt.CUSTOM_PG_TIMEOUT.get(name, PG_TIMEOUT)
    dist.init_process_group(
        "zcoll", init_method=store, world_size=SIZE, rank=RANK, timeout=timedelta(seconds=timeout)
    )


def _reset_file_barrier() -> None:
    WORLD.Barrier()
    if RANK == 0:
        dt.Barrier.init()  # empties TEMP_DIR/barrier
    dt.Barrier.barrier_id = 0
    WORLD.Barrier()


def _run_torch_test(name: str, ck: Checks) -> None:
    _fresh_world(name)
    _reset_file_barrier()
    outcome = _Outcome()
    TestZcollBackend(name).run(outcome)
    if outcome.failure is not None:
        ck.fail(name, outcome.failure)
    else:
        ck.check(True)
        if outcome.skip_reason is not None:
            say(f"ZCOLL-TORCH-SKIP {name} rank {RANK}: {' '.join(str(outcome.skip_reason).split())}")


def _case(name: str):
    def case(ck: Checks) -> None:
        _run_torch_test(name, ck)

    case.__name__ = f"case_{name}"
    return case


def _teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
    WORLD.Barrier()
    if RANK == 0:
        shutil.rmtree(TEMP_DIR, ignore_errors=True)


if __name__ == "__main__":
    _lift_claimed_skips()
    run_cases({f"case_{name}": _case(name) for name in test_names()}, teardown=_teardown)
