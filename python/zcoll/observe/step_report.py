"""``zcoll report DIR`` for step traces: figures per rank, the verdict, suggestions, a timeline.

1. ``analyze(docs)``: for each traced model, the steps every rank recorded completely, minus the
   first ``warmup``; per step and rank the phases, the buckets (ready, start, end, bytes, codec
   time estimate, how long the step waited for each), communication time, exposed communication
   (the part of the buckets' time after the backward pass ended), overlap, achieved bytes/s, and
   which rank was slowest (the most busy time: everyone else waited for it). Then the model of
   ``zcoll.step_model`` is fitted and asked for the verdict and the suggestions.
2. ``format_text(analyses)``: the summary a person reads.
3. ``plot_timeline(docs, analyses, path)``: a PNG of a few representative steps per rank
   (compute phases, communication per bucket, bucket-ready marks) on rank 0's clock.

Definitions: a step runs from the end of the previous step's last phase to the end of its own;
its time is the mean over ranks. Communication: the buckets' time on the worker, start to end.
Exposed communication: from the end of the backward pass to the end of the last bucket (the
step waits for it; hand-over gaps included). Overlap: the share of communication time that ran
while the backward pass was still computing. A bucket's wait: the part of the exposed time after
both the backward pass and the previous bucket ended (the waits sum to the exposed time). A
step's slowest rank: the one with the longest step minus sync (the others waited for it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional

import numpy as np

from . import step_model as sm
from .trace import clock_maps

PHASES = ("data", "forward", "backward", "sync", "optimizer")


@dataclass
class StepFigures:
    """One step of one rank (seconds, bytes)."""

    step: int
    duration: float
    phases: Dict[str, float]
    other: float
    comm: float  # sum of the buckets' communication time
    exposed: float  # from the end of the backward pass to the end of the last bucket
    hidden: float  # communication time before the backward pass ended
    wire: float  # bytes this rank sent
    dense: float  # gradient bytes in the buckets
    buckets: List[
        Dict[str, Any]
    ]  # per bucket: index, bytes, wire, ready/start/end (s after backward start), ...
    backward_end: float  # after backward start
    backward_start: float  # on rank 0's clock (ns)


@dataclass
class StepAnalysis:
    """The analysis of one traced model over all ranks."""

    model: Dict[str, Any]
    ranks: int
    steps: List[int]
    per_rank: List[List[StepFigures]]
    step_time: List[float]  # per analysed step: the mean over ranks
    slowest: List[int]  # per analysed step: the rank with the most busy time
    link_capacity: Optional[float]
    clocks: List[Dict[str, Any]]
    shapes: List[sm.StepShape] = field(default_factory=list)
    link: Optional[sm.LinkModel] = None
    current: Optional[sm.Config] = None
    verdict: Dict[str, Any] = field(default_factory=dict)
    advice: Dict[str, Any] = field(default_factory=dict)

    def median(self, rank: int, what: str) -> float:
        vals = [
            getattr(s, what) if hasattr(s, what) else s.phases.get(what, 0.0) for s in self.per_rank[rank]
        ]
        return float(np.median(vals)) if vals else 0.0

    def summary(self) -> Dict[str, Any]:
        """The JSON-able essentials (what ``StepProfiler.analysis`` holds)."""
        step = float(np.median(self.step_time))
        comm = [self.median(r, "comm") for r in range(self.ranks)]
        exposed = [self.median(r, "exposed") for r in range(self.ranks)]
        best_bucket = next((s for s in self.advice["suggestions"] if s["kind"] == "bucket"), None)
        return {
            "model": self.model["name"],
            "backend": self.model["backend"],
            "ranks": self.ranks,
            "steps_analysed": len(self.steps),
            "step_s": step,
            "mean_step_s": float(np.mean(self.step_time)),
            **self.accumulation_figures(),
            "model_step_s": self.verdict["model_s"],
            "verdict": self.verdict["label"],
            "reason": self.verdict["reason"],
            "comm_s": comm,
            "exposed_s": exposed,
            "overlap": [self.overlap(r) for r in range(self.ranks)],
            "achieved_Bps": [self.achieved(r) for r in range(self.ranks)],
            "link_capacity_Bps": self.link_capacity,
            "slowest_rank_counts": [self.slowest.count(r) for r in range(self.ranks)],
            "alpha_s": self.link.alpha,
            "beta_s_per_byte": self.link.beta,
            "suggestions": self.advice["suggestions"],
            "predictions": self.advice["table"],
            "suggested_bucket_cap_mb": best_bucket["bucket_cap_mb"] if best_bucket else None,
        }

    def predict(
        self,
        bucket_cap_mb: Optional[float] = None,
        method: Optional[str] = None,
        accumulation: Optional[int] = None,
    ) -> float:
        """The model's step time (per micro-batch with accumulation) for a setting; None keeps
        what was traced (bucket_cap_mb sets both DDP caps, as ``DDP(bucket_cap_mb=...)`` does)."""
        cfg = self.current
        if bucket_cap_mb is not None:
            cfg = replace(cfg, first_cap=bucket_cap_mb * sm.MIB, cap=bucket_cap_mb * sm.MIB)
        if method is not None:
            cfg = replace(cfg, method=method)
        if accumulation is not None:
            cfg = replace(cfg, accumulation=accumulation)
        return sm.predict(self.shapes, self.link, cfg)

    def measured(self) -> float:
        """The measured step time the model's current prediction answers: the median step, or
        with gradient accumulation the mean time per micro-batch."""
        return self.accumulation_figures().get("micro_batch_s", float(np.median(self.step_time)))

    def accumulation_figures(self) -> Dict[str, Any]:
        """With gradient accumulation (steps without communication in between): the median
        step with and without communication, the steps per update, and the mean time per
        micro-batch from those ((k - 1) quiet + 1 communicating) / k."""
        sync = [t for t, f in zip(self.step_time, self.per_rank[0]) if f.buckets]
        quiet = [t for t, f in zip(self.step_time, self.per_rank[0]) if not f.buckets]
        if not quiet or not sync:
            return {}
        at = [f.step for f in self.per_rank[0] if f.buckets]
        k = int(np.median(np.diff(at))) if len(at) > 1 else round(len(self.step_time) / len(sync))
        q, s = float(np.median(quiet)), float(np.median(sync))
        return {
            "accumulation_steps": k,
            "quiet_step_s": q,
            "sync_step_s": s,
            "micro_batch_s": ((k - 1) * q + s) / k,
        }

    def overlap(self, rank: int) -> float:
        comm = sum(s.comm for s in self.per_rank[rank])
        return sum(s.hidden for s in self.per_rank[rank]) / comm if comm > 0 else 1.0

    def achieved(self, rank: int) -> float:
        wire = sum(s.wire for s in self.per_rank[rank])
        comm = sum(s.comm for s in self.per_rank[rank])
        return wire / comm if comm > 0 else 0.0


def _end(step: Dict[str, Any]) -> Optional[int]:
    ends = [v[1] for v in step["phases"].values() if v[1] is not None]
    return max(ends) if ends else None


def _complete(step: Dict[str, Any]) -> bool:
    ph = step["phases"]
    return all(k in ph and ph[k][1] is not None for k in ("forward", "backward", "sync")) and all(
        b["end"] is not None and b["issued"] is not None for b in step["buckets"]
    )


def _figures(
    step: Dict[str, Any], prev_end: int, ranks: int, codecs: Dict[str, Any], to_rank0: Any
) -> StepFigures:
    """One step of one rank; bucket times in seconds after its backward start (and start_g /
    end_g on rank 0's clock, ns)."""
    ns = 1e-9
    ph = step["phases"]
    b0, b1 = ph["backward"]
    phases = {k: (v[1] - v[0]) * ns for k, v in ph.items() if v[1] is not None}
    duration = (_end(step) - prev_end) * ns
    ring = 2.0 * (ranks - 1) / ranks
    codec_of = sm.LinkModel(0, 0, 0, "", codecs, ranks).codec_time
    buckets, last_end, hidden = [], None, 0.0
    for b in sorted(step["buckets"], key=lambda b: b["ready"]):
        start = b["start"] if b["start"] is not None else max(b["issued"], last_end or b["issued"])
        waited = max(0, b["end"] - max(b1, last_end or b1)) * ns
        hidden += max(0, min(b["end"], b1) - start) * ns
        buckets.append(
            {
                "index": b["index"],
                "bytes": b["bytes"],
                "wire": b["wire"] or b["bytes"] * ring,
                "method": b["method"],
                "ready": (b["ready"] - b0) * ns,
                "issued": (b["issued"] - b0) * ns,
                "start": (start - b0) * ns,
                "end": (b["end"] - b0) * ns,
                "after_prev": (start - last_end) * ns if last_end is not None else None,
                "comm": (b["end"] - start) * ns,
                "codec": codec_of(b["method"], b["bytes"]),
                "waited": waited,
                "measured_start": b["start"] is not None,
                "start_g": to_rank0(start),
                "end_g": to_rank0(b["end"]),
                "issued_g": to_rank0(b["issued"]),
            }
        )
        last_end = b["end"] if last_end is None else max(last_end, b["end"])
    exposed = max(0, last_end - b1) * ns if buckets else 0.0
    return StepFigures(
        step["step"],
        duration,
        phases,
        duration - sum(phases.values()),
        sum(b["comm"] for b in buckets),
        exposed,
        hidden,
        sum(b["wire"] for b in buckets),
        sum(b["bytes"] for b in buckets),
        buckets,
        (b1 - b0) * ns,
        to_rank0(b0),
    )


def _bucket_params(steps: List[Dict[str, Any]], last: int) -> Dict[int, List[int]]:
    """The parameter sizes of each bucket index, as last recorded up to step `last`."""
    params: Dict[int, List[int]] = {}
    for s in steps:
        if s["step"] > last:
            break
        for b in s["buckets"]:
            if "params" in b:
                params[b["index"]] = b["params"]
    return params


def _collectives(figs: List[StepFigures]) -> Optional[Dict[str, List[float]]]:
    """The collectives of one step (figs: every rank's), on rank 0's clock: per bucket its own
    time, from the last rank's start to the first rank's end (a late rank's delay is not the
    collective's cost), and, where every rank had handed the bucket over before the previous
    collective ended, the gap from that end to this start. None when the ranks' buckets differ."""
    n = len(figs[0].buckets)
    if n == 0 or any(len(f.buckets) != n for f in figs):
        return None
    calls, gaps, prev_end = [], [], None
    for j in range(n):
        start = max(f.buckets[j]["start_g"] for f in figs)
        end = min(f.buckets[j]["end_g"] for f in figs)
        handed = max(f.buckets[j]["issued_g"] for f in figs)
        calls.append(max(0.0, end - start) * 1e-9)
        if prev_end is not None and handed <= prev_end:
            gaps.append(max(0.0, start - prev_end) * 1e-9)
        prev_end = end
    return {"calls": calls, "gaps": gaps}


def _shape(
    f: StepFigures, stream: tuple, cum: List[float], offset: float, quiet: Optional[float], gap: float
) -> sm.Shape:
    """The model's view of one step of one rank (hook costs the step lacks are NaN, filled in by
    _fill_hooks). A hook woke the worker when the previous collective had ended, and the
    worker's turnaround after it (gap) too, before the bucket was ready."""
    hooks, tau, wake, busy, idle, prev_end = 0.0, [], [], [], [], None
    for b in f.buckets:
        tau.append(b["ready"] - hooks)
        eta = b["issued"] - b["ready"]
        hooks += eta
        woke = prev_end is None or prev_end + gap <= b["ready"]
        (wake if woke else busy).append(eta)
        if woke and b["measured_start"]:
            idle.append(b["start"] - b["issued"])
        prev_end = b["end"] if prev_end is None else max(prev_end, b["end"])
    mean = lambda v: float(np.mean(v)) if v else float("nan")  # noqa: E731
    return sm.Shape(
        step=f.duration,
        other=f.duration - f.phases["backward"] - f.phases["sync"],
        optimizer=f.phases.get("optimizer", 0.0),
        offset=offset,
        tau_end=f.backward_end - hooks,
        eta_wake=mean(wake),
        eta_busy=mean(busy),
        ready_tau=tau,
        ready_bytes=cum,
        params=stream,
        h_idle=mean(idle) if idle else 0.0,
        finalize=max(0.0, f.phases["sync"] - f.exposed),
        quiet_step=quiet,
    )


def _fill_hooks(shapes: List[sm.Shape]) -> None:
    """A step with no hook of a kind (every bucket woke its worker, say) takes that kind's
    median over the rank's steps, else the other kind's."""
    for kind, other in (("eta_wake", "eta_busy"), ("eta_busy", "eta_wake")):
        seen = [getattr(s, kind) for s in shapes if not math.isnan(getattr(s, kind))]
        seen_other = [getattr(s, other) for s in shapes if not math.isnan(getattr(s, other))]
        fill = float(np.median(seen)) if seen else (float(np.median(seen_other)) if seen_other else 0.0)
        for s in shapes:
            if math.isnan(getattr(s, kind)):
                setattr(s, kind, fill)


def analyze(
    docs: List[Dict[str, Any]], warmup: int = 3, skipped: Optional[List[str]] = None
) -> List[StepAnalysis]:
    """One StepAnalysis per traced model (docs: every rank's trace document, rank order). A model
    none of whose steps after the warm-up was recorded completely on every rank is left out,
    the reason appended to `skipped`; ValueError when no model is left."""
    out, reasons = [], []
    for mid in range(len(docs[0]["models"])):
        try:
            out.append(_analyze_model(docs, mid, warmup))
        except ValueError as e:
            reasons.append(str(e))
    if skipped is not None:
        skipped += reasons
    if not out:
        raise ValueError("; ".join(reasons) or "no traced model")
    return out


MAX_STEPS = 200  # steps analysed per model (evenly spread); the replays cost time per step


def _analyze_model(docs: List[Dict[str, Any]], mid: int, warmup: int) -> StepAnalysis:
    ranks = docs[0]["size"]
    model = docs[0]["models"][mid]
    per_doc = [d["models"][mid] for d in docs]
    codecs = model.get("codecs", {})
    usable = []
    for m in per_doc:
        steps = m["steps"]
        # "data" exists when the previous step ran just before (not across a pause)
        ok = {
            s["step"]
            for i, s in enumerate(steps)
            if i > 0
            and s["step"] >= max(1, warmup)
            and _complete(s)
            and "data" in s["phases"]
            and _end(steps[i - 1]) is not None
        }
        usable.append(ok)
    chosen = sorted(set.intersection(*usable)) if usable else []
    if not chosen:
        raise ValueError(
            f"model {mid} ({model['name']}): no step after the first {warmup} was recorded completely on "
            "every rank; profile more steps (forward, backward and the gradient sync must all run)"
        )
    if len(chosen) > MAX_STEPS:
        chosen = [chosen[i * len(chosen) // MAX_STEPS] for i in range(MAX_STEPS)]
    per_rank, maps = [], clock_maps(docs)
    for r, m in enumerate(per_doc):
        by_step = {s["step"]: i for i, s in enumerate(m["steps"])}
        figs = [
            _figures(m["steps"][by_step[k]], _end(m["steps"][by_step[k] - 1]), ranks, codecs, maps[r])
            for k in chosen
        ]
        per_rank.append(figs)
    step_time = [float(np.mean([per_rank[r][i].duration for r in range(ranks)])) for i in range(len(chosen))]
    slowest = [
        max(range(ranks), key=lambda r: per_rank[r][i].duration - per_rank[r][i].phases["sync"])
        for i in range(len(chosen))
    ]
    link_info = docs[0]["meta"].get("link")
    a = StepAnalysis(
        model,
        ranks,
        chosen,
        per_rank,
        step_time,
        slowest,
        link_info["bandwidth_Bps"] if link_info else None,
        [d["meta"]["clock"] for d in docs],
    )
    _fit(a, per_doc, codecs)
    return a


def _fit(a: StepAnalysis, per_doc: List[Dict[str, Any]], codecs: Dict[str, Any]) -> None:
    """The model's constants and replayable steps, then the verdict and the suggestions."""
    method = a.model.get("compression") or "none"
    used = {b["method"] for figs in a.per_rank for f in figs for b in f.buckets}
    if len(used) == 1:
        method = used.pop()
    steps = [[a.per_rank[r][i] for r in range(a.ranks)] for i in range(len(a.steps))]
    joint = [_collectives(figs) for figs in steps]
    points = [
        (b["bytes"], b["wire"], c)
        for figs, j in zip(steps, joint)
        if j
        for b, c in zip(figs[0].buckets, j["calls"])
    ]
    a.link = sm.fit_link(points, method, codecs, a.ranks, a.model.get("calibration"), a.link_capacity)
    counts = [len(f.buckets) for f in a.per_rank[0] if f.buckets]
    modal = max(set(counts), key=counts.count) if counts else 0
    streams = []  # per rank: the gradient stream, as the last step with the usual buckets had it
    for r in range(a.ranks):
        params = _bucket_params(per_doc[r]["steps"], a.steps[-1])
        last = next((f.buckets for f in reversed(a.per_rank[r]) if len(f.buckets) == modal), [])
        stream = [size for b in last for size in (params.get(b["index"]) or [b["bytes"]])]
        quiet = [f.duration for f in a.per_rank[r] if not f.buckets]
        streams.append(
            (
                tuple(stream),
                list(np.cumsum([b["bytes"] for b in last], dtype=float)),
                float(np.median(quiet)) if quiet else None,
            )
        )
    for figs, j in zip(steps, joint):
        if j is None or len(j["calls"]) != modal:
            continue  # steps without communication (accumulation) enter through quiet_step
        bk = figs[0].buckets
        alpha = a.link.residuals([b["bytes"] for b in bk], [b["wire"] for b in bk], j["calls"])
        gap = float(np.mean(j["gaps"])) if j["gaps"] else 0.0
        ranks = [
            _shape(f, *streams[r][:2], (f.backward_start - figs[0].backward_start) * 1e-9, streams[r][2], gap)
            for r, f in enumerate(figs)
        ]
        a.shapes.append(sm.StepShape(ranks, float(np.mean(alpha)), gap))
    for r in range(a.ranks):
        _fill_hooks([s.ranks[r] for s in a.shapes])
    if not a.shapes:
        raise ValueError(
            f"model {a.model['id']} ({a.model['name']}): no analysed step communicated on every rank"
        )
    k = a.accumulation_figures().get("accumulation_steps", 1)
    a.current = sm.Config(
        a.model["first_bucket_cap_bytes"], a.model["bucket_cap_bytes"], method, accumulation=k
    )
    a.verdict = sm.verdict(a.shapes, a.link, a.current)
    a.advice = sm.suggestions(a.shapes, a.link, a.current, compression=a.model["backend"] == "zcoll")


# -- text ---------------------------------------------------------------------------------------
def _ms(s: float) -> str:
    return f"{s * 1e3:.2f}"


def _rate(bps: Optional[float]) -> str:
    if not bps:
        return "n/a"
    return f"{bps / 1e9:.2f} GB/s" if bps >= 1e9 else f"{bps / 1e6:.1f} MB/s"


def format_text(analyses: List[StepAnalysis], where: str = "") -> str:
    lines: List[str] = []
    for a in analyses:
        lines += _text_one(a, where)
        lines.append("")
    return "\n".join(lines)


def _text_one(a: StepAnalysis, where: str) -> List[str]:
    m = a.model
    L = [
        f"zcoll step report{': ' + where if where else ''}",
        (
            f"model {m['id']}: {m['name']} on {a.ranks} ranks ({m['backend']}), {m['gradient_bytes'] / 1e6:.2f} MB of "
            f"gradients in {m['parameters']} tensors; hook {m['hook']}, compression {m['compression'] or 'none'}; "
            f"bucket cap {m['bucket_cap_bytes'] / 2**20:g} MiB (first {m['first_bucket_cap_bytes'] / 2**20:g} MiB)"
        ),
        f"steps analysed: {len(a.steps)} (steps {a.steps[0]}..{a.steps[-1]})",
    ]
    for section in (_clock_lines, _per_step_lines, _bucket_lines, _verdict_lines, _advice_lines):
        L += section(a)
    return L


def _clock_lines(a: StepAnalysis) -> List[str]:
    """How well the ranks' clocks were aligned."""
    L: List[str] = []
    starts = [c["start"] for c in a.clocks]
    ends = [c.get("end") for c in a.clocks]
    off0 = ", ".join(f"{s['offset_ns'] / 1e6:+.3f}" for s in starts)
    rtt = max(s["rtt_ns"] for s in starts) / 1e6
    line = f"clocks: offset to rank 0 at start [{off0}] ms (exact within +-{rtt / 2:.3f} ms)"
    if all(ends):
        drift = max(abs(e["offset_ns"] - s["offset_ns"]) for s, e in zip(starts, ends)) / 1e6
        span = max((e["local_ns"] - s["local_ns"]) for s, e in zip(starts, ends)) / 1e9
        line += f"; at the end they moved by at most {drift:.3f} ms over {span:.1f} s (corrected linearly)"
    L.append(line)
    L.append("")
    return L


def _per_step_lines(a: StepAnalysis) -> List[str]:
    """Per rank: the phases, communication, overlap, bytes and rates; the slowest rank."""
    R = range(a.ranks)
    L: List[str] = []
    L.append("per step, median (ms)" + "".join(f"{'rank ' + str(r):>10}" for r in R))
    rows = (
        [("step", "duration")]
        + [(p, p) for p in PHASES]
        + [("other", "other"), ("communication", "comm"), ("  exposed", "exposed")]
    )
    for label, key in rows:
        L.append(f"  {label:<20}" + "".join(f"{_ms(a.median(r, key)):>10}" for r in R))
    L.append(f"  {'overlap %':<20}" + "".join(f"{100 * a.overlap(r):>10.0f}" for r in R))
    L.append(f"  {'sent MB':<20}" + "".join(f"{a.median(r, 'wire') / 1e6:>10.2f}" for r in R))
    L.append(f"  {'achieved':<20}" + "".join(f"{_rate(a.achieved(r)):>10}" for r in R))
    cap = a.link_capacity
    L.append(
        f"link capacity (ring exchange probe): {_rate(cap)}"
        + (
            f"; achieved during communication: {100 * max(a.achieved(r) for r in R) / cap:.0f}% of it"
            if cap
            else ""
        )
    )
    counts = [a.slowest.count(r) for r in R]
    L.append(
        "slowest rank (most busy time): "
        + ", ".join(f"rank {r} in {counts[r]}/{len(a.slowest)} steps" for r in R)
    )
    L.append(
        f"step time (mean over ranks): median {_ms(float(np.median(a.step_time)))} ms, "
        f"min {_ms(min(a.step_time))}, max {_ms(max(a.step_time))}"
    )
    acc = a.accumulation_figures()
    if acc:
        L.append(
            f"gradient accumulation: {acc['accumulation_steps']} micro-batches per update; median step "
            f"{_ms(acc['sync_step_s'])} ms with communication, {_ms(acc['quiet_step_s'])} ms without: "
            f"{_ms(acc['micro_batch_s'])} ms per micro-batch"
        )
    L.append("")
    return L


def _bucket_lines(a: StepAnalysis) -> List[str]:
    """Rank 0's buckets: when each was ready, sent and done."""
    L: List[str] = []
    L.append(
        "buckets, rank 0, median (ms after the backward pass started; codec time estimated from the kernel rates)"
    )
    L.append(
        f"  {'index':>5} {'MB':>8} {'sent MB':>8} {'ready':>8} {'start':>8} {'end':>8} {'comm':>8} {'codec':>8} {'waited':>8}"
    )
    figs = [f for f in a.per_rank[0] if f.buckets] or a.per_rank[0]
    nb = min(len(f.buckets) for f in figs)
    for i in range(nb):
        med = {
            k: float(np.median([f.buckets[i][k] for f in figs]))
            for k in ("wire", "ready", "start", "end", "comm", "codec", "waited")
        }
        b = figs[-1].buckets[i]
        L.append(
            f"  {b['index']:>5} {b['bytes'] / 1e6:>8.3f} {med['wire'] / 1e6:>8.3f} "
            + "".join(f"{_ms(med[k]):>9}" for k in ("ready", "start", "end", "comm", "codec", "waited"))
        )
    if any(not b["measured_start"] for f in figs for b in f.buckets):
        L.append(
            "  (start times inferred: this hook reports no start; the previous bucket's end or the hand-over)"
        )
    return L


def _verdict_lines(a: StepAnalysis) -> List[str]:
    """The verdict and the model behind it, checked against the measurement."""
    L: List[str] = []
    v, link = a.verdict, a.link
    L.append("")
    L.append(f"VERDICT: {v['label'].upper()}: {v['reason']}")
    L.append(
        f"  model: alpha {link.alpha * 1e6:.0f} us per call, {1 / link.beta / 1e6 if link.beta else float('inf'):.1f} MB/s "
        f"per rank on the wire ({link.source})"
    )
    ranks_ = [r for s in a.shapes for r in s.ranks]
    L.append(
        f"  a bucket's hook on the training thread: {np.median([r.eta_wake for r in ranks_]) * 1e6:.0f} us when it "
        f"wakes the idle worker, {np.median([r.eta_busy for r in ranks_]) * 1e6:.0f} us when the worker is busy"
    )
    measured = a.measured()
    L.append(
        f"  model check: {_ms(v['model_s'])} ms predicted for the current setting, {_ms(measured)} ms measured "
        f"({100 * (v['model_s'] / measured - 1):+.0f}%)"
    )
    L.append(
        f"  without communication {_ms(v['no_comm_s'])} ms; infinitely fast link {_ms(v['fast_link_s'])} ms; "
        f"zero per-bucket overhead {_ms(v['no_overhead_s'])} ms"
    )
    L.append(
        "  (each traced step replayed under a setting; mean over ranks, median over steps: docs/profiler.md)"
    )
    L.append("")
    return L


def _advice_lines(a: StepAnalysis) -> List[str]:
    """The suggestions and the predicted step time of every setting."""
    L: List[str] = []
    sug = a.advice["suggestions"]
    if not sug:
        L.append(
            f"SUGGESTIONS: none predicts a step more than {sm.MIN_GAIN:.0%} faster; keep the current setting."
        )
    else:
        L.append("SUGGESTIONS (predicted step time, speed-up over the model's current step):")
        for s in sug:
            L.append(f"  {s['kind']:<13} {s['text']}: {_ms(s['predicted_s'])} ms ({s['speedup']:.2f}x)")
            if s.get("note"):
                L.append(f"  {'':<13} {s['note']}")
    L.append("")
    L.append("predicted step time (ms) by method and bucket cap (MiB):")
    table = a.advice["table"]
    keys = list(next(iter(table.values())).keys())
    L.append(f"  {'method':<10}" + "".join(f"{k:>9}" for k in keys))
    for meth, row in table.items():
        L.append(f"  {meth[:10]:<10}" + "".join(f"{_ms(row[k]):>9}" for k in keys))
    acc = a.advice["accumulation"]
    L.append(
        "gradient accumulation (mean ms per micro-batch): "
        + ", ".join(f"k={k}: {_ms(t)}" for k, t in acc.items())
    )
    return L


# -- timeline -------------------------------------------------------------------------------------
PHASE_COLOURS = {
    "data": "#bbbbbb",
    "forward": "#4c72b0",
    "backward": "#55a868",
    "sync": "#c44e52",
    "optimizer": "#8172b2",
}


def plot_timeline(
    docs: List[Dict[str, Any]], analyses: List[StepAnalysis], path: Any, steps: int = 3
) -> None:
    """A PNG: for each rank a compute lane (phases) and a communication lane (buckets, ready
    marks), over `steps` consecutive analysed steps around the median step, rank 0's clock."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a = analyses[0]
    mid = a.model["id"]
    order = np.argsort(a.step_time)
    centre = int(order[len(order) // 2])
    first = max(0, min(centre - steps // 2, len(a.steps) - steps))
    chosen = set(a.steps[first : first + steps])
    maps = clock_maps(docs)
    spans = []
    for d in docs:
        for s in d["models"][mid]["steps"]:
            if s["step"] in chosen:
                spans.append((d["rank"], s))
    t0 = min(maps[r](v[0]) for r, s in spans for v in s["phases"].values())
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.9 * a.ranks))
    for r, s in spans:
        m = maps[r]
        y = 2 * (a.ranks - 1 - r)
        for name, (b, e) in s["phases"].items():
            if e is not None:
                ax.broken_barh(
                    [((m(b) - t0) / 1e6, (e - b) / 1e6)], (y + 1.05, 0.8), color=PHASE_COLOURS.get(name, "k")
                )
        for bk in s["buckets"]:
            if bk["end"] is None:
                continue
            start = bk["start"] if bk["start"] is not None else bk["issued"]
            ax.broken_barh(
                [((m(start) - t0) / 1e6, (bk["end"] - start) / 1e6)],
                (y + 0.1, 0.8),
                color="#dd8452",
                edgecolor="k",
                linewidth=0.3,
            )
            ax.plot([(m(bk["ready"]) - t0) / 1e6], [y + 0.95], "k|", markersize=6)
    ax.set_yticks([2 * (a.ranks - 1 - r) + off for r in range(a.ranks) for off in (0.5, 1.45)])
    ax.set_yticklabels([f"rank {r} {lane}" for r in range(a.ranks) for lane in ("comm", "compute")])
    ax.set_xlabel("ms (rank 0's clock)")
    handles = [matplotlib.patches.Patch(color=c, label=n) for n, c in PHASE_COLOURS.items()]
    handles.append(matplotlib.patches.Patch(color="#dd8452", label="bucket communication"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=6, fontsize=8)
    ax.set_title(
        f"{a.model['name']} on {a.ranks} ranks ({a.model['backend']}): {a.verdict['label']}, "
        f"median step {float(np.median(a.step_time)) * 1e3:.1f} ms"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
