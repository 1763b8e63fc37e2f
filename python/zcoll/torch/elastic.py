"""Training that goes on in place when a rank dies: :class:`ElasticLoop` (docs/recovery.md).

Needs in-place recovery, i.e. Open MPI with ULFM under ``mpirun --with-ft ulfm`` (elsewhere the
first lost rank re-raises the error with a note that recovery is by restart, ``zcoll run``).
The loop runs ``step_fn(step, model)`` for each step and keeps, in memory, the model's and the
optimizer's state after each of the last two completed steps. When a step fails because ranks
were lost (``zcoll.TimeoutError``, or the RuntimeError DDP raises quoting it), every survivor:

1. agrees with the others on the lost ranks: ``shrink()`` of the group's zcoll communicator
   (MPI's fault-tolerant agreement), then ``torch.distributed.shrink_group`` of those ranks, which
   makes the survivors' group the new default group;
2. agrees on the last step every survivor completed (an all_reduce MIN: a survivor may have
   finished the failed step where another did not) and loads that step's snapshot (no disk read),
   so at most the step in flight is lost;
3. keeps the global batch or the learning rate's rule: with ``policy="accumulate"`` the
   micro-batches per step grow to keep ranks x micro-batches at least what it was
   (``accumulation``, which ``step_fn`` reads from the loop); with ``policy="lr"`` the
   :class:`~zcoll.torch.LRScaling` given moves the rate to the rule's value for the smaller batch;
4. wraps the module in DDP again on the new group (``wrap``, which broadcasts rank 0's
   parameters: every survivor starts equal) and goes on from that step.

Example::

    # mpirun --with-ft ulfm --oversubscribe -n 4 python -m mpi4py train.py
    zcoll.torch.init_process_group(timeout=datetime.timedelta(seconds=10))
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    loop = ElasticLoop(net, opt, wrap=lambda m, g: DDP(m, process_group=g), policy="accumulate")

    def step_fn(step, model):
        opt.zero_grad()
        for k in range(loop.accumulation):
            loss_fn(model(x(step, k)), y(step, k)).backward()
        opt.step()

    loop.run(step_fn, steps=1000)
    print(loop.recoveries)        # one record per recovery: lost ranks, resumed step, seconds
"""

from __future__ import annotations

import copy
import math
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from .. import _C
from ..core.communicator import Communicator


class ElasticLoop:
    """The loop of the module docstring. ``module`` is the plain model (not DDP); ``wrap(module,
    group)`` returns what ``step_fn`` gets (e.g. DDP on that group; default: the module itself);
    ``scaling`` an LRScaling for ``policy="lr"``; ``micro_batch`` the rows per rank per
    micro-batch it uses to state the global batch."""

    POLICIES = ("accumulate", "lr", "none")

    def __init__(
        self,
        module: torch.nn.Module,
        optimizer: Any,
        wrap: Callable[[torch.nn.Module, Any], Any] | None = None,
        policy: str = "accumulate",
        scaling: Any = None,
        micro_batch: int = 1,
        accumulation: int = 1,
        group: Any = None,
    ):
        if policy not in self.POLICIES:
            raise ValueError(f"policy must be one of {', '.join(self.POLICIES)}, got {policy!r}")
        if policy == "lr" and scaling is None:
            raise ValueError('policy="lr" needs scaling=zcoll.torch.LRScaling(optimizer, base_batch=...)')
        self.module, self.optimizer, self.policy, self.scaling = module, optimizer, policy, scaling
        self.wrap = wrap or (lambda m, g: m)
        self.micro_batch, self.accumulation = int(micro_batch), int(accumulation)
        self.group = group if group is not None else dist.group.WORLD
        self.world = dist.get_world_size(self.group)
        self.batch = self.world * self.accumulation  # micro-batches per step over the job
        self.model = self.wrap(module, self.group)
        self.step = 0
        self._snapshots: dict = {0: self._snapshot()}
        self.recoveries: list = []

    def run(self, step_fn: Callable[[int, Any], Any], steps: int) -> int:
        """Runs steps self.step..steps-1, recovering in place from lost ranks; returns the steps run."""
        while self.step < steps:
            try:
                step_fn(self.step, self.model)
            except Exception as e:  # only a lost rank is recovered; anything else is raised again
                if not self._lost_rank(e):
                    raise
                failure = str(e)
            else:
                self.step += 1
                self._snapshots[self.step] = self._snapshot()
                self._snapshots.pop(self.step - 2, None)
                continue
            # outside the handler: its traceback, which holds the old DDP model, is gone
            self.recover(failure)
        return self.step

    def recover(self, error: str) -> None:
        """Steps 1-4 of the module docstring; collective over the survivors."""
        start = time.monotonic()
        pg = self.group if self.group is not None else dist.distributed_c10d._get_default_group()
        comm: Communicator = pg.communicator
        try:
            survivors = comm.shrink()  # MPI's agreement on who is lost
        except _C.ZcollError as e:
            raise RuntimeError(
                f"zcoll ElasticLoop: a rank was lost ({error}) and this job cannot shrink in place: {e}"
            ) from e
        lost = survivors.shrunk_from["lost"]
        survivors.free()
        self.model = None  # the old DDP's reducer goes, and with it its hooks on the parameters
        self.group = dist.shrink_group(lost, group=pg)
        done = torch.tensor([self.step], dtype=torch.int64)
        dist.all_reduce(done, op=dist.ReduceOp.MIN, group=self.group)
        self.step = int(done.item())
        self._restore(self._snapshots[self.step])
        self._snapshots = {self.step: self._snapshots[self.step]}
        old_world, self.world = self.world, dist.get_world_size(self.group)
        self._keep_batch()
        self.model = self.wrap(self.module, self.group)
        self.recoveries.append(
            {"lost": lost, "world": (old_world, self.world), "resumed_at": self.step,
             "accumulation": self.accumulation, "seconds": time.monotonic() - start}
        )  # fmt: skip

    def _keep_batch(self) -> None:
        if self.policy == "accumulate":
            self.accumulation = math.ceil(self.batch / self.world)
        elif self.policy == "lr":
            self.scaling.set_batch(self.world * self.accumulation * self.micro_batch)

    @staticmethod
    def _lost_rank(e: BaseException) -> bool:
        """A zcoll failure (zcoll.TimeoutError, or DDP's RuntimeError quoting one)."""
        return isinstance(e, _C.TimeoutError) or "zcoll" in str(e) and "rank" in str(e)

    def _snapshot(self) -> dict:
        return {
            "module": copy.deepcopy(self.module.state_dict()),
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
        }

    def _restore(self, snap: dict) -> None:
        self.module.load_state_dict(snap["module"])
        self.optimizer.load_state_dict(snap["optimizer"])
