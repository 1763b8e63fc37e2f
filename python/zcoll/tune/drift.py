"""After a decision: each check interval's measured communication against what was predicted for
it (a ``measured`` event), and whether it drifted far enough to run the trials again.

The trials' calls run in a few steps at the job's start, while each of the other methods takes
its turn; on two shared cores their times sat 17-43% (median error) from the later calls' in 5
of 12 set-ups, steadily, one way. So the prediction for an interval is what the checks before it
measured of the same bucket and method, once there is any (its mean for the sum; its median for
the typical calls, as these are measured); the trials' model predicts the first interval after a
decision (and a pair new to the checks) and is logged beside it (trial_predicted_s).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .stats import over_ranks

LEARNED_CALLS = 512  # a (bucket, method)'s latest decided calls that predict its next interval

Call = Tuple[str, str, float]  # (key, method, seconds)


class DriftWatch:
    """The interval's calls, what the checks so far learned of each (bucket, method), and the
    count of checks in a row that drifted."""

    def __init__(self, config: Any, log: Callable[..., None]):
        self.config, self._log = config, log
        self.calls: List[Call] = []  # since the last check
        self.learned: Dict[Tuple[str, str], List[float]] = {}
        self.trial_none: Dict[str, float] = {}  # key -> its uncompressed time in the trials
        self._drifted = 0

    def reset(self) -> None:
        """A new decision: nothing learned of the old one counts."""
        self.calls, self._drifted = [], 0
        self.learned.clear()

    def predict(self, model: Any, nbytes: int, key: str, method: str) -> Tuple[float, float, float]:
        """One call of (key, method): what the checks so far measured of it, as the mean (what
        predicts an interval's sum) and the median (each bucket's typical call), else both the
        model's prediction (fitted on the trials); and the model's prediction alone."""
        trial = model.predict(method, nbytes, key)
        learned = self.learned.get((key, method))
        if not learned:
            return trial, trial, trial
        return float(np.mean(learned)), float(np.median(learned)), trial

    def check(self, comm: Any, step: int, model: Any, nbytes: Dict[str, int], in_use: Dict[str, List[str]],
              allowed: Sequence[str]) -> Optional[str]:  # fmt: skip
        """Collective: the interval's calls, each the least over ranks (the last to arrive waits
        not), judged; returns why the trials should run again, or None."""
        calls, self.calls = self.calls, []
        (seconds,) = over_ranks(comm, [[t for _, _, t in calls]], "min")
        if model is None or not calls:
            return None
        return self.judge(
            step, [(k, m, t) for (k, m, _), t in zip(calls, seconds)], model, nbytes, in_use, allowed
        )

    def judge(self, step: int, calls: List[Call], model: Any, nbytes: Dict[str, int], in_use: Dict[str, List[str]],
              allowed: Sequence[str]) -> Optional[str]:  # fmt: skip
        """The interval's measured communication against its prediction (a `measured` event),
        then its calls learned for the next interval; the reason to re-decide after two
        drifted checks in a row when another method would now win."""
        pairs = {(k, m) for k, m, _ in calls}
        predictions = {
            (k, m): (*self.predict(model, nbytes[k], k, m), model.predict("none", nbytes[k], k))
            for k, m in pairs
        }
        totals = dict.fromkeys(
            ("measured", "predicted", "predicted_typical", "trial_predicted", "uncompressed", "trial_none"),
            0.0,
        )
        per_bucket: Dict[str, List[float]] = {}  # key -> [measured, predicted] over the interval
        times: Dict[str, List[float]] = {}  # key -> its calls' times
        for key, method, t in calls:
            p, p_typical, trial, none = predictions[(key, method)]
            per = per_bucket.setdefault(key, [0.0, 0.0])
            per[0], per[1] = per[0] + t, per[1] + p
            times.setdefault(key, []).append(t)
            for name, v in zip(totals, (t, p, p_typical, trial, none, self.trial_none.get(key, 0.0))):
                totals[name] += v
        self._learn(calls)
        if totals["predicted"] <= 0:
            return None
        # each bucket's median call times its calls: what a typical step took, robust to the odd
        # call a pause or a neighbour's burst stretched (the sum keeps those)
        typical = sum(float(np.median(t)) * len(t) for t in times.values())
        typical_rel = (typical - totals["predicted_typical"]) / totals["predicted_typical"]
        self._log_measured(step, totals, typical, typical_rel, per_bucket)
        # a change from what the checks before measured (the network, the step), two checks in a row
        self._drifted = self._drifted + 1 if abs(typical_rel) > self.config.drift else 0
        per_call = {k: sum(t) / len(t) for k, t in times.items()}
        if self._drifted >= 2 and self.another_would_win(per_call, model, nbytes, in_use, allowed):
            return (f"measured communication {totals['measured'] * 1e3:.1f} ms vs predicted "
                    f"{totals['predicted'] * 1e3:.1f} ms at two checks in a row")  # fmt: skip
        return None

    def _learn(self, calls: List[Call]) -> None:
        """Learned after predicting: for the next interval."""
        for key, method, t in calls:
            learned = self.learned.setdefault((key, method), [])
            learned.append(t)
        for learned in self.learned.values():
            del learned[:-LEARNED_CALLS]

    def _log_measured(self, step: int, totals: Dict[str, float], typical: float, typical_rel: float,
                      per_bucket: Dict[str, List[float]]) -> None:  # fmt: skip
        """Gains against the model's uncompressed time, and the trials' (none does not run once
        decided; the trials' is 0 without none among the methods)."""
        measured, predicted, trial_predicted = (
            totals["measured"],
            totals["predicted"],
            totals["trial_predicted"],
        )
        self._log(
            "measured",
            step=step,
            measured_s=measured,
            predicted_s=predicted,
            relative=(measured - predicted) / predicted,
            typical_s=typical,
            typical_relative=typical_rel,
            predicted_typical_s=totals["predicted_typical"],
            trial_predicted_s=trial_predicted,
            trial_relative=(measured - trial_predicted) / trial_predicted if trial_predicted > 0 else None,
            predicted_gain_s=totals["uncompressed"] - predicted,
            measured_gain_s=totals["uncompressed"] - measured,
            measured_gain_vs_trials_s=totals["trial_none"] - measured if totals["trial_none"] > 0 else None,
            per_bucket=per_bucket,  # key -> [measured, predicted] seconds over the interval
        )

    def another_would_win(self, per_call: Dict[str, float], model: Any, nbytes: Dict[str, int],
                          in_use: Dict[str, List[str]], allowed: Sequence[str]) -> bool:  # fmt: skip
        """Whether, at its measured cost (key -> seconds per call over the interval), some
        bucket's method is no longer the best choice: it exceeds another allowed method's
        prediction by more than the margin. A drift that leaves every choice standing (sign
        measured at twice its prediction over a 1 Gbit/s link, still far below int8's or
        none's) is not worth new trial steps, which include uncompressed ones (164 ms each there
        for the 2.18M MLP)."""
        if model is None or len(allowed) < 2:
            return False
        for key, mine in per_call.items():
            current = in_use.get(key, ["none"])[-1]
            if key not in nbytes:
                continue
            others = [model.predict(m, nbytes[key], key) for m in allowed if m != current]
            if others and mine > min(others) * (1 + self.config.margin):
                return True
        return False
