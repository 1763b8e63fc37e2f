"""The zcoll process group's collectives: zcoll's compiled algorithms on the tensors' own memory
(no copies; float16 and bfloat16 included), in the group's collective order (``_work``)."""

from __future__ import annotations

from typing import Any, List

import torch
import torch.distributed as dist

from . import _checks as chk
from . import _sparse
from ._work import ZcollWork


class CollectiveOps:
    """all_reduce, broadcast, reduce, all_gather, reduce_scatter (and their single-tensor and
    coalesced forms), barrier: each checks its tensors, then runs on the group's ordered executor
    (``_exec``) through its Communicator (``_comm``), both set by ProcessGroupZcoll."""

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
