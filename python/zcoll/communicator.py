"""The Communicator: zcoll's collectives over an MPI communicator, on arrays used in place."""
from __future__ import annotations

import atexit
import weakref
from typing import Any, Optional

from . import _C
from ._arrays import FLOAT_DTYPES, View, as_view, check_like, check_writable

OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4}
ALGORITHMS = {"auto": 0, "ring": 1, "tree": 2, "recursive_doubling": 3, "halving_doubling": 4, "mpi": 5, "shm": 6}

# Communicators still holding an MPI communicator: freed before MPI_Finalize (mpi4py finalizes
# MPI in an atexit handler registered before ours, so ours runs first).
_live: "weakref.WeakSet[Communicator]" = weakref.WeakSet()


@atexit.register
def _free_all() -> None:
    for c in list(_live):
        c.free()


def _op_code(op: str, dtype: str) -> int:
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; valid: {', '.join(OPS)}")
    if op == "avg" and dtype not in FLOAT_DTYPES:
        raise ValueError(f"op 'avg' needs a floating dtype, got {dtype}; use 'sum' and divide yourself")
    return OPS[op]


class Communicator:
    """zcoll's collectives over an MPI communicator.

    ``Communicator()`` duplicates ``MPI.COMM_WORLD`` (initialising MPI through mpi4py if needed);
    ``Communicator(comm)`` duplicates any mpi4py intracommunicator. zcoll's messages never mix
    with the caller's.

    Arrays (numpy, CPU torch tensors, DLPack or buffer-protocol objects) are used in place, never
    copied; results come back as the same kind of object (numpy for plain buffers). The GIL is
    released during every blocking call. Every rank must make the same calls in the same order.

    Set ``check=True`` (or the environment variable ``ZCOLL_CHECK=1``) to exchange a small header
    before each collective, so that ranks passing different sizes, dtypes, ops, roots or
    algorithms all raise ``zcoll.MismatchError`` instead of hanging or corrupting memory.

    Example::

        import numpy as np, zcoll
        comm = zcoll.Communicator()
        g = np.full(1000, comm.rank, dtype=np.float32)
        comm.allreduce(g, op="avg", out=g)          # in place
        total = comm.allreduce(g)                    # new array
    """

    def __init__(self, comm: Any = None, *, check: Optional[bool] = None):
        from mpi4py import MPI  # initialises MPI when it is not yet

        if comm is None:
            comm = MPI.COMM_WORLD
        if not isinstance(comm, MPI.Intracomm):
            raise TypeError(f"comm must be an mpi4py intracommunicator (or None), got {type(comm).__name__}")
        if comm == MPI.COMM_NULL:
            raise ValueError("comm is MPI.COMM_NULL")
        self._c: Optional[_C.Comm] = _C.Comm(comm.py2f())
        self._check = _C.env_get("ZCOLL_CHECK") if check is None else bool(check)
        self.segment_bytes = 0  # 0: built-in default; small values reach multi-segment code in tests
        self.pipeline_depth = 0
        _live.add(self)

    # -- properties -------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._comm().rank

    @property
    def size(self) -> int:
        return self._comm().size

    @property
    def wait_policy(self) -> str:
        """'spin' or 'yield' (ZCOLL_WAIT; auto yields when ranks outnumber this node's cores)."""
        return self._comm().wait_policy

    @property
    def freed(self) -> bool:
        return self._c is None

    def stats(self) -> dict:
        """Bytes and messages this rank sent through zcoll, and the number of collectives."""
        return self._comm().stats()

    def reset_stats(self) -> None:
        self._comm().reset_stats()

    def free(self) -> None:
        """Releases the MPI communicator (collective: every rank must call it). Idempotent."""
        if self._c is not None:
            self._c.free()
            self._c = None
        _live.discard(self)

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    def __repr__(self) -> str:
        if self._c is None:
            return "<zcoll.Communicator freed>"
        return f"<zcoll.Communicator rank={self.rank} size={self.size}>"

    def _comm(self) -> _C.Comm:
        if self._c is None:
            raise ValueError("this zcoll.Communicator has been freed; create a new one")
        return self._c

    def _pipeline(self) -> dict:
        return {"segment_bytes": self.segment_bytes, "depth": self.pipeline_depth, "check": self._check}

    def _out(self, x: View, out: Any, count: int, shape: tuple) -> View:
        if out is None:
            return as_view(x.empty(shape), "out")
        o = as_view(out, "out")
        check_writable(o, "out")
        check_like(o, x, count, "out")
        return o

    # -- collectives --------------------------------------------------------------------------
    def allreduce(self, x: Any, op: str = "sum", algorithm: str = "auto", out: Any = None, *,
                  compression: Any = None, key: Optional[str] = None) -> Any:
        """Reduces x over all ranks; every rank gets the same bits.

        op: sum, prod, min, max or avg (avg: floating dtypes). algorithm: auto, ring, tree,
        recursive_doubling, halving_doubling, shm (node-local shared memory; every rank on one
        node), or mpi (the MPI library's own MPI_Allreduce).
        out: where the result goes (may be x itself for in place); a new array when None.

        compression: a compressor from zcoll.compression (GradientQuantizer, TopK, RandomK,
        Threshold, HalfPrecision); op must then be sum or avg and x float32, float16 or bfloat16.
        key names the tensor, for the compressor's error-feedback residual (required when error
        feedback is on). The compressor's ``last_stats`` reports wire bytes and errors; NaN or
        Inf in x raises FloatingPointError on every rank. For example, in a DDP hook::

            comm.allreduce(bucket.buffer(), op="avg", compression=q, key=str(bucket.index()))
        """
        c = self._comm()
        v = as_view(x, "x")
        code = _op_code(op, v.dtype)
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {algorithm!r}; valid: {', '.join(ALGORITHMS)}")
        if compression is not None:
            return self._allreduce_compressed(v, op, algorithm, out, compression, key)
        o = self._out(v, out, v.count, v.shape)
        _C.allreduce(c, v.address, o.address, v.count, v.code, code, ALGORITHMS[algorithm], **self._pipeline())
        return o.obj

    def _allreduce_compressed(self, v: View, op: str, algorithm: str, out: Any, compression: Any,
                              key: Optional[str]) -> Any:
        from .compression import Compressor

        if not isinstance(compression, Compressor):
            raise TypeError(
                "compression must be a zcoll compressor (GradientQuantizer, TopK, RandomK, Threshold, "
                f"HalfPrecision), got {type(compression).__name__}"
            )
        if op not in ("sum", "avg"):
            raise ValueError(f"compressed allreduce supports op 'sum' and 'avg', not {op!r}")
        if algorithm != "auto":
            raise ValueError(
                f"algorithm={algorithm!r} with compression: the compressor picks its own algorithm "
                "(compressed ring or sparse allgather); leave algorithm='auto'"
            )
        o = self._out(v, out, v.count, v.shape)
        compression._allreduce(self._comm(), v, o, op, key, self._pipeline())
        return o.obj

    def reduce_scatter(self, x: Any, op: str = "sum", out: Any = None) -> Any:
        """Reduces x over all ranks and returns this rank's block of the result (1-D).

        Blocks are as equal as possible, the first ``x.size % size`` ranks holding one element
        more: rank r gets elements [block_begin(r), block_begin(r) + block_count(r)).
        """
        c = self._comm()
        v = as_view(x, "x")
        code = _op_code(op, v.dtype)
        n = _C.block_count(v.count, c.size, c.rank)
        o = self._out(v, out, n, (n,))
        _C.reduce_scatter(c, v.address, o.address, v.count, v.code, code, **self._pipeline())
        return o.obj

    def allgather(self, x: Any, out: Any = None) -> Any:
        """Concatenates every rank's x in rank order; the result has shape (size, *x.shape)."""
        c = self._comm()
        v = as_view(x, "x")
        o = self._out(v, out, v.count * c.size, (c.size,) + tuple(v.shape))
        _C.allgather(c, v.address, o.address, v.count, v.code, **self._pipeline())
        return o.obj

    def broadcast(self, x: Any, root: int = 0) -> Any:
        """Overwrites x on every rank with x from `root` (in place) and returns x."""
        c = self._comm()
        self._check_root(root)
        v = as_view(x, "x")
        check_writable(v, "x")
        _C.broadcast(c, v.address, v.count, v.code, root, **self._pipeline())
        return v.obj

    def reduce(self, x: Any, root: int = 0, op: str = "sum", out: Any = None) -> Any:
        """Reduces x over all ranks onto `root`. Returns the result on root, None elsewhere
        (where `out` is not touched)."""
        c = self._comm()
        self._check_root(root)
        v = as_view(x, "x")
        code = _op_code(op, v.dtype)
        # A given `out` is validated on every rank, not only on root: an error raised on root
        # alone would send the other ranks into the collective without it.
        o = self._out(v, out, v.count, v.shape) if c.rank == root or out is not None else None
        dst = o if c.rank == root else None
        _C.reduce(c, v.address, dst.address if dst else 0, v.count, v.code, code, root, **self._pipeline())
        return dst.obj if dst else None

    def barrier(self) -> None:
        """Returns once every rank has entered the barrier."""
        _C.barrier(self._comm())

    def _check_root(self, root: int) -> None:
        if not isinstance(root, int) or not 0 <= root < self.size:
            raise ValueError(f"root {root!r} out of range for {self.size} ranks (valid: 0..{self.size - 1})")
