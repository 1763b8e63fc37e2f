"""The trials of ``compression="auto"``: calibration, the screen, the final and the decision.

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
   the slowest rank's. At the screen's end (:meth:`Trials.screen`) the calls fit the model
   (compression_model.fit), which plans a method per bucket (compression_model.decide:
   overlap, per-bucket costs); the final's candidates are the methods whose median window was
   within SCREEN_BAND of a step of the fastest's (uncompressed always, when within it), and the
   plan (compression_model.finalists, at most ``finalists``).
3. Final (``final_rounds`` rounds) and decision (:meth:`Trials.decide`): the candidates take
   turns a step each, so that what else the machine does falls on all of them alike; each one's
   time is the median over rounds of its window against its round's (compression_model.
   paired_medians: what slows a whole round cancels); the best wins (compression_model.choose:
   a compressed one only when it saved ``min_gain`` of a step against uncompressed, a gain the
   rounds resolve where both took turns; then the fastest, or where the rounds do not resolve
   its lead over others, of those the one whose calls took the least; with ``step_margin`` the
   least lossy within that fraction of a step of the fastest). A ``decision`` event per bucket:
   method, candidate, reason, the model's predictions and the trials' measurements.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import compression_model as cm
from .stats import interquartile_mean, over_ranks

MISSING = 1e30  # a trial table's entry where a method was not measured
Calibration = List[Tuple[float, float, float]]  # (dense bytes, bytes sent, seconds)


@dataclass
class Outcome:
    """What the trials decided."""

    model: cm.CostModel  # fitted on every trial call: the predictions
    decisions: Dict[str, cm.Decision]
    allowed: List[str]  # the winner's methods (and none): what a bucket DDP adds later may use
    trial_none: Dict[str, float]  # key -> its uncompressed trial call


class Trials:
    """The trial schedule (screen, then final) and what its steps measured."""

    def __init__(self, config: Any, log: Callable[..., None]):
        self.config, self._log = config, log
        self.calibration: Optional[Calibration] = None
        self.codecs: Dict[str, Dict[str, Any]] = {}
        self.calibration_bytes = 0  # what this rank sent calibrating (comm.stats()'s bytes_sent)
        self._times: Dict[Tuple[str, str], List[float]] = {}  # (key, method) -> trial seconds
        self._ready: Dict[str, List[float]] = {}  # key -> hand-over offsets in the trials
        # candidate -> its trial steps' windows; trial steps end to end (a typical step)
        self._windows: Dict[str, List[float]] = {}
        self._full: List[float] = []
        self._last_end: Optional[float] = None
        self.start(config.start_step)

    # -- the schedule ------------------------------------------------------------------------------
    def start(self, step: int) -> None:
        """Trials from `step`: the screen, then a final of at most `finalists` candidates."""
        c = self.config
        self.first = step
        self.screen_end = step + len(c.methods) * c.trial_repeats
        most = min(c.finalists, len(c.methods) + 1) if len(c.methods) > 1 else 0
        self.end = self.screen_end + most * c.final_rounds
        self.final: List[cm.Candidate] = []  # the final's candidates, in the order they take turns
        self.screened: Dict[str, float] = {}  # method -> median screening window (slowest rank's)
        self.plan: Dict[str, cm.Decision] = {}  # the model's per-bucket choice after the screen
        self.typical = 0.0

    def __contains__(self, step: int) -> bool:
        return self.first <= step < self.end

    def candidate(self, step: int) -> cm.Candidate:
        """The screen: each method for trial_repeats steps in turn; the final: the candidates one
        step each, in an order that rotates every round (so that none always follows another)."""
        if step < self.screen_end:
            return cm.Candidate(self.config.methods[(step - self.first) // self.config.trial_repeats])
        rnd, pos = divmod(step - self.screen_end, len(self.final))
        return self.final[(pos + rnd) % len(self.final)]

    def counted(self, step: int) -> bool:
        """Whether a trial step's times count: not a method's first screening step (it warms
        the method up: the compressor's first call allocates its residuals)."""
        return step >= self.screen_end or (step - self.first) % self.config.trial_repeats != 0

    # -- measuring -------------------------------------------------------------------------------
    def calibrate(self, comm: Any) -> cm.CostModel:
        """Collective, once: the calibration, and the model fitted on it alone."""
        sent = comm.stats()["bytes_sent"]
        self.calibration, self.codecs = calibrate(comm, cm.with_escalations(self.config.methods))
        self.calibration_bytes = comm.stats()["bytes_sent"] - sent  # once: 4 x (256 B, 1 MiB, 4 MiB)
        return cm.fit(self.calibration, self.codecs, comm.size)

    def record(self, key: str, method: str, step: int, seconds: float, ready_offset: float) -> None:
        if self.counted(step):
            self._times.setdefault((key, method), []).append(seconds)
            self._ready.setdefault(key, []).append(ready_offset)

    def end_step(self, step: int, now: float, ready0: Optional[float]) -> None:
        """A step ended at `now` (its first bucket handed over at ready0)."""
        trial = step in self
        if trial and self.counted(step) and ready0 is not None:
            self._windows.setdefault(self.candidate(step).name, []).append(now - ready0)
        if trial and self._last_end is not None:
            self._full.append(now - self._last_end)
        self._last_end = now

    def restart_clock(self) -> None:
        """The next step's time leaves the work just done (the screen's) out."""
        self._last_end = time.perf_counter()

    # -- the screen and the decision ------------------------------------------------------------
    def fit(self, comm: Any, keys: List[str], nbytes: Dict[str, int]) -> Tuple[cm.CostModel, np.ndarray]:
        """The model fitted on the trials' calls so far, and its table: per bucket (rows, in
        `keys` order) each method's typical call (interquartile_mean; MISSING where not
        measured), then the bucket's hand-over offset. A bucket's time in one call is the least
        over ranks (the last rank to hand the bucket over does not wait: its time is the
        collective's; which rank is last changes from step to step, so the least is taken per
        call, then the middle half's mean)."""
        cols = list(self.config.methods)
        calls = over_ranks(comm, [self._times.get((k, m), []) for k in keys for m in cols], "min")
        medians = [interquartile_mean(t) if t else MISSING for t in calls]
        ready = comm.allreduce(
            np.array([float(np.median(self._ready.get(k, [0.0]))) for k in keys]), op="min"
        )
        table = np.column_stack([np.array(medians).reshape(len(keys), len(cols)), ready])
        trials = {
            m: [(k, nbytes[k], table[i, j]) for i, k in enumerate(keys) if table[i, j] < MISSING]
            for j, m in enumerate(cols)
        }
        return cm.fit(self.calibration or [], self.codecs, comm.size, trials), table

    def step_times(self, comm: Any, names: Sequence[str]) -> Tuple[Dict[str, List[float]], float]:
        """Per candidate name its counted trial steps' windows (in order: the final's r-th from
        round r), and the trial steps' median end to end time (a typical step); every step the
        slowest rank's."""
        names = list(names)
        steps = over_ranks(comm, [self._windows.get(n, []) for n in names] + [self._full], "max")
        full = float(np.median(steps.pop() or [0.0]))
        return {n: t for n, t in zip(names, steps) if t}, full

    def screen(self, comm: Any, keys: List[str], nbytes: Dict[str, int], step: int) -> cm.CostModel:
        """The screen's end: its step medians, the model fitted on its calls and the model's
        per-bucket plan; the final's candidates (compression_model.finalists)."""
        c = self.config
        windows, self.typical = self.step_times(comm, c.methods)
        self.screened = {n: float(np.median(t)) for n, t in windows.items()}
        model, table = self.fit(comm, keys, nbytes)
        buckets = [(k, nbytes[k], table[i, -1]) for i, k in enumerate(keys)]
        plan = cm.decide(model, buckets, c.methods, c.margin, c.min_gain)
        self.plan = {d.key: d for d in plan}
        final = cm.finalists(self.screened, {d.key: d.method for d in plan}, c.finalists, self.typical, c.screen_band)
        self.final = final if c.final_rounds and len(final) > 1 else []
        self.end = self.screen_end + len(self.final) * c.final_rounds
        self._windows.clear()  # the decision compares the final's steps only (they took turns)
        self._log("screen", step=step, window_s=self.screened, typical_step_s=self.typical,
                  plan={d.key: d.method for d in plan}, finalists=[f.name for f in self.final])  # fmt: skip
        return model

    def decide(self, comm: Any, keys: List[str], nbytes: Dict[str, int], step: int) -> Outcome:
        """The trials' end: the candidate with the best measured steps (compression_model.choose;
        without a final, the screen's methods on their screening steps), every bucket's method
        from it, and the model fitted on every trial call for the predictions."""
        c, cols = self.config, list(self.config.methods)
        model, table = self.fit(comm, keys, nbytes)
        final: Optional[cm.FinalRounds] = None
        if self.final:
            candidates = self.final
            rounds, typical = self.step_times(comm, [f.name for f in self.final])
            windows = cm.paired_medians(rounds)
            final = cm.FinalRounds(rounds, self._calls_of(candidates, keys, table))
        else:
            candidates = [cm.Candidate(m) for m in cols]
            windows, typical = dict(self.screened), self.typical
        none_s = windows.get("none", self.screened.get("none"))
        winner, why = cm.choose(candidates, windows, none_s, typical, c.min_gain, c.step_margin, final)
        measured = {k: {m: float(table[i, j]) for j, m in enumerate(cols) if table[i, j] < MISSING}
                    for i, k in enumerate(keys)}  # fmt: skip
        context = dict(candidate=winner.name, trial_window_s=windows, screen_window_s=self.screened,
                       final_rounds_s=final.windows if final is not None else None,
                       final_calls_s=final.calls if final is not None else None, typical_step_s=typical)  # fmt: skip
        physics = cm.fit(self.calibration or [], self.codecs, comm.size)
        decisions = {k: self._decision(model, physics, k, nbytes[k], winner, why, step, measured[k], context)
                     for k in keys}  # fmt: skip
        self._times.clear()
        self._ready.clear()
        self._windows.clear()
        self._full.clear()
        return Outcome(model, decisions, [m for m in cols if m in winner.methods() or m == "none"],
                       {k: t["none"] for k, t in measured.items() if "none" in t})  # fmt: skip

    def _decision(self, model: cm.CostModel, physics: cm.CostModel, key: str, n: int, winner: cm.Candidate, why: str,
                  step: int, measured: Dict[str, float], context: Dict[str, Any]) -> cm.Decision:  # fmt: skip
        """One bucket's decision, logged with the model's predictions and the trials' measurements."""
        cols = list(self.config.methods)
        method = winner.method(key)
        planned = self.plan.get(key) if winner.name == cm.PLAN else None
        reason = why + (f"; this bucket: {planned.reason}" if planned is not None else "")
        predicted = {m: model.predict(m, n, key) for m in cols}
        d = cm.Decision(
            key, n, method, reason, model.predict(method, n, key), model.predict("none", n, key), predicted
        )
        self._log("decision", step=step, bucket=key, bytes=n, method=method, reason=reason,
                  predicted_s=d.predicted_s, predicted_gain_s=d.predicted_gain_s, predicted=predicted,
                  measured_trial=measured, physics_predicted={m: physics.predict(m, n) for m in cols},
                  **context)  # fmt: skip
        return d

    def _calls_of(
        self, candidates: Sequence[cm.Candidate], keys: List[str], table: np.ndarray
    ) -> Dict[str, float]:
        """Per candidate the sum over buckets of each bucket's typical trial call with its method
        (the `table` of fit); a candidate with a call not measured is left out."""
        cols = list(self.config.methods)
        calls = {}
        for cand in candidates:
            each = [table[i, cols.index(cand.method(k))] if cand.method(k) in cols else MISSING
                    for i, k in enumerate(keys)]  # fmt: skip
            if all(t < MISSING for t in each):
                calls[cand.name] = float(sum(each))
        return calls

    def state_dict(self) -> Dict[str, Any]:
        return {"trial_start": self.first, "trial_end": self.end, "screened": dict(self.screened),
                "typical": self.typical, "final": [[f.name, dict(f.plan)] for f in self.final]}  # fmt: skip

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.start(state["trial_start"])
        self.end = state["trial_end"]  # as the screen set it (before: the most the trials may take)
        self.screened, self.typical = dict(state["screened"]), state["typical"]
        self.final = [cm.Candidate(name, dict(plan)) for name, plan in state["final"]]


def calibrate(comm: Any, methods: Sequence[str]) -> Tuple[Calibration, Dict[str, Dict[str, Any]]]:
    """Collective: uncompressed allreduces of 256 B, 1 MiB and 4 MiB (median of 3 after a
    warm-up; dense bytes, bytes sent, seconds) and the methods' kernel rates, every timing the
    slowest rank's, so every rank fits the same model."""
    own = []
    for nbytes in (256, 1 << 20, 4 << 20):
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
