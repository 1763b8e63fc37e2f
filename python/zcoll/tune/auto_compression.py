"""``compression="auto"``: each DDP bucket's method chosen from measurements of this job, and
guarded while it trains.

Used through the DDP hook (``zcoll.torch.apply_gradient_compression(ddp, "auto")`` or
``CompressionState(compressor=zcoll.AutoCompression(...))``); the string "auto" means
``AutoCompression()`` (:func:`resolve`). Or called directly, once per tensor and training step
(``comm.allreduce(grad, op="avg", compression="auto", key=name, out=grad)``: each key one
bucket; a step ends where a key of the step comes again, see :meth:`AutoCompression._allreduce`).

Everything runs on the process group's ordered worker, in bucket order (or in the caller's order
of keys), so every collective it adds is issued in the same order on every rank; every decision
is made from allreduced numbers by deterministic code, so it is identical on every rank.

The parts, each with one job: auto_config (what it may do), trials (calibration, side trials,
decision), guard (metrics, exact checks, escalation), drift (after a decision, measured against
predicted communication every ``check_every`` steps: off by more than ``drift`` at two checks in a
row, when another method would now win, or a changed link verdict from ``comm.diagnose()`` every
``diagnose_every`` steps, runs the trials again), residuals (error feedback across methods). This
class runs them in order for each bucket and at each step's end.
"""

from __future__ import annotations

import contextlib
import time
import zlib
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from .. import _C
from ..observe.guard_metrics import MetricsLog
from . import compression_model as cm
from .auto_config import AutoConfig
from .drift import DriftWatch
from .guard import Guard
from .residuals import ResidualStore
from .stats import as_array
from .trials import Trials


def resolve(compression: Any) -> Any:
    """The one place the string "auto" becomes an AutoCompression."""
    if isinstance(compression, str):
        if compression != "auto":
            raise ValueError(f"compression as a string must be 'auto', got {compression!r}")
        return AutoCompression()
    return compression


class AutoCompression:
    """The method of each DDP bucket chosen from measurements and guarded (module docstring).
    ``AutoCompression(methods, **options)``: the options are AutoConfig's fields (or pass
    ``config=AutoConfig(...)``).

    Example::

        state = zcoll.torch.apply_gradient_compression(ddp, zcoll.AutoCompression(metrics_path="m.jsonl"))
        ...
        print(zcoll.tune.compression_model.render(state.compressor.decisions.values()))
    """

    error_feedback = True
    measure_error = False

    def __init__(self, methods: Sequence[str] = cm.CANDIDATES, *, config: Optional[AutoConfig] = None,
                 _test_corrupt_fraction: float = 0.0, **options: Any):  # fmt: skip
        self.config = config or AutoConfig(methods, test_corrupt_fraction=_test_corrupt_fraction, **options)
        c = self.config
        self.metrics: Optional[MetricsLog] = None
        self.events: List[Dict[str, Any]] = []  # decisions and guard events (also in the log)
        self.residuals = ResidualStore(c.sample if c.guard else 0)
        self.trials, self.guard, self.drift = (
            Trials(c, self._log),
            Guard(c, self._log),
            DriftWatch(c, self._log),
        )
        self.allowed = list(c.methods)  # what a bucket DDP adds later may use: the decision's (and none)
        self.model: Optional[cm.CostModel] = None
        self.decisions: Dict[str, cm.Decision] = {}
        self.decided_step: Optional[int] = None
        self.calls_by_method: Dict[str, int] = {}  # bucket calls per method (trials, escalations)
        self.nbytes: Dict[str, int] = {}
        self._verdict: Optional[str] = None
        self._step_keys: List[str] = []  # this step's buckets, in order
        self._step_ready0: Optional[float] = None
        # comm.allreduce(compression=self): the step of the calls, its keys so far, its last call's end
        self._call_step, self._call_keys, self._call_end = 0, set(), 0.0

    def __repr__(self) -> str:
        return f"AutoCompression(methods={list(self.config.methods)}, check_every={self.config.check_every})"

    # -- which method ---------------------------------------------------------------------------
    def method(self, key: str, step: int, nbytes: int) -> str:
        """The method bucket `key` (of nbytes) goes with at `step`: none in the trials (the
        candidates run beside it); once decided, the bucket's decision (escalated by the guard);
        a key first seen after the decision, the model's choice for its size (no overlap
        assumed); else none."""
        if key in self.guard.path and step not in self.trials:
            return self.guard.path[key][-1]
        if self.decided_step is not None and self.model is not None and step not in self.trials:
            c = self.config
            return cm.decide(self.model, [(key, nbytes, 0.0)], self.allowed, c.margin, c.min_gain)[0].method
        return "none"

    def compressor(self, method: str) -> Any:
        return self.residuals.compressor(method)

    # error feedback across methods (CompressionState's layouts use these)
    def residual(self, key: str) -> Optional[np.ndarray]:
        return self.residuals.residual(key)

    def reset(self, key: Optional[str] = None) -> None:
        self.residuals.reset(key)

    def set_residual(self, key: str, values: Any) -> None:
        self.residuals.set_residual(key, values)

    # -- one bucket (on the group's worker) -------------------------------------------------------
    def allreduce(self, comm: Any, buf: Any, key: str, step: int, last: bool, ready: float) -> Any:
        """Averages `buf` over comm with this step's method for `key`; returns the result."""
        if self.metrics is None:
            c = self.config
            self.metrics = MetricsLog(c.metrics_path if comm.rank == 0 else None, c.metrics_port, comm.rank)
        if self._decided_uncompressed(key, step):
            return self._uncompressed(comm, buf, key, step, last)
        x = as_array(buf)
        method = self._prepare(comm, key, step, x, ready)
        if step in self.trials:
            out = self.trials.run(comm, buf, key, step, ready - self._step_ready0)
            for m in self.trials.candidates:  # (beside it, on a copy)
                self.calls_by_method[m] = self.calls_by_method.get(m, 0) + 1
            if last:
                self._end_step(comm, step)
            return out
        guarded = self.config.guard and method != "none"
        with self.guard.spent:
            idx = self.guard.sample_indices(key, step, x.size) if guarded and self._check_step(step) else None
            grad = None if idx is None else x[idx]  # this rank's gradient there (a copy: in place below)
            meant = None if idx is None else grad + self.residuals.residual_at(key, idx)
        t0 = time.perf_counter()
        out, stats = self._send(comm, buf, key, method, step)
        seconds = time.perf_counter() - t0
        y = as_array(out)
        if self.config.test_corrupt_fraction and method != "none":
            self._corrupt(y, key, step)
        if self.model is not None and key in self.guard.path:
            self.drift.calls.append((key, method, seconds))
        with self.guard.spent:
            if guarded:
                self.guard.bucket_metrics(self.metrics, key, method, step, stats, seconds)
            if idx is not None:
                self.guard.keep_check(
                    key, method, meant - self.residuals.residual_at(key, idx), grad, y[idx].copy()
                )
        if last:
            self._end_step(comm, step)
        return out

    def _prepare(self, comm: Any, key: str, step: int, x: np.ndarray, ready: float) -> str:
        """The bucket's method for this call, its residual moved to it; calibrates first."""
        if self.trials.calibration is None:
            self.model = self.trials.calibrate(comm)
        if self.decided_step is None and step >= self.trials.end:
            # undecided with the trial steps behind: the hook began compressing after them (its
            # warm-up steps send uncompressed without calling here), so the trials start now
            self.trials.start(step)
        if self._step_ready0 is None:
            self._step_ready0 = ready
        self._step_keys.append(key)
        self.nbytes[key] = x.nbytes
        method = self.method(key, step, x.nbytes)
        if self.decided_step is not None and key not in self.guard.path and step not in self.trials:
            self.guard.set_path(key, [method])  # a new bucket (DDP rebuilt them): the model's choice
        self.residuals.switch(key, method, x)
        self.calls_by_method[method] = self.calls_by_method.get(method, 0) + 1
        self.guard.started(step)
        return method

    def _send(self, comm: Any, buf: Any, key: str, method: str, step: int) -> tuple:
        """The allreduce itself, in place; (result, the compressor's stats or None)."""
        if method == "none":
            return comm.allreduce(buf, op="avg", out=buf), None
        c = self.residuals.compressor(method)
        try:
            out = comm.allreduce(buf, op="avg", compression=c, key=key, out=buf)
        finally:
            stats = c.last_stats
            if stats is not None and stats.nonfinite and self.metrics is not None:
                self.metrics.add(
                    "zcoll_compression_nonfinite_total", stats.nonfinite, bucket=key, method=method
                )
                self._log("bucket", step=step, bucket=key, method=method, nonfinite=stats.nonfinite)
        return out, stats

    def _allreduce(self, comm: Any, x: Any, out: Any, op: Any, algorithm: Any, key: Optional[str]) -> None:
        """``comm.allreduce(x, op="avg", compression=self, key=key, out=out)``: the hook's path for
        a caller without DDP (a manual loop, Horovod-style), each key a bucket. The caller calls
        every key once per training step, in the same order on every rank; a step ends where a key
        the step already had comes again (so the step's checks and decision run at the
        next step's first call, on every rank at the same point). The trials' windows run from a
        step's first call to its last call's end. Only averages (what error feedback and the
        guard's exact check compare against); float32 only (the codecs' residuals)."""
        _check_call(x, out, op, algorithm, key)
        if out is not x:
            np.copyto(as_array(out), as_array(x))
        if key in self._call_keys:  # the keys came round again: the previous step is complete
            self._end_step(comm, self._call_step, self._call_end)
            self._call_step += 1
            self._call_keys.clear()
        self._call_keys.add(key)
        flat = out.reshape(-1)  # a view (contiguous): residuals move between methods as 1-D, as DDP's buckets
        self.allreduce(comm, flat, key, self._call_step, False, time.perf_counter())
        self._call_end = time.perf_counter()

    def _decided_uncompressed(self, key: str, step: int) -> bool:
        """Whether `key` goes uncompressed at `step` by decision (or escalation), its residual
        already sent: nothing to switch, sample or guard, only its time to keep."""
        return (
            self.decided_step is not None
            and key in self.nbytes  # (not so for a bucket's first call after load_state_dict)
            and self.residuals.method_of.get(key, "none") == "none"
            and self.guard.path.get(key, ("",))[-1] == "none"
            and step not in self.trials
        )

    def _uncompressed(self, comm: Any, buf: Any, key: str, step: int, last: bool) -> Any:
        """allreduce()'s path for a bucket decided uncompressed. Measured: auto's own work on
        the hook's worker (Python, on the last bucket's critical path, sharing the GIL and two
        cores with the backward pass) cost 2-4% of a 2-rank step against plain zcoll."""
        t0 = time.perf_counter()
        out = comm.allreduce(buf, op="avg", out=buf)
        self.drift.calls.append((key, "none", time.perf_counter() - t0))
        self.calls_by_method["none"] = self.calls_by_method.get("none", 0) + 1
        if last:
            self._end_step(comm, step)
        return out

    def _check_step(self, step: int) -> bool:
        d = self.decided_step
        return (
            d is not None
            and step not in self.trials
            and (step - d) % self.config.check_every == self.config.check_every - 1
        )

    def _corrupt(self, y: np.ndarray, key: str, step: int) -> None:
        rng = np.random.default_rng([self.config.seed + 1, zlib.crc32(key.encode()), step])
        k = int(round(self.config.test_corrupt_fraction * y.size))
        if k:
            y[rng.choice(y.size, size=k, replace=False)] = 1e3 * max(float(np.max(np.abs(y))), 1e-3)

    def _log(self, event: str, **fields: Any) -> None:
        self.events.append({"event": event, **fields})
        if self.metrics is not None:
            self.metrics.write(event, **fields)

    # -- collectives at a step's end (every rank, same step) --------------------------------------
    def _end_step(self, comm: Any, step: int, end: Optional[float] = None) -> None:
        """The step's bookkeeping and its collectives (decision, checks); `end`: when its
        last bucket's call ended (None: now)."""
        keys, ready0, self._step_keys, self._step_ready0 = self._step_keys, self._step_ready0, [], None
        now = time.perf_counter() if end is None else end
        self.trials.end_step(step, None if ready0 is None else now - ready0)
        if step in self.trials and step == self.trials.end - 1:
            self._decide(comm, keys, step)
        elif self.guard.pending or self._check_step(step):  # (nothing compressed: still the drift check)
            self._check(comm, step)
        every = self.config.diagnose_every
        if every and self.decided_step is not None and step % every == 0:
            label = str(comm.diagnose().label)
            if self._verdict is not None and label != self._verdict:
                self._redecide(step, f"the link verdict changed from {self._verdict} to {label}")
            self._verdict = label

    def _decide(self, comm: Any, keys: List[str], step: int) -> None:
        outcome = self.trials.decide(comm, keys, self.nbytes, step)
        self.model, self.decisions, self.allowed = outcome.model, outcome.decisions, outcome.allowed
        self.drift.reset()
        self.drift.trial_none = outcome.trial_none
        for k, d in outcome.decisions.items():
            self.guard.set_path(k, [d.method])
        self.decided_step = step + 1

    def _check(self, comm: Any, step: int) -> None:
        """The guard's exact check (its time is the guard's) and the drift check."""
        guarded = bool(self.guard.pending)
        with self.guard.spent if guarded else contextlib.nullcontext():
            self.guard.check(comm, step, self.metrics)
            why = self.drift.check(comm, step, self.model, self.nbytes, self.guard.path, self.allowed)
            if why:
                self._redecide(step, why)
        if guarded:
            self.guard.log_cost(step)

    def _redecide(self, step: int, why: str) -> None:
        self.trials.start(step + 1)
        self.decided_step = None
        self.drift.reset()
        self._log("redecide", step=step, reason=why)

    # -- reports and checkpoints --------------------------------------------------------------------
    def report(self) -> Dict[str, Any]:
        """The decisions (as recommend() returns them), the model and the guard's state."""
        return {
            "decided": self.decided_step is not None,
            "decided_at_step": self.decided_step,
            "decisions": [d.as_dict() for d in self.decisions.values()],
            "in_use": {k: p[-1] for k, p in self.guard.path.items()},
            "model": self.model.describe() if self.model is not None else None,
            "text": cm.render(list(self.decisions.values())),
        }

    def state_dict(self) -> Dict[str, Any]:
        """This rank's state for checkpoints: every method's residuals and call counts, which
        method holds each bucket's residual, the decisions as escalated, the trial schedule. The
        model is fitted again (calibration) when a resumed run starts; its decisions are kept."""
        # call_step: a resumed run starts a step
        return {**self.residuals.state_dict(), **self.guard.state_dict(), **self.trials.state_dict(),
                "decided_step": self.decided_step, "allowed": list(self.allowed),
                "call_step": self._call_step + bool(self._call_keys)}  # fmt: skip

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.residuals.load_state_dict(state)
        self.guard.load_state_dict(state)
        self.trials.load_state_dict(state)
        self.decided_step = state["decided_step"]
        self.allowed = list(state["allowed"])
        self._call_step, self._call_keys = int(state.get("call_step", 0)), set()

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()


def _check_call(x: Any, out: Any, op: Any, algorithm: Any, key: Optional[str]) -> None:
    """Refuses, before any communication, what ``compression="auto"`` cannot do without DDP."""
    if key is None:
        raise ValueError(
            'compression="auto" measures and decides per tensor: pass key=... naming it (the same '
            "keys, once each per training step, in the same order on every rank)"
        )
    name = op if isinstance(op, str) else getattr(op, "name", str(op))
    if name != "avg":
        raise ValueError(f'compression="auto" averages: pass op="avg" (got {name!r})')
    if (algorithm if isinstance(algorithm, str) else getattr(algorithm, "name", "")) != "auto":
        raise ValueError(
            f"compression='auto' chooses its own algorithms: leave algorithm='auto' (got {algorithm!r})"
        )
    dtype, shape, _ = _C.describe(x, "x")
    if dtype != "float32":
        raise TypeError(f'compression="auto" takes float32 tensors, got {dtype} (key {key!r})')
    if out is not x:
        out_dtype, out_shape, _ = _C.describe(out, "out")
        if (out_dtype, tuple(out_shape)) != (dtype, tuple(shape)):
            raise ValueError(
                f"out must match x: x is {dtype}{tuple(shape)}, out {out_dtype}{tuple(out_shape)}"
            )
        if np.shares_memory(as_array(x), as_array(out)):
            raise ValueError("out overlaps x without being x: pass out=x (in place) or a separate buffer")
