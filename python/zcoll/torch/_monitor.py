"""monitored_barrier of the zcoll process group: gloo's protocol, gloo's messages.

A barrier that says who did not come, for finding the rank that hangs a job.

1. Every rank but 0 sends rank 0 one byte, "arrived", and waits for rank 0's verdict.
2. Rank 0 waits up to `timeout` for every other rank's arrival, then sends each rank that arrived
   the verdict: 1 (everyone came, pass) or 0 (someone did not).
3. Rank 0 raises when a rank did not arrive: ``[Rank 0]: Rank 1 failed to pass monitoredBarrier
   in 2000 ms`` (the first missing rank in rank order, as gloo reports it), with
   ``wait_all_ranks`` every missing rank: ``[Rank 0]: Ranks 1, 2 failed to pass ...``; with no
   time at all: ``Rank 0 timed out in monitoredBarrier after 0 ms``. A rank told 0, or that hears
   nothing within `timeout` + GRACE_SECONDS, raises ``Rank 2 successfully reached
   monitoredBarrier, but received errors while waiting for send/recv from rank 0``. All raise
   torch's DistBackendError (a RuntimeError), as gloo does.

Messages travel on the group's own internal communicator with tags of their own, one pair per
call (the n-th monitored_barrier of a group uses tags from n), so a late message of a failed
barrier (an arrival after rank 0 gave up, a verdict nobody waited for) never meets a later
barrier: it cannot pass a barrier for a rank that has not come. As in gloo, whose tags also count
calls, every rank must make the same calls: a rank that skipped one is out of step afterwards,
and rank 0 names it in every later barrier. Tags repeat after TAG_PAIRS calls.

Cost: 2 (p - 1) one-byte messages, all through rank 0; rank 0 polls, yielding the core.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, List

import numpy as np
import torch.distributed as dist

TAG_BASE = 16384  # tags TAG_BASE .. TAG_BASE + 2 * TAG_PAIRS - 1 (MPI guarantees up to 32767)
TAG_PAIRS = 8192
GRACE_SECONDS = 5.0  # how much longer than rank 0 a waiting rank waits for the verdict
_POLL_SECONDS = 50e-6


def _mpi() -> Any:
    from mpi4py import MPI

    return MPI


def seconds(timeout: Any) -> float:
    return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)


def monitored_barrier(comm: Any, call: int, timeout: Any, wait_all_ranks: bool = False) -> None:
    """The `call`-th monitored barrier over mpi4py communicator `comm` (see the module docstring)."""
    if comm.size == 1:
        return
    arrive = TAG_BASE + 2 * (call % TAG_PAIRS)
    if comm.rank == 0:
        _root(comm, arrive, seconds(timeout), wait_all_ranks)
    else:
        _member(comm, arrive, seconds(timeout))


def _root(comm: Any, arrive: int, timeout: float, wait_all_ranks: bool) -> None:
    MPI = _mpi()
    ms = int(round(timeout * 1000))
    if timeout <= 0:
        raise dist.DistBackendError(f"Rank 0 timed out in monitoredBarrier after {ms} ms.")
    others = range(1, comm.size)
    boxes = {r: np.zeros(1, np.uint8) for r in others}
    pending = {r: comm.Irecv([boxes[r], MPI.BYTE], source=r, tag=arrive) for r in others}
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for r in [r for r, req in pending.items() if req.Test()]:
            del pending[r]
        if pending:
            time.sleep(_POLL_SECONDS)
    for req in pending.values():
        req.Cancel()
        req.Wait()  # a cancelled receive completes at once
    missing = sorted(pending)
    verdict = np.array([0 if missing else 1], np.uint8)
    _send_all(comm, verdict, [r for r in others if r not in pending], arrive + 1)
    if not missing:
        return
    who = f"Ranks {', '.join(map(str, missing))}" if wait_all_ranks else f"Rank {missing[0]}"
    raise dist.DistBackendError(f"[Rank 0]: {who} failed to pass monitoredBarrier in {ms} ms")


def _send_all(comm: Any, verdict: np.ndarray, ranks: List[int], tag: int) -> None:
    MPI = _mpi()
    requests = [comm.Isend([verdict, MPI.BYTE], dest=r, tag=tag) for r in ranks]
    MPI.Request.Waitall(requests)  # one byte each: sent eagerly


def _member(comm: Any, arrive: int, timeout: float) -> None:
    MPI = _mpi()
    me = comm.rank
    arrived = np.ones(1, np.uint8)
    send = comm.Isend([arrived, MPI.BYTE], dest=0, tag=arrive)
    verdict = np.zeros(1, np.uint8)
    recv = comm.Irecv([verdict, MPI.BYTE], source=0, tag=arrive + 1)
    deadline = time.monotonic() + timeout + GRACE_SECONDS
    while not recv.Test():
        if time.monotonic() > deadline:
            recv.Cancel()
            recv.Wait()
            send.Wait()  # one byte: sent eagerly; no later barrier receives with its tag
            raise dist.DistBackendError(_member_error(me, f"no verdict within {timeout + GRACE_SECONDS:g} s"))
        time.sleep(_POLL_SECONDS)
    send.Wait()
    if verdict[0] != 1:
        raise dist.DistBackendError(_member_error(me, "rank 0 found a rank that did not arrive"))


def _member_error(rank: int, why: str) -> str:
    return (
        f"Rank {rank} successfully reached monitoredBarrier, but received errors while waiting for "
        f"send/recv from rank 0 ({why}). Please check rank 0 logs for faulty rank."
    )
