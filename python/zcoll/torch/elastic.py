"""Training that goes on in place when a rank dies: :class:`ElasticLoop` (docs/recovery.md).

Needs in-place recovery, i.e. Open MPI with ULFM under ``mpirun --with-ft ulfm`` (elsewhere the
first lost rank re-raises the error with a note that recovery is by restart, ``zcoll run``).
The loop runs ``step_fn(step, model)`` for each step and keeps, in memory, the model's, the
optimizer's (and the LRScaling's) state after each of the last two completed steps. When a step
fails because ranks were lost (``zcoll.TimeoutError``, or the RuntimeError DDP raises quoting
it), every survivor:

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

A rank lost during steps 1-4 (another fault while recovering) starts them again on the ranks
left; the recovery's record then lists every rank lost. ``ranks`` holds the original (first
group's) rank of each member of the current group, in its order.

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
    print(loop.recoveries)        # one record per recovery: lost ranks, resumed step, seconds, ...
"""

from __future__ import annotations

import copy
import gc
import math
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from .. import _C
from ..core.communicator import Communicator

# What MPI's fault-tolerance extensions say in an mpi4py error (a rank lost during the recovery's
# own MPI calls): ULFM's error classes' names.
_MPI_LOST = ("PROC_FAILED", "REVOKED", "Process Failure", "revoked")


class ElasticLoop:
    """The loop of the module docstring. ``module`` is the plain model (not DDP); ``wrap(module,
    group)`` returns what ``step_fn`` gets (e.g. DDP on that group; default: the module itself);
    ``scaling`` an LRScaling for ``policy="lr"`` (saved and rolled back with the optimizer);
    ``micro_batch`` the rows per rank per micro-batch it uses to state the global batch;
    ``on_phase(phase, step)``, when given, is told "recover" when a recovery starts and "train"
    when it is done (a monitor's or a chaos test's hook)."""

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
        on_phase: Callable[[str, int], None] | None = None,
    ):
        if policy not in self.POLICIES:
            raise ValueError(f"policy must be one of {', '.join(self.POLICIES)}, got {policy!r}")
        if policy == "lr" and scaling is None:
            raise ValueError('policy="lr" needs scaling=zcoll.torch.LRScaling(optimizer, base_batch=...)')
        self.module, self.optimizer, self.policy, self.scaling = module, optimizer, policy, scaling
        self.wrap = wrap or (lambda m, g: m)
        self.on_phase = on_phase or (lambda phase, step: None)
        self.micro_batch, self.accumulation = int(micro_batch), int(accumulation)
        self.group = group if group is not None else dist.group.WORLD
        self.world = dist.get_world_size(self.group)
        self.ranks = list(range(self.world))  # the first group's rank of each member, in order
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
        """Steps 1-4 of the module docstring; collective over the survivors. A rank lost on the
        way starts them again, as many times as there are ranks to lose."""
        start, old_world, lost, attempts = time.monotonic(), self.world, [], 0
        self.on_phase("recover", self.step)
        while True:
            attempts += 1
            try:
                lost += self._shrink(error)
                self._resume()
                break
            except Exception as e:  # a rank lost while recovering: again, on the ranks left
                if not self._lost_rank(e) or attempts >= old_world:
                    raise
                error = str(e)
        self.recoveries.append(
            {"lost": sorted(lost), "world": (old_world, self.world), "resumed_at": self.step,
             "accumulation": self.accumulation, "attempts": attempts, "seconds": time.monotonic() - start,
             "finished": time.time()}
        )  # fmt: skip
        self.on_phase("train", self.step)

    def _shrink(self, error: str) -> list:
        """Step 1: the survivors' group; returns the lost ranks (first group's numbering)."""
        pg = self.group
        comm: Communicator = pg.communicator
        try:
            survivors = comm.shrink()  # MPI's agreement on who is lost
        except _C.ZcollError as e:
            if not _C.shrink_unavailable_reason():
                raise
            raise RuntimeError(
                f"zcoll ElasticLoop: a rank was lost ({error}) and this job cannot shrink in place: {e}"
            ) from e
        kept, lost = survivors.shrunk_from["kept"], survivors.shrunk_from["lost"]
        survivors.free()
        self.model = None  # the old DDP's reducer goes, and with it its hooks on the parameters
        gc.collect()
        self.group = dist.shrink_group(lost, group=pg)
        gone = [self.ranks[r] for r in lost]
        self.ranks = [self.ranks[r] for r in kept]
        self.world = dist.get_world_size(self.group)
        return gone

    def _resume(self) -> None:
        """Steps 2-4: the last step every survivor completed, its snapshot, the batch, DDP again."""
        done = torch.tensor([self.step], dtype=torch.int64)
        dist.all_reduce(done, op=dist.ReduceOp.MIN, group=self.group)
        self.step = int(done.item())
        self._restore(self._snapshots[self.step])
        self._snapshots = {s: v for s, v in self._snapshots.items() if s <= self.step}
        self._keep_batch()
        self.model = self.wrap(self.module, self.group)

    def _keep_batch(self) -> None:
        if self.policy == "accumulate":
            self.accumulation = math.ceil(self.batch / self.world)
        elif self.policy == "lr":
            self.scaling.set_batch(self.world * self.accumulation * self.micro_batch)

    @staticmethod
    def _lost_rank(e: BaseException) -> bool:
        """A zcoll failure (zcoll.TimeoutError, or DDP's RuntimeError quoting one), or MPI's
        report of a failed process (ULFM) from the recovery's own MPI calls."""
        text = str(e)
        return (
            isinstance(e, _C.TimeoutError)
            or ("zcoll" in text and "rank" in text)
            or any(word in text for word in _MPI_LOST)
        )

    def _snapshot(self) -> dict:
        snap = {
            "module": copy.deepcopy(self.module.state_dict()),
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
        }
        if self.scaling is not None:
            snap["scaling"] = copy.deepcopy(self.scaling.state_dict())
        return snap

    def _restore(self, snap: dict) -> None:
        self.module.load_state_dict(snap["module"])
        self.optimizer.load_state_dict(snap["optimizer"])
        if self.scaling is not None:
            self.scaling.load_state_dict(snap["scaling"])
