"""The zcoll process group's messages through mpi4py on the tensors' memory: all-to-all, gather
and scatter in the collective order (on their own communicator, ``_coll_p2p``), users' send/recv
on theirs (``_p2p``), monitored_barrier; and how a failed one breaks the group (``_p2p``)."""

from __future__ import annotations

from typing import Any, Callable, List, Optional

import torch
from torch.distributed import distributed_c10d as c10d

from .._C import BrokenError
from . import _checks as chk
from . import _monitor, _p2p
from ._work import ZcollWork

_TAG = 0  # tag of zcoll's own all-to-all / gather / scatter messages (on their own communicator)


class MessageOps:
    """all_to_all, gather, scatter, send, recv, monitored_barrier of ProcessGroupZcoll (which sets
    the communicators, executors and failure state these read)."""

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

    # -- helpers and lifetime -------------------------------------------------------------------
    def _root(self, call: str, opts: Any) -> int:
        root = 0 if opts is None else opts.rootRank
        if not 0 <= root < self.size():
            raise ValueError(f"zcoll {call}: root {root} out of range for a group of {self.size()}")
        return root

    def _peer(self, call: str, peer: int) -> None:
        if not 0 <= peer < self.size():
            raise ValueError(f"zcoll {call}: peer rank {peer} out of range for a group of {self.size()}")
