"""Bad calls that must raise a clear exception before any communication.

Shared by core/test_communicator.py (one rank, in process) and mpi/api.py (every rank of 2 and 3, where the
communicator's traffic counters must not move and the communicator must still work afterwards).
Each entry: (name, call(comm), exception type, words its message must contain).
"""

from __future__ import annotations

import array

import numpy as np
import torch
import zcoll

DTYPE_WORDS = "float32 float64 float16 bfloat16 int8 uint8 int32 int64"
OP_WORDS = "sum prod min max avg"
ALGORITHM_WORDS = "auto ring tree recursive_doubling halving_doubling mpi shm hierarchical ordered_ring"


def f32(n: int = 4) -> np.ndarray:
    return np.arange(n, dtype=np.float32)


def read_only(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False
    return a


class DLPackOnly:
    """Exposes an array through DLPack only (no buffer protocol, no __array_interface__)."""

    def __init__(self, a: np.ndarray):
        self._a = a

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def block(comm) -> int:
    """Elements of this rank's reduce_scatter block of f32()."""
    return len(zcoll.block_range(4, comm.size, comm.rank))


BAD_CALLS = [
    # unknown names: ValueError listing the valid ones
    ("allreduce unknown op", lambda c: c.allreduce(f32(), op="mean"), ValueError, "'mean' " + OP_WORDS),
    ("reduce_scatter unknown op", lambda c: c.reduce_scatter(f32(), op="mean"), ValueError, OP_WORDS),
    ("reduce unknown op", lambda c: c.reduce(f32(), op="xor"), ValueError, OP_WORDS),
    (
        "allreduce unknown algorithm",
        lambda c: c.allreduce(f32(), algorithm="bruck"),
        ValueError,
        "'bruck' " + ALGORITHM_WORDS,
    ),
    (
        "allreduce numpy complex256",
        lambda c: c.allreduce(np.zeros(4, np.clongdouble)),
        ValueError,
        DTYPE_WORDS,
    ),
    ("allgather numpy int16", lambda c: c.allgather(np.zeros(4, np.int16)), ValueError, DTYPE_WORDS),
    ("broadcast numpy uint16", lambda c: c.broadcast(np.zeros(4, np.uint16)), ValueError, DTYPE_WORDS),
    (
        "allreduce torch int16",
        lambda c: c.allreduce(torch.zeros(4, dtype=torch.int16)),
        ValueError,
        DTYPE_WORDS,
    ),
    (
        "allreduce torch uint16",
        lambda c: c.allreduce(torch.zeros(4, dtype=torch.uint16)),
        ValueError,
        DTYPE_WORDS,
    ),
    ("allreduce a list", lambda c: c.allreduce([1.0, 2.0]), TypeError, "numpy torch DLPack buffer"),
    # layout
    ("allreduce non-contiguous numpy", lambda c: c.allreduce(f32(8)[::2]), ValueError, "contiguous"),
    (
        "allreduce non-contiguous torch",
        lambda c: c.allreduce(torch.zeros(4, 4).t()),
        ValueError,
        "contiguous",
    ),
    ("broadcast non-contiguous torch", lambda c: c.broadcast(torch.zeros(8)[::2]), ValueError, "contiguous"),
    (
        "allreduce non-contiguous out",
        lambda c: c.allreduce(f32(), out=f32(8)[::2]),
        ValueError,
        "out contiguous",
    ),
    # read-only destinations (a read-only *input* is fine)
    (
        "allreduce read-only out",
        lambda c: c.allreduce(f32(), out=read_only(f32())),
        ValueError,
        "out read-only",
    ),
    ("reduce read-only out", lambda c: c.reduce(f32(), out=read_only(f32())), ValueError, "read-only"),
    (
        "allgather read-only out",
        lambda c: c.allgather(f32(), out=read_only(f32(4 * c.size))),
        ValueError,
        "read-only",
    ),
    (
        "reduce_scatter read-only out",
        lambda c: c.reduce_scatter(f32(), out=read_only(f32(block(c)))),
        ValueError,
        "read-only",
    ),
    ("broadcast read-only numpy", lambda c: c.broadcast(read_only(f32())), ValueError, "read-only"),
    ("broadcast bytes", lambda c: c.broadcast(bytes(8)), ValueError, "read-only"),
    (
        "broadcast read-only DLPack",
        lambda c: c.broadcast(DLPackOnly(read_only(f32()))),
        ValueError,
        "read-only",
    ),
    # out of the wrong size or dtype
    ("allreduce out too small", lambda c: c.allreduce(f32(), out=f32(3)), ValueError, "out 3 4"),
    (
        "allreduce out wrong dtype",
        lambda c: c.allreduce(f32(), out=np.zeros(4)),
        ValueError,
        "out float64 float32",
    ),
    (
        "allreduce out torch wrong dtype",
        lambda c: c.allreduce(torch.zeros(4), out=torch.zeros(4, dtype=torch.bfloat16)),
        ValueError,
        "dtype bfloat16 float32",
    ),
    (
        "reduce_scatter out of the full size",
        lambda c: c.reduce_scatter(f32(), out=f32(4 + 1)),
        ValueError,
        "out elements",
    ),
    (
        "allgather out without the rank axis",
        lambda c: c.allgather(f32(), out=f32(4 * c.size + 1)),
        ValueError,
        "out elements",
    ),
    (
        "allgather out wrong dtype",
        lambda c: c.allgather(f32(), out=np.zeros(4 * c.size, np.int32)),
        ValueError,
        "dtype",
    ),
    ("reduce out too large", lambda c: c.reduce(f32(), out=f32(5)), ValueError, "out elements"),
    # roots
    ("broadcast root = size", lambda c: c.broadcast(f32(), root=c.size), ValueError, "root out of range"),
    ("broadcast root -1", lambda c: c.broadcast(f32(), root=-1), ValueError, "root"),
    ("reduce root = size", lambda c: c.reduce(f32(), root=c.size), ValueError, "root out of range"),
    ("reduce root 1.0", lambda c: c.reduce(f32(), root=1.0), ValueError, "root"),
    # avg needs a floating dtype
    (
        "allreduce avg int32",
        lambda c: c.allreduce(np.arange(4, dtype=np.int32), op="avg"),
        ValueError,
        "avg int32",
    ),
    ("reduce_scatter avg uint8", lambda c: c.reduce_scatter(bytearray(4), op="avg"), ValueError, "avg uint8"),
    (
        "reduce avg torch int64",
        lambda c: c.reduce(torch.zeros(4, dtype=torch.int64), op="avg"),
        ValueError,
        "avg",
    ),
    (
        "allreduce avg array.array('i')",
        lambda c: c.allreduce(array.array("i", [1, 2]), op="avg"),
        ValueError,
        "avg",
    ),
]
