"""The "zcoll" torch.distributed backend: a Python ProcessGroup over zcoll's Communicator.

Collectives run zcoll's compiled algorithms on the tensors' own memory (no copies; float16 and
bfloat16 included), the GIL released. Point-to-point, all-to-all, gather and scatter go through
mpi4py on the same memory (see ``_p2p``). Ordering and async completion: see ``_work``.

1. ``import zcoll.torch`` registers the backend (CPU) with ``extended_api=True``.
2. The default group sits on a duplicate of the MPI world communicator (torch rank == MPI rank,
   checked). ``dist.new_group(ranks)`` builds the matching MPI sub-communicator with
   ``MPI_Comm_create_group``, collective over the members only, which is exactly the set of
   ranks torch calls the creator on (non-members return early), so it cannot deadlock.
3. Each group owns: the zcoll Communicator (collectives), two more duplicates (user send/recv;
   all-to-all, gather, scatter), one ordered executor for collectives and one for send/recv.

Supported: all_reduce (SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR, on the dtypes and ops gloo
takes: ``_checks`` and docs/torch.md), broadcast, reduce,
all_gather, all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor, all_to_all_single,
all_to_all, gather, scatter, all_gather_coalesced, barrier, monitored_barrier (``_monitor``),
send, recv, isend/irecv (with or without src), the *_coalesced variants of allreduce /
allgather_into_tensor / reduce_scatter_tensor, and async_op=True for all of them. Anything else
raises NotImplementedError naming the call; sparse COO tensors go only to all_reduce with SUM
(``_sparse``: gathered and added, as gloo does).

Timeouts: the group's ``timeout=`` (``init_process_group`` / ``new_group``; when left at torch's
default, ``ZCOLL_TIMEOUT``) is the deadline of every collective and point-to-point wait; on
expiry every surviving rank raises ``zcoll.TimeoutError`` naming the ranks that never arrived,
and the group is broken (later calls raise ``zcoll.BrokenError``). ``Work.wait(timeout)`` aborts
the operation the same way when it is not done in time. A failed send/recv breaks the group's
point-to-point channel (a late message of it must never be matched by a later receive), a failed
all-to-all / gather / scatter the whole group; MPI's errors are translated (``_p2p``).

Example::

    # mpirun -n 2 python -m mpi4py example.py
    import torch, torch.distributed as dist, zcoll.torch
    dist.init_process_group("zcoll")
    t = torch.full((4,), float(dist.get_rank()))
    dist.all_reduce(t, op=dist.ReduceOp.AVG)          # inline, about 15 us of Python
    w = dist.all_reduce(t, async_op=True); w.wait()    # ordered worker thread
    sub = dist.new_group([0, 1])
"""

from __future__ import annotations

import atexit
import datetime
import functools
import weakref
import zlib
from typing import Any, Callable, Optional

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from ..core.communicator import Communicator, leave_on_uncaught
from . import _checks as chk
from . import _launch, _shrink
from ._work import OrderedExecutor, ZcollWork
from .pg_collectives import CollectiveOps
from .pg_messages import MessageOps

BACKEND = "zcoll"

_live: "weakref.WeakSet[ProcessGroupZcoll]" = weakref.WeakSet()


class ProcessGroupZcoll(CollectiveOps, MessageOps, _shrink.ShrinkOps, dist.ProcessGroup):
    """torch.distributed process group over zcoll; created by torch (see the module docstring)."""

    def __init__(self, comm: Any, rank: int, size: int, name: str = "0", timeout: Optional[float] = None):
        super().__init__(rank, size)
        self._base = comm  # owned: a duplicate or a sub-communicator of the world
        self._comm = Communicator(comm, timeout=timeout)
        self._p2p = comm.Dup()  # users' send/recv (their tags)
        self._coll_p2p = comm.Dup()  # zcoll's all-to-all, gather, scatter
        self._exec = OrderedExecutor(f"zcoll-pg{name}", on_timeout=self._comm.abort)
        self._p2p_exec = OrderedExecutor(f"zcoll-pg{name}-p2p", on_timeout=self._abort_p2p)
        self._p2p_abort: Optional[str] = None  # set by Work.wait(timeout) on a send/recv
        self._p2p_failure: Optional[str] = None  # why the users' send/recv channel broke
        self._coll_failure: Optional[str] = None  # why all-to-all / gather / scatter broke
        self._monitored_calls = 0  # monitored_barrier calls so far (their tags)
        self._group_name = name
        self._group_desc = ""
        _live.add(self)

    # -- identity (torch calls these) ------------------------------------------------------
    def getBackendName(self) -> str:
        return BACKEND

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return self._group_desc

    def __repr__(self) -> str:
        return (
            f"<zcoll.torch.ProcessGroupZcoll rank={self.rank()} size={self.size()} name={self._group_name}>"
        )

    # -- for hooks and tools ----------------------------------------------------------------
    @property
    def communicator(self) -> Communicator:
        """The zcoll Communicator this group runs on (``.stats()`` counts its bytes)."""
        return self._comm

    @property
    def mpi_comm(self) -> Any:
        """The mpi4py communicator of this group (ranks = group ranks)."""
        return self._base

    def submit(self, fn: Callable[[], Any], value: Any, async_op: bool = True) -> ZcollWork:
        """Runs fn() in this group's collective order (see ``_work``); the work's future holds
        `value`. DDP hooks use it to run a zcoll call on a bucket in order with everything else."""
        return self._exec.call(fn, value, async_op)

    split_group = chk.unsupported("split_group (use dist.new_group)")
    merge_remote_group = chk.unsupported("merge_remote_group")

    def shutdown(self) -> None:
        """Finishes queued work, joins the worker threads, frees the communicators. Idempotent."""
        self._exec.shutdown()
        self._p2p_exec.shutdown()
        if not self._comm.freed:
            self._comm.free()
            from mpi4py import MPI

            if not MPI.Is_finalized():
                for c in (self._p2p, self._coll_p2p, self._base):
                    c.Free()
        _live.discard(self)

    def abort(self) -> None:
        self.shutdown()


@atexit.register
def _shutdown_all() -> None:
    leave_on_uncaught()  # before shutdown() frees anything collectively
    for pg in list(_live):
        pg.shutdown()


def _parent_comm() -> Any:
    """The communicator torch's global ranks index, for building sub-communicators."""
    default = c10d._get_default_group()
    if isinstance(default, ProcessGroupZcoll):
        return default.mpi_comm
    world = _launch.world_comm()
    if default.rank() != world.rank or default.size() != world.size:
        raise _launch.launch_error(default.rank(), default.size(), world)
    return world


def _create(opts: Any, backend_options: Any = None) -> ProcessGroupZcoll:
    """torch's creator (extended API): the default group or a subgroup, see the module docstring."""
    if not opts.global_ranks_in_group:  # before mpi4py starts MPI: a torch launcher's job joins MPI
        _launch.join_launcher_job(opts, _timeout_seconds(opts))
    from mpi4py import MPI

    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:  # worker threads call MPI alongside the caller
        raise RuntimeError(
            "zcoll: the torch backend needs MPI initialised with MPI_THREAD_MULTIPLE (mpi4py's default); "
            "it was initialised with a lower level (mpi4py.rc.thread_level?)"
        )
    ranks = list(opts.global_ranks_in_group)
    name = str(opts.group_id)
    if not ranks:
        world = _launch.world_comm()
        if world.rank != opts.group_rank or world.size != opts.group_size:
            raise _launch.launch_error(opts.group_rank, opts.group_size, world)
        comm = world.Dup()
    else:
        parent = _parent_comm()
        everyone = parent.Get_group()
        group = everyone.Incl(ranks)  # group rank i = ranks[i], as torch numbers them
        try:
            comm = parent.Create_group(group, tag=zlib.crc32(name.encode()) % 32768)
        finally:
            group.Free()
            everyone.Free()
    return ProcessGroupZcoll(comm, opts.group_rank, opts.group_size, name, _timeout_seconds(opts))


def _timeout_seconds(opts: Any) -> Optional[float]:
    """The group's timeout= in seconds; None when torch passed its own default (then the
    communicator's default, ZCOLL_TIMEOUT, holds: an explicit argument beats the environment)."""
    timeout = getattr(opts, "timeout", None)
    if timeout is None or timeout == c10d.default_pg_timeout:
        return None
    return timeout.total_seconds()


def register() -> None:
    """Registers the backend (done by ``import zcoll.torch``) and lets ``dist.monitored_barrier``
    reach zcoll groups. Idempotent."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
    if not getattr(c10d.monitored_barrier, "_zcoll", False):
        dist.monitored_barrier = c10d.monitored_barrier = _monitored_barrier_for(c10d.monitored_barrier)
    _shrink.install()  # torch.distributed.shrink_group on zcoll groups


def _monitored_barrier_for(torchs: Callable[..., Any]) -> Callable[..., Any]:
    """torch's dist.monitored_barrier refuses every backend but gloo by name ("only implemented
    for GLOO backend"), before asking the group. This wrapper sends a call on a zcoll group to
    the group's own monitored_barrier and everything else to torch's function unchanged."""

    @functools.wraps(torchs)
    def monitored_barrier(group: Any = None, timeout: Any = None, wait_all_ranks: bool = False) -> Any:
        if c10d._rank_not_in_group(group):
            return torchs(group, timeout, wait_all_ranks)  # torch warns and returns
        pg = c10d._get_default_group() if group is None else group
        if not isinstance(pg, ProcessGroupZcoll):
            return torchs(group, timeout, wait_all_ranks)
        if isinstance(timeout, (int, float)):
            timeout = datetime.timedelta(seconds=timeout)
        return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    monitored_barrier._zcoll = True
    return monitored_barrier
