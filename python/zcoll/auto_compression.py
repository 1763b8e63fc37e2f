"""``compression="auto"``: each DDP bucket's method chosen from measurements of this job, and
guarded while it trains.

Used through the DDP hook (``zcoll.torch.apply_gradient_compression(ddp, "auto")`` or
``CompressionState(compressor=zcoll.AutoCompression(...))``); the string "auto" means
``AutoCompression()`` (:func:`resolve`). ``comm.allreduce(compression="auto")`` is refused: a
single call has no step to measure in and no backward pass to overlap with.

Everything below runs on the process group's ordered worker, in bucket order, so every
collective it adds is issued in the same order on every rank; every decision is made from
allreduced numbers by deterministic code, so it is identical on every rank.

1. Calibrate (first bucket): uncompressed allreduces of 256 B, 1 MiB and 4 MiB and the kernel
   rates of every method (and of what the guard may escalate to); the slowest rank's numbers
   on every rank, so every rank fits the same model (:func:`calibrate`).
2. Trials (``len(methods) * trial_repeats`` steps from ``start_step``): every bucket of a step
   goes with the same method, each method for trial_repeats steps (the first not counted);
   each bucket's time on the worker, its hand-over time and each step's time are recorded.
3. Decide (at the end of the last trial step, :meth:`_decide`): the trials' medians, allreduced,
   fit the model (compression_model.fit); compression_model.decide chooses per bucket among the
   methods whose trial steps were faster than the uncompressed ones; a ``decision`` event per
   bucket: method, reason, the model's prediction and the trials' measurement of every method.
4. Afterwards, every ``check_every`` steps, measured against predicted communication (a
   ``measured`` event, with both gains over the model's uncompressed time); off by more than
   ``drift`` at two checks in a row, or a changed link verdict (``comm.diagnose()`` every
   ``diagnose_every`` steps), runs the trials again (``redecide``).
5. Guard, every step and compressed bucket: compression ratio, residual-to-gradient norm ratio
   (on ``sample`` fixed indices), non-finite count (``bucket`` events, Prometheus gauges).
   Every ``check_every`` steps an exact check: at ``sample`` indices (the same on every rank,
   from the key and the step) what each rank meant to send (its gradient plus the residual it
   carried minus the one it keeps) is averaged uncompressed and compared with the compressed
   result (``error``: lost beyond error feedback; ``step_error``, against the average
   gradient, is logged only: error feedback sends that part later). ``error`` above ``bound``
   escalates the bucket one step (ESCALATION: sign/top-k -> int4 -> int8 -> bf16 -> none);
   ``calm_checks`` checks in a row under a quarter of it step back down one (hysteresis).
   Optional ``residual_bound``: a mean residual-to-gradient ratio above it escalates too
   (error feedback's debt growing; under half of it counts as calm).

Test-only fault: ``_test_corrupt_fraction`` (private) overwrites that fraction of a compressed
result's values (the same ones on every rank) with 1e3 times the bucket's largest value.
"""

from __future__ import annotations

import math
import time
import zlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import compression_model as cm
from .metrics import MetricsLog

# The guard's bound on the relative L2 error of a compressed average against the exact average
# of what the ranks meant to send (gradient + carried residual - kept residual): zcoll's codecs
# keep every rounding, hops included, in the residuals, so an honest codec measures float
# rounding (0 to ~1e-7 on 2 and 4 ranks, every method); anything near 1e-3 is lost mass.
DEFAULT_BOUND = 1e-3

# A residual-to-gradient norm ratio above this means error feedback owes more than a whole
# gradient: updates arrive more than a step late on average. Measured on the digits MLP (2 ranks,
# the guard's checks every 10 steps): int8 0.02 (max 0.03), int4 0.3 (max 0.6), sign 3-16,
# top-1% 6-10: the bound separates the methods that keep up from those that carry a debt. Off
# by default (residual_bound=None): escalating sign or top-k to int4 trades their speed for
# accuracy, which the caller chooses (the guarded configurations of examples/train_digits.py and
# bench/ddp_step.py pass it).
RESIDUAL_BOUND = 1.0


def resolve(compression: Any) -> Any:
    """The one place the string "auto" becomes an AutoCompression."""
    if isinstance(compression, str):
        if compression != "auto":
            raise ValueError(f"compression as a string must be 'auto', got {compression!r}")
        return AutoCompression()
    return compression


def _relative(got: np.ndarray, want: np.ndarray) -> float:
    """||got - want|| / ||want|| (||got|| when want is 0; inf when not finite)."""
    norm = float(np.linalg.norm(want))
    err = float(np.linalg.norm(got - want)) / norm if norm > 0 else float(np.linalg.norm(got))
    return err if math.isfinite(err) else math.inf


def _array(x: Any) -> np.ndarray:
    """A float32 numpy view of a CPU tensor or array (the same memory)."""
    return x.numpy() if hasattr(x, "numpy") else np.asarray(x)


class AutoCompression:
    """The method of each DDP bucket chosen from measurements and guarded (module docstring).

    methods: candidates, least lossy first (compression_model.LOSSINESS); trial_repeats: steps
    per method in the trials (the first not counted); start_step: the first trial step (DDP
    rebuilds its buckets after step 0); margin / min_gain: see compression_model.decide;
    guard: the per-step metrics and exact checks; check_every: steps between exact checks (and
    drift checks); sample: elements per bucket in a check; bound: relative error lost beyond
    error feedback that escalates (DEFAULT_BOUND); residual_bound: a residual-to-gradient norm
    ratio (the ranks' mean at a check) that escalates too (None: off; RESIDUAL_BOUND, 1.0,
    is the calibrated one);
    calm_checks: quiet checks before stepping back down; drift: relative drift of measured from
    predicted communication time that re-decides (at two checks in a row; 0.5: the noise of a
    shared machine stays below it); diagnose_every: steps between link
    diagnoses (0: never; a changed verdict re-decides); metrics_path: JSON-lines log (rank 0
    writes it); metrics_port: Prometheus (None: ZCOLL_METRICS_PORT; each rank on port + rank).

    Example::

        state = zcoll.torch.apply_gradient_compression(ddp, zcoll.AutoCompression(metrics_path="m.jsonl"))
        ...
        print(zcoll.compression_model.render(state.compressor.decisions.values()))
    """

    error_feedback = True
    measure_error = False

    def __init__(
        self,
        methods: Sequence[str] = cm.CANDIDATES,
        *,
        trial_repeats: int = 4,
        start_step: int = 1,
        margin: float = 0.05,
        min_gain: float = 0.05,
        guard: bool = True,
        check_every: int = 50,
        sample: int = 4096,
        bound: float = DEFAULT_BOUND,
        residual_bound: Optional[float] = None,
        calm_checks: int = 3,
        drift: float = 0.5,
        diagnose_every: int = 0,
        metrics_path: Optional[str] = None,
        metrics_port: Optional[int] = None,
        seed: int = 0,
        _test_corrupt_fraction: float = 0.0,
    ):
        unknown = [m for m in methods if m != "none" and m not in cm.METHODS]
        if unknown or not methods:
            raise ValueError(f"unknown methods {unknown}; known: none, {', '.join(cm.METHODS)}")
        if trial_repeats < 2 or start_step < 0 or check_every < 1 or sample < 1 or calm_checks < 1:
            raise ValueError(
                "need trial_repeats >= 2, start_step >= 0, check_every >= 1, sample >= 1, calm_checks >= 1; "
                f"got {trial_repeats}, {start_step}, {check_every}, {sample}, {calm_checks}"
            )
        if not 0.0 <= _test_corrupt_fraction <= 1.0:
            raise ValueError(f"_test_corrupt_fraction must be in [0, 1], got {_test_corrupt_fraction}")
        self.methods = tuple(dict.fromkeys(methods))  # the trials' order
        self.allowed = list(self.methods)  # what the last decision chose among (trial steps veto)
        self.trial_repeats, self.margin, self.min_gain = int(trial_repeats), margin, min_gain
        self.guard, self.check_every, self.sample = bool(guard), int(check_every), int(sample)
        self.bound = float(bound)
        self.residual_bound = None if residual_bound is None else float(residual_bound)
        self._residual_ratio: Dict[str, float] = {}
        self._fixed: Dict[str, np.ndarray] = {}  # key -> its residual-ratio sample indices
        self.calm_checks, self.drift, self.diagnose_every = (
            int(calm_checks),
            float(drift),
            int(diagnose_every),
        )
        self.metrics_path, self.metrics_port, self.seed = metrics_path, metrics_port, seed
        self._test_corrupt_fraction = float(_test_corrupt_fraction)
        self.metrics: Optional[MetricsLog] = None
        self._compressors: Dict[str, Any] = {}
        self.method_of: Dict[str, str] = {}  # key -> the method whose compressor holds its residual
        self._pending: Dict[str, np.ndarray] = {}  # residuals of keys sent uncompressed
        self.model: Optional[cm.CostModel] = None
        self._calibration: Optional[List[Tuple[float, float, float]]] = None
        self.calibration_bytes = 0  # what this rank sent calibrating (comm.stats()'s bytes_sent)
        self.calls_by_method: Dict[str, int] = {}  # bucket calls per method (trials, escalations)
        self.guard_seconds = 0.0  # the guard's own time, summed at each check (guard_cost events)
        self._guard_s, self._guard_since = 0.0, None  # since: the step of the first call
        self._codecs: Dict[str, Dict[str, Any]] = {}
        self.decisions: Dict[str, cm.Decision] = {}
        self.path: Dict[str, List[str]] = {}  # key -> [decided method, escalations...]; last = in use
        self._calm: Dict[str, int] = {}
        self.trial_start = int(start_step)
        self.decided_step: Optional[int] = None
        self._times: Dict[Tuple[str, str], List[float]] = {}  # (key, method) -> trial seconds
        self._ready: Dict[str, List[float]] = {}  # key -> hand-over offsets in the trials
        self._step_s: Dict[str, List[float]] = {}  # method -> trial step times (end to end)
        self._last_end: Optional[float] = None
        self._nbytes: Dict[str, int] = {}
        self._step_keys: List[str] = []  # this step's buckets, in order
        self._step_ready0: Optional[float] = None
        # since the last check: measured, predicted, predicted uncompressed, uncompressed in the trials
        self._measured = [0.0, 0.0, 0.0, 0.0]
        self._trial_none: Dict[str, float] = {}  # key -> its uncompressed time in the trials
        self._per_bucket: Dict[str, List[float]] = {}  # key -> [measured, predicted] since the last check
        self._drifted = 0
        self._verdict: Optional[str] = None
        self._check: List[Tuple[str, str, np.ndarray, np.ndarray]] = []  # key, method, meant, got
        self.events: List[Dict[str, Any]] = []  # decisions and guard events (also in the log)

    def __repr__(self) -> str:
        return f"AutoCompression(methods={list(self.methods)}, check_every={self.check_every})"

    # -- which method -------------------------------------------------------------------------
    @property
    def trial_steps(self) -> int:
        return len(self.methods) * self.trial_repeats

    def in_trials(self, step: int) -> bool:
        return self.trial_start <= step < self.trial_start + self.trial_steps

    def method(self, key: str, step: int, nbytes: int) -> str:
        """The method bucket `key` (of nbytes) goes with at `step`: the trials' method of the
        step; once decided, the bucket's decision (escalated by the guard); a key first seen
        after the decision, the model's choice for its size (no overlap assumed); else none."""
        if self.in_trials(step):
            return self.methods[(step - self.trial_start) // self.trial_repeats]
        if key in self.path:
            return self.path[key][-1]
        if self.decided_step is not None and self.model is not None:
            new = cm.decide(self.model, [(key, nbytes, 0.0)], self.allowed, self.margin, self.min_gain)
            return new[0].method
        return "none"

    def compressor(self, method: str) -> Any:
        if method not in self._compressors:
            self._compressors[method] = cm.make_compressor(method)
        return self._compressors[method]

    # -- error feedback across methods (CompressionState's layouts use these) -------------------
    def residual(self, key: str) -> Optional[np.ndarray]:
        m = self.method_of.get(key, "none")
        return self._pending.get(key) if m == "none" else self._compressors[m].residual(key)

    def reset(self, key: Optional[str] = None) -> None:
        for c in self._compressors.values():
            c.reset(key)
        if key is None:
            self._pending.clear()
        else:
            self._pending.pop(key, None)

    def set_residual(self, key: str, values: Any) -> None:
        m = self.method_of.get(key, "none")
        if m == "none":
            self._pending[key] = np.array(values, dtype=np.float32, copy=True).reshape(-1)
        else:
            self._compressors[m].set_residual(key, values)

    def _switch(self, key: str, method: str, buf: np.ndarray) -> None:
        """Moves key's residual to `method`'s compressor; into the buffer when it goes dense."""
        old = self.method_of.get(key, "none")
        if old == method:
            return
        e = self.residual(key)
        e = None if e is None else e.reshape(-1).copy()
        self.reset(key)
        self.method_of[key] = method
        if e is not None and e.size == buf.size:
            if method == "none":
                buf += e
            else:
                self._compressors[method].set_residual(key, e)

    # -- one bucket (on the group's worker) ----------------------------------------------------
    def allreduce(self, comm: Any, buf: Any, key: str, step: int, last: bool, ready: float) -> Any:
        """Averages `buf` over comm with this step's method for `key`; returns the result."""
        if self.metrics is None:
            self.metrics = MetricsLog(
                self.metrics_path if comm.rank == 0 else None, self.metrics_port, comm.rank
            )
        x = _array(buf)
        if self._calibration is None:
            self._calibrate(comm)
        if self.decided_step is None and step >= self.trial_start + self.trial_steps:
            # undecided with the trial steps behind: the hook began compressing after them (its
            # warm-up steps send uncompressed without calling here), so the trials start now
            self.trial_start = step
        if self._step_ready0 is None:
            self._step_ready0 = ready
        self._step_keys.append(key)
        self._nbytes[key] = x.nbytes
        method = self.method(key, step, x.nbytes)
        if self.decided_step is not None and key not in self.path and not self.in_trials(step):
            self._switch_path(key, [method])  # a new bucket (DDP rebuilt them): the model's choice
        self._switch(key, method, x)
        self.calls_by_method[method] = self.calls_by_method.get(method, 0) + 1
        if self._guard_since is None:
            self._guard_since = step
        g0 = time.perf_counter()
        checking = self.guard and method != "none" and self._check_step(step)
        idx = self._sample_indices(key, step, x.size) if checking else None
        grad = x[idx] if checking else None  # this rank's gradient there (a copy: the call is in place)
        meant = grad + self._residual_at(key, idx) if checking else None
        watched = self.guard and method != "none"
        fixed = self._fixed_indices(key, x.size) if watched else None
        sampled = x[fixed] if watched else None  # for the residual-to-gradient ratio
        t0 = time.perf_counter()
        self._guard_s += t0 - g0
        if method == "none":
            out = comm.allreduce(buf, op="avg", out=buf)
            stats = None
        else:
            c = self.compressor(method)
            try:
                out = comm.allreduce(buf, op="avg", compression=c, key=key, out=buf)  # in place
            finally:
                stats = c.last_stats
                if stats is not None and stats.nonfinite and self.metrics is not None:
                    self.metrics.add(
                        "zcoll_compression_nonfinite_total", stats.nonfinite, bucket=key, method=method
                    )
                    self._log("bucket", step=step, bucket=key, method=method, nonfinite=stats.nonfinite)
        seconds = time.perf_counter() - t0
        y = _array(out)
        if self._test_corrupt_fraction and method != "none":
            self._corrupt(y, key, step)
        self._record(key, method, step, seconds, ready)
        g1 = time.perf_counter()
        if watched:
            self._metrics(key, method, step, fixed, sampled, stats, seconds)
        if checking:
            meant -= self._residual_at(key, idx)
            both = np.concatenate([meant, grad, [self._residual_ratio.get(key, 0.0)]]).astype(np.float32)
            self._check.append((key, method, both, y[idx].copy()))
        self._guard_s += time.perf_counter() - g1
        if last:
            self._end_step(comm, step)
        return out

    def _residual_at(self, key: str, idx: np.ndarray) -> np.ndarray:
        e = self.residual(key)
        return np.zeros(len(idx), np.float32) if e is None else e.reshape(-1)[idx]

    def _check_step(self, step: int) -> bool:
        return (
            self.decided_step is not None
            and not self.in_trials(step)
            and (step - self.decided_step) % self.check_every == self.check_every - 1
        )

    def _sample_indices(self, key: str, step: int, n: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, zlib.crc32(key.encode()), step])
        drawn = np.sort(rng.integers(0, n, size=min(n, self.sample)))  # O(sample)
        # sorted and without repeats; np.unique took 0.6 ms for 4096 indices (sorting is 30 us)
        return drawn[np.concatenate(([True], drawn[1:] != drawn[:-1]))] if drawn.size else drawn

    def _corrupt(self, y: np.ndarray, key: str, step: int) -> None:
        rng = np.random.default_rng([self.seed + 1, zlib.crc32(key.encode()), step])
        k = int(round(self._test_corrupt_fraction * y.size))
        if k:
            big = 1e3 * max(float(np.max(np.abs(y))), 1e-3)
            y[rng.choice(y.size, size=k, replace=False)] = big

    def _record(self, key: str, method: str, step: int, seconds: float, ready: float) -> None:
        if self.in_trials(step):
            if (step - self.trial_start) % self.trial_repeats:  # the first step of a method warms it up
                self._times.setdefault((key, method), []).append(seconds)
                self._ready.setdefault(key, []).append(ready - self._step_ready0)
        elif self.model is not None and key in self.path:
            self._measured[0] += seconds
            self._measured[1] += self.model.predict(method, self._nbytes[key], key)
            self._measured[2] += self.model.predict("none", self._nbytes[key], key)
            self._measured[3] += self._trial_none.get(key, 0.0)
            per = self._per_bucket.setdefault(key, [0.0, 0.0])
            per[0] += seconds
            per[1] += self.model.predict(method, self._nbytes[key], key)

    def _fixed_indices(self, key: str, n: int) -> np.ndarray:
        """The `sample` indices of a bucket of n elements its residual ratio is estimated on
        every step: 16 runs of consecutive elements spread evenly over the bucket, so every
        layer is represented in proportion and the reads are ones the prefetcher follows (the
        scattered sample it replaced measured about the same cost here; the guard's accuracy
        measurements in docs/compression.md were made with these runs)."""
        idx = self._fixed.get(key)
        if idx is None or (idx.size and idx[-1] >= n):
            runs = 16
            length = max(1, min(n, self.sample) // runs)
            starts = np.unique(np.linspace(0, max(n - length, 0), runs).astype(np.int64))
            idx = np.unique((starts[:, None] + np.arange(length)[None, :]).reshape(-1))
            self._fixed[key] = idx
        return idx

    def _metrics(
        self, key: str, method: str, step: int, idx: np.ndarray, grad: np.ndarray, stats: Any, seconds: float
    ) -> None:
        """The step's metrics of one bucket; the residual-to-gradient norm ratio estimated on
        `sample` fixed indices (grad: the gradient there; full norms would cost ~1% of a small
        step)."""
        e = self.residual(key)
        g = math.sqrt(float(np.dot(grad, grad)))  # np.linalg.norm's checks cost more than the sum
        kept = e.reshape(-1)[idx] if e is not None else None
        r = math.sqrt(float(np.dot(kept, kept))) / g if kept is not None and g > 0 else 0.0
        self._residual_ratio[key] = r
        ratio = stats.ratio if stats is not None else 1.0
        m = self.metrics
        if m is not None:
            m.set("zcoll_compression_ratio", ratio, bucket=key, method=method)
            m.set("zcoll_compression_residual_ratio", r, bucket=key, method=method)
            m.set("zcoll_compression_comm_seconds", seconds, bucket=key, method=method)
            m.write(
                "bucket",
                step=step,
                bucket=key,
                method=method,
                ratio=ratio,
                residual_ratio=r,
                nonfinite=stats.nonfinite if stats is not None else 0,
                seconds=seconds,
            )

    def _log(self, event: str, **fields: Any) -> None:
        self.events.append({"event": event, **fields})
        if self.metrics is not None:
            self.metrics.write(event, **fields)

    # -- collectives at a step's end (every rank, same step) ------------------------------------
    def _end_step(self, comm: Any, step: int) -> None:
        keys, self._step_keys, self._step_ready0 = self._step_keys, [], None
        now = time.perf_counter()
        if (
            self.in_trials(step)
            and (step - self.trial_start) % self.trial_repeats
            and self._last_end is not None
        ):
            self._step_s.setdefault(self.method(keys[-1], step, 0), []).append(now - self._last_end)
        self._last_end = now
        if step == self.trial_start + self.trial_steps - 1:
            self._decide(comm, keys, step)
        elif self._check or self._check_step(step):  # (nothing compressed: still the drift check)
            guarded = bool(self._check)
            t0 = time.perf_counter()
            self._run_check(comm, step)
            if guarded:  # the exact check's allreduce and verdicts are the guard's too
                self._guard_s += time.perf_counter() - t0
                self._log_guard_cost(step)
        if self.diagnose_every and self.decided_step is not None and step % self.diagnose_every == 0:
            label = str(comm.diagnose().label)
            if self._verdict is not None and label != self._verdict:
                self._redecide(step, f"the link verdict changed from {self._verdict} to {label}")
            self._verdict = label

    def _log_guard_cost(self, step: int) -> None:
        """The guard's own time (sampling, metrics, the exact check) per step since the last
        check: its overhead, measured where it is spent rather than as a difference of two
        noisy step times."""
        steps = step - self._guard_since
        if steps > 0:
            self._log("guard_cost", step=step, steps=steps, seconds=self._guard_s, per_step_s=self._guard_s / steps)
        self.guard_seconds += self._guard_s
        self._guard_s, self._guard_since = 0.0, step

    def _calibrate(self, comm: Any) -> None:
        sent = comm.stats()["bytes_sent"]
        self._calibration, self._codecs = calibrate(comm, cm.with_escalations(self.methods))
        self.calibration_bytes = comm.stats()["bytes_sent"] - sent  # once: 4 x (256 B, 1 MiB, 4 MiB)
        self.model = cm.fit(self._calibration, self._codecs, comm.size)

    def _decide(self, comm: Any, keys: List[str], step: int) -> None:
        """The trials' medians into the model; one decision per bucket (module docstring, 3).

        A bucket's time is the least over ranks (the last rank to hand the bucket over waits
        least: its time is the collective's, the others' include waiting for it); a step's time
        is the slowest rank's. Methods whose trial steps were not at least ``min_gain`` faster
        than uncompressed ones are not chosen: the model sees one bucket's communication, the
        step also pays what the codecs take from the computation (they share the cores)."""
        cols = list(self.methods)
        missing = 1e30
        rows = [
            [float(np.median(self._times.get((k, m), [missing]))) for m in cols]
            + [float(np.median(self._ready.get(k, [0.0])))]
            for k in keys
        ]
        table = comm.allreduce(np.array(rows, np.float64).reshape(-1), op="min").reshape(
            len(keys), len(cols) + 1
        )
        steps = comm.allreduce(
            np.array([float(np.median(self._step_s.get(m, [missing]))) for m in cols]), op="max"
        )
        step_s = {m: float(t) for m, t in zip(cols, steps) if t < missing}
        trials = {
            m: [(k, self._nbytes[k], table[i, j]) for i, k in enumerate(keys) if table[i, j] < missing]
            for j, m in enumerate(cols)
        }
        physics = cm.fit(self._calibration or [], self._codecs, comm.size)
        self.model = cm.fit(self._calibration or [], self._codecs, comm.size, trials)
        allowed = cols
        if "none" in step_s:  # cols in order, so that decide() sees the same candidates everywhere
            allowed = [
                m
                for m in cols
                if m == "none" or step_s.get(m, math.inf) <= step_s["none"] * (1 - self.min_gain)
            ]
        self.allowed = list(allowed)
        if "none" in cols:
            j = cols.index("none")
            self._trial_none = {k: float(table[i, j]) for i, k in enumerate(keys) if table[i, j] < missing}
        decisions = cm.decide(
            self.model,
            [(k, self._nbytes[k], table[i, -1]) for i, k in enumerate(keys)],
            allowed,
            self.margin,
            self.min_gain,
        )
        self.decisions = {d.key: d for d in decisions}
        for i, d in enumerate(decisions):
            self._switch_path(d.key, [d.method])
            measured = {m: float(table[i, j]) for j, m in enumerate(cols) if table[i, j] < missing}
            self._log(
                "decision",
                step=step,
                bucket=d.key,
                bytes=d.nbytes,
                method=d.method,
                reason=d.reason,
                predicted_s=d.predicted_s,
                predicted_gain_s=d.predicted_gain_s,
                predicted={m: self.model.predict(m, d.nbytes, d.key) for m in cols},
                measured_trial=measured,
                trial_step_s=step_s,
                vetoed=[m for m in cols if m not in allowed],
                physics_predicted={m: physics.predict(m, d.nbytes) for m in cols},
            )
        self.decided_step = step + 1
        self._times.clear()
        self._ready.clear()
        self._step_s.clear()
        self._measured = [0.0, 0.0, 0.0, 0.0]

    def _switch_path(self, key: str, path: List[str]) -> None:
        self.path[key] = path
        self._calm[key] = 0

    def _run_check(self, comm: Any, step: int) -> None:
        """One allreduce (sum) of every checked sample and the drift sums; the verdicts."""
        checks, self._check = self._check, []
        parts = [both for _, _, both, _ in checks]
        total = (
            comm.allreduce(np.concatenate(parts or [np.zeros(0)]).astype(np.float32), op="sum") / comm.size
        )
        keys = sorted(self._per_bucket)  # the same buckets on every rank
        sums = self._measured + [v for k in keys for v in self._per_bucket[k]]
        drift = comm.allreduce(np.array(sums, np.float64), op="min")  # as the trials: least over ranks
        per_bucket = {k: [float(drift[4 + 2 * i]), float(drift[5 + 2 * i])] for i, k in enumerate(keys)}
        self._per_bucket = {}
        off = 0
        for key, method, both, got in checks:
            n = got.size
            meant, grad, residual = (
                total[off : off + n],
                total[off + n : off + 2 * n],
                float(total[off + 2 * n]),
            )
            off += 2 * n + 1
            self._guard(key, method, _relative(got, meant), _relative(got, grad), residual, step)
        measured, predicted, uncompressed, trial_none = (float(v) for v in drift[:4])
        self._measured = [0.0, 0.0, 0.0, 0.0]
        if predicted > 0:
            rel = (measured - predicted) / predicted
            # gains against the model's uncompressed time, and the trials' (none does not run once
            # decided; the trials' is 0 without none among the methods)
            self._log(
                "measured",
                step=step,
                measured_s=measured,
                predicted_s=predicted,
                relative=rel,
                predicted_gain_s=uncompressed - predicted,
                measured_gain_s=uncompressed - measured,
                measured_gain_vs_trials_s=trial_none - measured if trial_none > 0 else None,
                per_bucket=per_bucket,  # key -> [measured, predicted] seconds over the interval
            )
            self._drifted = self._drifted + 1 if abs(rel) > self.drift else 0
            if self._drifted >= 2 and self._another_would_win(per_bucket):
                self._redecide(
                    step,
                    f"measured communication {measured * 1e3:.1f} ms vs predicted "
                    f"{predicted * 1e3:.1f} ms at two checks in a row",
                )

    def _another_would_win(self, per_bucket: Dict[str, List[float]]) -> bool:
        """Whether, at its measured cost, some bucket's method is no longer the best choice: its
        measured time per call (the model's prediction scaled by measured / predicted over the
        interval) exceeds another allowed method's prediction by more than the margin. A drift
        that leaves every choice standing (sign measured at twice its prediction over a 1 Gbit/s
        link, still far below int8's or none's) is not worth new trial steps, which include
        uncompressed ones (164 ms each there for the 2.18M MLP)."""
        if self.model is None or len(self.allowed) < 2:
            return False
        for key, (measured, predicted) in per_bucket.items():
            current = self.path.get(key, ["none"])[-1]
            nbytes = self._nbytes.get(key)
            if nbytes is None or predicted <= 0:
                continue
            mine = measured / predicted * self.model.predict(current, nbytes, key)
            others = [self.model.predict(m, nbytes, key) for m in self.allowed if m != current]
            if others and mine > min(others) * (1 + self.margin):
                return True
        return False

    def _guard(self, key: str, method: str, err: float, step_err: float, residual: float, step: int) -> None:
        """err: what the result lost beyond what error feedback carries over (relative to the
        average of what the ranks meant to send); step_err: against the average gradient;
        residual: the ranks' mean residual-to-gradient norm ratio (escalates above
        residual_bound when one is set)."""
        bound = self.bound
        owed = self.residual_bound is not None and residual > self.residual_bound
        if self.metrics is not None:
            self.metrics.set("zcoll_compression_check_error", min(err, 1e300), bucket=key, method=method)
            self.metrics.set("zcoll_compression_step_error", min(step_err, 1e300), bucket=key, method=method)
        self._log(
            "check",
            step=step,
            bucket=key,
            method=method,
            error=err,
            bound=bound,
            step_error=step_err,
            residual_ratio=residual,
        )
        path = self.path.get(key)
        if path is None or path[-1] != method:
            return
        if (err > bound or owed) and method in cm.ESCALATION:
            up = cm.ESCALATION[method]
            path.append(up)
            self._calm[key] = 0
            if self.metrics is not None:
                self.metrics.add("zcoll_compression_escalations_total", 1, bucket=key)
            self._log("escalate", step=step, bucket=key, method=up, previous=method, error=err, bound=bound)
        elif (
            len(path) > 1
            and err < bound / 4
            and (self.residual_bound is None or residual < self.residual_bound / 2)
        ):
            self._calm[key] += 1
            if self._calm[key] >= self.calm_checks:
                path.pop()
                self._calm[key] = 0
                self._log("relax", step=step, bucket=key, method=path[-1], previous=method, error=err)
        else:
            self._calm[key] = 0

    def _redecide(self, step: int, why: str) -> None:
        self.trial_start = step + 1
        self.decided_step = None
        self._drifted = 0
        self._log("redecide", step=step, reason=why)

    # -- reports and checkpoints ------------------------------------------------------------------
    def report(self) -> Dict[str, Any]:
        """The decisions (as recommend() returns them), the model and the guard's state."""
        return {
            "decided": self.decided_step is not None,
            "decided_at_step": self.decided_step,
            "decisions": [d.as_dict() for d in self.decisions.values()],
            "in_use": {k: p[-1] for k, p in self.path.items()},
            "model": self.model.describe() if self.model is not None else None,
            "text": cm.render(list(self.decisions.values())),
        }

    def state_dict(self) -> Dict[str, Any]:
        """This rank's state for checkpoints: every method's residuals and call counts, which
        method holds each bucket's residual, the decisions as escalated, the trial schedule. The
        model is fitted again (calibration) when a resumed run starts; its decisions are kept."""
        return {
            "compressors": {m: c.state_dict() for m, c in self._compressors.items()},
            "method_of": dict(self.method_of),
            "pending": {k: v.copy() for k, v in self._pending.items()},
            "path": {k: list(p) for k, p in self.path.items()},
            "trial_start": self.trial_start,
            "decided_step": self.decided_step,
            "allowed": list(self.allowed),
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        for m, s in state["compressors"].items():
            self.compressor(m).load_state_dict(s)
        self.method_of = dict(state["method_of"])
        self._pending = {k: np.array(v, np.float32) for k, v in state["pending"].items()}
        self.path = {k: list(p) for k, p in state["path"].items()}
        self._calm = {k: 0 for k in self.path}
        self.trial_start, self.decided_step = state["trial_start"], state["decided_step"]
        self.allowed = list(state["allowed"])

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()


def calibrate(
    comm: Any, methods: Sequence[str]
) -> Tuple[List[Tuple[float, float, float]], Dict[str, Dict[str, Any]]]:
    """Collective: uncompressed allreduces of 256 B, 1 MiB and 4 MiB (median of 3 after a
    warm-up; dense bytes, bytes sent, seconds) and the methods' kernel rates, every timing the
    slowest rank's, so every rank fits the same model."""
    sizes = (256, 1 << 20, 4 << 20)
    own = []
    for nbytes in sizes:
        t = np.zeros(nbytes // 4, np.float32)
        times, wire = [], 0
        for i in range(4):
            sent = comm.stats()["bytes_sent"]
            t0 = time.perf_counter()
            comm.allreduce(t, op="sum", out=t)
            if i:
                times.append(time.perf_counter() - t0)
                wire = comm.stats()["bytes_sent"] - sent
        own.append((float(nbytes), float(wire), float(np.median(times))))
    codecs = cm.codec_rates([m for m in methods if m != "none"])
    names = sorted(codecs)
    rates = [codecs[m][k] for m in names for k in ("encode_s_per_byte", "decode_s_per_byte")]
    vec = comm.allreduce(np.array([s for _, _, s in own] + rates, np.float64), op="max")
    calibration = [(b, w, float(s)) for (b, w, _), s in zip(own, vec[: len(own)])]
    for i, m in enumerate(names):
        codecs[m]["encode_s_per_byte"] = float(vec[len(own) + 2 * i])
        codecs[m]["decode_s_per_byte"] = float(vec[len(own) + 2 * i + 1])
    return calibration, codecs
