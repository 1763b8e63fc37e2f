"""The per-bucket cost model and decision behind ``compression="auto"`` (zcoll.tune.auto_compression)
and ``zcoll.torch.recommend``: which method each DDP bucket should travel with.

Model (the terms of zcoll.observe.step_model.LinkModel, the step model of ``zcoll report``, per bucket):

1. time(method, bucket b of n dense bytes) = alpha_m + offset_b + pair_mb
                                             + max(beta * wire(method, n), codec(method, n))

   - beta: seconds per byte a rank sends, from allreduces of several sizes through the group
     (the calibration); it is the group's measured rate, so the tiers it crosses (shared
     memory, the network) are in it;
   - wire: bytes a rank sends: 2(p-1)/p n uncompressed or through a ring codec (times its
     payload ratio), (p-1) n times the payload ratio for top-k's allgather;
   - codec: encode + decode kernel time at the measured rates (the compressed algorithms
     pipeline it with the transfer, hence the max);
   - alpha_m + offset_b: what the trial steps' calls took beyond the max term, split into a
     per-call cost per method and an offset per bucket (its place in the step: the backward
     computation it shares the cores with), fitted on this job (median polish); before any
     trial, alpha is the calibration's smallest allreduce and there is no offset;
   - pair_mb: what remains of a measured (method, bucket) pair after those (the cores a bucket
     shares with the backward pass slow methods unequally), so each measured pair is
     reproduced; pairs not measured are extrapolated by the additive terms.
2. What the step's overlap hides: bucket j is handed over at ready_j (measured, from the first
   bucket's hand-over); one worker runs the buckets in order, so bucket j ends at
   max(ready_j, end_{j-1}) + time_j, and the step pays exposed = max(0, end_last - ready_last).

Decision (:func:`decide`; deterministic, so identical inputs give identical decisions on every
rank):

1. per bucket, among ``methods``, the fastest; the least lossy (LOSSINESS order) within
   ``margin`` of it; none (when a candidate) when that saves less than ``min_gain`` of the
   uncompressed time; bf16 (REFERENCE, when a candidate) when a lossier pick saves less than
   ``min_gain`` of bf16's time;
2. then, bucket by bucket, the least lossy method that does not make the exposed time longer
   (by more than ``tolerance_s``): a bucket hidden behind the backward pass stays uncompressed.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..compression.methods import METHODS, make_compressor
from ..observe.step_model import LinkModel, fit_link

# Least lossy first (fp16 is left out: bf16 cannot overflow).
LOSSINESS = ("none", "bf16", "int8", "int4", "top10%", "sign", "top1%")
# What "auto" tries by default: 16-bit is the reference a lossier method has to beat, and int8 is
# as lossy as it goes without a recipe (int4, sign and top-k keep a model's quality only with a
# warm-up and momentum correction, which the caller's optimizer has to take part in).
CANDIDATES = ("none", "bf16", "int8")
REFERENCE = "bf16"
# Guarded compression's escalation ladder (the issue's: sign/top-k -> int4 -> int8 -> bf16 -> none).
ESCALATION = {
    "top1%": "int4",
    "top10%": "int4",
    "sign": "int4",
    "int4": "int8",
    "int8": "bf16",
    "fp16": "none",
    "bf16": "none",
}


def with_escalations(methods: Sequence[str]) -> Tuple[str, ...]:
    """`methods` and every method the guard may escalate them to."""
    out = list(dict.fromkeys(methods))
    for m in out:  # grows while it runs
        up = ESCALATION.get(m)
        if up is not None and up not in out:
            out.append(up)
    return tuple(out)


@dataclass
class CostModel:
    """time(method, dense bytes) of one bucket's allreduce (see the module docstring)."""

    link: LinkModel
    alpha: Dict[str, float] = field(default_factory=dict)  # fitted per-call cost per method
    offset: Dict[str, float] = field(default_factory=dict)  # fitted per bucket (its place in the step)
    # what a measured (method, bucket) pair took beyond transfer + alpha + offset: the terms above
    # are additive, the cores a bucket shares with the backward pass slow methods unequally
    pair: Dict[Tuple[str, str], float] = field(default_factory=dict)

    def transfer(self, method: str, nbytes: float) -> float:
        """The bandwidth and kernel term, without the per-call cost."""
        return max(self.link.beta * self.link.wire(method, nbytes), self.link.codec_time(method, nbytes))

    def predict(self, method: str, nbytes: float, key: Optional[str] = None) -> float:
        """Seconds of one bucket's allreduce: a measured (method, bucket) pair exactly as measured
        (also when faster than the transfer term: a token-bucket link sends a small payload at
        its burst rate, faster than the calibration's large allreduces); any other pair by the
        additive terms, never less than its kernels plus the smallest allreduce (the fitted
        terms are negative where the calibration overestimated the transfer)."""
        t = (
            self.transfer(method, nbytes)
            + self.alpha.get(method, self.link.alpha)
            + self.offset.get(key, 0.0)
        )
        if (method, key) in self.pair:
            return t + self.pair[(method, key)]
        return max(t, self.link.codec_time(method, nbytes) + self.link.alpha)

    def describe(self) -> Dict[str, Any]:
        return {
            "alpha_s": self.link.alpha,
            "beta_s_per_byte": self.link.beta,
            "gbps": 8e-9 / self.link.beta if self.link.beta > 0 else math.inf,
            "ranks": self.link.ranks,
            "alpha_per_method_s": dict(self.alpha),
            "offset_per_bucket_s": dict(self.offset),
            "pair_s": {f"{m} {k}": v for (m, k), v in sorted(self.pair.items())},
            "codecs": {
                m: {k: c[k] for k in ("encode_s_per_byte", "decode_s_per_byte", "payload_ratio", "exchange")}
                for m, c in self.link.codecs.items()
            },
        }


def fit(
    calibration: Sequence[Tuple[float, float, float]],
    codecs: Dict[str, Dict[str, Any]],
    ranks: int,
    trials: Optional[Dict[str, Sequence[Tuple[str, float, float]]]] = None,
) -> CostModel:
    """The model from the calibration (dense bytes, bytes sent, seconds) of uncompressed
    allreduces, the codec rates (format of LinkModel.codecs) and, when given, the trial measurements
    {method: [(bucket key, dense bytes, seconds)]}: what the measurements took beyond the
    transfer term, split additively into a per-call cost per method and an offset per bucket
    (what its place in the step adds: the computation it competes with for the cores), by
    Tukey's median polish (medians, so one slow trial moves neither much); what remains of each
    measured pair is kept too (CostModel.pair), so the model reproduces every pair the trials
    measured and extrapolates by the additive terms to pairs they did not (a new bucket, an
    escalation)."""
    points = [{"bytes": b, "wire": w, "seconds": s} for b, w, s in calibration]
    link = fit_link([], "none", codecs, ranks, {"points": points}, None)
    link.wire_per_byte = 2.0 * (ranks - 1) / ranks
    if calibration:
        b, w, s = min(calibration)
        link.alpha = max(0.0, s - link.beta * w)
    model = CostModel(link)
    extra = {(m, k): s - model.transfer(m, n) for m, pts in (trials or {}).items() for k, n, s in pts}
    if not extra:
        return model
    methods, keys = sorted({m for m, _ in extra}), sorted({k for _, k in extra})
    offset = dict.fromkeys(keys, 0.0)
    for _ in range(3):
        alpha = {
            m: float(np.median([v - offset[k] for (mm, k), v in extra.items() if mm == m])) for m in methods
        }
        offset = {
            k: float(np.median([v - alpha[m] for (m, kk), v in extra.items() if kk == k])) for k in keys
        }
    model.alpha, model.offset = alpha, offset
    model.pair = {(m, k): v - alpha[m] - offset[k] for (m, k), v in extra.items()}
    return model


@dataclass
class Decision:
    """One bucket's method, why, and the model's numbers (seconds)."""

    key: str
    nbytes: int
    method: str
    reason: str
    predicted_s: float
    predicted_none_s: float
    predicted: Dict[str, float] = field(default_factory=dict)  # every candidate

    @property
    def predicted_gain_s(self) -> float:
        return self.predicted_none_s - self.predicted_s

    def as_dict(self) -> Dict[str, Any]:
        return dict(asdict(self), predicted_gain_s=self.predicted_gain_s)


def _lossier(a: str, b: str) -> bool:
    rank = {m: i for i, m in enumerate(LOSSINESS)}
    return rank.get(a, len(LOSSINESS)) > rank.get(b, len(LOSSINESS))


def exposed(costs: Sequence[float], ready: Sequence[float]) -> float:
    """Communication time the step pays after its last bucket was handed over: one worker
    running the buckets in order, bucket j from max(ready_j, the previous end)."""
    end = -math.inf
    for c, r in zip(costs, ready):
        end = max(end, r) + c
    return max(0.0, end - ready[-1]) if ready else 0.0


def decide(
    model: CostModel,
    buckets: Sequence[Tuple[str, int, float]],
    methods: Sequence[str] = CANDIDATES,
    margin: float = 0.05,
    min_gain: float = 0.05,
    tolerance_s: float = 5e-5,
) -> List[Decision]:
    """Per bucket (key, dense bytes, ready seconds after the first bucket's hand-over, in hand-over
    order), the method (see the module docstring)."""
    order = [m for m in LOSSINESS if m in methods] + [m for m in methods if m not in LOSSINESS]
    out: List[Decision] = []
    for key, n, _ in buckets:
        cost = {m: model.predict(m, n, key) for m in order}
        dense = model.predict("none", n, key)
        fastest = min(cost.values())
        pick = next(m for m in order if cost[m] <= fastest * (1 + margin))
        reason = f"the least lossy method within {margin:.0%} of the fastest ({min(cost, key=cost.get)})"
        if pick != "none" and "none" in cost and dense - cost[pick] < min_gain * dense:
            pick, reason = "none", f"compression would save less than {min_gain:.0%} of its time"
        elif (
            _lossier(pick, REFERENCE)
            and REFERENCE in cost
            and cost[REFERENCE] - cost[pick] < min_gain * cost[REFERENCE]
        ):
            pick, reason = (
                REFERENCE,
                f"{pick} would save less than {min_gain:.0%} against {REFERENCE}, the reference",
            )
        elif pick == "none":
            reason = "uncompressed is the fastest (within the margin)"
        out.append(Decision(key, int(n), pick, reason, cost[pick], dense, cost))
    ready = [r for _, _, r in buckets]
    for j, d in enumerate(out):
        if d.method == "none":
            continue
        base = exposed([x.predicted_s for x in out], ready)
        for m in order[: order.index(d.method)]:
            trial = [x.predicted_s for x in out]
            trial[j] = d.predicted[m]
            more = exposed(trial, ready) - base
            if more <= tolerance_s:
                d.reason = f"{m} instead of {d.method}: " + (
                    "the step's overlap hides the difference"
                    if more <= 0
                    else f"the step pays only {1e6 * more:.0f} us more (tolerance {1e6 * tolerance_s:.0f} us)"
                )
                d.method, d.predicted_s = m, d.predicted[m]
                break
    return out


def render(decisions: Sequence[Decision]) -> str:
    """A human-readable table of decisions."""
    lines = [f"{'bucket':<28} {'MiB':>7} {'method':>7} {'pred ms':>8} {'none ms':>8}  reason"]
    for d in decisions:
        lines.append(
            f"{d.key:<28} {d.nbytes / 2**20:7.2f} {d.method:>7} {1e3 * d.predicted_s:8.3f} "
            f"{1e3 * d.predicted_none_s:8.3f}  {d.reason}"
        )
    return "\n".join(lines)


def codec_rates(
    methods: Sequence[str], elements: int = 1 << 20, repeats: int = 3
) -> Dict[str, Dict[str, Any]]:
    """Local: seconds per dense byte to encode and decode each method on a sample of float32
    gradients (the best of `repeats`), its payload bytes per dense byte, and how its allreduce
    exchanges (ring of payloads, or allgather of top-k pairs); the format of LinkModel.codecs."""
    x = np.random.default_rng(0).standard_normal(elements).astype(np.float32)
    out = np.empty_like(x)
    rates: Dict[str, Dict[str, Any]] = {}
    for m in methods:
        if m == "none":
            continue
        c = make_compressor(m)
        c.error_feedback = False  # stateless: key=None
        enc, dec = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            payload = c.compress(x)
            t1 = time.perf_counter()
            c.decompress(payload, out)
            dec.append(time.perf_counter() - t1)
            enc.append(t1 - t0)
        rates[m] = {
            "encode_s_per_byte": min(enc) / x.nbytes,
            "decode_s_per_byte": min(dec) / x.nbytes,
            "payload_ratio": payload.nbytes / x.nbytes,
            "exchange": "allgather" if type(c).__name__ == "TopK" else "ring",
            "constructor": METHODS[m].spelling,
        }
    return rates
