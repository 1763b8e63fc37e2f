"""Metrics of guarded compression: a JSON-lines log and, when a port is set, the Prometheus text
format served from a daemon thread.

1. ``MetricsLog(path)``: one JSON object per line, ``{"t": unix seconds, "event": ..., ...}``,
   flushed per line so a crashed run keeps what it logged. Events: ``bucket`` (per bucket and
   step), ``decision``, ``check``, ``escalate``, ``relax``, ``redecide`` (zcoll.auto_compression).
2. ``port`` (or ZCOLL_METRICS_PORT): every rank serves ``GET /metrics`` on port + its rank
   (several ranks share a machine), the latest value of each gauge and each counter's total:

       zcoll_compression_ratio{bucket="ddp/bucket0/1024",method="int8"} 3.9

   rendered by prometheus_client and served by Starlette on uvicorn in a daemon thread
   (zcoll.observe.serve; the ``monitor`` extra); port 0 or unset: no server. A port in use or a
   missing extra is a warning naming it, never an error: the training goes on without the server.
   ``zcoll monitor`` shows the same figures per rank beside the rest of the job.
"""

from __future__ import annotations

import json
import math
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .. import _C
from . import metrics, serve

HELP = {
    "zcoll_compression_ratio": "dense bytes / bytes sent of the bucket's last allreduce",
    "zcoll_compression_residual_ratio": "norm of the error-feedback residual / norm of the bucket's gradient",
    "zcoll_compression_nonfinite_total": "non-finite values or blocks seen in compressed buckets",
    "zcoll_compression_check_error": "relative error of the last sampled exact check",
    "zcoll_compression_escalations_total": "times a bucket's compression was made less lossy by the guard",
    "zcoll_compression_comm_seconds": "seconds of the bucket's last allreduce",
}


class MetricsLog:
    """JSON lines at `path` (None: none) and Prometheus gauges on `port` + rank (None: from
    ZCOLL_METRICS_PORT; 0: no server)."""

    def __init__(self, path: Optional[str] = None, port: Optional[int] = None, rank: int = 0):
        self.path = Path(path) if path else None
        self._file = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")
        self._values: Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float] = {}
        self._names: Dict[Tuple[str, str], Tuple[str, str]] = {}  # (bucket, method) -> their JSON
        self._lock = threading.Lock()
        port = int(_C.env_get("ZCOLL_METRICS_PORT")) if port is None else int(port)
        self.server = _serve(self, port + rank) if port else None


    def write(self, event: str, **fields: Any) -> None:
        """One JSON line; flushed at once, except the per-step "bucket" lines, which go out with
        the next other event (a check, every check_every steps) or at close: a write call per
        bucket and step cost ~0.1 ms on the hook's worker."""
        if self._file is not None:
            self._file.write(json.dumps({"t": time.time(), "event": event, **fields}, default=float) + "\n")
            if event != "bucket":
                self._file.flush()

    def write_bucket(
        self,
        step: int,
        bucket: str,
        method: str,
        ratio: float,
        residual_ratio: float,
        nonfinite: int,
        seconds: float,
    ) -> None:
        """write("bucket", ...) for the guard's per-step line, formatted directly: json.dumps
        took ~70 us of the hook's worker per bucket and step under load."""
        if self._file is None:
            return
        names = self._names.get((bucket, method))
        if names is None:
            names = self._names[(bucket, method)] = (json.dumps(bucket), json.dumps(method))
        f = [_number(v) for v in (ratio, residual_ratio, seconds)]
        self._file.write(
            f'{{"t": {time.time()!r}, "event": "bucket", "step": {int(step)}, "bucket": {names[0]}, '
            f'"method": {names[1]}, "ratio": {f[0]}, "residual_ratio": {f[1]}, "nonfinite": {int(nonfinite)}, '
            f'"seconds": {f[2]}}}\n'
        )

    def set(self, name: str, value: float, **labels: str) -> None:
        with self._lock:
            self._values[(name, tuple(sorted(labels.items())))] = float(value)

    def add(self, name: str, value: float, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + float(value)

    def prometheus(self) -> str:
        """The Prometheus text exposition format (version 0.0.4) of every value, rendered by
        prometheus_client (names ending in _total are counters, the rest gauges)."""
        return metrics.exposition(_GuardCollector(self)).decode()

    def families(self) -> Any:
        """The values as prometheus_client metric families."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            items = sorted(self._values.items())
        fams: Dict[str, Any] = {}
        for (name, labels), v in items:
            fam = fams.get(name)
            if fam is None:
                kind = CounterMetricFamily if name.endswith("_total") else GaugeMetricFamily
                fam = fams[name] = kind(name, HELP.get(name, name), labels=[k for k, _ in labels])
            fam.add_metric([val for _, val in labels], v)
        return list(fams.values())

    def buckets(self) -> List[Dict[str, Any]]:
        """The latest figures per (bucket, method): ratio, residual_ratio, seconds (what
        zcoll monitor shows as compression per bucket)."""
        fields = {"zcoll_compression_ratio": "ratio", "zcoll_compression_residual_ratio": "residual_ratio",
                  "zcoll_compression_comm_seconds": "seconds", "zcoll_compression_check_error": "check_error"}  # fmt: skip
        with self._lock:
            items = list(self._values.items())
        rows: Dict[Tuple[str, str], Dict[str, Any]] = {}
        for (name, labels), v in items:
            d = dict(labels)
            if name in fields and "bucket" in d and "method" in d:
                row = rows.setdefault((d["bucket"], d["method"]), {"bucket": d["bucket"], "method": d["method"]})
                row[fields[name]] = v
        return list(rows.values())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.server is not None:
            self.server.close()
            self.server = None


def _number(v: float) -> str:
    """A float as json.dumps writes it (repr; Infinity and NaN spelled its way)."""
    v = float(v)
    return repr(v) if math.isfinite(v) else json.dumps(v)


class _GuardCollector:
    def __init__(self, log: MetricsLog):
        self.log = log

    def collect(self) -> Any:
        return self.log.families()


def _serve(log: MetricsLog, port: int) -> Any:
    """GET /metrics (and /) on 127.0.0.1:port: Starlette on uvicorn (zcoll.observe.serve)."""
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    async def page(_request: Any) -> Response:
        return Response(log.prometheus(), media_type=metrics.CONTENT_TYPE)

    app = Starlette(routes=[Route("/metrics", page), Route("/", page)])
    try:
        return serve.serve(app, serve.LOOPBACK, port)
    except (OSError, ImportError, RuntimeError) as e:  # the job goes on without its metrics port
        warnings.warn(f"{e}; compression metrics are not served (the JSON log, if any, is written)", stacklevel=3)
        return None


# -- zcoll report ------------------------------------------------------------------------------------
EVENTS = ("bucket", "decision", "measured", "check", "escalate", "relax", "redecide", "guard_cost")


def is_metrics_log(path: Any) -> bool:
    """A JSON-lines file whose first line is one of MetricsLog's events."""
    p = Path(path)
    if not p.is_file() or p.suffix != ".jsonl":
        return False
    with open(p, encoding="utf-8") as f:
        try:
            return json.loads(f.readline() or "{}").get("event") in EVENTS
        except ValueError:
            return False


def _errors(measured: List[Dict[str, Any]], field: str) -> str:
    """The median and worst |relative error| of the `measured` events that have `field`."""
    errors = sorted(abs(r[field]) for r in measured if r.get(field) is not None)
    return f"median |error| {100 * errors[len(errors) // 2]:.1f}%, worst {100 * errors[-1]:.1f}%"


def report(path: Any) -> str:
    """What ``zcoll report`` prints for a metrics log: the decisions (method, reason, predicted
    vs the trials' measurement of its time and of its error against the exact average), predicted
    vs measured communication per check, the exact checks per method (worst error against its
    bound, and the error against the average gradient as measured against the trials'
    prediction), escalations and relaxations, and per bucket and method the mean compression
    ratio and residual-to-gradient norm ratio."""
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    out = [f"compression metrics: {path} ({len(rows)} events)"]
    for section in (_decision_lines, _measured_lines, _guard_lines):
        out += section(rows)
    return "\n".join(out) + "\n"


def _decision_lines(rows: List[Dict[str, Any]]) -> List[str]:
    """The decisions: method, predicted and measured in the trials, reason."""
    out: List[str] = []
    decisions = [r for r in rows if r["event"] == "decision"]
    if decisions:
        out.append("decisions (predicted / measured in the trials, ms; error against the exact average):")
        for r in decisions:
            m = r["method"]
            trial = r.get("measured_trial", {}).get(m)
            none = r.get("measured_trial", {}).get("none")
            error = r.get("predicted_error")
            out.append(
                f"  step {r['step']:>4} {r['bucket']:<28} {m:>7}: {1e3 * r['predicted_s']:.2f} / "
                + (f"{1e3 * trial:.2f}" if trial is not None else "-")
                + (f" (none {1e3 * none:.2f})" if none is not None else "")
                + (f", error {100 * error:.2f}%" if error is not None else "")
                + f"  {r['reason']}"
            )
    return out


def _measured_lines(rows: List[Dict[str, Any]]) -> List[str]:
    """Predicted against measured communication over the check intervals."""
    out: List[str] = []
    measured = [r for r in rows if r["event"] == "measured"]
    if measured:
        out.append(
            f"communication, predicted vs measured over {len(measured)} check intervals: "
            f"{_errors(measured, 'relative')}; measured gain over "
            f"uncompressed (model) {1e3 * sum(r['measured_gain_s'] for r in measured):.1f} ms, predicted "
            f"{1e3 * sum(r['predicted_gain_s'] for r in measured):.1f} ms"
        )
        for field, what in (
            ("typical_relative", "typical calls (each bucket's median call times its calls)"),
            ("trial_relative", "the trials' model alone (no interval learned from)"),
        ):
            if any(r.get(field) is not None for r in measured):
                out.append(f"  {what}: {_errors(measured, field)}")
        per: Dict[str, list] = {}
        for r in measured:
            for key, (got, want) in r.get("per_bucket", {}).items():
                if want > 0:
                    per.setdefault(key, []).append(abs(got - want) / want)
        for key, errs in sorted(per.items()):
            errs.sort()
            out.append(f"  {key:<28} predicted vs measured: median |error| {100 * errs[len(errs) // 2]:.1f}%")
        trial = [
            r["measured_gain_vs_trials_s"] for r in measured if r.get("measured_gain_vs_trials_s") is not None
        ]
        if trial:
            out.append(f"measured gain over the trials' uncompressed buckets: {1e3 * sum(trial):.1f} ms")
    return out


def _guard_lines(rows: List[Dict[str, Any]]) -> List[str]:
    """The exact checks, escalations and per-bucket ratios."""
    out: List[str] = []
    checks: Dict[str, list] = {}
    for r in rows:
        if r["event"] == "check":
            checks.setdefault(r["method"], []).append((r["error"], r["bound"]))
    predicted = {
        r["method"]: r["predicted_error"] for r in rows if r["event"] == "decision" and "predicted_error" in r
    }
    for m, cs in sorted(checks.items()):
        worst = max(e for e, _ in cs)
        out.append(f"exact checks, {m}: {len(cs)}, worst relative error {worst:.3g} (bound {cs[0][1]:.3g})")
        steps = sorted(
            r["step_error"] for r in rows if r["event"] == "check" and r["method"] == m and "step_error" in r
        )
        if steps:
            trial = f"{100 * predicted[m]:.2f}%" if m in predicted else "-"
            out.append(f"  {m} against the average gradient: {100 * steps[len(steps) // 2]:.2f}% measured (median), "
                       f"{trial} predicted by the trials")  # fmt: skip
    for r in rows:
        if r["event"] in ("escalate", "relax", "redecide"):
            what = (
                r.get("reason") or f"{r.get('previous')} -> {r.get('method')} (error {r.get('error', 0):.3g})"
            )
            out.append(f"  step {r['step']:>4} {r['event']:<9} {r.get('bucket', '')} {what}")
    per: Dict[Tuple[str, str], list] = {}
    for r in rows:
        if r["event"] == "bucket" and "ratio" in r:
            per.setdefault((r["bucket"], r["method"]), []).append((r["ratio"], r["residual_ratio"]))
    if per:
        out.append("per bucket and method: steps, mean compression ratio, mean residual/gradient norm")
        for (b, m), v in sorted(per.items()):
            out.append(
                f"  {b:<28} {m:>7} {len(v):>5} {sum(x for x, _ in v) / len(v):8.1f}x "
                f"{sum(y for _, y in v) / len(v):8.3f}"
            )
    return out
