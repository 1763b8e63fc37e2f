"""The step-time model behind ``zcoll report``'s verdict and predictions (docs/profiler.md).

Fitted on one rank's traced steps (medians over the analysed steps), it replays a step with other
bucket sizes, another compression method or gradient accumulation:

1. Compute: the backward pass on a *compute clock* tau, real time minus the time the bucket
   hooks took on the compute thread (eta per bucket); bucket i's gradients are all ready at
   tau_i; the pass ends at tau_A. Everything outside backward and sync (data, forward, loss,
   optimizer, gaps) is ``other`` and does not change.
2. Gradient stream: the parameters in the order DDP buckets them (the order their gradients
   become ready), each made ready at a tau interpolated linearly in bytes between the ends of
   the measured buckets. New buckets are cut from this stream as DDP does (a bucket closes once
   it reaches its cap; the first may have its own cap) and are ready at their last gradient.
3. Hooks: each bucket costs eta on the compute thread, so bucket j is ready at
   tau'_j + j eta, handed over at + eta, and the pass ends at tau_A + N' eta.
4. Communication: one ordered worker. Bucket j starts at max(hand-over + h_idle,
   end of j-1 + h_busy) and takes c = alpha + max(beta x, codec): x the bytes this rank sends
   (measured bytes per dense byte for the method in use; 2(p-1)/p times the payload ratio for a
   ring codec, (p-1) times it for top-k's allgather), codec the compression kernels' time
   (encode + (2 - 1/p) decode per dense byte on a ring, encode + decode for top-k), overlapped
   with the transfer (the compressed algorithms pipeline them), alpha the per-call cost.
5. Step: T = other + tau_A + N' eta + max(0, last end - end of backward) + finalize (DDP's copy
   of the results, measured as the part of ``sync`` not spent waiting).
   With accumulation k: (k - 1) steps without communication (other - optimizer + tau_A) and one
   with; the figure reported is the mean time per micro-batch.

alpha and beta: least squares over the traced buckets when the run is uncompressed and their
sizes span at least 4x up to at least 256 KiB; otherwise beta from the start-up calibration (two
allreduce sizes through the same process group) and alpha the median of what the traced buckets
took beyond beta x (and beyond their codec time).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

MIB = 1 << 20


@dataclass
class Link:
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


@dataclass
class Shape:
    """One traced step of one rank (seconds). The model replays each traced step under a new
    setting, so that what it does not model (noise, a slow forward) stays as it was measured."""

    step: float  # measured step time
    other: float  # step - backward - sync
    optimizer: float
    tau_end: float  # compute-clock length of the backward pass
    eta: float  # compute-thread time per bucket hook
    ready_tau: List[float]  # compute-clock time each measured bucket was complete
    ready_bytes: List[float]  # cumulative dense bytes through each measured bucket
    params: Tuple[int, ...]  # gradient sizes in bucket order
    h_idle: float  # hand-over to start, worker idle (this rank's median)
    h_busy: float  # previous end to start, worker busy (this rank's median)
    finalize: float
    quiet_step: Optional[float] = None  # a step without communication (measured median), if any

    def tau_at(self, cum_bytes: np.ndarray) -> np.ndarray:
        xs = np.concatenate(([0.0], self.ready_bytes))
        ys = np.concatenate(([0.0], np.maximum.accumulate(self.ready_tau))) if len(self.ready_tau) else np.zeros(1)
        return np.interp(cum_bytes, xs, ys)


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


def simulate(shape: Shape, link: Link, cfg: Config) -> float:
    """Predicted time of one traced step of one rank under cfg (seconds)."""
    if not cfg.communicate:
        return shape.other + shape.tau_end
    ovh, lnk = cfg.overhead_scale, cfg.link_scale
    eta, h_idle, h_busy = shape.eta * ovh, shape.h_idle * ovh, shape.h_busy * ovh
    sizes, ends = rebucket(shape.params, cfg.first_cap, cfg.cap)
    handed = shape.tau_at(ends) + eta * np.arange(1, len(sizes) + 1)
    alpha = link.alpha * ovh
    end = -math.inf
    for n, h in zip(sizes.tolist(), handed.tolist()):
        c = alpha + lnk * max(link.beta * link.wire(cfg.method, n), link.codec_time(cfg.method, n))
        end = max(h + h_idle, end + h_busy) + c
    backward = shape.tau_end + len(sizes) * eta
    exposed = max(0.0, end - backward) if len(sizes) else 0.0
    step = shape.other + backward + exposed + shape.finalize * ovh
    if cfg.accumulation > 1:
        quiet = shape.quiet_step if shape.quiet_step is not None else shape.other - shape.optimizer + shape.tau_end
        step = ((cfg.accumulation - 1) * quiet + step) / cfg.accumulation
    return step


def predict(shapes: Sequence[Sequence[Shape]], link: Link, cfg: Config) -> float:
    """The step time under cfg: each traced step replayed on every rank (shapes[rank][step]),
    the mean over ranks per step, the median over steps (as the measured step time is taken)."""
    per_step = np.mean([[simulate(s, link, cfg) for s in rank] for rank in shapes], axis=0)
    return float(np.median(per_step))


# -- fitting ---------------------------------------------------------------------------------------
def fit_link(points: Sequence[Tuple[float, float, float]], method: str, codecs: Dict[str, Any], ranks: int,
             calibration: Optional[Dict[str, Any]], capacity: Optional[float]) -> Link:
    """alpha and beta (see the module docstring) from traced buckets (dense bytes, bytes sent,
    seconds), the start-up calibration points and the probed capacity (bytes/s)."""
    pts = np.array(points, dtype=float).reshape(-1, 3)
    dense, x, c = pts[:, 0], pts[:, 1], pts[:, 2]
    ring = 2.0 * (ranks - 1) / ranks
    wire_per_byte = float(np.median(x / np.maximum(dense, 1))) if len(pts) else ring
    link = Link(0.0, 0.0, wire_per_byte, method, dict(codecs), ranks)
    if method == "none" and len(pts) >= 4 and x.max() >= 256 * 1024 and x.max() >= 4 * max(x.min(), 1.0):
        beta, alpha = np.polyfit(x, c, 1)
        if beta > 0 and alpha >= 0:
            link.alpha, link.beta, link.source = float(alpha), float(beta), "least squares over the traced buckets"
            return link
    beta, source = _calibrated_beta(calibration, ranks)
    if beta is None and capacity:
        beta, source = 1.0 / capacity, "the link probe's capacity"
    if beta is None:
        beta, source = 0.0, "nothing (no calibration, no probe): bytes cost nothing in this model"
    link.beta = beta
    codec = np.array([link.codec_time(method, d) for d in dense])
    link.alpha = float(max(0.0, np.median(c - np.maximum(beta * x, codec)))) if len(pts) else 0.0
    link.source = f"beta from {source}; alpha = median of what the traced buckets took beyond it"
    return link


def _calibrated_beta(calibration: Optional[Dict[str, Any]], ranks: int) -> Tuple[Optional[float], str]:
    if not calibration or len(calibration.get("points", [])) < 2:
        return None, ""
    small, large = calibration["points"][0], calibration["points"][-1]
    ring = 2.0 * (ranks - 1) / ranks

    def sent(p: Dict[str, Any]) -> float:
        return p["wire"] if p.get("wire") else p["bytes"] * ring

    dx = sent(large) - sent(small)
    if dx <= 0:
        return None, ""
    return max(0.0, (large["seconds"] - small["seconds"]) / dx), "the start-up calibration (two allreduce sizes)"


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


def verdict(shapes: Sequence[Sequence[Shape]], link: Link, current: Config) -> Dict[str, Any]:
    """compute-bound, link-bound or overhead-bound, from the model's counterfactuals."""
    now = predict(shapes, link, current)
    no_comm = predict(shapes, link, replace(current, communicate=False))
    fast_link = predict(shapes, link, replace(current, link_scale=0.0))
    no_overhead = predict(shapes, link, replace(current, overhead_scale=0.0))
    share = (now - no_comm) / now if now > 0 else 0.0
    if share < COMPUTE_BOUND_SHARE:
        label = "compute-bound"
        why = (f"communication adds {share:.0%} to the step (hidden behind the backward pass or small): "
               "faster communication cannot help much")
    elif now - fast_link >= now - no_overhead:
        label = "link-bound"
        why = (f"communication adds {share:.0%} to the step, mostly moving bytes: an infinitely fast link would "
               f"save {1e3 * (now - fast_link):.1f} ms, zero per-bucket overhead {1e3 * (now - no_overhead):.1f} ms")
    else:
        label = "overhead-bound"
        why = (f"communication adds {share:.0%} to the step, mostly fixed costs per bucket and call: zero "
               f"overhead would save {1e3 * (now - no_overhead):.1f} ms, an infinitely fast link "
               f"{1e3 * (now - fast_link):.1f} ms")
    return {"label": label, "reason": why, "model_s": now, "no_comm_s": no_comm, "fast_link_s": fast_link,
            "no_overhead_s": no_overhead, "comm_share": share}


def suggestions(shapes: Sequence[Sequence[Shape]], link: Link, current: Config, compression: bool) -> Dict[str, Any]:
    """Predicted step times of other bucket caps, methods and accumulation steps; the ones that
    beat the current setting by MIN_GAIN, best first."""
    now = predict(shapes, link, current)
    methods = [current.method] + ([m for m in ("none", *link.codecs) if m != current.method] if compression else [])
    table: Dict[str, Dict[str, float]] = {}
    for m in methods:
        row = {"default": predict(shapes, link, replace(current, method=m))}
        for mb in CAPS_MB:
            row[str(mb)] = predict(shapes, link, replace(current, method=m, first_cap=mb * MIB, cap=mb * MIB))
        table[m] = row
    out: List[Dict[str, Any]] = []
    best_cap = min(table[current.method].items(), key=lambda kv: kv[1])
    if best_cap[1] < now * (1 - MIN_GAIN):
        out.append({"kind": "bucket", "bucket_cap_mb": _mb(best_cap[0]), "predicted_s": best_cap[1],
                    "text": f"bucket_cap_mb={best_cap[0]}" if best_cap[0] != "default" else "DDP's default buckets"})
    for m in methods[1:]:
        cap, t = min(table[m].items(), key=lambda kv: kv[1])
        if t < now * (1 - MIN_GAIN):
            name = link.codecs.get(m, {}).get("constructor", m) if m != "none" else "no compression"
            out.append({"kind": "compression", "method": m, "bucket_cap_mb": _mb(cap), "predicted_s": t,
                        "text": f"{name}" + (f" with bucket_cap_mb={cap}" if cap != "default" else "")})
    cap_mb = _mb(best_cap[0])
    base = replace(current, first_cap=cap_mb * MIB, cap=cap_mb * MIB) if cap_mb else current
    for k in ACCUMULATION:
        t = predict(shapes, link, replace(base, accumulation=k))
        if t < now * (1 - MIN_GAIN):
            out.append({"kind": "accumulation", "steps": k, "bucket_cap_mb": cap_mb, "predicted_s": t,
                        "text": f"gradient_accumulation_steps={k}" + (f" with bucket_cap_mb={cap_mb}" if cap_mb else "")
                        + f" (time per micro-batch; {lr_rule(k)})"})
    for s in out:
        s["speedup"] = now / s["predicted_s"]
    out.sort(key=lambda s: s["predicted_s"])
    return {"current_s": now, "table": table, "suggestions": out}


def _mb(key: str) -> Optional[float]:
    if key == "default":
        return None
    v = float(key)
    return int(v) if v.is_integer() else v
