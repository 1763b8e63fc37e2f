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
from typing import Any, List, Sequence

import torch

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


def irecv(comm: Any, t: torch.Tensor, src: int, tag: int) -> Any:
    return comm.Irecv(buffer(t), source=src, tag=tag)


def wait_all(requests: Sequence[Any]) -> None:
    """Completes every request: polls a little, then sleeps briefly between polls (GIL released)."""
    MPI = _mpi()
    requests = list(requests)
    polls = 0
    while not MPI.Request.Testall(requests):
        polls += 1
        if polls > _POLLS_BEFORE_SLEEP:
            time.sleep(0 if polls < 4 * _POLLS_BEFORE_SLEEP else 20e-6)


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


def alltoall_lists(comm: Any, outs: Sequence[torch.Tensor], ins: Sequence[torch.Tensor], tag: int) -> None:
    """outs[j] on rank i receives ins[i] of rank j; the own piece is copied locally."""
    rank = comm.rank
    reqs = [irecv(comm, o, j, tag) for j, o in enumerate(outs) if j != rank]
    reqs += [isend(comm, x, j, tag) for j, x in enumerate(ins) if j != rank]
    outs[rank].copy_(ins[rank])
    wait_all(reqs)


def alltoall_single(comm: Any, out: torch.Tensor, inp: torch.Tensor, out_splits, in_splits, tag: int) -> None:
    size = comm.size
    alltoall_lists(comm, _rows(out, out_splits, size, "output"), _rows(inp, in_splits, size, "input"), tag)


def gather(comm: Any, outs: Sequence[torch.Tensor], inp: torch.Tensor, root: int, tag: int) -> None:
    if comm.rank != root:
        wait_all([isend(comm, inp, root, tag)])
        return
    reqs = [irecv(comm, o, j, tag) for j, o in enumerate(outs) if j != root]
    outs[root].copy_(inp)
    wait_all(reqs)


def scatter(comm: Any, out: torch.Tensor, ins: Sequence[torch.Tensor], root: int, tag: int) -> None:
    if comm.rank != root:
        wait_all([irecv(comm, out, root, tag)])
        return
    reqs = [isend(comm, x, j, tag) for j, x in enumerate(ins) if j != root]
    out.copy_(ins[root])
    wait_all(reqs)
