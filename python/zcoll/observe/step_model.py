"""The step-time model behind ``zcoll report``'s verdict and predictions (docs/profiler.md).

It replays every traced step, on all ranks together, under another setting (bucket size,
compression method, gradient accumulation); the prediction is the median over the replayed steps
of the mean over ranks, the way the measured step time is taken. Replaying the measured steps,
rather than a fitted average, keeps what the model does not explain (noise, a slow forward) as
it was measured, so only the setting changes between the two.

1. Compute: the backward pass of rank r on a *compute clock* tau, real time minus the time the
   bucket hooks took on the compute thread (eta per bucket); bucket i's gradients are all ready
   at tau_i; the pass ends at tau_end. Everything outside backward and sync (data, forward,
   loss, optimizer, gaps) is ``other`` and does not change.
2. Gradient stream: the parameters in the order DDP buckets them (the order their gradients
   become ready), each made ready at a tau interpolated linearly in bytes between the ends of
   the measured buckets. New buckets are cut from this stream as DDP does (a bucket closes once
   it reaches its cap; the first may have its own cap) and are ready at their last gradient.
3. Hooks: each bucket's hook costs time on the compute thread: eta_wake when it wakes an idle
   worker (the previous collective and the worker's turnaround after it, gap, have ended:
   waking a thread costs far more than queueing for a busy one), eta_busy otherwise. Bucket j is handed over after its gradients and every hook
   so far, and the pass ends at tau_end + the hooks' time.
4. Communication: one ordered worker per rank, one collective per bucket. Bucket j's
   collective starts once every rank has handed it over (rank r's backward pass began offset_r
   after rank 0's; + h_idle, its worker's wake-up) and gap after the previous collective ended
   (the workers' turnaround); it ends c_j later on every rank, with
   c = alpha + max(beta x, codec): x the bytes a rank sends (measured bytes per dense byte for
   the method in use; 2(p-1)/p times the payload ratio for a ring codec, (p-1) times it for
   top-k's allgather), codec the compression kernels' time (encode + (2 - 1/p) decode per dense
   byte on a ring, encode + decode for top-k) overlapped with the transfer (the compressed
   algorithms pipeline them), alpha the per-call cost.
5. Step of rank r: other + tau_end + hooks + max(0, last end - end of its backward pass) +
   finalize (DDP's copy of the results: the part of ``sync`` not spent waiting).
   With accumulation k: (k - 1) steps without communication (the measured ones, else
   other - optimizer + tau_end) and one with; the figure is the mean time per micro-batch.

Constants: c of a traced bucket is measured from the last rank's start to the first rank's end
(clocks aligned), so waiting for a late rank is not counted as cost. beta: the slope of a
least-squares line through the traced buckets (bytes sent, c) when the run is uncompressed and
their sizes span at least 4x up to at least 256 KiB; otherwise from the start-up calibration
(two allreduce sizes through the same process group), else from the link probe. alpha, eta_wake,
eta_busy, h_idle and gap: each traced step's own mean (alpha: what its buckets took beyond beta x and
their codec time; gap: from one collective's end, the first rank's, to the next one's start, the
last rank's, where every rank had handed the next bucket over before), sums over buckets being
what matters.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

MIB = 1 << 20


@dataclass
class LinkModel:
    """Communication constants of one run (seconds, bytes)."""

    alpha: float  # per call
    beta: float  # per byte this rank sends
    wire_per_byte: float  # bytes sent per dense byte with the method in use
    method: str  # the method in use ("none" or a compressor's name)
    codecs: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    ranks: int = 2
    source: str = ""  # how alpha and beta were found

    def wire(self, method: str, n: float) -> float:
        if method == self.method:
            return n * self.wire_per_byte
        ring = 2.0 * (self.ranks - 1) / self.ranks
        if method == "none":
            return n * ring
        c = self.codecs[method]
        factor = (self.ranks - 1) if c["exchange"] == "allgather" else ring
        return n * factor * c["payload_ratio"]

    def codec_time(self, method: str, n: float) -> float:
        if method == "none" or method not in self.codecs:
            return 0.0
        c = self.codecs[method]
        decodes = 1.0 if c["exchange"] == "allgather" else 2.0 - 1.0 / self.ranks
        return n * (c["encode_s_per_byte"] + decodes * c["decode_s_per_byte"])

    def call_time(self, method: str, n: float) -> float:
        return self.alpha + max(self.beta * self.wire(method, n), self.codec_time(method, n))

    def residuals(
        self, dense: Sequence[float], sent: Sequence[float], seconds: Sequence[float]
    ) -> np.ndarray:
        """What calls took beyond beta x and their codec time (>= 0): the per-call cost."""
        codec = np.array([self.codec_time(self.method, d) for d in dense])
        return np.maximum(0.0, np.asarray(seconds) - np.maximum(self.beta * np.asarray(sent), codec))


@dataclass
class Shape:
    """One traced step of one rank (seconds, on this rank's clock from its backward start)."""

    step: float  # measured step time
    other: float  # step - backward - sync
    optimizer: float
    offset: float  # start of its backward pass after rank 0's (aligned clocks)
    tau_end: float  # compute-clock length of the backward pass
    eta_wake: float  # compute-thread time of a hook that wakes an idle worker (this step's mean)
    eta_busy: float  # ... of a hook while the worker is busy with an earlier bucket
    ready_tau: List[float]  # compute-clock time each measured bucket was complete
    ready_bytes: List[float]  # cumulative dense bytes through each measured bucket
    params: Tuple[int, ...]  # gradient sizes in bucket order
    h_idle: float  # hand-over to start, worker idle (this step's mean)
    finalize: float
    quiet_step: Optional[float] = None  # a step without communication (measured median), if any
    _curve: Optional[Tuple[np.ndarray, np.ndarray]] = field(default=None, repr=False, compare=False)

    def tau_at(self, cum_bytes: np.ndarray) -> np.ndarray:
        """Compute-clock time at which the gradient stream has produced cum_bytes."""
        if self._curve is None:
            self._curve = (
                np.concatenate(([0.0], self.ready_bytes)),
                np.concatenate(([0.0], np.maximum.accumulate(self.ready_tau))),
            )
        return np.interp(cum_bytes, *self._curve)

    def quiet(self) -> float:
        return self.quiet_step if self.quiet_step is not None else self.other - self.optimizer + self.tau_end


@dataclass
class StepShape:
    """One traced step on every rank."""

    ranks: List[Shape]
    alpha: float  # per-call cost of this step's collectives (mean)
    gap: float  # from a collective's end to the next one's start when the workers were busy (mean)


@dataclass(frozen=True)
class Config:
    """A setting to predict: DDP's bucket caps (bytes), the method, accumulation steps, and the
    counterfactual scales the verdict uses."""

    first_cap: float
    cap: float
    method: str = "none"
    accumulation: int = 1
    link_scale: float = 1.0  # 0: an infinitely fast link and free codecs
    overhead_scale: float = 1.0  # 0: no per-bucket or per-call cost
    communicate: bool = True


@functools.lru_cache(maxsize=4096)
def rebucket(params: Tuple[int, ...], first_cap: float, cap: float) -> Tuple[np.ndarray, np.ndarray]:
    """DDP's greedy assignment (reducer.cpp compute_bucket_assignment_by_size): gradients in
    order, a bucket closes once it holds >= its limit; the first bucket's limit is first_cap.
    Returns (bucket bytes, cumulative bytes at each bucket's end)."""
    sizes, ends, size, cum, limit = [], [], 0, 0, first_cap
    for b in params:
        size += b
        cum += b
        if size >= limit:
            sizes.append(size)
            ends.append(cum)
            size, limit = 0, cap
    if size:
        sizes.append(size)
        ends.append(cum)
    return np.array(sizes, dtype=float), np.array(ends, dtype=float)


def _plan(params: Tuple[int, ...], link: LinkModel, cfg: Config) -> Tuple[np.ndarray, np.ndarray]:
    """The buckets of cfg: cumulative bytes at each one's end, and each one's time beyond alpha."""
    sizes, ends = rebucket(params, cfg.first_cap, cfg.cap)
    wire = np.array([link.wire(cfg.method, n) for n in sizes])
    codec = np.array([link.codec_time(cfg.method, n) for n in sizes])
    return ends, cfg.link_scale * np.maximum(link.beta * wire, codec)


def simulate(step: StepShape, plan: Tuple[np.ndarray, np.ndarray], cfg: Config) -> float:
    """Predicted time of one traced step under cfg, its buckets planned by _plan (seconds): the
    mean over ranks."""
    ranks = step.ranks
    k = cfg.accumulation
    if not cfg.communicate:  # the ranks still meet once per update: the slowest one's compute
        quiet = sum(s.quiet() for s in ranks) / len(ranks)
        return ((k - 1) * quiet + max(s.other + s.tau_end for s in ranks)) / k
    ovh = cfg.overhead_scale
    ends, cost = plan
    n = len(ends)
    ready = [s.offset + s.tau_at(ends) for s in ranks]  # before any hook's time
    hooks = [0.0] * len(ranks)
    alpha, gap, end = step.alpha * ovh, step.gap * ovh, -math.inf
    for j in range(n):
        handed = -math.inf
        for r, s in enumerate(ranks):
            t = ready[r][j] + hooks[r]
            idle = end + step.gap <= t  # the worker finished the previous collective and its turnaround
            eta = (s.eta_wake if idle else s.eta_busy) * ovh
            hooks[r] += eta
            handed = max(handed, t + eta + (s.h_idle * ovh if idle else 0.0))
        end = max(handed, end + gap) + alpha + float(cost[j])
    times = []
    for r, s in enumerate(ranks):
        backward = s.tau_end + hooks[r]
        exposed = max(0.0, end - s.offset - backward) if n else 0.0
        t = s.other + backward + exposed + s.finalize * ovh
        times.append(((k - 1) * s.quiet() + t) / k)
    return sum(times) / len(times)


def predict(steps: Sequence[StepShape], link: LinkModel, cfg: Config) -> float:
    """The step time under cfg: the median over the replayed steps."""
    plan = _plan(steps[0].ranks[0].params, link, cfg)
    return float(np.median([simulate(s, plan, cfg) for s in steps]))


# -- fitting ---------------------------------------------------------------------------------------
def fit_link(
    points: Sequence[Tuple[float, float, float]],
    method: str,
    codecs: Dict[str, Any],
    ranks: int,
    calibration: Optional[Dict[str, Any]],
    capacity: Optional[float],
) -> LinkModel:
    """alpha and beta (see the module docstring) from traced buckets (dense bytes, bytes sent,
    seconds), the start-up calibration points and the probed capacity (bytes/s)."""
    pts = np.array(points, dtype=float).reshape(-1, 3)
    dense, x, c = pts[:, 0], pts[:, 1], pts[:, 2]
    ring = 2.0 * (ranks - 1) / ranks
    wire_per_byte = float(np.median(x / np.maximum(dense, 1))) if len(pts) else ring
    link = LinkModel(0.0, 0.0, wire_per_byte, method, dict(codecs), ranks)
    beta, source = None, ""
    if method == "none" and len(pts) >= 4 and x.max() >= 256 * 1024 and x.max() >= 4 * max(x.min(), 1.0):
        slope = float(np.polyfit(x, c, 1)[0])
        if slope > 0:
            beta, source = slope, "least squares over the traced buckets"
    if beta is None:
        beta, source = _calibrated_beta(calibration, ranks)
    if beta is None and capacity:
        beta, source = 1.0 / capacity, "the link probe's capacity"
    if beta is None:
        beta, source = 0.0, "nothing (no calibration, no probe): bytes cost nothing in this model"
    link.beta = beta
    link.alpha = float(np.mean(link.residuals(dense, x, c))) if len(pts) else 0.0
    link.source = f"beta from {source}; alpha: the mean of what the traced buckets took beyond it"
    return link


def _calibrated_beta(calibration: Optional[Dict[str, Any]], ranks: int) -> Tuple[Optional[float], str]:
    """Seconds per byte sent of the calibration's allreduces: least squares over its sizes'
    medians."""
    points = (calibration or {}).get("points", [])
    ring = 2.0 * (ranks - 1) / ranks
    sent = np.array([p["wire"] if p.get("wire") else p["bytes"] * ring for p in points], dtype=float)
    if len(points) < 2 or sent.max() <= sent.min():
        return None, ""
    slope = float(np.polyfit(sent, [p["seconds"] for p in points], 1)[0])
    if slope <= 0:  # noise beat the bytes: no information
        return None, ""
    return slope, "the start-up calibration (allreduces of several sizes)"


# -- verdict and suggestions ---------------------------------------------------------------------------
COMPUTE_BOUND_SHARE = 0.15  # communication (exposed + hooks) below this share of the step
CAPS_MB = (0.25, 0.5, 1, 2, 4, 8, 16, 25, 64, 256)
ACCUMULATION = (2, 4, 8)
MIN_GAIN = 0.05  # a suggestion must predict at least this much faster a step


def lr_rule(k: int) -> str:
    return (
        f"the effective batch grows {k}x per update: keep its schedule with SGD lr x {k} (linear scaling rule, "
        f"Goyal et al. 2017, with gradual warm-up) or Adam/AdamW lr x {math.sqrt(k):.2g} (square-root rule, "
        f"Malladi et al. 2022); warm-up and decay counted in updates shrink {k}x (the same length in samples)"
    )


def verdict(shapes: Sequence[StepShape], link: LinkModel, current: Config) -> Dict[str, Any]:
    """compute-bound, link-bound or overhead-bound, from the model's counterfactuals."""
    now = predict(shapes, link, current)
    no_comm = predict(shapes, link, replace(current, communicate=False))
    fast_link = predict(shapes, link, replace(current, link_scale=0.0))
    no_overhead = predict(shapes, link, replace(current, overhead_scale=0.0))
    share = (now - no_comm) / now if now > 0 else 0.0
    if share < COMPUTE_BOUND_SHARE:
        label = "compute-bound"
        why = (
            f"communication adds {share:.0%} to the step (hidden behind the backward pass or small): "
            "faster communication cannot help much"
        )
    elif now - fast_link >= now - no_overhead:
        label = "link-bound"
        why = (
            f"communication adds {share:.0%} to the step, mostly moving bytes: an infinitely fast link would "
            f"save {1e3 * (now - fast_link):.1f} ms, zero per-bucket overhead {1e3 * (now - no_overhead):.1f} ms"
        )
    else:
        label = "overhead-bound"
        why = (
            f"communication adds {share:.0%} to the step, mostly fixed costs per bucket and call: zero "
            f"overhead would save {1e3 * (now - no_overhead):.1f} ms, an infinitely fast link "
            f"{1e3 * (now - fast_link):.1f} ms"
        )
    return {
        "label": label,
        "reason": why,
        "model_s": now,
        "no_comm_s": no_comm,
        "fast_link_s": fast_link,
        "no_overhead_s": no_overhead,
        "comm_share": share,
    }


LOSSINESS = ("none", "fp16", "int8", "int4", "sign", "top1%")  # least lossy first
LOSSY_MARGIN = 0.25  # a lossier method must predict a step this much faster to be preferred


def suggestions(
    shapes: Sequence[StepShape], link: LinkModel, current: Config, compression: bool
) -> Dict[str, Any]:
    """One suggestion per knob, each with its predicted step time (the table: every method at
    the caps in use, column "current", and at each cap):

    1. bucket: the cap with the fastest predicted step for the method in use;
    2. compression (zcoll groups): the least lossy method (LOSSINESS order) whose predicted step,
       at its best cap, is within LOSSY_MARGIN of the fastest method's; suggested when it beats
       suggestion 1 (or the current step) by MIN_GAIN;
    3. accumulation, at the cap of 1 and the method in use: the smallest k of ACCUMULATION whose
       mean time per micro-batch is within 10% of the step without communication (else the
       largest), with the learning-rate rule that keeps the larger batch's schedule.

    Each appears only when it predicts a step at least MIN_GAIN faster than the current one."""
    now = predict(shapes, link, current)
    methods = [current.method] + (
        [m for m in ("none", *link.codecs) if m != current.method] if compression else []
    )
    table: Dict[str, Dict[str, float]] = {}
    for m in methods:
        row = {"current": predict(shapes, link, replace(current, method=m))}
        for mb in CAPS_MB:
            row[str(mb)] = predict(shapes, link, replace(current, method=m, first_cap=mb * MIB, cap=mb * MIB))
        table[m] = row
    out: List[Dict[str, Any]] = []
    cap_key, cap_t = min(table[current.method].items(), key=lambda kv: kv[1])
    cap_mb = _mb(cap_key)
    if cap_t < now * (1 - MIN_GAIN):
        out.append(
            {
                "kind": "bucket",
                "bucket_cap_mb": cap_mb,
                "predicted_s": cap_t,
                "text": f"bucket_cap_mb={cap_key}",
            }
        )
    out += _compression_suggestion(table, link, current, min(now, cap_t))
    base = replace(current, first_cap=cap_mb * MIB, cap=cap_mb * MIB) if cap_mb else current
    quiet = predict(shapes, link, replace(base, communicate=False))
    acc = {k: predict(shapes, link, replace(base, accumulation=k)) for k in ACCUMULATION}
    k = next((k for k in ACCUMULATION if acc[k] <= 1.1 * quiet), ACCUMULATION[-1])
    if acc[k] < now * (1 - MIN_GAIN):
        out.append(
            {
                "kind": "accumulation",
                "steps": k,
                "bucket_cap_mb": cap_mb,
                "predicted_s": acc[k],
                "text": f"gradient_accumulation_steps={k}"
                + (f" with bucket_cap_mb={cap_key}" if cap_mb else "")
                + " (mean time per micro-batch)",
                "note": lr_rule(k),
            }
        )
    for s in out:
        s["speedup"] = now / s["predicted_s"]
    return {"current_s": now, "table": table, "suggestions": out, "accumulation": acc}


def _compression_suggestion(table: Dict[str, Dict[str, float]], link: LinkModel, current: Config,
                            beat: float) -> List[Dict[str, Any]]:  # fmt: skip
    """The least lossy method within LOSSY_MARGIN of the fastest, at its best cap, when it
    beats `beat` by MIN_GAIN (see suggestions)."""
    out: List[Dict[str, Any]] = []
    best = {m: min(row.items(), key=lambda kv: kv[1]) for m, row in table.items()}
    fastest = min(t for _, t in best.values())
    ranked = sorted(best, key=lambda m: LOSSINESS.index(m) if m in LOSSINESS else len(LOSSINESS))
    pick = next(m for m in ranked if best[m][1] <= fastest * (1 + LOSSY_MARGIN))
    key, t = best[pick]
    if pick != current.method and t < beat * (1 - MIN_GAIN):
        name = link.codecs[pick].get("constructor", pick) if pick != "none" else "no compression"
        out.append(
            {
                "kind": "compression",
                "method": pick,
                "bucket_cap_mb": _mb(key),
                "predicted_s": t,
                "text": name + (f" with bucket_cap_mb={key}" if key != "current" else ""),
                "note": "lossy: error feedback keeps convergence (EF-SGD); check the accuracy"
                if pick != "none"
                else "",
            }
        )
    return out


def _mb(key: str) -> Optional[float]:
    if key == "current":
        return None
    v = float(key)
    return int(v) if v.is_integer() else v
