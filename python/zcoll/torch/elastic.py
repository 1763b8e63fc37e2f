"""Training that goes on in place when a rank dies or stops: :class:`ElasticLoop` (docs/recovery.md).

Needs in-place recovery, i.e. Open MPI with ULFM under ``mpirun --with-ft ulfm`` (elsewhere the
first lost rank re-raises the error with a note that recovery is by restart, ``zcoll run``).
The loop runs ``step_fn(step, model)`` for each step and keeps, in memory, the model's, the
optimizer's (and the LRScaling's) state after each of the last two completed steps. When a step
fails because ranks were lost (``zcoll.TimeoutError``, or the RuntimeError DDP raises quoting
it), every survivor:

1. agrees with the others on the lost ranks and makes the survivors' group, the new default
   group. Ranks MPI holds failed (killed: MPI learns within tens of ms): ``shrink()`` of the
   group's zcoll communicator (MPI's fault-tolerant agreement), then
   ``torch.distributed.shrink_group`` of those ranks. Ranks that are alive but never arrived
   (stopped, hung: the error's ``missing``, which MPI does not hold failed within ``grace``
   seconds): ``shrink_group`` of them alone, which builds the group of the others without them
   (``MPI_Comm_create_group``); the survivors check they excluded the same ranks and tell each
   excluded rank so, which, if it ever runs again, raises :class:`ExcludedError` at its next
   recovery instead of training on (it is no longer in their group);
2. agrees on the last step every survivor completed (an all_reduce MIN: a survivor may have
   finished the failed step where another did not) and loads that step's snapshot (no disk read),
   so at most the step in flight is lost;
3. keeps the global batch or the learning rate's rule. Each step's global batch is the
   micro-batches ``(rank, k)``, rank of the first group, k < the first accumulation. With
   ``policy="accumulate"`` the survivors together compute exactly those: each its own first rank's,
   and the lost ranks' dealt out in turn (``micro_batches``), each loss weighted by ``loss_scale``
   so that DDP's average over the survivors is the mean over the whole global batch: the step is
   the fault-free one up to the order of float sums. With ``policy="lr"`` each survivor computes
   its own rank's only (the global batch shrinks) and the :class:`~zcoll.torch.LRScaling` given
   moves the rate to the rule's value for the smaller batch; ``"none"`` does neither;
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
        loop.backward(model, lambda rank, k: loss_fn(model(x(step, rank, k)), y(step, rank, k)))
        opt.step()

    loop.run(step_fn, steps=1000)
    print(loop.recoveries)        # one record per recovery: lost ranks, resumed step, seconds, ...
"""

from __future__ import annotations

import contextlib
import copy
import gc
import math
import re
import time
import zlib
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.distributed as dist

from .. import _C
from ..core.communicator import Communicator
from ._shrink import ShrinkOptions, failed_ranks, known_failed

# What MPI's fault-tolerance extensions say in an mpi4py error (a rank lost during the recovery's
# own MPI calls): ULFM's error classes' names.
_MPI_LOST = ("PROC_FAILED", "REVOKED", "Process Failure", "revoked")
# The survivors' notice to a rank they excluded alive, on the old group's MPI communicator (whose
# only other messages are MPI_Comm_create_group's and never this tag).
_EXCLUDED_TAG = 32764
_NEVER_ARRIVED = re.compile(r"Never arrived \(not heard from within [\d.]+ s of the failure\): (.*)")
# How the watchdog describes a rank whose process it sees alive on this machine (not failed)
_SEEN_ALIVE = re.compile(
    r"rank (\d+) \(its process, pid \d+ on this machine, is (?:stopped|running but not in)"
)


class ExcludedError(RuntimeError):
    """This rank was left out by the others: they timed out waiting for it (stopped, hung) and
    went on without it. It cannot rejoin in place; a restart (``zcoll run``) brings it back."""


def share(ranks: list, world: int, accumulation: int, member: int) -> list:
    """The micro-batches ``(first-group rank, k)`` of one global batch (``world`` ranks x
    ``accumulation``) that member ``member`` of the group of first-group ranks ``ranks`` computes:
    its own rank's, then every len(ranks)-th of the lost ranks' (in rank order), so the group
    computes each exactly once and no member more than one above another."""
    kept = set(ranks)
    orphans = [(q, k) for q in range(world) if q not in kept for k in range(accumulation)]
    return [(ranks[member], k) for k in range(accumulation)] + orphans[member :: len(ranks)]


def named_ranks(e: BaseException) -> tuple:
    """(missing, lost): the ranks a zcoll failure names as never arrived and as lost (group
    ranks), from its attributes or the text DDP quotes; (None, None) when it names none."""
    for err in (e, e.__cause__, e.__context__):
        if err is not None and getattr(err, "missing", None) is not None:
            return sorted(err.missing), sorted(getattr(err, "lost", []) or [])
    text = str(e)
    if "Every rank was heard from" in text:
        return [], []
    m = _NEVER_ARRIVED.search(text)
    if m is None:
        return None, None
    part = re.split(r"\. (?:Ranks? \d|Flight recorder)", m[1])[0]
    found = re.findall(r"(?:^|; )rank (\d+)( \(lost)?", part)
    return sorted(int(r) for r, _ in found), sorted(int(r) for r, dead in found if dead)


def seen_alive(e: BaseException) -> list:
    """The ranks a zcoll failure's text describes as alive on this machine (stopped, or running
    but outside zcoll): MPI cannot hold them failed, so there is no grace to wait for them."""
    return sorted({int(r) for r in _SEEN_ALIVE.findall(str(e))})


def _probe(comm: Any, tag: int, status: Any) -> bool:
    """An any-source Iprobe of `tag` on mpi4py communicator `comm`. Under ULFM one fails while a
    failed rank of the communicator is not acknowledged (a rank killed while this one was
    stopped): the failures are acknowledged and the probe made again; False if it still fails."""
    from mpi4py import MPI

    for _ in range(2):
        try:
            return bool(comm.Iprobe(source=MPI.ANY_SOURCE, tag=tag, status=status))
        except MPI.Exception:
            with contextlib.suppress(MPI.Exception, NotImplementedError, AttributeError):
                comm.Ack_failed()
    return False


def _failure(e: BaseException, comm: Any = None, known: Optional[dict] = None) -> dict:
    """What a recovery needs of a failure: its text and the ranks it names. From ``comm._last_failure``
    (the watchdog's own record of the failure that broke the group's communicator) when ``comm`` has
    one that is not ``known`` (the failure already being recovered from: a later error, e.g. MPI's
    during the recovery, is not it); else from the exception (named_ranks, seen_alive)."""
    last = getattr(comm, "_last_failure", None)
    source = (id(comm), last["seq"]) if last is not None else None
    if last is not None and (known is None or known.get("source") != source):
        return {"text": str(e), "missing": sorted(last["missing"]), "lost": sorted(last["lost"]),
                "alive": sorted(last["alive"]), "source": source}  # fmt: skip
    missing, lost = named_ranks(e)
    return {"text": str(e), "missing": missing, "lost": lost, "alive": seen_alive(e), "source": None}


def _positive(name: str, v: Any, low: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ValueError(f"ElasticLoop: {name} must be an integer >= {low}, got {v!r}")
    return v


class ElasticLoop:
    """The loop of the module docstring. ``module`` is the plain model (not DDP); ``wrap(module,
    group)`` returns what ``step_fn`` gets (e.g. DDP on that group; default: the module itself);
    ``scaling`` an LRScaling for ``policy="lr"`` (saved and rolled back with the optimizer);
    ``micro_batch`` the rows per rank per micro-batch it uses to state the global batch;
    ``accumulation`` the micro-batches per rank per step of the first group; ``group`` a zcoll
    process group (default: the default group); ``grace`` the seconds MPI gets to hold the ranks a
    failure names failed before they count as alive and unresponsive (step 1);
    ``on_phase(phase, step)``, when given, is told "recover" when a recovery starts and "train"
    when it is done (a monitor's or a chaos test's hook)."""

    POLICIES = ("accumulate", "lr", "none")

    def __init__(
        self,
        module: torch.nn.Module,
        optimizer: Any,
        wrap: Optional[Callable[[torch.nn.Module, Any], Any]] = None,
        policy: str = "accumulate",
        scaling: Any = None,
        micro_batch: int = 1,
        accumulation: int = 1,
        group: Any = None,
        on_phase: Optional[Callable[[str, int], None]] = None,
        grace: float = 3.0,
    ):
        self._validate(module, optimizer, wrap, policy, scaling, on_phase, grace)
        self.module, self.optimizer, self.policy, self.scaling = module, optimizer, policy, scaling
        self.wrap = wrap or (lambda m, g: m)
        self.on_phase = on_phase or (lambda phase, step: None)
        self.micro_batch = _positive("micro_batch", micro_batch)
        self.accumulation = self.first_accumulation = _positive("accumulation", accumulation)
        self.grace = float(grace)
        self.group = group if group is not None else dist.group.WORLD
        if not isinstance(getattr(self.group, "communicator", None), Communicator):
            raise ValueError(
                f"ElasticLoop recovers through the zcoll backend: group must be a zcoll process group "
                f"(zcoll.torch.init_process_group, or dist.new_group on it), got {self.group!r}"
            )
        self.world = self.first_world = dist.get_world_size(self.group)
        self.ranks = list(range(self.world))  # the first group's rank of each member, in order
        self.ranks_before = self.ranks  # the same, before the last shrink
        self.batch = self.world * self.accumulation  # micro-batches per step over the job
        self.model = self.wrap(module, self.group)
        self.step = 0
        self._snapshots: dict = {0: self._snapshot()}
        self._notices: list = []  # sends to excluded ranks, kept until exit (never waited for)
        self.recoveries: list = []

    @classmethod
    def _validate(cls, module, optimizer, wrap, policy, scaling, on_phase, grace) -> None:
        if policy not in cls.POLICIES:
            raise ValueError(f"policy must be one of {', '.join(cls.POLICIES)}, got {policy!r}")
        if policy == "lr" and scaling is None:
            raise ValueError('policy="lr" needs scaling=zcoll.torch.LRScaling(optimizer, base_batch=...)')
        if policy != "lr" and scaling is not None:
            raise ValueError(f'scaling= is the learning-rate rule of policy="lr"; policy is {policy!r}')
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"ElasticLoop: module must be a torch.nn.Module, got {type(module).__name__}")
        if not callable(getattr(optimizer, "state_dict", None)) or not hasattr(optimizer, "load_state_dict"):
            raise TypeError(f"ElasticLoop: optimizer must have state_dict/load_state_dict, got {optimizer!r}")
        for name, fn in (("wrap", wrap), ("on_phase", on_phase)):
            if fn is not None and not callable(fn):
                raise TypeError(f"ElasticLoop: {name} must be callable, got {fn!r}")
        if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not grace >= 0:
            raise ValueError(f"ElasticLoop: grace must be a number of seconds >= 0, got {grace!r}")

    @property
    def micro_batches(self) -> list:
        """This rank's micro-batches ``(first-group rank, k)`` of each step's global batch (module
        docstring, 3.): with ``policy="accumulate"`` a share of every rank's, lost ones included."""
        me = dist.get_rank(self.group)
        if self.policy == "accumulate":
            return share(self.ranks, self.first_world, self.first_accumulation, me)
        return [(self.ranks[me], k) for k in range(self.first_accumulation)]

    @property
    def loss_scale(self) -> float:
        """The weight of one micro-batch's loss: after DDP's average over the current ranks, the
        mean over the global batch (``"accumulate"``) or over the ranks' micro-batches."""
        if self.policy == "accumulate":
            return self.world / (self.first_world * self.first_accumulation)
        return 1.0 / self.first_accumulation

    def backward(self, model: Any, loss_of: Callable[[int, int], torch.Tensor]) -> float:
        """``(loss_of(rank, k) * loss_scale).backward()`` for each of ``micro_batches``; under DDP
        (``model.no_sync``) the gradients' all-reduce runs once, with the last, so ranks with
        shares of different sizes make the same calls. Returns the micro-batches' mean loss."""
        mine, total = self.micro_batches, 0.0
        for i, (rank, k) in enumerate(mine):
            quiet = i + 1 < len(mine) and hasattr(model, "no_sync")
            with model.no_sync() if quiet else contextlib.nullcontext():
                loss = loss_of(rank, k)
                (loss * self.loss_scale).backward()
            total += float(loss.detach())
        return total / len(mine)

    def run(self, step_fn: Callable[[int, Any], Any], steps: int) -> int:
        """Runs steps self.step..steps-1, recovering in place from lost ranks; returns the steps run."""
        if not callable(step_fn):
            raise TypeError(f"ElasticLoop.run: step_fn must be callable, got {step_fn!r}")
        _positive("steps", steps, 0)
        while self.step < steps:
            try:
                step_fn(self.step, self.model)
            except Exception as e:  # only a lost rank is recovered; anything else is raised again
                if not self._lost_rank(e):
                    raise
                failure = _failure(e, self._communicator())
            else:
                self.step += 1
                self._snapshots[self.step] = self._snapshot()
                self._snapshots.pop(self.step - 2, None)
                continue
            # outside the handler: its traceback, which holds the old DDP model, is gone
            self.recover(failure)
        return self.step

    def recover(self, failure: dict) -> None:
        """Steps 1-4 of the module docstring; collective over the survivors. A rank lost on the
        way starts them again, as many times as there are ranks to lose. ``failure``: the
        failed step's ``{"text", "missing", "lost", "alive"}`` (group ranks; missing/lost None when
        the failure names none; alive: seen alive on this machine, optional)."""
        start, old_world, lost, attempts, how = time.monotonic(), self.world, [], 0, []
        self.on_phase("recover", self.step)
        while True:
            attempts += 1
            try:
                gone, way = self._shrink(failure)
                lost, how = lost + gone, how + [way]
                self._resume()
                break
            except ExcludedError:
                raise
            except Exception as e:  # a rank lost while recovering: again, on the ranks left
                if not self._lost_rank(e) or attempts >= old_world:
                    raise
                failure = _failure(e, self._communicator(), failure)
        self.recoveries.append(
            {"lost": sorted(lost), "world": (old_world, self.world), "resumed_at": self.step,
             "accumulation": self.accumulation, "attempts": attempts, "how": ",".join(how),
             "seconds": time.monotonic() - start, "finished": time.time()}
        )  # fmt: skip
        self.on_phase("train", self.step)

    def _shrink(self, failure: dict) -> tuple:
        """Step 1: the survivors' group; returns the lost ranks (first group's numbering) and
        which way: "failed" (MPI holds them failed: its shrink) or "excluded" (alive, left out)."""
        pg = self.group
        self._check_excluded(pg.mpi_comm, 0.0)
        missing = failure["missing"]
        if missing == []:  # every rank was heard from: the others may have gone on without this one
            self._check_excluded(pg.mpi_comm, self.grace)
            raise RuntimeError(
                f"zcoll ElasticLoop: the step failed, but the failure names no rank that never arrived, so "
                f"there is no rank to recover from: {failure['text']}"
            )
        if missing and not _C.shrink_unavailable_reason() and not self._all_failed(pg, missing, failure):
            self._check_excluded(pg.mpi_comm, 0.0)
            return self._exclude(pg, missing), "excluded"
        comm: Communicator = pg.communicator
        try:
            survivors = comm.shrink()  # MPI's agreement on who is lost
        except _C.ZcollError as e:
            if not _C.shrink_unavailable_reason():
                raise
            raise RuntimeError(
                f"zcoll ElasticLoop: a rank was lost ({failure['text']}) and this job cannot shrink in place: {e}"
            ) from e
        lost = survivors.shrunk_from["lost"]
        survivors.free()
        self._regroup(pg, lost)
        return [self.ranks_before[r] for r in lost], "failed"

    def _all_failed(self, pg: Any, missing: list, failure: dict) -> bool:
        """Whether MPI holds every missing rank failed within ``grace`` s. At once False when the
        failure saw one of them alive on this machine (stopped or hung: MPI never will); MPI
        then still gets the grace to hold the ranks zcoll saw exit failed, so that every survivor
        builds the group without them the same way (_shrink.ShrinkOps._remaining)."""
        if set(failure.get("alive") or []) & set(missing):
            dead = sorted(set(failure.get("lost") or []) & set(missing))
            known_failed(pg.mpi_comm, dead, self.grace)
            return False
        return known_failed(pg.mpi_comm, missing, self.grace)

    def _regroup(self, pg: Any, excluded: list, alive: bool = False) -> None:
        """torch's shrink_group of `excluded` (group ranks): the new group, ranks and world.
        ``alive``: MPI already had its grace and does not hold them all failed (no second wait)."""
        self.model = None  # the old DDP's reducer goes, and with it its hooks on the parameters
        gc.collect()
        self.group = dist.shrink_group(sorted(excluded), group=pg, pg_options=ShrinkOptions(alive=alive))
        self.ranks_before = self.ranks
        self.ranks = [q for r, q in enumerate(self.ranks) if r not in set(excluded)]
        self.world = dist.get_world_size(self.group)

    def _exclude(self, pg: Any, missing: list) -> list:
        """Step 1 for ranks alive but unresponsive: the group without them, a check that every
        survivor left out the same ranks, and a notice to each of them (ExcludedError there)."""
        base = pg.mpi_comm
        self._regroup(pg, missing, alive=True)
        mark = zlib.crc32(repr(sorted(missing)).encode())
        check = torch.tensor([mark, -mark], dtype=torch.int64)
        dist.all_reduce(check, op=dist.ReduceOp.MIN, group=self.group)
        if int(check[0]) != -int(check[1]):
            raise RuntimeError(
                f"zcoll ElasticLoop: the survivors left out different ranks (this one: {missing} of the old "
                "group); they cannot go on together"
            )
        if dist.get_rank(self.group) == 0:
            for r in sorted(set(missing) - failed_ranks(base)):  # a failed one has no use for it
                notice = np.array([self.step, self.world, *self.ranks], dtype=np.int64)
                self._notices.append((notice, base.Isend(notice, dest=r, tag=_EXCLUDED_TAG)))
        return [self.ranks_before[r] for r in missing]

    def _check_excluded(self, base: Any, wait: float) -> None:
        """Raises ExcludedError when the survivors' notice (_exclude) is here, within `wait` s."""
        from mpi4py import MPI

        deadline, status = time.monotonic() + wait, MPI.Status()
        while True:
            here = _probe(base, _EXCLUDED_TAG, status)
            if here:
                notice = np.empty(status.Get_count(MPI.INT64_T), dtype=np.int64)
                base.Recv(notice, source=status.Get_source(), tag=_EXCLUDED_TAG)
                me = self.ranks[dist.get_rank(self.group)]
                raise ExcludedError(
                    f"zcoll ElasticLoop: rank {me} (of the first group) was left out by the others: they timed "
                    f"out waiting for it (stopped or hung) at step {int(notice[0])} and went on without it on "
                    f"{int(notice[1])} ranks (first-group ranks {notice[2:].tolist()}). It is no longer in "
                    "their group and cannot rejoin in place; a restart (zcoll run) brings it back"
                )
            if time.monotonic() >= deadline:
                return
            time.sleep(0.005)

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

    def _communicator(self) -> Optional[Communicator]:
        """The zcoll communicator of the current group (None for a group of another backend)."""
        return getattr(self.group, "communicator", None)

    @staticmethod
    def _lost_rank(e: BaseException) -> bool:
        """A zcoll failure (zcoll.TimeoutError, or DDP's RuntimeError quoting one), or MPI's
        report of a failed process (ULFM) from the recovery's own MPI calls."""
        text = str(e)
        return not isinstance(e, ExcludedError) and (
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
