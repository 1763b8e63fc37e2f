"""Point-to-point pieces of the zcoll process group, over mpi4py on the tensors' memory.

send/recv, all_to_all (both forms), gather and scatter post nonblocking MPI sends and receives
straight from and into the tensors (``MPI.buffer.fromaddress``: no copies, every dtype, bf16
included) and complete them with :func:`wait_all`, which polls and yields the core instead of
busy-waiting (MPICH's own waits spin, ruinous when ranks outnumber cores).

Example::

    reqs = [isend(comm, t, dst=1, tag=0)]
    wait_all(reqs)
"""

from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Sequence

import torch

from .._C import TimeoutError as ZcollTimeoutError
from .._C import ZcollError

_POLLS_BEFORE_SLEEP = 64


def _mpi() -> Any:
    from mpi4py import MPI  # imported on use: importing zcoll.torch does not start MPI

    return MPI


def buffer(t: torch.Tensor) -> list:
    """[memory, MPI.BYTE] over a contiguous CPU tensor's bytes (no copy)."""
    MPI = _mpi()
    nbytes = t.numel() * t.element_size()
    return [MPI.buffer.fromaddress(t.data_ptr() if nbytes else 0, nbytes), nbytes, MPI.BYTE]


def isend(comm: Any, t: torch.Tensor, dst: int, tag: int) -> Any:
    return comm.Isend(buffer(t), dest=dst, tag=tag)


def irecv(comm: Any, t: torch.Tensor, src: Optional[int], tag: int) -> Any:
    """A receive into t from rank src, or from any rank when src is None."""
    return comm.Irecv(buffer(t), source=_mpi().ANY_SOURCE if src is None else src, tag=tag)


def wait_all(
    requests: Sequence[Any],
    timeout: float = 0.0,
    what: str = "point-to-point operation",
    peers: Sequence[Optional[int]] = (),
    statuses: Optional[List[Any]] = None,
    aborted: Optional[Callable[[], Optional[str]]] = None,
) -> None:
    """Completes every request: polls a little, then sleeps briefly between polls (GIL released).
    After `timeout` seconds (0: never) cancels what is left and raises zcoll.TimeoutError naming
    the peers (peers[i]: of requests[i]) still unfinished. An MPI error raises zcoll.ZcollError
    saying what failed, with which peer, and MPI's own words. statuses: MPI.Status objects, one
    per request, filled in (e.g. the source of a receive from any rank). aborted(): a reason to
    give up now (Work.wait(timeout) expired), checked as often as the deadline."""
    MPI = _mpi()
    requests = list(requests)
    if statuses is None:
        statuses = [MPI.Status() for _ in requests]
    polls = 0
    deadline = time.monotonic() + timeout if timeout > 0 else None
    while not _test_all(requests, statuses, what, peers):
        polls += 1
        if polls > _POLLS_BEFORE_SLEEP:
            time.sleep(0 if polls < 4 * _POLLS_BEFORE_SLEEP else 20e-6)
            if polls % 64:
                continue
            if deadline is not None and time.monotonic() > deadline:
                _expire(requests, f"timed out after {timeout:g} s", what, peers)
            reason = aborted() if aborted is not None else None
            if reason:
                _expire(requests, f"was aborted ({reason})", what, peers)


def _test_all(requests: List[Any], statuses: List[Any], what: str, peers: Sequence[Optional[int]]) -> bool:
    MPI = _mpi()
    try:
        return MPI.Request.Testall(requests, statuses)
    except MPI.Exception as e:
        _cancel(requests)
        raise _mpi_error(e, statuses, what, peers) from None


def _mpi_error(error: Any, statuses: List[Any], what: str, peers: Sequence[Optional[int]]) -> Exception:
    """zcoll.ZcollError for an MPI error in one of `what`'s messages: which peer, MPI's error
    string, and what a truncation means here."""
    MPI = _mpi()
    codes = [(i, s.Get_error()) for i, s in enumerate(statuses)]
    failed = [(i, c) for i, c in codes if c not in (MPI.SUCCESS, MPI.ERR_PENDING)] or [
        (-1, error.Get_error_code())
    ]
    parts = []
    for i, code in failed:
        peer = _who(peers[i]) if 0 <= i < len(peers) else "a peer"
        text = f"the message with {peer} failed: {MPI.Get_error_string(code).strip()}"
        if MPI.Get_error_class(code) == MPI.ERR_TRUNCATE:
            got = statuses[i].Get_count(MPI.BYTE) if i >= 0 else "?"
            text += (
                f" (a message of {got} bytes or more arrived for a smaller receive buffer: the sender sent "
                "another size, or this receive matched a message meant for another operation with the "
                "same source and tag)"
            )
        parts.append(text)
    return ZcollError(f"zcoll: {what}: " + "; ".join(parts))


def _who(peer: Optional[int]) -> str:
    return "any rank" if peer is None else f"rank {peer}"


def _cancel(requests: List[Any]) -> List[int]:
    """Cancels every unfinished request; returns their indices."""
    MPI = _mpi()
    waiting = []
    for i, req in enumerate(requests):
        if req == MPI.REQUEST_NULL:  # completed (Testall nulls what is done)
            continue
        waiting.append(i)
        try:
            req.Cancel()
        except MPI.Exception:
            pass
    return waiting


def _expire(requests: List[Any], why: str, what: str, peers: Sequence[Optional[int]]) -> None:
    waiting = sorted({_who(peers[i]) for i in _cancel(requests) if i < len(peers)})
    who = ", ".join(waiting) if waiting else "its peers"
    raise ZcollTimeoutError(f"zcoll: {what} {why} waiting for {who}; the unfinished messages were cancelled")


def _rows(t: torch.Tensor, splits: Sequence[int], size: int, name: str) -> List[torch.Tensor]:
    """Splits t along dim 0 into `size` contiguous pieces (equal pieces when splits is empty)."""
    if t.dim() == 0:
        raise ValueError(f"zcoll all_to_all_single: {name} must have at least one dimension")
    rows = t.shape[0]
    if not splits:
        if rows % size:
            raise ValueError(
                f"zcoll all_to_all_single: {name} has {rows} rows, not divisible by the group size {size}; "
                "pass split sizes"
            )
        splits = [rows // size] * size
    if len(splits) != size or sum(splits) != rows:
        raise ValueError(
            f"zcoll all_to_all_single: {name} split sizes {list(splits)} must be {size} numbers "
            f"summing to {rows}"
        )
    return list(torch.split(t, list(splits), dim=0))


def alltoall_lists(
    comm: Any, outs: Sequence[torch.Tensor], ins: Sequence[torch.Tensor], tag: int, timeout: float = 0.0
) -> None:
    """outs[j] on rank i receives ins[i] of rank j; the own piece is copied locally."""
    rank = comm.rank
    peers = [j for j in range(len(outs)) if j != rank]
    reqs = [irecv(comm, outs[j], j, tag) for j in peers]
    reqs += [isend(comm, ins[j], j, tag) for j in peers]
    outs[rank].copy_(ins[rank])
    wait_all(reqs, timeout, "all_to_all", peers + peers)


def alltoall_single(comm: Any, out: torch.Tensor, inp: torch.Tensor, out_splits, in_splits, tag: int) -> None:
    size = comm.size
    alltoall_lists(comm, _rows(out, out_splits, size, "output"), _rows(inp, in_splits, size, "input"), tag)


def gather(
    comm: Any, outs: Sequence[torch.Tensor], inp: torch.Tensor, root: int, tag: int, timeout: float = 0.0
) -> None:
    if comm.rank != root:
        wait_all([isend(comm, inp, root, tag)], timeout, "gather", [root])
        return
    peers = [j for j in range(len(outs)) if j != root]
    reqs = [irecv(comm, outs[j], j, tag) for j in peers]
    outs[root].copy_(inp)
    wait_all(reqs, timeout, "gather", peers)


def scatter(
    comm: Any, out: torch.Tensor, ins: Sequence[torch.Tensor], root: int, tag: int, timeout: float = 0.0
) -> None:
    if comm.rank != root:
        wait_all([irecv(comm, out, root, tag)], timeout, "scatter", [root])
        return
    peers = [j for j in range(len(ins)) if j != root]
    reqs = [isend(comm, ins[j], j, tag) for j in peers]
    out.copy_(ins[root])
    wait_all(reqs, timeout, "scatter", peers)
