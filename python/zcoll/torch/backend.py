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

Supported: all_reduce (SUM, AVG, PRODUCT, MIN, MAX; AVG on floating dtypes), broadcast, reduce,
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
from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from ..communicator import Communicator
from . import _checks as chk
from . import _launch, _monitor, _p2p, _sparse
from ._work import OrderedExecutor, ZcollWork

BACKEND = "zcoll"

_TAG = 0  # tag of zcoll's own all-to-all / gather / scatter messages (on their own communicator)

_live: "weakref.WeakSet[ProcessGroupZcoll]" = weakref.WeakSet()


class ProcessGroupZcoll(dist.ProcessGroup):
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

    # -- collectives --------------------------------------------------------------------------
    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> dist.Work:
        try:
            t = chk.one("all_reduce", tensors)
        except chk.SparseTensorError:  # costs nothing until raised
            t = None
        if t is None:  # outside the except block: its errors are not "during handling" of that one
            return self._sparse_allreduce(tensors[0], opts)
        op = chk.op_name("all_reduce", opts, t)
        comm = self._comm
        if opts is not None and not opts.asyncOp:  # the common synchronous call: no closure
            done = self._exec.run_now(comm.allreduce, t, op, "auto", t)
            if done is not None:
                return done
        return self._exec.call(lambda: comm.allreduce(t, op=op, out=t), [t], chk.is_async(opts))

    def _sparse_allreduce(self, t: torch.Tensor, opts: Any) -> ZcollWork:
        if t.layout != torch.sparse_coo:
            raise NotImplementedError(
                f"zcoll all_reduce: {t.layout} tensors are not supported (sparse COO are)"
            )
        values = chk.check("all_reduce", t._values(), "the sparse tensor's values")
        op = chk.op_name("all_reduce", opts, values)
        if op != "sum":
            raise NotImplementedError(
                f"zcoll all_reduce: sparse tensors reduce with SUM only (as gloo's), not {op}"
            )
        comm = self._comm
        return self._exec.call(lambda: _sparse.allreduce_sum(comm, t), [t], chk.is_async(opts))

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> ZcollWork:
        ts = list(tensors)
        if not ts:
            raise ValueError("zcoll all_reduce_coalesced: got no tensors")
        chk.same(
            "all_reduce_coalesced", chk.check("all_reduce_coalesced", ts[0], "tensors[0]"), ts, "tensors"
        )
        ops = [chk.op_name("all_reduce_coalesced", opts, t) for t in ts]
        comm = self._comm

        def run() -> None:
            for t, op in zip(ts, ops):
                comm.allreduce(t, op=op, out=t)

        return self._exec.call(run, ts, chk.is_async(opts))

    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> ZcollWork:
        t = chk.one("broadcast", tensors)
        root = self._root("broadcast", opts)
        comm = self._comm
        return self._exec.call(lambda: comm.broadcast(t, root=root), [t], chk.is_async(opts))

    def reduce(self, tensors: List[torch.Tensor], opts: Any = None) -> ZcollWork:
        t = chk.one("reduce", tensors)
        root = self._root("reduce", opts)
        op = chk.op_name("reduce", opts, t)
        comm, out = self._comm, (t if self.rank() == root else None)
        return self._exec.call(lambda: comm.reduce(t, root=root, op=op, out=out), [t], chk.is_async(opts))

    def allgather(
        self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor], opts: Any = None
    ) -> ZcollWork:
        inp = chk.one("all_gather", inputs)
        if len(output_lists) != 1 or len(output_lists[0]) != self.size():
            raise ValueError(
                f"zcoll all_gather: expected one list of {self.size()} output tensors, got "
                f"{[len(o) for o in output_lists]}"
            )
        outs = output_lists[0]
        chk.same("all_gather", inp, outs, "tensor_list", inp.numel())
        comm, flat = self._comm, chk.tiled(outs)

        def run() -> None:
            if flat is not None:
                comm.allgather(inp, out=flat)
                return
            gathered = comm.allgather(inp)
            for o, g in zip(outs, gathered):
                o.view(-1).copy_(g.view(-1))

        return self._exec.call(run, output_lists, chk.is_async(opts))

    def all_gather_single(self, out: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> ZcollWork:
        chk.check("all_gather_into_tensor", out, "output")
        chk.check("all_gather_into_tensor", inp, "input")
        chk.like("all_gather_into_tensor", out, inp, self.size())
        comm = self._comm
        return self._exec.call(lambda: comm.allgather(inp, out=out), [out], chk.is_async(opts))

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(
        self, outs: List[torch.Tensor], ins: List[torch.Tensor], opts: Any = None
    ) -> ZcollWork:
        for o, i in zip(outs, ins):
            chk.check("all_gather_into_tensor_coalesced", o, "output")
            chk.check("all_gather_into_tensor_coalesced", i, "input")
            chk.like("all_gather_into_tensor_coalesced", o, i, self.size())
        comm = self._comm

        def run() -> None:
            for o, i in zip(outs, ins):
                comm.allgather(i, out=o)

        return self._exec.call(run, outs, chk.is_async(opts))

    def allgather_coalesced(
        self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor], opts: Any = None
    ) -> ZcollWork:
        """dist.all_gather_coalesced: output_lists[r][i] receives inputs[i] of rank r; one
        allgather per tensor (the tensors may differ in shape and dtype)."""
        if len(output_lists) != self.size() or any(len(o) != len(inputs) for o in output_lists):
            raise ValueError(
                f"zcoll all_gather_coalesced: expected {self.size()} output lists of {len(inputs)} tensors, "
                f"got {[len(o) for o in output_lists]}"
            )
        for i, inp in enumerate(inputs):
            chk.check("all_gather_coalesced", inp, f"input_tensor_list[{i}]")
            chk.same(
                "all_gather_coalesced",
                inp,
                [o[i] for o in output_lists],
                f"output_tensor_lists[*][{i}]",
                inp.numel(),
            )
        comm = self._comm

        def run() -> None:
            for i, inp in enumerate(inputs):
                gathered = comm.allgather(inp)
                for r, outs in enumerate(output_lists):
                    outs[i].view(-1).copy_(gathered[r].view(-1))

        return self._exec.call(run, output_lists, chk.is_async(opts))

    def reduce_scatter(
        self, outputs: List[torch.Tensor], input_lists: List[List[torch.Tensor]], opts: Any = None
    ) -> ZcollWork:
        out = chk.one("reduce_scatter", outputs)
        if len(input_lists) != 1 or len(input_lists[0]) != self.size():
            raise ValueError(
                f"zcoll reduce_scatter: expected one list of {self.size()} input tensors, got "
                f"{[len(i) for i in input_lists]}"
            )
        ins = input_lists[0]
        chk.same("reduce_scatter", out, ins, "input_list", out.numel())
        op = chk.op_name("reduce_scatter", opts, out)
        comm, flat = self._comm, chk.tiled(ins)

        def run() -> None:
            src = flat if flat is not None else torch.cat([i.reshape(-1) for i in ins])
            comm.reduce_scatter(src, op=op, out=out)

        return self._exec.call(run, [out], chk.is_async(opts))

    def reduce_scatter_single(self, out: torch.Tensor, inp: torch.Tensor, opts: Any = None) -> ZcollWork:
        chk.check("reduce_scatter_tensor", out, "output")
        chk.check("reduce_scatter_tensor", inp, "input")
        chk.like("reduce_scatter_tensor", inp, out, self.size())
        op = chk.op_name("reduce_scatter_tensor", opts, inp)
        comm = self._comm
        return self._exec.call(lambda: comm.reduce_scatter(inp, op=op, out=out), [out], chk.is_async(opts))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(
        self, outs: List[torch.Tensor], ins: List[torch.Tensor], opts: Any = None
    ) -> ZcollWork:
        ops = []
        for o, i in zip(outs, ins):
            chk.check("reduce_scatter_tensor_coalesced", o, "output")
            chk.check("reduce_scatter_tensor_coalesced", i, "input")
            chk.like("reduce_scatter_tensor_coalesced", i, o, self.size())
            ops.append(chk.op_name("reduce_scatter_tensor_coalesced", opts, i))
        comm = self._comm

        def run() -> None:
            for o, i, op in zip(outs, ins, ops):
                comm.reduce_scatter(i, op=op, out=o)

        return self._exec.call(run, outs, chk.is_async(opts))

    def barrier(self, opts: Any = None) -> ZcollWork:
        comm = self._comm
        return self._exec.call(comm.barrier, [], chk.is_async(opts))

    # -- through mpi4py -----------------------------------------------------------------------
    def alltoall_base(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        out_splits: List[int],
        in_splits: List[int],
        opts: Any = None,
    ) -> ZcollWork:
        chk.check("all_to_all_single", out, "output")
        chk.check("all_to_all_single", inp, "input")
        if out.dtype != inp.dtype:
            raise ValueError(
                "zcoll all_to_all_single: mixed dtypes in one call: "
                f"output is {out.dtype}, input is {inp.dtype}"
            )
        size, mc = self.size(), self._coll_p2p
        outs = _p2p._rows(out, out_splits, size, "output")
        ins = _p2p._rows(inp, in_splits, size, "input")
        timeout = self._comm.timeout
        return self._exec.call(
            self._messages("all_to_all_single", lambda: _p2p.alltoall_lists(mc, outs, ins, _TAG, timeout)),
            [out],
            chk.is_async(opts),
        )

    def alltoall(self, outs: List[torch.Tensor], ins: List[torch.Tensor], opts: Any = None) -> ZcollWork:
        if len(outs) != self.size() or len(ins) != self.size():
            raise ValueError(
                f"zcoll all_to_all: expected {self.size()} input and output tensors, "
                f"got {len(ins)} and {len(outs)}"
            )
        chk.check("all_to_all", ins[0], "input_tensor_list[0]")
        chk.same("all_to_all", ins[0], ins, "input_tensor_list")
        chk.same("all_to_all", ins[0], outs, "output_tensor_list")
        mc, timeout = self._coll_p2p, self._comm.timeout
        return self._exec.call(
            self._messages("all_to_all", lambda: _p2p.alltoall_lists(mc, outs, ins, _TAG, timeout)),
            outs,
            chk.is_async(opts),
        )

    def gather(
        self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor], opts: Any = None
    ) -> ZcollWork:
        inp = chk.one("gather", inputs)
        root = self._root("gather", opts)
        outs: List[torch.Tensor] = []
        if self.rank() == root:
            if len(output_lists) != 1 or len(output_lists[0]) != self.size():
                raise ValueError(f"zcoll gather: the root needs one list of {self.size()} output tensors")
            outs = output_lists[0]
            chk.same("gather", inp, outs, "gather_list", inp.numel())
        mc, timeout = self._coll_p2p, self._comm.timeout
        return self._exec.call(
            self._messages("gather", lambda: _p2p.gather(mc, outs, inp, root, _TAG, timeout)),
            output_lists,
            chk.is_async(opts),
        )

    def scatter(
        self, outputs: List[torch.Tensor], input_lists: List[List[torch.Tensor]], opts: Any = None
    ) -> ZcollWork:
        out = chk.one("scatter", outputs)
        root = self._root("scatter", opts)
        ins: List[torch.Tensor] = []
        if self.rank() == root:
            if len(input_lists) != 1 or len(input_lists[0]) != self.size():
                raise ValueError(f"zcoll scatter: the root needs one list of {self.size()} input tensors")
            ins = input_lists[0]
            chk.same("scatter", out, ins, "scatter_list", out.numel())
        mc, timeout = self._coll_p2p, self._comm.timeout
        return self._exec.call(
            self._messages("scatter", lambda: _p2p.scatter(mc, out, ins, root, _TAG, timeout)),
            [out],
            chk.is_async(opts),
        )

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> ZcollWork:
        t = chk.one("send", tensors)
        self._peer("send", dst)
        self._p2p_usable("send")
        req = _p2p.isend(self._p2p, t, dst, tag)  # posted now: MPI keeps the issue order
        return self._p2p_exec.call(
            lambda: self._p2p_wait(req, f"send to rank {dst} (tag {tag})", dst), [t], True
        )

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> ZcollWork:
        t = chk.one("recv", tensors)
        self._peer("recv", src)
        return self._recv(t, src, tag)

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> ZcollWork:
        """recv / irecv without src: from whichever rank sends first; ``work._source_rank()``
        (what dist.recv returns) is that rank."""
        return self._recv(chk.one("recv", tensors), None, tag)

    def _recv(self, t: torch.Tensor, src: Optional[int], tag: int) -> ZcollWork:
        self._p2p_usable("recv")
        req = _p2p.irecv(self._p2p, t, src, tag)
        source = [src]
        what = f"recv from {'any rank' if src is None else f'rank {src}'} (tag {tag})"

        def wait() -> None:
            source[0] = self._p2p_wait(req, what, src)

        work = self._p2p_exec.call(wait, [t], True)
        work.source = source
        return work

    def _messages(self, call: str, fn: Callable[[], None]) -> Callable[[], None]:
        """fn (all-to-all, gather, scatter over mpi4py) as a step of the collective order. One that
        fails breaks the group as a failed zcoll collective does (its messages could still arrive,
        and the next such call, same tag, would match them): later ones raise BrokenError, and the
        communicator is aborted so that the next zcoll collective fails on every rank. One after a
        failed zcoll collective (the communicator broken) raises BrokenError too."""

        def run() -> None:
            if self._coll_failure is None and self._comm.broken:
                self._coll_failure = (
                    "an earlier collective failed (the zcoll.TimeoutError it raised says why)"
                )
            if self._coll_failure is not None:
                from .. import BrokenError

                raise BrokenError(
                    f"zcoll {call}: this group broke when {self._coll_failure}; use a new group"
                )
            try:
                fn()
            except Exception as e:
                self._coll_failure = f"{call} failed ({e})"
                self._comm.abort(self._coll_failure)
                raise

        return run

    def _p2p_usable(self, call: str) -> None:
        if self._p2p_failure is not None:
            from .. import BrokenError

            raise BrokenError(
                f"zcoll {call}: this group's point-to-point channel broke when an earlier operation failed "
                f"({self._p2p_failure}); a message of that operation could still arrive and be matched by "
                "this one, so none is posted: use a new group (dist.new_group)"
            )

    def _p2p_wait(self, req: Any, what: str, peer: Optional[int]) -> int:
        """Completes one user send/recv; returns the peer's rank. A failure (timeout, MPI error)
        breaks the group's point-to-point channel: what the failed operation's peer sends later
        must never be matched by another receive."""
        from mpi4py import MPI

        status = MPI.Status()
        try:
            _p2p.wait_all([req], self._comm.timeout, what, [peer], [status], lambda: self._p2p_abort)
        except Exception as e:
            self._p2p_failure = f"{what}: {e}"
            raise
        return status.Get_source()

    def _abort_p2p(self, reason: str) -> None:
        self._p2p_abort = reason  # the running send/recv gives up, and the channel breaks

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """gloo's monitored barrier (see ``_monitor``): rank 0 raises naming the ranks that did not
        arrive within `timeout` (default: the group's timeout)."""
        if timeout is None:
            timeout = self._comm.timeout or c10d.default_pg_timeout
        self._monitored_calls += 1
        _monitor.monitored_barrier(self._coll_p2p, self._monitored_calls, timeout, wait_all_ranks)

    split_group = chk.unsupported("split_group (use dist.new_group)")
    merge_remote_group = chk.unsupported("merge_remote_group")

    # -- helpers and lifetime -------------------------------------------------------------------
    def _root(self, call: str, opts: Any) -> int:
        root = 0 if opts is None else opts.rootRank
        if not 0 <= root < self.size():
            raise ValueError(f"zcoll {call}: root {root} out of range for a group of {self.size()}")
        return root

    def _peer(self, call: str, peer: int) -> None:
        if not 0 <= peer < self.size():
            raise ValueError(f"zcoll {call}: peer rank {peer} out of range for a group of {self.size()}")

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
