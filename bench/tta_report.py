"""bench/tta.py's report: per set-up, workload and method, over seeds, the time to the quality
target (median and range), the speed-up against gloo and against uncompressed zcoll (ratios of
the medians, each measured in the same jobs), the quality at the budget's end (equal steps), and
the plots of quality against wall-clock time."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from tta_job import METHODS
from tta_workloads import WORKLOADS

COLUMNS = ["setup", "workload", "method", "reached", "time_to_target_s", "range_s", "vs_gloo", "vs_zcoll",
           "steps_to_target", "final", "final_range", "step_ms"]  # fmt: skip


def _median(xs: List[float]) -> Optional[float]:
    return statistics.median(xs) if xs else None


def cells(docs: List[Dict[str, Any]]) -> Dict[Tuple[str, str, str], Dict[str, Any]]:
    """(setup, workload, method) -> the seeds' figures."""
    out: Dict[Tuple[str, str, str], Dict[str, Any]] = {}
    for d in docs:
        for method, r in d["methods"].items():
            c = out.setdefault((d["setup"], d["workload"], method), {"seeds": 0, "times": [], "steps": [], "finals": [],
                                                                      "step_s": [], "failures": [], "doc": d})  # fmt: skip
            c["seeds"] += 1
            if r.get("failure"):
                c["failures"].append(r["failure"])
            if r.get("reached"):
                c["times"].append(r["reached"]["seconds"])
                c["steps"].append(r["reached"]["step"])
            if r.get("final") is not None:
                c["finals"].append(r["final"])
            if r.get("step_s_median"):
                c["step_s"].append(r["step_s_median"])
    return out


def rows(docs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    table = cells(docs)
    out = []
    for (setup, workload, method), c in sorted(table.items(), key=lambda kv: _order(kv[0])):
        t = _median(c["times"])
        ref = {
            name: _median(table.get((setup, workload, name), {}).get("times", []))
            for name in ("gloo", "zcoll")
        }
        finals = c["finals"]
        out.append({
            "setup": setup, "workload": workload, "method": method,
            "reached": f"{len(c['times'])}/{c['seeds']}",
            "time_to_target_s": t,
            "range_s": (min(c["times"]), max(c["times"])) if c["times"] else None,
            "vs_gloo": ref["gloo"] / t if t and ref["gloo"] else None,
            "vs_zcoll": ref["zcoll"] / t if t and ref["zcoll"] else None,
            "steps_to_target": _median(c["steps"]),
            "final": _median(finals),
            "final_range": (min(finals), max(finals)) if finals else None,
            "step_ms": 1e3 * _median(c["step_s"]) if c["step_s"] else None,
            "failure": c["failures"][0] if c["failures"] else None,
        })  # fmt: skip
    return out


def _order(key: Tuple[str, str, str]) -> Tuple[int, int, int, str]:
    setups = ["shm2", "shm4", "net1g", "net100m"]
    s, w, m = key
    return (setups.index(s) if s in setups else 9, list(WORKLOADS).index(w) if w in WORKLOADS else 9,
            list(METHODS).index(m) if m in METHODS else 99, m)  # fmt: skip


def gist(why: str, width: int = 160) -> str:
    """The informative line of a failure: an exception or abort message rather than mpirun's banner."""
    lines = [" ".join(line.split()) for line in why.splitlines()]
    found = (line for key in ("what():", "Error", "error") for line in lines if key in line)
    best = next(found, None)
    return (best or next((line for line in lines if line and not line.startswith("=")), why))[:width]


def _fmt(v: Any, spec: str = ".2f") -> str:
    if v is None:
        return "-"
    if isinstance(v, tuple):
        return f"{v[0]:{spec}}-{v[1]:{spec}}"
    return f"{v:{spec}}"


def markdown(table: List[Dict[str, Any]], docs: List[Dict[str, Any]]) -> str:
    lines = ["| set-up | workload | method | reached | time to target s (median, range) | vs gloo | vs zcoll | "
             "steps to target | quality at the budget (median, range) | step ms |", "|" + "---|" * 10]  # fmt: skip
    for r in table:
        if r["method"] == "compute":  # a bound, not a way to train: each rank alone, no communication
            lines.append(f"| {r['setup']} | {r['workload']} | compute (no communication: the bound) | - | - | - | - | - "
                         f"| - | {_fmt(r['step_ms'], '.1f')} |")  # fmt: skip
            continue
        time_cell = (
            f"{_fmt(r['time_to_target_s'], '.1f')} ({_fmt(r['range_s'], '.1f')})"
            if r["time_to_target_s"]
            else "not reached"
        )
        if r["failure"]:
            time_cell += f" **failed: {gist(r['failure'])}**"
        lines.append(f"| {r['setup']} | {r['workload']} | {r['method']} | {r['reached']} | {time_cell} | "
                     f"{_fmt(r['vs_gloo'])}x | {_fmt(r['vs_zcoll'])}x | {_fmt(r['steps_to_target'], '.0f')} | "
                     f"{_fmt(r['final'], '.3f')} ({_fmt(r['final_range'], '.3f')}) | {_fmt(r['step_ms'], '.1f')} |")  # fmt: skip
    groups = {(r["setup"], r["workload"]) for r in table}
    for setup, workload in sorted(groups):
        if not any(r["time_to_target_s"] for r in table if (r["setup"], r["workload"]) == (setup, workload)):
            d = next(d for d in docs if (d["setup"], d["workload"]) == (setup, workload))
            lines.append(f"\n{setup} {workload}: no method reached the target ({d['quality']} {d['target']}) within "
                         f"the budget of {d['steps']} steps: it is beyond this budget")  # fmt: skip
    failed = [d for d in docs if d.get("job_failure")]
    for d in failed:
        lines.append(
            f"\njob {d['setup']} {d['workload']} seed {d['seed']} failed: {gist(d['job_failure'], 400)}"
        )
    targets = {d["workload"]: (d["quality"], d["target"], d["steps"]) for d in docs}
    lines.append("")
    for w, (quality, target, steps) in sorted(targets.items()):
        lines.append(
            f"- {w}: target {quality} {'>=' if 'accuracy' in quality else '<='} {target}, budget {steps} steps"
        )
    return "\n".join(lines) + "\n"


def summary(table: List[Dict[str, Any]], docs: List[Dict[str, Any]]) -> str:
    """One line per set-up and workload: gloo, uncompressed zcoll, the best fixed method and auto
    (time to target, medians over seeds), auto's ratios, its quality at the budget against
    uncompressed zcoll's, and its time against the compute-only bound (auto's steps to target
    times the step with no communication)."""
    lines = ["| set-up | workload | gloo s | zcoll s | best fixed | auto s | auto chose | auto vs gloo | "
             "auto vs zcoll | auto vs best | quality at the budget: auto / zcoll | auto / compute-only bound |",
             "|" + "---|" * 12]  # fmt: skip
    for setup, workload in sorted(
        {(r["setup"], r["workload"]) for r in table}, key=lambda k: _order((*k, ""))
    ):
        cell = {r["method"]: r for r in table if (r["setup"], r["workload"]) == (setup, workload)}
        fixed = [r for m, r in cell.items() if m not in ("compute", "zcoll-auto") and r["time_to_target_s"]]
        best = min(fixed, key=lambda r: r["time_to_target_s"], default=None)
        auto, zc, gl, comp = (cell.get(m, {}) for m in ("zcoll-auto", "zcoll", "gloo", "compute"))
        t = auto.get("time_to_target_s")
        bound = (
            comp.get("step_ms")
            and auto.get("steps_to_target")
            and comp["step_ms"] * auto["steps_to_target"] / 1e3
        )
        chose = _chosen(docs, setup, workload)
        lines.append(f"| {setup} | {workload} | {_fmt(gl.get('time_to_target_s'), '.1f')} | {_fmt(zc.get('time_to_target_s'), '.1f')} | "
                     f"{best['method'] + ' ' + _fmt(best['time_to_target_s'], '.1f') if best else '-'} | {_fmt(t, '.1f')} | {chose} | "
                     f"{_fmt(auto.get('vs_gloo'))}x | {_fmt(auto.get('vs_zcoll'))}x | "
                     f"{_fmt(best['time_to_target_s'] / t if best and t else None)}x | "
                     f"{_fmt(auto.get('final'), '.3f')} / {_fmt(zc.get('final'), '.3f')} | {_fmt(t / bound if t and bound else None)}x |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _chosen(docs: List[Dict[str, Any]], setup: str, workload: str) -> str:
    """What auto sent with, over the seeds' jobs: each method and on how many buckets."""
    counts: Dict[str, int] = {}
    for d in docs:
        a = (
            d["methods"].get("zcoll-auto", {}).get("auto")
            if (d["setup"], d["workload"]) == (setup, workload)
            else None
        )
        for method in (a or {}).get("in_use", {}).values():
            counts[method] = counts.get(method, 0) + 1
    return ", ".join(f"{m} x{n}" for m, n in sorted(counts.items())) or "-"


def write(docs: List[Dict[str, Any]], out: Path) -> str:
    table = rows(docs)
    text = summary(table, docs) + "\n" + markdown(table, docs)
    (out / "tta.md").write_text(text)
    with open(out / "tta.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS + ["failure"])
        writer.writeheader()
        for r in table:
            writer.writerow({k: (f"{v[0]}-{v[1]}" if isinstance(v, tuple) else v) for k, v in r.items()})
    plot(docs, out)
    return text


def plot(docs: List[Dict[str, Any]], out: Path) -> None:
    """Per set-up one figure: a panel per workload, quality against the clock, one curve per
    method (at each evaluation the median over seeds of its clock and of its quality)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for setup in sorted({d["setup"] for d in docs}):
        mine = [d for d in docs if d["setup"] == setup and d["methods"]]
        workloads = sorted({d["workload"] for d in mine})
        if not workloads:
            continue
        fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4.5), squeeze=False)
        for ax, w in zip(axes[0], workloads):
            runs = [d for d in mine if d["workload"] == w]
            for method in runs[0]["methods"]:
                curves = [d["methods"][method]["evals"] for d in runs if method in d["methods"]]
                n = min(len(c) for c in curves)
                if n == 0:
                    continue
                xs = [statistics.median(c[i][1] for c in curves) for i in range(n)]
                ys = [statistics.median(c[i][2] for c in curves) for i in range(n)]
                ax.plot(xs, ys, label=method, linestyle="--" if method.startswith("gloo") else "-")
            ax.axhline(runs[0]["target"], color="k", linewidth=0.8, linestyle=":")
            ax.set_title(f"{w} ({setup}, {runs[0]['ranks'] if 'ranks' in runs[0] else '?'} ranks)")
            ax.set_xlabel("training wall-clock s (slowest rank; evaluation excluded)")
            ax.set_ylabel(runs[0]["quality"])
            ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"tta-{setup}.png", dpi=90)
        plt.close(fig)
