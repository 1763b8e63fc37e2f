"""The Python API: error cases and object handling in this process (one rank: MPI starts as a
singleton), then the same on every rank of real jobs (tests/mpi/api.py), and cross-rank
mismatches in check mode (tests/mpi/mismatch.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import zcoll
from error_cases import ALGORITHM_WORDS, BAD_CALLS
from mpi4py import MPI
from mpi_util import case_names, script_job


@pytest.fixture(scope="module")
def comm():
    c = zcoll.Communicator()
    yield c
    c.free()


@pytest.mark.parametrize("name,call,exc,words", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_call(comm, name, call, exc, words):
    before = comm.stats()
    with pytest.raises(exc) as info:
        call(comm)
    missing = [w for w in words.split() if w not in str(info.value)]
    assert not missing, f"message lacks {missing}: {info.value}"
    assert comm.stats() == before, "a failed call must not count as a collective"


def test_exception_types():
    assert issubclass(zcoll.MismatchError, ValueError)
    assert issubclass(zcoll.ZcollError, RuntimeError)
    assert not issubclass(zcoll.ZcollError, ValueError)


def test_constructor_errors():
    with pytest.raises(TypeError, match="intracommunicator"):
        zcoll.Communicator("world")
    with pytest.raises(TypeError, match="intracommunicator"):
        zcoll.Communicator(MPI.COMM_NULL)  # a plain Comm
    with pytest.raises(ValueError, match="COMM_NULL"):
        zcoll.Communicator(MPI.Intracomm())  # a null intracommunicator


def test_freed_communicator():
    c = zcoll.Communicator()
    assert not c.freed and "size=1" in repr(c)
    c.free()
    c.free()  # idempotent
    assert c.freed and "freed" in repr(c)
    with pytest.raises(ValueError, match="freed"):
        c.allreduce(np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="freed"):
        c.barrier()
    with pytest.raises(ValueError, match="freed"):
        _ = c.rank


def test_single_rank_results(comm):
    """One rank: every collective is a copy, and results keep the caller's kind and shape."""
    x = np.arange(6, dtype=np.float64).reshape(2, 3)
    for op in zcoll.OPS:
        if op not in ("band", "bor", "bxor"):  # integers and bool only
            assert np.array_equal(comm.allreduce(x, op=op), x)
    assert comm.allgather(x).shape == (1, 2, 3)
    assert np.array_equal(comm.reduce_scatter(x), x.reshape(-1))
    assert np.array_equal(comm.reduce(x, op="max"), x)
    t = torch.arange(4, dtype=torch.bfloat16)
    out = torch.empty(4, dtype=torch.bfloat16)
    assert comm.allreduce(t, out=out) is out and torch.equal(out, t)
    assert comm.broadcast(t) is t


def test_module_helpers():
    assert set(zcoll.__all__) <= set(dir(zcoll))
    assert list(zcoll.OPS) == ["sum", "prod", "min", "max", "avg", "band", "bor", "bxor"]
    assert set(zcoll.ALGORITHMS) == set(ALGORITHM_WORDS.split())
    for count in (0, 1, 7, 8, 1009):
        for p in (1, 2, 3, 4):
            blocks = [zcoll.block_range(count, p, r) for r in range(p)]
            assert [i for b in blocks for i in b] == list(range(count)), "blocks tile the buffer in order"
            assert max(map(len, blocks)) - min(map(len, blocks)) <= 1
            assert sorted(map(len, blocks), reverse=True) == list(map(len, blocks)), "larger blocks first"
    for nbytes in (0, 4, 4096, 1 << 20, 1 << 26):
        for p in (1, 2, 3, 4, 64):
            assert zcoll.choose_algorithm(nbytes, p) in set(zcoll.ALGORITHMS) - {"auto"}
            # oversubscribed: MPI's own collectives busy-spin, never picked
            assert zcoll.choose_algorithm(nbytes, p, oversubscribed=True) != "mpi"
            assert zcoll.choose_algorithm(nbytes, p, shared_memory=False) != "shm"
    # several nodes of equal size: hierarchical above the small-message rules; a measured ring
    # order whose slowest hop is >= 1.25x rank order's: ordered_ring; shm still first on one node
    big = 1 << 20
    assert zcoll.choose_algorithm(big, 4, shared_memory=False, node_hierarchy=True) == "hierarchical"
    assert zcoll.choose_algorithm(4096, 4, shared_memory=False, node_hierarchy=True) == "recursive_doubling"
    assert zcoll.choose_algorithm(16384, 4, shared_memory=False, node_hierarchy=True) == "mpi"
    assert zcoll.choose_algorithm(big, 4, shared_memory=False, ordered_ring_gain=4.0) == "ordered_ring"
    assert zcoll.choose_algorithm(big, 4, shared_memory=False, ordered_ring_gain=1.2) == "ring"
    assert zcoll.choose_algorithm(big, 4, shared_memory=False, node_hierarchy=True, ordered_ring_gain=4.0) == "hierarchical"
    assert zcoll.choose_algorithm(big, 4, shared_memory=True, ordered_ring_gain=4.0) == "shm"


# Fewest checks each case must report, about 90% of what it makes today: a script that silently
# stops checking fails.
API_MIN_CHECKS = {
    "objects": 100,
    "read_only_inputs": 3,
    "zero_copy_out": 3,
    "errors": 65,
    "subcommunicator": 2,
    "free": 10,
}
MISMATCH_MIN_CHECKS = {"mismatches_raise_on_every_rank": 45, "matching_calls_work_in_check_mode": 2}


@pytest.mark.parametrize("case", case_names("mpi/api.py"))
@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_api_on_every_rank(nprocs, case):
    """Objects, errors (raised on every rank before any traffic), sub-communicators, free."""
    script_job("mpi/api.py", nprocs, timeout=180).check(case, API_MIN_CHECKS[case])


@pytest.mark.parametrize("case", case_names("mpi/mismatch.py"))
@pytest.mark.parametrize("mode", ["env", "arg"])
@pytest.mark.parametrize("nprocs", [2, 3])
def test_mismatch_raises_on_every_rank(nprocs, mode, case):
    """ZCOLL_CHECK=1 (mode env) or Communicator(check=True) (mode arg)."""
    env = {"ZCOLL_CHECK": "1"} if mode == "env" else None
    script_job("mpi/mismatch.py", nprocs, f"--mode={mode}", env=env).check(case, MISMATCH_MIN_CHECKS[case])
