"""The step profiler: where a DDP training step's time goes, per rank and per bucket.

Turn it on with one line, either around the training loop::

    with zcoll.torch.profile(ddp_model, "trace/") as prof:
        for x, y in loader:
            loss_fn(ddp_model(x), y).backward(); opt.step(); opt.zero_grad()
    print(prof.analysis["verdict"])            # on every rank; rank 0 also wrote trace/zcoll-report.txt

or for a whole program, without touching it: ``ZCOLL_TRACE=trace/ mpirun -n 2 python train.py``
(every DistributedDataParallel model is traced from its optimizer's first step on; the files are
written at exit). Then ``zcoll report trace/`` prints the summary and draws the timeline, and
trace/zcoll-trace.json opens in ui.perfetto.dev. What is recorded: zcoll.torch.tracer.
"""

from __future__ import annotations

import atexit
import gc
import os
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.optimizer import register_optimizer_step_post_hook

from .. import _C
from ..observe import step_report
from ..observe import trace as _trace
from . import _launch, hooks
from .tracer import MAX_ENV_STEPS, ModelTracer, average_hook, timed_hook, traced_models, zcoll_group


def _ensure_timed_hook(ddp: DDP) -> None:
    """A model with no comm hook gets one that reports its buckets (see the module docstring)."""
    if getattr(ddp, "_comm_hooks", None):
        return
    if zcoll_group(ddp.process_group) is not None:
        ddp.register_comm_hook(ddp.process_group, hooks.allreduce_hook)
    else:
        ddp.register_comm_hook(ddp.process_group, timed_hook(average_hook))


# -- the user-facing profiler ------------------------------------------------------------------------
def _mpi_world() -> Any:
    world = _launch.world_comm()
    if dist.is_initialized() and (world.rank != dist.get_rank() or world.size != dist.get_world_size()):
        raise RuntimeError(
            f"zcoll.torch.profile: torch.distributed says rank {dist.get_rank()} of {dist.get_world_size()} "
            f"but MPI says {world.rank} of {world.size}; the profiler aligns clocks and gathers traces "
            "through MPI: launch with mpirun or srun"
        )
    return world


class StepProfiler:
    """What :func:`profile` returns; a context manager. After the ``with`` block:
    ``analysis`` (a dict: verdict, suggestions, per-rank figures; the same on every rank) and
    ``paths`` (the files rank 0 wrote; [] elsewhere)."""

    def __init__(
        self,
        ddp: DDP,
        directory: Any,
        *,
        optimizer: Any = None,
        steps: int = 200,
        probe_bytes: int = 4 << 20,
        calibrate: bool = True,
        warmup: int = 3,
        clock: Callable[[], int] = time.perf_counter_ns,
    ):
        if not isinstance(ddp, DDP):
            raise TypeError(
                f"zcoll.torch.profile: expected a DistributedDataParallel model, got {type(ddp).__name__}"
            )
        if steps < 1:
            raise ValueError(f"zcoll.torch.profile: steps must be >= 1, got {steps}")
        self.ddp, self.directory, self.optimizer = ddp, Path(directory), optimizer
        self.steps, self.probe_bytes, self.calibrate_group, self.warmup = (
            steps,
            probe_bytes,
            calibrate,
            warmup,
        )
        self.clock = clock
        self.session: Optional[_trace.Session] = None
        self.tracer: Optional[ModelTracer] = None
        self.analysis: Optional[Dict[str, Any]] = None
        self.paths: List[Path] = []

    def __enter__(self) -> "StepProfiler":
        if self.ddp in traced_models:
            raise ValueError("zcoll.torch.profile: this model is already being profiled (ZCOLL_TRACE?)")
        self.session = _trace.Session(
            self.directory, _mpi_world(), clock=self.clock, probe_bytes=self.probe_bytes
        )
        self.tracer = _start_tracer(
            self.session.recorder, self.ddp, self.optimizer, self.steps, self.calibrate_group
        )
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.tracer.detach()
        traced_models.discard(self.ddp)
        self.tracer.time_codecs()
        if exc_type is not None:  # the other ranks may not be here: keep this rank's record only
            self.session.finish(timeout=10.0)
            return
        directory, warmup = self.directory, self.warmup
        self.analysis = self.session.finish(lambda docs: _summarize(docs, directory, warmup))
        self.paths = list(self.session.paths)

    def paused(self) -> "_Paused":
        """A context in which nothing is recorded and no hook of the profiler is installed
        (to compare profiled and unprofiled steps in one run)."""
        return _Paused(self.tracer)


class _Paused:
    def __init__(self, tracer: ModelTracer):
        self.tracer = tracer

    def __enter__(self) -> None:
        self.tracer.detach()

    def __exit__(self, *exc: Any) -> None:
        self.tracer.attach()


def _start_tracer(rec: _trace.Recorder, ddp: DDP, optimizer: Any, steps: int, calibrate: bool) -> ModelTracer:
    _ensure_timed_hook(ddp)
    tracer = ModelTracer(rec, ddp, optimizer, steps)
    if calibrate:
        tracer.calibrate()
    tracer.attach()
    traced_models.add(ddp)
    return tracer


def _summarize(docs: List[Dict[str, Any]], directory: Path, warmup: int) -> Any:
    """Rank 0: the analysis of every traced model, written to zcoll-report.txt; returns its
    summary (a dict, or a list of them for several models)."""
    skipped: List[str] = []
    try:
        analyses = step_report.analyze(docs, warmup=warmup, skipped=skipped)
    except ValueError as e:  # too few steps, say: the traces are still written
        return {"error": str(e)}
    text = step_report.format_text(analyses, str(directory)) + "".join(
        f"not analysed: {s}\n" for s in skipped
    )
    (Path(directory) / "zcoll-report.txt").write_text(text)
    summaries = [a.summary() for a in analyses]
    return summaries[0] if len(summaries) == 1 else summaries


def profile(
    ddp_model: DDP,
    dir: Any = "zcoll-trace",
    *,
    optimizer: Any = None,
    steps: int = 200,
    probe_bytes: int = 4 << 20,
    calibrate: bool = True,
    warmup: int = 3,
) -> StepProfiler:
    """Profiles the training steps of a DDP model inside a ``with`` block (collective: every
    rank enters and leaves it).

    dir: where rank 0 writes the traces (``zcoll-trace-rank<r>.json``, the merged Chrome trace
    ``zcoll-trace.json``) and ``zcoll-report.txt``. optimizer: the one whose ``step()`` ends a
    step (default: any optimizer stepping this model's parameters). steps: at most this many
    steps are recorded. probe_bytes: size of the link probe at the start (0: none). calibrate:
    time the group's allreduce at the start (the report's predictions need it). warmup: steps
    the analysis skips (DDP rebuilds its buckets after the first).

    Example::

        with zcoll.torch.profile(ddp, "trace") as prof:
            for step in range(50):
                train_step()
        if dist.get_rank() == 0:
            print(prof.analysis["verdict"], prof.analysis["suggestions"][0])
    """
    return StepProfiler(
        ddp_model,
        dir,
        optimizer=optimizer,
        steps=steps,
        probe_bytes=probe_bytes,
        calibrate=calibrate,
        warmup=warmup,
    )


# -- ZCOLL_TRACE: every DDP model of the program ---------------------------------------------------------
class _EnvTracing:
    """ZCOLL_TRACE=dir: a global optimizer step hook finds the DDP models an optimizer steps (once
    per optimizer, through the garbage collector's list of objects) and traces them from the next
    step on; the files are written at exit. Every rank steps the same optimizers in the same
    order, so the collective set-up (clocks, link, calibration) happens in step on every rank."""

    def __init__(self, directory: str):
        self.directory = directory
        self.session: Optional[_trace.Session] = None
        self.tracers: List[ModelTracer] = []
        self.checked: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self.handle = register_optimizer_step_post_hook(self._after_step)

    def _after_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        if opt in self.checked:
            return
        self.checked.add(opt)
        mine = {id(p) for g in opt.param_groups for p in g["params"]}
        found = [
            o
            for o in gc.get_objects()
            if isinstance(o, DDP) and o not in traced_models and any(id(p) in mine for p in o.parameters())
        ]
        for ddp in found:
            if self.session is None:
                self.session = _trace.Session(self.directory, _mpi_world())
                atexit.register(self.finish)
            self.tracers.append(_start_tracer(self.session.recorder, ddp, opt, MAX_ENV_STEPS, True))

    def finish(self) -> None:
        if self.session is None or self.session.finished:
            return
        for t in self.tracers:
            t.detach()
            t.time_codecs()
        self.handle.remove()
        directory = Path(self.directory)
        self.session.finish(lambda docs: _summarize(docs, directory, 3), timeout=30.0)


_env: Optional[_EnvTracing] = None


def trace_from_environment() -> None:
    """Turns on ZCOLL_TRACE's tracing when the variable names a directory (called by
    ``import zcoll.torch``). Idempotent."""
    global _env
    directory = _C.env_get("ZCOLL_TRACE")
    if directory and _env is None:
        _env = _EnvTracing(os.path.expanduser(directory))
