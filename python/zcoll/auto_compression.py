"""``compression="auto"``: each DDP bucket's method chosen from measurements of this job, and
guarded while it trains.

Used through the DDP hook (``zcoll.torch.apply_gradient_compression(ddp, "auto")`` or
``CompressionState(compressor=zcoll.AutoCompression(...))``); the string "auto" means
``AutoCompression()`` (:func:`resolve`). Or called directly, once per tensor and training step
(``comm.allreduce(grad, op="avg", compression="auto", key=name, out=grad)``: each key one
bucket; a step ends where a key of the step comes again, see :meth:`AutoCompression._allreduce`).

Everything below runs on the process group's ordered worker, in bucket order (or in the
caller's order of keys), so every collective it adds is issued in the same order on every
rank; every decision is made from allreduced numbers by deterministic code, so it is identical
on every rank.

1. Calibrate (first bucket): uncompressed allreduces of 256 B, 1 MiB and 4 MiB and the kernel
   rates of every method (and of what the guard may escalate to); the slowest rank's numbers
   on every rank, so every rank fits the same model (:func:`calibrate`).
2. Screen (``len(methods) * trial_repeats`` steps from ``start_step``): every bucket of a step
   goes with the same method, each method for trial_repeats steps (the first not counted);
   each bucket's time on the worker (per call the least over ranks: the rank that arrived last
   did not wait), its hand-over time, each step's window (from its first bucket's hand-over to
   its last bucket's end: what compression changes, the backward pass sharing the cores with
   the codecs and the exposed communication; not the forward pass, the optimizer or a pause
   between steps) and each step end to end (a typical step: the scale of the gains); every step
   the slowest rank's. At the screen's end (:meth:`_screen`) the calls fit the model
   (compression_model.fit), which plans a method per bucket (compression_model.decide:
   overlap, per-bucket costs); the final's candidates are the methods whose median window was
   within SCREEN_BAND of a step of the fastest's (uncompressed always, when within it), and the
   plan (compression_model.finalists, at most ``finalists``).
3. Final (``final_rounds`` rounds) and decision (:meth:`_decide`): the candidates take turns a
   step each, so that what else the machine does falls on all of them alike; each one's time
   is the median over rounds of its window against its round's (compression_model.
   paired_medians: what slows a whole round cancels); the best wins (compression_model.choose:
   a compressed one only when it saved ``min_gain`` of a step against uncompressed, a gain the
   rounds resolve where both took turns; then the fastest, or where the rounds do not resolve
   its lead over others, of those the one whose calls took the least (compression_model.
   FinalRounds: six rounds of windows scatter more than the gaps between compressed methods,
   the calls far less); with ``step_margin`` the least lossy within that fraction of a step of
   the fastest). The model itself judges only communication; the steps also pay what the codecs
   take from the computation (they share the cores), so the steps decide where they can. A
   ``decision`` event per bucket: method, candidate, reason, the model's predictions (fitted
   on every trial call) and the trials' measurements.
4. Afterwards, every ``check_every`` steps, measured against predicted communication (a
   ``measured`` event, with both gains over the model's uncompressed time). The first interval
   after a decision is predicted by the trials' model, every later one by what the checks
   before it measured of the same buckets and methods (the trials' model's prediction is
   logged beside it). Off by more than ``drift`` at two checks in a row, when another method
   would now win, or a changed link verdict (``comm.diagnose()`` every ``diagnose_every``
   steps), runs the trials again (``redecide``).
5. Guard, every step and compressed bucket: compression ratio, residual-to-gradient norm ratio
   (on ``sample`` elements, summed inside the collective: CompressionStats.input_squares /
   residual_squares), non-finite count (``bucket`` events, Prometheus gauges).
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

import contextlib
import math
import time
import zlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _C
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

MISSING = 1e30  # a trial table's entry where a method was not measured
LEARNED_CALLS = 512  # a (bucket, method)'s latest decided calls that predict its next interval


def resolve(compression: Any) -> Any:
    """The one place the string "auto" becomes an AutoCompression."""
    if isinstance(compression, str):
        if compression != "auto":
            raise ValueError(f"compression as a string must be 'auto', got {compression!r}")
        return AutoCompression()
    return compression


class _Spent:
    """Wall seconds and this thread's CPU seconds spent inside ``with`` blocks, until taken."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def __enter__(self) -> "_Spent":
        self._wall0, self._cpu0 = time.perf_counter(), time.thread_time()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.wall += time.perf_counter() - self._wall0
        self.cpu += time.thread_time() - self._cpu0

    def take(self) -> Tuple[float, float]:
        spent, (self.wall, self.cpu) = (self.wall, self.cpu), (0.0, 0.0)
        return spent


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
    per method in the screen (the first not counted); final_rounds: rounds of the final (0: the
    screen's steps decide); finalists: its most candidates; start_step: the first trial step
    (DDP rebuilds its buckets after step 0); margin / min_gain: see compression_model.decide;
    step_margin: see compression_model.choose;
    guard: the per-step metrics and exact checks; check_every: steps between exact checks (and
    drift checks); sample: elements per bucket in a check; bound: relative error lost beyond
    error feedback that escalates (DEFAULT_BOUND); residual_bound: a residual-to-gradient norm
    ratio (the ranks' mean at a check) that escalates too (None: off; RESIDUAL_BOUND, 1.0,
    is the calibrated one);
    calm_checks: quiet checks before stepping back down; drift: relative drift of measured from
    predicted communication time (each bucket's median call times its calls) that re-decides
    (at two checks in a row; 0.5: the noise of a shared machine stays below it); diagnose_every: steps between link
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
        trial_repeats: int = 3,
        final_rounds: int = 6,
        finalists: int = 4,
        start_step: int = 1,
        margin: float = 0.05,
        min_gain: float = 0.05,
        step_margin: float = cm.STEP_MARGIN,
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
        if (
            trial_repeats < 2
            or final_rounds < 0
            or finalists < 2
            or start_step < 0
            or check_every < 1
            or sample < 1
            or calm_checks < 1
        ):
            raise ValueError(
                "need trial_repeats >= 2, final_rounds >= 0, finalists >= 2, start_step >= 0, check_every >= 1, "
                f"sample >= 1, calm_checks >= 1; got {trial_repeats}, {final_rounds}, {finalists}, {start_step}, "
                f"{check_every}, {sample}, {calm_checks}"
            )
        if not 0.0 <= _test_corrupt_fraction <= 1.0:
            raise ValueError(f"_test_corrupt_fraction must be in [0, 1], got {_test_corrupt_fraction}")
        self.methods = tuple(dict.fromkeys(methods))  # the trials' order
        self.allowed = list(self.methods)  # what a bucket DDP adds later may use: the decision's (and none)
        self.trial_repeats, self.margin, self.min_gain = int(trial_repeats), margin, min_gain
        self.final_rounds, self.finalists, self.step_margin = int(final_rounds), int(finalists), step_margin
        self.guard, self.check_every, self.sample = bool(guard), int(check_every), int(sample)
        self.bound = float(bound)
        self.residual_bound = None if residual_bound is None else float(residual_bound)
        self._residual_ratio: Dict[str, float] = {}
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
        # the guard's own wall time and this thread's CPU time in it, summed at each check
        # (guard_cost events); the wall time includes waiting for the GIL and the cores
        self.guard_seconds = self.guard_cpu_seconds = 0.0
        self._guard_spent = _Spent()  # since the last check
        self._guard_since: Optional[int] = None  # the step of the first call, then of the last check
        self._codecs: Dict[str, Dict[str, Any]] = {}
        self.decisions: Dict[str, cm.Decision] = {}
        self.path: Dict[str, List[str]] = {}  # key -> [decided method, escalations...]; last = in use
        self._calm: Dict[str, int] = {}
        self._screened: Dict[str, float] = {}  # method -> median screening step (slowest rank's)
        self._final: List[cm.Candidate] = []  # the final's candidates, in the order they take turns
        self._plan: Dict[str, cm.Decision] = {}  # the model's per-bucket choice after the screen
        self._start_trials(int(start_step))
        self.decided_step: Optional[int] = None
        self._times: Dict[Tuple[str, str], List[float]] = {}  # (key, method) -> trial seconds
        self._ready: Dict[str, List[float]] = {}  # key -> hand-over offsets in the trials
        # candidate -> its trial steps' windows: from the step's first bucket hand-over to its last
        # bucket's end (what compression changes: backward sharing the cores with the codecs, the
        # exposed communication; the forward pass, the optimizer and pauses between steps are not in it)
        self._step_s: Dict[str, List[float]] = {}
        self._full_s: List[float] = []  # trial steps end to end: a typical step, the gains' scale
        self._last_end: Optional[float] = None
        self._nbytes: Dict[str, int] = {}
        self._step_keys: List[str] = []  # this step's buckets, in order
        self._step_ready0: Optional[float] = None
        self._calls: List[Tuple[str, str, float]] = []  # (key, method, seconds) since the last check
        # (key, method) -> its decided calls' seconds (least over ranks) at the checks so far, the
        # last LEARNED_CALLS: what predicts the next interval (_predict)
        self._learned: Dict[Tuple[str, str], List[float]] = {}
        self._trial_none: Dict[str, float] = {}  # key -> its uncompressed time in the trials
        self._drifted = 0
        self._verdict: Optional[str] = None
        self._check: List[Tuple[str, str, np.ndarray, np.ndarray]] = []  # key, method, meant, got
        # comm.allreduce(compression=self): the step of the calls, its keys so far, its last call's end
        self._call_step, self._call_keys, self._call_end = 0, set(), 0.0
        self.events: List[Dict[str, Any]] = []  # decisions and guard events (also in the log)

    def __repr__(self) -> str:
        return f"AutoCompression(methods={list(self.methods)}, check_every={self.check_every})"

    # -- which method -------------------------------------------------------------------------
    @property
    def trial_steps(self) -> int:
        """Steps of the trials (before the screen ends: the most they may take)."""
        return self._trial_end - self.trial_start

    def in_trials(self, step: int) -> bool:
        return self.trial_start <= step < self._trial_end

    def _start_trials(self, step: int) -> None:
        """Trials from `step`: the screen, then a final of at most `finalists` candidates."""
        self.trial_start = step
        self._screen_end = step + len(self.methods) * self.trial_repeats
        most = min(self.finalists, len(self.methods) + 1) if len(self.methods) > 1 else 0
        self._trial_end = self._screen_end + most * self.final_rounds
        self._final, self._screened, self._plan, self._typical = [], {}, {}, 0.0

    def _trial_candidate(self, step: int) -> cm.Candidate:
        """The screen: each method for trial_repeats steps in turn; the final: the candidates one
        step each, in an order that rotates every round (so that none always follows another)."""
        if step < self._screen_end:
            return cm.Candidate(self.methods[(step - self.trial_start) // self.trial_repeats])
        rnd, pos = divmod(step - self._screen_end, len(self._final))
        return self._final[(pos + rnd) % len(self._final)]

    def _counted(self, step: int) -> bool:
        """Whether a trial step's times count: not a method's first screening step (it warms
        the method up: the compressor's first call allocates its residuals)."""
        return step >= self._screen_end or (step - self.trial_start) % self.trial_repeats != 0

    def method(self, key: str, step: int, nbytes: int) -> str:
        """The method bucket `key` (of nbytes) goes with at `step`: the trials' method of the
        step; once decided, the bucket's decision (escalated by the guard); a key first seen
        after the decision, the model's choice for its size (no overlap assumed); else none."""
        if self.in_trials(step):
            return self._trial_candidate(step).method(key)
        if key in self.path:
            return self.path[key][-1]
        if self.decided_step is not None and self.model is not None:
            new = cm.decide(self.model, [(key, nbytes, 0.0)], self.allowed, self.margin, self.min_gain)
            return new[0].method
        return "none"

    def compressor(self, method: str) -> Any:
        if method not in self._compressors:
            c = self._compressors[method] = cm.make_compressor(method)
            c.norm_sample = self.sample if self.guard else 0  # the residual ratio's sums
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
        e = None if e is None else e.reshape(-1)  # no copy: reset() below lets go of it
        self.reset(key)
        self.method_of[key] = method
        if e is not None and e.size == buf.size:
            if method == "none":
                buf += e
            else:
                self.compressor(method).set_residual(key, e)  # (its first call may come later)

    # -- one bucket (on the group's worker) ----------------------------------------------------
    def allreduce(self, comm: Any, buf: Any, key: str, step: int, last: bool, ready: float) -> Any:
        """Averages `buf` over comm with this step's method for `key`; returns the result."""
        if self.metrics is None:
            self.metrics = MetricsLog(
                self.metrics_path if comm.rank == 0 else None, self.metrics_port, comm.rank
            )
        if self._decided_uncompressed(key, step):
            return self._uncompressed(comm, buf, key, step, last)
        x = _array(buf)
        if self._calibration is None:
            self._calibrate(comm)
        if self.decided_step is None and step >= self._trial_end:
            # undecided with the trial steps behind: the hook began compressing after them (its
            # warm-up steps send uncompressed without calling here), so the trials start now
            self._start_trials(step)
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
        with self._guard_spent:
            checking = self.guard and method != "none" and self._check_step(step)
            idx = self._sample_indices(key, step, x.size) if checking else None
            grad = x[idx] if checking else None  # this rank's gradient there (a copy: in place below)
            meant = grad + self._residual_at(key, idx) if checking else None
            watched = self.guard and method != "none"
        t0 = time.perf_counter()
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
        with self._guard_spent:
            if watched:
                self._metrics(key, method, step, stats, seconds)
            if checking:
                meant -= self._residual_at(key, idx)
                both = np.concatenate([meant, grad, [self._residual_ratio.get(key, 0.0)]]).astype(np.float32)
                self._check.append((key, method, both, y[idx].copy()))
        if last:
            self._end_step(comm, step)
        return out

    def _allreduce(self, comm: Any, x: Any, out: Any, op: Any, algorithm: Any, key: Optional[str]) -> None:
        """``comm.allreduce(x, op="avg", compression=self, key=key, out=out)``: the hook's path for
        a caller without DDP (a manual loop, Horovod-style), each key a bucket. The caller calls
        every key once per training step, in the same order on every rank; a step ends where a key
        the step already had comes again (so the step's checks, screen and decision run at the
        next step's first call, on every rank at the same point). The trials' windows run from a
        step's first call to its last call's end. Only averages (what error feedback and the
        guard's exact check compare against); float32 only (the codecs' residuals)."""
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
            xs, outs = _array(x), _array(out)
            if np.shares_memory(xs, outs):
                raise ValueError("out overlaps x without being x: pass out=x (in place) or a separate buffer")
            np.copyto(outs, xs)
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
            and key in self._nbytes  # (not so for a bucket's first call after load_state_dict)
            and self.method_of.get(key, "none") == "none"
            and self.path.get(key, ("",))[-1] == "none"
            and not self.in_trials(step)
        )

    def _uncompressed(self, comm: Any, buf: Any, key: str, step: int, last: bool) -> Any:
        """allreduce()'s path for a bucket decided uncompressed. Measured: auto's own work on
        the hook's worker (Python, on the last bucket's critical path, sharing the GIL and two
        cores with the backward pass) cost 2-4% of a 2-rank step against plain zcoll."""
        t0 = time.perf_counter()
        out = comm.allreduce(buf, op="avg", out=buf)
        self._calls.append((key, "none", time.perf_counter() - t0))
        self.calls_by_method["none"] = self.calls_by_method.get("none", 0) + 1
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
        """An exact check's `sample` indices of a bucket of n elements: every stride-th element
        from an offset drawn from (seed, key, step), so the same on every rank, different at
        every check, spread over every layer, sorted and without repeats (a random draw,
        sorted and deduplicated, cost 0.35 ms of the hook's worker at each check under load)."""
        k = min(n, self.sample)
        if k == 0:
            return np.zeros(0, np.int64)
        stride = n // k
        offset = zlib.crc32(f"{self.seed}/{key}/{step}".encode()) % stride
        return offset + stride * np.arange(k, dtype=np.int64)

    def _corrupt(self, y: np.ndarray, key: str, step: int) -> None:
        rng = np.random.default_rng([self.seed + 1, zlib.crc32(key.encode()), step])
        k = int(round(self._test_corrupt_fraction * y.size))
        if k:
            big = 1e3 * max(float(np.max(np.abs(y))), 1e-3)
            y[rng.choice(y.size, size=k, replace=False)] = big

    def _record(self, key: str, method: str, step: int, seconds: float, ready: float) -> None:
        if self.in_trials(step):
            if self._counted(step):
                self._times.setdefault((key, method), []).append(seconds)
                self._ready.setdefault(key, []).append(ready - self._step_ready0)
        elif self.model is not None and key in self.path:
            self._calls.append((key, method, seconds))

    def _metrics(self, key: str, method: str, step: int, stats: Any, seconds: float) -> None:
        """The step's metrics of one bucket; the residual-to-gradient norm ratio estimated on
        the same `sample` elements of both, summed by the collective (full norms would cost ~1%
        of a small step; the same sums as numpy calls here cost ~30 us each)."""
        grad, kept = stats.input_squares, stats.residual_squares
        r = math.sqrt(kept / grad) if grad else 0.0
        self._residual_ratio[key] = r
        ratio = stats.ratio
        m = self.metrics
        if m is None:
            return
        if m.server is not None:  # the gauges are for Prometheus only
            m.set("zcoll_compression_ratio", ratio, bucket=key, method=method)
            m.set("zcoll_compression_residual_ratio", r, bucket=key, method=method)
            m.set("zcoll_compression_comm_seconds", seconds, bucket=key, method=method)
        m.write_bucket(step, key, method, ratio, r, stats.nonfinite, seconds)

    def _log(self, event: str, **fields: Any) -> None:
        self.events.append({"event": event, **fields})
        if self.metrics is not None:
            self.metrics.write(event, **fields)

    # -- collectives at a step's end (every rank, same step) ------------------------------------
    def _end_step(self, comm: Any, step: int, end: Optional[float] = None) -> None:
        """The step's bookkeeping and its collectives (screen, decision, checks); `end`: when its
        last bucket's call ended (None: now)."""
        keys, ready0, self._step_keys, self._step_ready0 = self._step_keys, self._step_ready0, [], None
        now = time.perf_counter() if end is None else end
        trial = self.in_trials(step)
        if trial and self._counted(step) and ready0 is not None:
            self._step_s.setdefault(self._trial_candidate(step).name, []).append(now - ready0)
        if trial and self._last_end is not None:
            self._full_s.append(now - self._last_end)
        self._last_end = now
        if trial and step == self._screen_end - 1:
            self._screen(comm, keys, step)
            self._last_end = time.perf_counter()  # the next step's time leaves the screen's work out
        if trial and step == self._trial_end - 1:
            self._decide(comm, keys, step)
        elif self._check or self._check_step(step):  # (nothing compressed: still the drift check)
            guarded = bool(self._check)  # the exact check's allreduce and verdicts are the guard's too
            with self._guard_spent if guarded else contextlib.nullcontext():
                self._run_check(comm, step)
            if guarded:
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
        wall, cpu = self._guard_spent.take()
        steps = step - (self._guard_since or 0)
        if steps > 0:
            self._log(
                "guard_cost",
                step=step,
                steps=steps,
                seconds=wall,
                per_step_s=wall / steps,
                cpu_seconds=cpu,
                cpu_per_step_s=cpu / steps,
            )
        self.guard_seconds += wall
        self.guard_cpu_seconds += cpu
        self._guard_since = step

    def _calibrate(self, comm: Any) -> None:
        sent = comm.stats()["bytes_sent"]
        self._calibration, self._codecs = calibrate(comm, cm.with_escalations(self.methods))
        self.calibration_bytes = comm.stats()["bytes_sent"] - sent  # once: 4 x (256 B, 1 MiB, 4 MiB)
        self.model = cm.fit(self._calibration, self._codecs, comm.size)

    def _fit_trials(self, comm: Any, keys: List[str]) -> Tuple[cm.CostModel, np.ndarray]:
        """The model fitted on the trials' calls so far, and its table: per bucket (rows, in
        `keys` order) each method's typical call (_interquartile_mean; MISSING where not
        measured), then the bucket's hand-over offset. A bucket's time in one call is the least
        over ranks (the last rank to hand the bucket over does not wait: its time is the
        collective's; which rank is last changes from step to step, so the least is taken per
        call, then the middle half's mean)."""
        cols = list(self.methods)
        calls = _over_ranks(comm, [self._times.get((k, m), []) for k in keys for m in cols], "min")
        medians = [_interquartile_mean(t) if t else MISSING for t in calls]
        ready = comm.allreduce(
            np.array([float(np.median(self._ready.get(k, [0.0]))) for k in keys]), op="min"
        )
        table = np.column_stack([np.array(medians).reshape(len(keys), len(cols)), ready])
        trials = {
            m: [(k, self._nbytes[k], table[i, j]) for i, k in enumerate(keys) if table[i, j] < MISSING]
            for j, m in enumerate(cols)
        }
        return cm.fit(self._calibration or [], self._codecs, comm.size, trials), table

    def _step_times(self, comm: Any, names: Sequence[str]) -> Tuple[Dict[str, List[float]], float]:
        """Per candidate name its counted trial steps' windows (in order: the final's r-th from
        round r), and the trial steps' median end to end time (a typical step); every step the
        slowest rank's."""
        names = list(names)
        steps = _over_ranks(comm, [self._step_s.get(n, []) for n in names] + [self._full_s], "max")
        full = float(np.median(steps.pop() or [0.0]))
        return {n: t for n, t in zip(names, steps) if t}, full

    def _screen(self, comm: Any, keys: List[str], step: int) -> None:
        """The screen's end (module docstring, 3): its step medians, the model fitted on its
        calls and the model's per-bucket plan; the final's candidates (compression_model.finalists)."""
        windows, typical = self._step_times(comm, self.methods)
        self._screened = {n: float(np.median(t)) for n, t in windows.items()}
        self._typical = typical
        self.model, table = self._fit_trials(comm, keys)
        buckets = [(k, self._nbytes[k], table[i, -1]) for i, k in enumerate(keys)]
        plan = cm.decide(self.model, buckets, self.methods, self.margin, self.min_gain)
        self._plan = {d.key: d for d in plan}
        final = cm.finalists(self._screened, {d.key: d.method for d in plan}, self.finalists, typical)
        self._final = final if self.final_rounds and len(final) > 1 else []
        self._trial_end = self._screen_end + len(self._final) * self.final_rounds
        self._step_s.clear()  # the decision compares the final's steps only (they took turns)
        self._log(
            "screen",
            step=step,
            window_s=self._screened,
            typical_step_s=typical,
            plan={d.key: d.method for d in plan},
            finalists=[c.name for c in self._final],
        )

    def _decide(self, comm: Any, keys: List[str], step: int) -> None:
        """The trials' end (module docstring, 3): the candidate with the best measured steps
        (compression_model.choose; without a final, the screen's methods on their screening
        steps), every bucket's method from it, and the model fitted on every trial call for
        the predictions."""
        cols = list(self.methods)
        self.model, table = self._fit_trials(comm, keys)
        final: Optional[cm.FinalRounds] = None
        if self._final:
            candidates = self._final
            rounds, typical = self._step_times(comm, [c.name for c in self._final])
            windows = cm.paired_medians(rounds)
            final = cm.FinalRounds(rounds, self._calls_of(candidates, keys, table))
        else:
            candidates = [cm.Candidate(m) for m in cols]
            windows, typical = dict(self._screened), self._typical
        none_s = windows.get("none", self._screened.get("none"))
        winner, why = cm.choose(candidates, windows, none_s, typical, self.min_gain, self.step_margin, final)
        self.allowed = [m for m in cols if m in winner.methods() or m == "none"]
        if "none" in cols:
            j = cols.index("none")
            self._trial_none = {k: float(table[i, j]) for i, k in enumerate(keys) if table[i, j] < MISSING}
        physics = cm.fit(self._calibration or [], self._codecs, comm.size)
        self.decisions = {}
        for i, k in enumerate(keys):
            n, method = self._nbytes[k], winner.method(k)
            planned = self._plan.get(k) if winner.name == cm.PLAN else None
            reason = why + (f"; this bucket: {planned.reason}" if planned is not None else "")
            predicted = {m: self.model.predict(m, n, k) for m in cols}
            none_s = self.model.predict("none", n, k)
            d = cm.Decision(k, n, method, reason, self.model.predict(method, n, k), none_s, predicted)
            self.decisions[k] = d
            self._switch_path(k, [method])
            self._log(
                "decision",
                step=step,
                bucket=k,
                bytes=n,
                method=method,
                candidate=winner.name,
                reason=reason,
                predicted_s=d.predicted_s,
                predicted_gain_s=d.predicted_gain_s,
                predicted=predicted,
                measured_trial={m: float(table[i, j]) for j, m in enumerate(cols) if table[i, j] < MISSING},
                trial_window_s=windows,
                final_rounds_s=final.windows if final is not None else None,
                final_calls_s=final.calls if final is not None else None,
                screen_window_s=self._screened,
                typical_step_s=typical,
                physics_predicted={m: physics.predict(m, n) for m in cols},
            )
        self.decided_step = step + 1
        self._times.clear()
        self._ready.clear()
        self._step_s.clear()
        self._full_s.clear()
        self._calls = []
        self._learned.clear()

    def _calls_of(
        self, candidates: Sequence[cm.Candidate], keys: List[str], table: np.ndarray
    ) -> Dict[str, float]:
        """Per candidate the sum over buckets of each bucket's typical trial call with its method
        (the `table` of _fit_trials); a candidate with a call not measured is left out."""
        cols = list(self.methods)
        calls = {}
        for c in candidates:
            each = [
                table[i, cols.index(c.method(k))] if c.method(k) in cols else MISSING
                for i, k in enumerate(keys)
            ]
            if all(t < MISSING for t in each):
                calls[c.name] = float(sum(each))
        return calls

    def _switch_path(self, key: str, path: List[str]) -> None:
        self.path[key] = path
        self._calm[key] = 0

    def _run_check(self, comm: Any, step: int) -> None:
        """One allreduce (sum) of every checked sample, one (min) of the interval's call times; the
        verdicts and the drift."""
        checks, self._check = self._check, []
        parts = [both for _, _, both, _ in checks]  # none when nothing is compressed (every rank alike)
        total = None
        if parts:
            total = comm.allreduce(np.concatenate(parts).astype(np.float32), op="sum") / comm.size
        calls, self._calls = self._calls, []
        # as in the trials: each call's time is the least over ranks (the last to arrive waits not)
        (seconds,) = _over_ranks(comm, [[t for _, _, t in calls]], "min")
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
        if self.model is not None and calls:
            self._judge_prediction(step, [(k, m, t) for (k, m, _), t in zip(calls, seconds)])

    def _predict(self, key: str, method: str) -> Tuple[float, float, float]:
        """One call of (key, method): what the checks so far measured of it, as the mean (what
        predicts an interval's sum) and the median (each bucket's typical call), else both the
        model's prediction (fitted on the trials); and the model's prediction alone."""
        trial = self.model.predict(method, self._nbytes[key], key)
        learned = self._learned.get((key, method))
        if not learned:
            return trial, trial, trial
        return float(np.mean(learned)), float(np.median(learned)), trial

    def _judge_prediction(self, step: int, calls: List[Tuple[str, str, float]]) -> None:
        """The interval's measured communication against what was predicted for it (a `measured`
        event), the drift that re-decides, then the interval's calls learned for the next one.

        The trials' calls run in a few steps at the job's start, while each of the other methods
        takes its turn; on two shared cores their times sat 17-43% (median error) from the later
        calls' in 5 of 12 set-ups (run 13), steadily, one way. So the prediction for an interval
        is what the checks before it measured of the same bucket and method, once there is any
        (its mean for the sum; its median for the typical calls, as these are measured); the
        trials' model predicts the first interval after a decision (and a pair new to the
        checks) and is logged beside it (trial_predicted_s)."""
        # per (key, method): the predictions (sum, typical, the trials' model's) and the model's
        # uncompressed time
        predictions = {
            (k, m): (*self._predict(k, m), self.model.predict("none", self._nbytes[k], k))
            for k, m in {(k, m) for k, m, _ in calls}
        }
        per_bucket: Dict[str, List[float]] = {}  # key -> [measured, predicted] over the interval
        times: Dict[str, List[float]] = {}  # key -> its calls' times
        by_pair: Dict[Tuple[str, str], List[float]] = {}  # (key, method) -> its calls' times
        measured = predicted = predicted_typical = trial_predicted = uncompressed = trial_none = 0.0
        for key, method, t in calls:
            p, p_typical, trial, none = predictions[(key, method)]
            per = per_bucket.setdefault(key, [0.0, 0.0])
            per[0] += t
            per[1] += p
            times.setdefault(key, []).append(t)
            by_pair.setdefault((key, method), []).append(t)
            measured, predicted, trial_predicted = measured + t, predicted + p, trial_predicted + trial
            predicted_typical += p_typical
            uncompressed += none
            trial_none += self._trial_none.get(key, 0.0)
        # each bucket's median call times its calls: what a typical step took, robust to the odd
        # call a pause or a neighbour's burst stretched (the sum keeps those)
        typical = sum(float(np.median(t)) * len(t) for t in times.values())
        for pair, seconds in by_pair.items():  # learned after predicting: for the next interval
            learned = self._learned.setdefault(pair, [])
            learned += seconds
            del learned[:-LEARNED_CALLS]
        if predicted <= 0:
            return
        rel = (measured - predicted) / predicted
        typical_rel = (typical - predicted_typical) / predicted_typical
        # gains against the model's uncompressed time, and the trials' (none does not run once
        # decided; the trials' is 0 without none among the methods)
        self._log(
            "measured",
            step=step,
            measured_s=measured,
            predicted_s=predicted,
            relative=rel,
            typical_s=typical,
            typical_relative=typical_rel,
            predicted_typical_s=predicted_typical,
            trial_predicted_s=trial_predicted,
            trial_relative=(measured - trial_predicted) / trial_predicted if trial_predicted > 0 else None,
            predicted_gain_s=uncompressed - predicted,
            measured_gain_s=uncompressed - measured,
            measured_gain_vs_trials_s=trial_none - measured if trial_none > 0 else None,
            per_bucket=per_bucket,  # key -> [measured, predicted] seconds over the interval
        )
        # a change from what the checks before measured (the network, the step), two checks in a row
        self._drifted = self._drifted + 1 if abs(typical_rel) > self.drift else 0
        per_call = {k: sum(t) / len(t) for k, t in times.items()}
        if self._drifted >= 2 and self._another_would_win(per_call):
            self._redecide(
                step,
                f"measured communication {measured * 1e3:.1f} ms vs predicted "
                f"{predicted * 1e3:.1f} ms at two checks in a row",
            )

    def _another_would_win(self, per_call: Dict[str, float]) -> bool:
        """Whether, at its measured cost (key -> seconds per call over the interval), some
        bucket's method is no longer the best choice: it exceeds another allowed method's
        prediction by more than the margin. A drift that leaves every choice standing (sign
        measured at twice its prediction over a 1 Gbit/s link, still far below int8's or
        none's) is not worth new trial steps, which include uncompressed ones (164 ms each there
        for the 2.18M MLP)."""
        if self.model is None or len(self.allowed) < 2:
            return False
        for key, mine in per_call.items():
            current = self.path.get(key, ["none"])[-1]
            nbytes = self._nbytes.get(key)
            if nbytes is None:
                continue
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
        self._start_trials(step + 1)
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
            "trial_end": self._trial_end,  # as the screen set it (before: the most the trials may take)
            "screened": dict(self._screened),
            "typical": self._typical,
            "final": [[c.name, dict(c.plan)] for c in self._final],
            "decided_step": self.decided_step,
            "allowed": list(self.allowed),
            "call_step": self._call_step + bool(self._call_keys),  # (a resumed run starts a step)
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        for m, s in state["compressors"].items():
            self.compressor(m).load_state_dict(s)
        self.method_of = dict(state["method_of"])
        self._pending = {k: np.array(v, np.float32) for k, v in state["pending"].items()}
        self.path = {k: list(p) for k, p in state["path"].items()}
        self._calm = {k: 0 for k in self.path}
        self._start_trials(state["trial_start"])
        self._trial_end = state["trial_end"]
        self._screened, self._typical = dict(state["screened"]), state["typical"]
        self._final = [cm.Candidate(name, dict(plan)) for name, plan in state["final"]]
        self.decided_step = state["decided_step"]
        self.allowed = list(state["allowed"])
        self._call_step, self._call_keys = int(state.get("call_step", 0)), set()

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()


def _interquartile_mean(times: Sequence[float]) -> float:
    """The mean of the middle half of a bucket's trial calls: what it predicts is a sum of calls
    over a check interval. A first-ready bucket's calls are bimodal on shared cores (0.4-0.8
    or 2.5-4 ms for the transformer on 2 ranks, as the rest of the backward pass runs or not),
    and the median of 8 of them lands in either mode (predicted 0.58 ms, measured ~2 ms a call);
    the middle half's mean weighs both modes and still drops a pause's outlier."""
    t = np.sort(np.asarray(times, dtype=np.float64))
    cut = t.size // 4
    return float(t[cut : t.size - cut].mean())


def _over_ranks(comm: Any, lists: Sequence[Sequence[float]], op: str) -> List[List[float]]:
    """Element by element, the least ("min") or greatest ("max") over ranks of lists of timings
    (one allreduce; the lists may be ragged or empty: padding takes no part)."""
    width = max([len(x) for x in lists] + [0])
    width = int(comm.allreduce(np.array([width], np.float64), op="max")[0])
    pad = 1e300 if op == "min" else -1e300
    grid = np.full((len(lists), width), pad)
    for i, x in enumerate(lists):
        grid[i, : len(x)] = x
    grid = comm.allreduce(grid.reshape(-1), op=op).reshape(len(lists), width)
    return [[float(v) for v in row if abs(v) < 1e299] for row in grid]


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
