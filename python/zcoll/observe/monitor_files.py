"""A finished run for ``zcoll monitor DIR``: what its files say, as MonitorState.load() takes it.

Read from DIR (each part optional, at least one needed):

1. step traces (``zcoll-trace-rank*.json``, zcoll.torch.profile / ZCOLL_TRACE): every analysed
   step per rank (step, compute, communication, exposed communication, overlap), the step
   report's verdict (compute-, link- or overhead-bound) and its suggestions (zcoll.observe.step_report);
2. a link probe (``probe.json`` in DIR or DIR/zcoll-probe/, ``zcoll probe``): the bandwidth and
   latency matrices and their hotspots;
3. guarded compression's metrics logs (``*.jsonl``): each bucket's last ratio, residual ratio
   and time;
4. flight-recorder dumps (``zcoll-flight-*.json``): each dumping rank and its reason, as faults.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from . import flight, guard_metrics, probe, step_report, trace


def load(directory: Any, warmup: int = 3) -> dict[str, Any]:
    """The snapshot of a finished run; ValueError when DIR holds nothing of the above."""
    d = Path(directory)
    if not d.is_dir():
        raise ValueError(f"{d} is not a directory")
    snap: dict[str, Any] = {
        "run": d.name,
        "steps": {},
        "ranks": {},
        "setup": {},
        "faults": [],
        "verdicts": [],
    }
    found = [part(d, snap, warmup) for part in (_traces, _probe, _guard, _flight)]
    if not any(found):
        raise ValueError(
            f"{d}: no step traces (zcoll-trace-rank*.json), probe.json, metrics log (*.jsonl) or flight-recorder "
            "dumps (zcoll-flight-*.json)"
        )
    return snap


def _traces(d: Path, snap: dict[str, Any], warmup: int) -> bool:
    if not any(d.glob("zcoll-trace-rank*.json")):
        return False
    docs = trace.load(d)
    a = step_report.analyze(docs, warmup=warmup)[0]
    for r in range(a.ranks):
        snap["steps"][r] = [
            {"step": f.step, "step_s": f.duration, "compute": f.duration - f.exposed, "communication": f.comm,
             "exposed_communication": f.exposed, "overlap": f.hidden / f.comm if f.comm > 0 else None,
             "source": "profiler"}
            for f in a.per_rank[r]
        ]  # fmt: skip
    s = a.summary()
    verdict = {
        "label": s["verdict"],
        "who": None,
        "text": f"{s['verdict']}: {s['reason']}",
        "evidence": s["reason"],
    }
    snap["verdict"] = verdict
    snap["verdicts"] = [dict(verdict, t=None)]
    snap["report"] = {
        "model": s["model"], "step_s": s["step_s"], "model_step_s": s["model_step_s"],
        "suggestions": [
            {"kind": x["kind"], "text": f"{x['text']}: {x['predicted_s'] * 1e3:.1f} ms predicted ({x['speedup']:.2f}x)"}
            for x in s["suggestions"]
        ],
    }  # fmt: skip
    snap["setup"] = {"ranks": a.ranks, "model": s["model"], "backend": s["backend"],
                     "compression": [a.model.get("compression") or "none"]}  # fmt: skip
    return True


def _probe(d: Path, snap: dict[str, Any], _warmup: int) -> bool:
    path = next((p for p in (d / "probe.json", d / "zcoll-probe" / "probe.json") if p.is_file()), None)
    if path is None:
        return False
    r = probe.load(path)

    def matrix(m: Any) -> list:
        return [[float(v) if math.isfinite(v) else None for v in row] for row in m]

    snap["links"] = {"bandwidth": matrix(r.bandwidth), "latency": matrix(r.latency), "source": "zcoll probe"}
    snap["setup"].setdefault("ranks", r.size)
    if r.hotspots and "verdict" not in snap:
        h = r.hotspots[0]
        i, j = h.pairs[0]
        snap["verdict"] = {
            "label": "slow link",
            "who": f"{i}->{j}",
            "text": h.describe(),
            "evidence": h.describe(),
        }
    snap.setdefault("report", {}).setdefault("suggestions", []).extend(
        {"kind": "probe", "text": f"hotspot: {h.describe()}"} for h in r.hotspots
    )
    return True


def _guard(d: Path, snap: dict[str, Any], _warmup: int) -> bool:
    logs = [p for p in sorted(d.glob("*.jsonl")) if guard_metrics.is_metrics_log(p)]
    for p in logs:
        last: dict[tuple, dict[str, Any]] = {}
        for line in p.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a line cut by a killed run
            if row.get("event") == "bucket" and "ratio" in row:
                last[(row["bucket"], row["method"])] = {
                    "bucket": row["bucket"], "method": row["method"], "ratio": row.get("ratio"),
                    "residual_ratio": row.get("residual_ratio"), "seconds": row.get("seconds"),
                }  # fmt: skip
        snap["ranks"].setdefault(0, {"calls": []}).setdefault("buckets", []).extend(last.values())
    return bool(logs)


def _flight(d: Path, snap: dict[str, Any], _warmup: int) -> bool:
    dumps = flight.load([str(d)])
    for dump in dumps:
        snap["faults"].append({"rank": dump.get("rank"), "what": dump.get("reason", "dumped"), "t": None})
    return bool(dumps)
