"""The trials of ``compression="auto"``: calibration, side trials and the decision. No candidate
ever changes the model before it is chosen.

1. Calibrate (first bucket): a few uncompressed allreduces of 256 B (the per-call cost) and the
   kernel rates of every method (and of what the guard may escalate to) on a small sample; the
   slowest rank's numbers on every rank, so every rank fits the same model (:func:`calibrate`).
   The cost per byte comes from the trial steps' own exact calls (their sizes are the buckets'):
   large calibration messages would cost seconds on a slow link before the first step.
2. Trial steps (``trial_repeats`` from ``start_step``; the first warms the candidates up and is
   not counted): every bucket is averaged exactly, and that is what the model gets; beside it each
   candidate averages a copy of the same gradient through its own compressor (its own
   error-feedback residuals, carried from call to call as if it were in use). Per call: each
   candidate's time (the least over ranks: the last rank to arrive did not wait), its result's
   relative error and cosine against the exact average (identical on every rank: so are both
   results), each bucket's hand-over offset in its step, and each step's window (from its first
   hand-over to its last bucket's end).
3. Decision (:meth:`Trials.decide`): the model (compression_model.fit) reproduces every measured
   call; the candidates whose median error is within ``error_bound`` may be chosen; when the
   exact average's communication is predicted to leave no more than ``hidden`` of a step exposed,
   none is chosen (the backward pass hides it); else per bucket compression_model.decide (the
   least lossy within ``margin`` of the fastest, compressed only when it saves ``min_gain``,
   lossier than bf16 only when it saves ``min_gain`` against bf16, less lossy where the step's
   overlap hides the difference). A ``decision`` event per bucket: method, reason, the predicted
   call time and error of every candidate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..compression.methods import make_compressor
from . import compression_model as cm
from .guard import relative_error
from .stats import as_array, interquartile_mean, over_ranks

Calibration = List[Tuple[float, float, float]]  # (dense bytes, bytes sent, seconds)


@dataclass
class Outcome:
    """What the trials decided."""

    model: cm.CostModel  # fitted on every trial call: the predictions
    decisions: Dict[str, cm.Decision]
    allowed: List[str]  # the methods a bucket DDP adds later may use
    trial_none: Dict[str, float]  # key -> its exact trial call


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """cos(a, b) (1 when either is 0); float32 dot products: a judgement, not an exact sum."""
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return float(np.dot(a, b)) / (na * nb) if na > 0 and nb > 0 else 1.0


class Trials:
    """The trial schedule and what its calls measured."""

    def __init__(self, config: Any, log: Callable[..., None]):
        self.config, self._log = config, log
        self.calibration: Optional[Calibration] = None
        self.codecs: Dict[str, Dict[str, Any]] = {}
        self.calibration_bytes = 0  # what this rank sent calibrating (comm.stats()'s bytes_sent)
        self._side: Dict[str, Any] = {}  # method -> its compressor on the side (own residuals)
        self._times: Dict[Tuple[str, str], List[float]] = {}  # (key, method) -> seconds per call
        self._errors: Dict[Tuple[str, str], List[Tuple[float, float]]] = {}  # -> (relative, cosine)
        self._ready: Dict[str, List[float]] = {}  # key -> hand-over offsets in its step
        self._wire: Dict[str, float] = {}  # key -> bytes this rank sent in its exact call
        self._windows: List[
            float
        ] = []  # counted trial steps, first hand-over to last end, less the side calls
        self._side_s = 0.0  # this step's side calls so far
        self.start(config.start_step)

    def start(self, step: int) -> None:
        self.first, self.end = step, step + self.config.trial_repeats
        self._side.clear()  # a new round of trials starts the candidates' residuals afresh

    def __contains__(self, step: int) -> bool:
        return self.first <= step < self.end

    def counted(self, step: int) -> bool:
        return step > self.first  # the first trial step allocates the candidates' residuals

    @property
    def candidates(self) -> List[str]:
        return [m for m in self.config.methods if m != "none"]

    def calibrate(self, comm: Any) -> cm.CostModel:
        """Collective, once: the calibration, and the model fitted on it alone."""
        sent = comm.stats()["bytes_sent"]
        self.calibration, self.codecs = calibrate(comm, cm.with_escalations(self.config.methods))
        self.calibration_bytes = comm.stats()["bytes_sent"] - sent  # once: 4 x 256 B
        return cm.fit(self.calibration, self.codecs, comm.size)

    def run(self, comm: Any, buf: Any, key: str, step: int, ready_offset: float) -> Any:
        """Collective: buf averaged exactly (returned), and each candidate beside it on a copy."""
        x = as_array(buf)
        grad = x.copy()  # the average below overwrites the bucket
        sent = comm.stats()["bytes_sent"]
        t0 = time.perf_counter()
        out = comm.allreduce(buf, op="avg", out=buf)
        exact = as_array(out)
        calls = [("none", time.perf_counter() - t0)]
        self._wire[key] = float(comm.stats()["bytes_sent"] - sent)
        order = self.candidates
        shift = step % len(order) if order else 0
        for method in order[shift:] + order[:shift]:  # rotated: none always follows another
            side = grad.copy()
            c = self._side.setdefault(method, make_compressor(method))
            t0 = time.perf_counter()
            comm.allreduce(side, op="avg", compression=c, key=key, out=side)
            calls.append((method, time.perf_counter() - t0))
            self._side_s += calls[-1][1]
            if self.counted(step):
                self._errors.setdefault((key, method), []).append(
                    (relative_error(side, exact), cosine(side, exact))
                )
        if self.counted(step):
            for method, seconds in calls:
                self._times.setdefault((key, method), []).append(seconds)
            self._ready.setdefault(key, []).append(ready_offset)
        return out

    def end_step(self, step: int, window: Optional[float]) -> None:
        """A trial step ended; window: from its first hand-over to its last bucket's end (the
        side calls are taken out: they are the trials' cost, not the step's)."""
        if step in self and self.counted(step) and window is not None:
            self._windows.append(window - self._side_s)
        self._side_s = 0.0

    def decide(self, comm: Any, keys: List[str], nbytes: Dict[str, int], step: int) -> Outcome:
        """Collective: the trials' end (module docstring, 3)."""
        c, cols = self.config, ["none"] + self.candidates
        calls = over_ranks(comm, [self._times.get((k, m), []) for k in keys for m in cols], "min")
        (windows,) = over_ranks(comm, [self._windows], "max")
        ready = comm.allreduce(
            np.array([float(np.median(self._ready.get(k, [0.0]))) for k in keys]), op="min"
        )
        measured = {k: {m: interquartile_mean(calls[i * len(cols) + j]) for j, m in enumerate(cols)
                        if calls[i * len(cols) + j]} for i, k in enumerate(keys)}  # fmt: skip
        points = (self.calibration or []) + [(float(nbytes[k]), self._wire.get(k, 0.0), t["none"])
                                             for k, t in measured.items() if "none" in t]  # fmt: skip
        model = cm.fit(points, self.codecs, comm.size,
                       {m: [(k, nbytes[k], t[m]) for k, t in measured.items() if m in t] for m in cols})  # fmt: skip
        errors = self._error_summary(keys, nbytes)
        step_s = float(np.median(windows)) if windows else 0.0
        buckets = [(k, nbytes[k], float(r)) for k, r in zip(keys, ready)]
        exposed = cm.exposed([model.predict("none", n, k) for k, n, _ in buckets], [r for _, _, r in buckets])
        plan, allowed = self._plan(model, buckets, errors, exposed, step_s)
        context = dict(trial_step_s=step_s, exposed_none_s=exposed, error_bound=c.error_bound,
                       trial_error={m: {"relative": e[0], "cosine": e[1]} for m, e in errors.items()})  # fmt: skip
        for d in plan:
            self._log("decision", step=step, bucket=d.key, bytes=d.nbytes, method=d.method, reason=d.reason,
                      predicted_s=d.predicted_s, predicted_gain_s=d.predicted_gain_s, predicted=d.predicted,
                      predicted_error=errors.get(d.method, (0.0, 1.0))[0], measured_trial=measured[d.key], **context)  # fmt: skip
        self._times.clear()
        self._errors.clear()
        self._ready.clear()
        self._windows.clear()
        return Outcome(
            model,
            {d.key: d for d in plan},
            allowed,
            {k: t["none"] for k, t in measured.items() if "none" in t},
        )

    def _plan(self, model: cm.CostModel, buckets: List[Tuple[str, int, float]], errors: Dict[str, Tuple[float, float]],
              exposed: float, step_s: float) -> Tuple[List[cm.Decision], List[str]]:  # fmt: skip
        """Each bucket's decision and the methods a later bucket may use (module docstring, 3).
        One method given (a guarded fixed method): that method, whatever the trials measured."""
        c = self.config
        if len(c.methods) == 1:
            return cm.decide(model, buckets, c.methods, c.margin, c.min_gain), list(c.methods)
        if "none" in c.methods and exposed <= c.hidden * step_s:
            why = (f"communication hidden behind the backward pass: uncompressed leaves {1e3 * exposed:.2f} ms of "
                   f"a {1e3 * step_s:.2f} ms step exposed (at most {c.hidden:.0%})")  # fmt: skip
            cols = ["none"] + self.candidates
            plan = [cm.Decision(k, n, "none", why, model.predict("none", n, k), model.predict("none", n, k),
                                {m: model.predict(m, n, k) for m in cols}) for k, n, _ in buckets]  # fmt: skip
            return plan, ["none"]
        allowed = ["none"] + [m for m in self.candidates if errors.get(m, (np.inf,))[0] <= c.error_bound]
        usable = [m for m in allowed if m in c.methods] or ["none"]
        return cm.decide(model, buckets, usable, c.margin, c.min_gain), allowed

    def _error_summary(self, keys: List[str], nbytes: Dict[str, int]) -> Dict[str, Tuple[float, float]]:
        """Per candidate: the median over its counted calls of the relative error and cosine,
        every bucket weighted by its size (its share of the step's gradient)."""
        out = {}
        for m in self.candidates:
            rel = [(e, nbytes[k]) for k in keys for e, _ in self._errors.get((k, m), [])]
            cos = [(x, nbytes[k]) for k in keys for _, x in self._errors.get((k, m), [])]
            if rel:
                out[m] = (_weighted_median(rel), _weighted_median(cos))
        return out

    def state_dict(self) -> Dict[str, Any]:
        return {"trial_start": self.first, "trial_end": self.end}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.start(state["trial_start"])
        self.end = state["trial_end"]


def _weighted_median(pairs: Sequence[Tuple[float, float]]) -> float:
    values = sorted(pairs)
    half, acc = sum(w for _, w in values) / 2, 0.0
    for v, w in values:
        acc += w
        if acc >= half:
            return float(v)
    return float(values[-1][0])


def calibrate(
    comm: Any, methods: Sequence[str], sizes: Sequence[int] = (256,)
) -> Tuple[Calibration, Dict[str, Dict[str, Any]]]:
    """Collective: uncompressed allreduces of each of `sizes` bytes (median of 3 after a warm-up;
    dense bytes, bytes sent, seconds) and the methods' kernel rates on a sample of 64 Ki floats,
    every timing the slowest rank's, so every rank fits the same model."""
    own = []
    for nbytes in sizes:
        t = np.zeros(max(1, nbytes // 4), np.float32)
        times, wire = [], 0
        for i in range(4):
            sent = comm.stats()["bytes_sent"]
            t0 = time.perf_counter()
            comm.allreduce(t, op="sum", out=t)
            if i:
                times.append(time.perf_counter() - t0)
                wire = comm.stats()["bytes_sent"] - sent
        own.append((float(nbytes), float(wire), float(np.median(times))))
    codecs = cm.codec_rates([m for m in methods if m != "none"], elements=1 << 16)
    names = sorted(codecs)
    rates = [codecs[m][k] for m in names for k in ("encode_s_per_byte", "decode_s_per_byte")]
    vec = comm.allreduce(np.array([s for _, _, s in own] + rates, np.float64), op="max")
    for i, m in enumerate(names):
        codecs[m]["encode_s_per_byte"] = float(vec[len(own) + 2 * i])
        codecs[m]["decode_s_per_byte"] = float(vec[len(own) + 2 * i + 1])
    return [(b, w, float(s)) for (b, w, _), s in zip(own, vec[: len(own)])], codecs
