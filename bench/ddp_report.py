"""The report of bench/ddp_step.py: tables, targets, CSV and plot from its jobs' results.

1. ``make_table``: one (model, ranks, network)'s timing job (and the model's accuracy job) as rows:
   median step time and its IQR, speed-up over gloo at the same bucket setting and over gloo's
   best, communication-only time, the serial sum (compute-only + communication-only), bytes each
   rank sends per step, test accuracy; ``print_table`` prints it as markdown.
2. ``speed_targets``: the training-step targets (zcoll and its compressions against gloo on the
   emulated link and on shared memory; every zcoll configuration within the serial sum).
3. ``auto_targets``: compression='auto' and the guard: auto against the fixed methods, its
   decision and predictions from its log (zcoll.tools.auto_log), the guard's overhead, accuracy and
   byte savings.
4. ``report``: all of it from a saved ddp_step.json (``--from-json``), then the CSV and the PNG.
"""

from __future__ import annotations

import csv
import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import ddp_workload as wl
from ddp_runner import AUTO_LOGS, CONFIRM, log
from zcoll.tools import auto_log

WHERE = {"shm": "shared memory", "slow": "emulated link"}
# zcoll.AutoCompression's default check_every: the interval a user's log compares over
DEFAULT_CHECK_EVERY = 50


# -- tables ---------------------------------------------------------------------------------------
@dataclass
class Row:
    config: str
    bucket: str  # default | suggested | <n>MB | - (compute)
    bucket_mb: Optional[float]
    note: str
    step_ms: float
    p25_ms: float
    p75_ms: float
    steps: int
    comm_ms: Optional[float] = None
    serial_ms: Optional[float] = None  # compute-only + comm-only
    vs_gloo: Optional[float] = None  # gloo's step at the same bucket setting / this step
    vs_gloo_best: Optional[float] = None  # gloo's best step over bucket settings / this step
    bytes_per_step: Optional[float] = None
    bytes_estimated: bool = False
    accuracy: Optional[float] = None
    identical: Optional[bool] = None
    optimizer_ms: Optional[float] = None  # the optimizer's part of the step (median)
    # Adam's second moments exactly 0 at the end (they make torch's CPU sqrt slow: ddp_step_job)
    second_moments_at_zero: Optional[float] = None


@dataclass
class Table:
    model: str
    ranks: int
    network: str
    parameters: int
    gradient_bytes: int
    rows: List[Row]
    failed: Dict[str, str] = field(default_factory=dict)
    accuracy_epochs: int = 0
    notes: Dict[str, str] = field(default_factory=dict)  # configuration -> about its suggested buckets


def quantile(xs: List[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def estimated_bytes(config: str, ranks: int, grad_bytes: int) -> Optional[float]:
    """What a ring allreduce sends per rank (gloo counts nothing): 2 (p-1)/p of the buffer."""
    if config == "gloo":
        return 2 * (ranks - 1) / ranks * grad_bytes
    if config == "gloo-fp16":
        return 2 * (ranks - 1) / ranks * grad_bytes / 2
    return None


def make_table(network: str, timing: dict, accuracy: Optional[dict], failed: Dict[str, str]) -> Table:
    p = timing["ranks"]
    entries = timing["entries"]
    comm = {(e["config"], e["bucket"]): e for e in entries if e["kind"] == "comm"}
    rows = []
    for e in (e for e in entries if e["kind"] == "step"):
        ms = [t * 1e3 for t in e["times"]]
        r = Row(
            config=e["config"],
            bucket=e["bucket"],
            bucket_mb=e["bucket_mb"],
            note=e["note"],
            step_ms=statistics.median(ms),
            p25_ms=quantile(ms, 0.25),
            p75_ms=quantile(ms, 0.75),
            steps=len(ms),
        )
        if e.get("optimizer_median") is not None:  # (runs saved before it was recorded: absent)
            r.optimizer_ms = e["optimizer_median"] * 1e3
            r.second_moments_at_zero = e.get("second_moments_at_zero")
        c = comm.get((e["config"], e["bucket"]))
        if c is not None:
            r.comm_ms = c["median"] * 1e3
        if e["config"].startswith("zcoll"):
            r.bytes_per_step = e["bytes_per_step"]
        elif e["config"] != "compute":
            r.bytes_per_step = estimated_bytes(e["config"], p, timing["gradient_bytes"])
            r.bytes_estimated = r.bytes_per_step is not None
        rows.append(r)
    compute = next((r.step_ms for r in rows if r.config == "compute"), None)
    gloo = {r.bucket: r.step_ms for r in rows if r.config == "gloo"}
    for r in rows:
        if compute is not None and r.comm_ms is not None:
            r.serial_ms = compute + r.comm_ms
        if r.bucket in gloo:
            r.vs_gloo = gloo[r.bucket] / r.step_ms
        if gloo:
            r.vs_gloo_best = min(gloo.values()) / r.step_ms
    if accuracy is not None:
        acc = {(a["config"], a["bucket"]): a for a in accuracy["accuracy"]}
        for r in rows:
            a = acc.get((r.config, r.bucket))
            if a is not None:
                r.accuracy, r.identical = a["accuracy"], a["identical"]
    epochs = accuracy["accuracy"][0]["epochs"] if accuracy and accuracy["accuracy"] else 0
    return Table(
        model=timing["model"],
        ranks=p,
        network=network,
        parameters=timing["parameters"],
        gradient_bytes=timing["gradient_bytes"],
        rows=rows,
        failed=dict(failed),
        accuracy_epochs=epochs,
        notes=dict(timing.get("notes", {})),
    )


def fmt(x: Optional[float], spec: str, none: str = "-") -> str:
    return none if x is None else format(x, spec)


def human_bytes(b: Optional[float], estimated: bool) -> str:
    if b is None:
        return "-"
    text = f"{b / 1e6:.2f} MB" if b >= 1e5 else f"{b / 1e3:.1f} kB"
    return ("~" if estimated else "") + text


def bucket_label(r: Row) -> str:
    if r.bucket == "suggested":
        return f"sugg. {r.bucket_mb:g}MB" + ("*" if r.note.startswith("fallback") else "")
    return r.bucket


def print_table(t: Table) -> None:
    where = WHERE[t.network]
    print(
        f"\n### {t.model} ({t.parameters / 1e6:.2f}M parameters, "
        f"{t.gradient_bytes / 1e6:.1f} MB of gradients), "
        f"{t.ranks} ranks, {where}"
    )
    acc_head = f"test acc ({t.accuracy_epochs} ep)" if t.accuracy_epochs else "test acc"
    head = [
        "configuration",
        "buckets",
        "step ms",
        "IQR ms",
        "vs gloo",
        "vs gloo best",
        "comm-only ms",
        "serial ms",
        "step/serial",
        "bytes/step/rank",
        acc_head,
    ]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("-" * (len(h) + 2) for h in head) + "|")
    for r in t.rows:
        ratio = None if r.serial_ms is None else r.step_ms / r.serial_ms
        acc = (
            "-"
            if r.accuracy is None
            else f"{r.accuracy:.2%}" + ("" if r.identical or r.config == "compute" else " (ranks differ!)")
        )
        cells = [
            r.config,
            bucket_label(r),
            f"{r.step_ms:.1f}",
            f"{r.p25_ms:.0f}-{r.p75_ms:.0f}",
            fmt(r.vs_gloo, ".2f") + ("x" if r.vs_gloo else ""),
            fmt(r.vs_gloo_best, ".2f") + ("x" if r.vs_gloo_best else ""),
            fmt(r.comm_ms, ".1f"),
            fmt(r.serial_ms, ".1f"),
            fmt(ratio, ".2f"),
            human_bytes(r.bytes_per_step, r.bytes_estimated),
            acc,
        ]
        print("| " + " | ".join(cells) + " |")
    for config, reason in t.failed.items():
        print(f"| {config} | - | {reason} |")
    notes: Dict[str, List[str]] = {}  # what a suggested bucket setting came from -> configurations
    for config, note in [(r.config, r.note) for r in t.rows if r.note] + list(t.notes.items()):
        notes.setdefault(note, []).append(config)
    for note, configs in notes.items():
        print(f"  * suggested buckets of {', '.join(configs)}: {note}")
    if t.accuracy_epochs:
        print("  accuracy: separate run on shared memory; compute = rank 0's model trained on its own shard")


# -- targets --------------------------------------------------------------------------------------
@dataclass
class Target:
    what: str
    value: Optional[float]
    want: float
    detail: str
    unit: str = "x"
    at_most: bool = False  # PASS when value <= want (else >=)

    @property
    def status(self) -> str:
        if self.value is None:
            return "n/a "
        return "PASS" if (self.value <= self.want if self.at_most else self.value >= self.want) else "MISS"


def best(t: Table, config: str) -> Optional[Row]:
    rows = [r for r in t.rows if r.config == config]
    return min(rows, key=lambda r: r.step_ms) if rows else None


def speedup(t: Optional[Table], config: str, baseline: str) -> Tuple[Optional[float], str]:
    if t is None:
        return None, "not measured"
    a, b = best(t, config), best(t, baseline)
    if a is None or b is None:
        return None, f"{config if a is None else baseline} not measured"
    return (
        b.step_ms / a.step_ms,
        f"{config} {a.step_ms:.1f} ms @{bucket_label(a)} vs {baseline} {b.step_ms:.1f} ms @{bucket_label(b)}",
    )


def speed_targets(tables: List[Table]) -> List[Target]:
    """The training-step targets, each from one run's table: best bucket setting of each
    configuration against the best of gloo's; the serial sum at DDP's default buckets everywhere."""
    find = {(t.model, t.ranks, t.network): t for t in tables}
    out = []
    slow = find.get(("mlp", 2, "slow"))
    for config, baseline, want in [
        ("zcoll", "gloo", 1.25),
        ("zcoll-int8", "gloo", 2.5),
        ("zcoll-int8", "gloo-fp16", 1.7),
        ("zcoll-top1%", "gloo", 3.0),
    ]:
        value, detail = speedup(slow, config, baseline)
        out.append(Target(f"emulated link, 2 ranks, mlp: {config} vs {baseline}", value, want, detail))
    for model in wl.MODELS:
        value, detail = speedup(find.get((model, 2, "shm")), "zcoll", "gloo")
        out.append(Target(f"shared memory, 2 ranks, {model}: zcoll vs gloo", value, 1.3, detail))
    for t in tables:
        for r in t.rows:
            if r.config.startswith("zcoll") and r.bucket == "default" and r.serial_ms is not None:
                out.append(
                    Target(
                        f"{WHERE[t.network]}, {t.ranks} ranks, {t.model}: "
                        f"{r.config} @default within serial sum",
                        r.serial_ms / r.step_ms,
                        1.0,
                        f"step {r.step_ms:.1f} ms, compute + comm-only {r.serial_ms:.1f} ms",
                    )
                )
    return out


def _optimizer_detail(auto: Row, other: Row) -> str:
    """The two steps' optimizer parts and Adam's second moments at exactly 0: a model that
    trained differently (auto's trial steps ran every method) can step its optimizer at another
    speed whatever its communication (ddp_step_job.StepEntry.second_moments_at_zero)."""
    if auto.optimizer_ms is None or other.optimizer_ms is None:
        return ""
    text = f"; optimizer {auto.optimizer_ms:.1f} vs {other.optimizer_ms:.1f} ms"
    if auto.second_moments_at_zero is not None and other.second_moments_at_zero is not None:
        text += (
            f" (second moments at 0: {100 * auto.second_moments_at_zero:.1f}% vs "
            f"{100 * other.second_moments_at_zero:.1f}%)"
        )
    rest = (auto.step_ms - auto.optimizer_ms, other.step_ms - other.optimizer_ms)
    return text + f"; without it {rest[0]:.1f} vs {rest[1]:.1f} ms ({rest[1] / rest[0]:.2f}x)"


def _guard_cost(directory: Path, method: str) -> Optional[Tuple[float, float]]:
    """The guard's own wall and CPU seconds per step (medians of its guard_cost events) in the
    log of zcoll-guarded-<method>, or None without one."""
    events = [
        json.loads(line)
        for p in sorted(directory.glob(f"zcoll-guard-{method.rstrip('%')}-*.jsonl"))
        for line in p.read_text().splitlines()
        if '"guard_cost"' in line
    ]
    if not events:
        return None
    return statistics.median(e["per_step_s"] for e in events), statistics.median(
        e["cpu_per_step_s"] for e in events
    )


def auto_targets(
    tables: List[Table], out: Optional[Path], confirms: Optional[Dict[tuple, Table]] = None
) -> List[Target]:
    """compression='auto' and the guard: zcoll-auto against the fixed methods (within 5% of the
    best; on shared memory at most 3% slower than uncompressed), decided within 50 steps and its
    predicted communication within 15% of measured (from its log); the guard's overhead (<= 1% of
    the step) and the guarded methods' accuracy (within 0.3 point of uncompressed) and byte savings
    kept (>= 50% of the unguarded method's). With a confirmation run (--confirm-steps), auto
    against the fixed methods and its log are judged on that run."""
    found = []
    for t in tables:
        where = f"{WHERE[t.network]}, {t.ranks} ranks, {t.model}"
        again = (confirms or {}).get((t.model, t.ranks, t.network))
        judged = again or t
        if again is not None:
            where += " (confirmation run)"
        found += _auto_vs_fixed(judged, t.network, where)
        if best(judged, "zcoll-auto") is not None and out is not None:
            logs = f"{t.model}-{t.ranks}-{t.network}" + (CONFIRM if again is not None else "")
            found += _auto_log_targets(out / AUTO_LOGS / logs, where)
        for m in ("sign", "top1%"):
            found += _guard_targets(t, m, best(judged, "zcoll"), out, where)
    return found


def _auto_vs_fixed(judged: Table, network: str, where: str) -> List[Target]:
    """zcoll-auto within 5% of the fastest fixed method; on shared memory at most 3% slower than
    uncompressed zcoll (with zcoll-again, the A/A control, beside it)."""
    found = []
    auto, plain = best(judged, "zcoll-auto"), best(judged, "zcoll")
    fixed = [r for r in (best(judged, c) for c in wl.FIXED) if r is not None]
    if auto is not None and fixed:
        b = min(fixed, key=lambda r: r.step_ms)
        found.append(
            Target(
                f"{where}: zcoll-auto within 5% of the best fixed method",
                b.step_ms / auto.step_ms,
                round(1 / 1.05, 3),
                f"auto {auto.step_ms:.1f} ms vs {b.config} {b.step_ms:.1f} ms" + _optimizer_detail(auto, b),
            )
        )
    if auto is not None and plain is not None and network == "shm":
        twin = best(judged, "zcoll-again")
        control = f"; zcoll-again (A/A) {plain.step_ms / twin.step_ms:.2f}x" if twin is not None else ""
        found.append(
            Target(
                f"{where}: zcoll-auto at most 3% slower than uncompressed",
                plain.step_ms / auto.step_ms,
                round(1 / 1.03, 3),
                f"auto {auto.step_ms:.1f} ms vs zcoll {plain.step_ms:.1f} ms{control}",
            )
        )
    return found


def _guard_targets(t: Table, m: str, plain: Optional[Row], out: Optional[Path], where: str) -> List[Target]:
    """The guarded method m: its own overhead (<= 1% of the step, from its log), its accuracy
    against uncompressed zcoll (within 0.3 point) and the byte savings it keeps (>= 50% of the
    unguarded method's against `plain`, uncompressed zcoll)."""
    found = []
    g, f = best(t, f"zcoll-guarded-{m}"), best(t, f"zcoll-{m}")
    cost = _guard_cost(out / AUTO_LOGS / f"{t.model}-{t.ranks}-{t.network}", m) if out else None
    if g is not None and cost is not None:
        found.append(_guard_overhead(g, f, cost, m, where))
    acc = {
        c: next((r for r in t.rows if r.config == c and r.accuracy is not None), None)
        for c in ("zcoll", f"zcoll-guarded-{m}")
    }
    ga, pa = acc[f"zcoll-guarded-{m}"], acc["zcoll"]
    if ga is not None and pa is not None:
        found.append(
            Target(
                f"{where}: guarded {m} accuracy vs uncompressed",
                100 * (ga.accuracy - pa.accuracy),
                -0.3,
                f"{100 * ga.accuracy:.2f}% vs {100 * pa.accuracy:.2f}%",
                unit=" points",
            )
        )
    if (
        g is not None
        and f is not None
        and plain is not None
        and None not in (g.bytes_per_step, f.bytes_per_step, plain.bytes_per_step)
        and plain.bytes_per_step > f.bytes_per_step
    ):
        kept = (plain.bytes_per_step - g.bytes_per_step) / (plain.bytes_per_step - f.bytes_per_step)
        found.append(
            Target(
                f"{where}: guarded {m} keeps its byte savings",
                kept,
                0.5,
                f"{g.bytes_per_step / 1e6:.2f} MB vs {f.bytes_per_step / 1e6:.2f} MB unguarded, "
                f"{plain.bytes_per_step / 1e6:.2f} MB uncompressed",
            )
        )
    return found


def _guard_overhead(g: Row, f: Optional[Row], cost: Tuple[float, float], m: str, where: str) -> Target:
    """The guard's own wall time per step of zcoll-guarded-m, in percent of its step."""
    wall, cpu = cost
    return Target(
        f"{where}: guard overhead on {m} (its own wall time per step)",
        100 * wall / (g.step_ms * 1e-3),
        1,
        f"{wall * 1e3:.3f} ms of a {g.step_ms:.1f} ms step, {cpu * 1e3:.3f} ms of it CPU "
        f"({100 * cpu / (g.step_ms * 1e-3):.1f}%); steps "
        + (f"{f.step_ms:.1f} ms unguarded, " if f else "")
        + f"{g.step_ms:.1f} ms guarded (which escalates while error feedback owes a gradient)",
        unit="%",
        at_most=True,
    )


def _guard_cost(directory: Path, method: str) -> Optional[Tuple[float, float]]:
    """The guard's own wall and CPU seconds per step (medians of its guard_cost events) in the
    log of zcoll-guarded-<method>, or None without one."""
    pattern = f"zcoll-guard-{method.rstrip('%')}-*.jsonl"
    events = [e for e in auto_log.read(directory, pattern) if e.get("event") == "guard_cost"]
    if not events:
        return None
    return statistics.median(e["per_step_s"] for e in events), statistics.median(
        e["cpu_per_step_s"] for e in events
    )


def _auto_log_targets(directory: Path, where: str) -> List[Target]:
    """Decided within 50 steps; median |predicted - measured| / predicted communication <= 15%,
    measured as the interval's sum and as its typical calls (each bucket's median call times its
    calls: the odd stretched call left out), and summed over the default check interval."""
    rows = auto_log.read(directory)
    decided = [r["step"] + 1 for r in rows if r["event"] == "decision"]
    out = [
        Target(
            f"{where}: zcoll-auto decided within 50 steps",
            max(decided) if decided else None,
            50,
            f"step {max(decided) if decided else '-'} (log: {directory})",
            unit=" steps",
            at_most=True,
        )
    ]
    return out + _interval_targets(rows, where) + [_block_target(rows, where)]


def _interval_targets(rows: List[dict], where: str) -> List[Target]:
    """The median error of each check interval's prediction, of its sum and of its typical calls."""
    measured = [r for r in rows if r["event"] == "measured"]
    sums = (("relative", "measured_s", "summed"), ("typical_relative", "typical_s", "typical calls"))
    alone = sorted(abs(r["trial_relative"]) for r in measured if r.get("trial_relative") is not None)
    out = []
    for key, value, what in sums:
        rel = sorted(abs(r[key]) for r in measured if key in r)
        floor = auto_log.interval_noise(rows, value)
        median = auto_log.median_percent
        out.append(
            Target(
                f"{where}: zcoll-auto predicted communication vs measured ({what})",
                median(rel),
                15,
                f"median over {len(rel)} check intervals, worst {100 * rel[-1]:.0f}%"
                + (f"; measured vs the interval before: {100 * floor:.0f}%" if floor is not None else "")
                + (f"; the trials' model alone: {median(alone):.0f}%" if alone and key == "relative" else "")
                if rel
                else "no checks",
                unit="%",
                at_most=True,
            )
        )
    return out


def _block_target(rows: List[dict], where: str) -> Target:
    """The prediction's error summed over blocks of intervals as long as the default check interval."""
    size = DEFAULT_CHECK_EVERY // wl.AUTO_CHECK_EVERY
    learned, trial = auto_log.block_errors(rows, size)
    median = auto_log.median_percent
    return Target(
        f"{where}: zcoll-auto predicted communication vs measured (summed over "
        f"{DEFAULT_CHECK_EVERY} steps, the default check interval)",
        median(learned),
        15,
        f"median over {len(learned)} blocks of {size} intervals, worst {100 * max(learned):.0f}%"
        + (f"; the trials' model alone: {median(trial):.0f}%" if trial else "")
        if learned
        else "no block of checks",
        unit="%",
        at_most=True,
    )


def print_targets(found: List[Target], title: str) -> None:
    print(f"\nTargets ({title}; n/a = not measured in this run):")
    for t in found:
        value = "-" if t.value is None else f"{t.value:.2f}{t.unit}"
        want = f"{'<=' if t.at_most else '>='} {t.want}{t.unit}"
        print(f"  {t.status} {t.what}: {value} (want {want}) [{t.detail}]")


# -- outputs --------------------------------------------------------------------------------------
def write_csv(tables: List[Table], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = ["model", "ranks", "network", *Row.__dataclass_fields__]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields + ["failed"])
        w.writeheader()
        for t in tables:
            for r in t.rows:
                w.writerow(dict(model=t.model, ranks=t.ranks, network=t.network, **asdict(r), failed=""))
            for config, reason in t.failed.items():
                w.writerow(
                    dict(model=t.model, ranks=t.ranks, network=t.network, config=config, failed=reason)
                )
    log(f"CSV written to {path}")


def plot(tables: List[Table], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not tables:
        return
    cols = len({t.network for t in tables})
    nrows = -(-len(tables) // cols)
    height = 0.3 * max(len(t.rows) + len(t.failed) for t in tables) + 1.5
    fig, axes = plt.subplots(nrows, cols, figsize=(7.5 * cols, height * nrows), squeeze=False)
    for ax, t in zip(axes.flat, tables):
        labels = [f"{r.config} @{bucket_label(r)}" if r.config != "compute" else "compute" for r in t.rows]
        labels += [f"{config}: {reason.split(':')[0]}" for config, reason in t.failed.items()]  # no bar
        y = list(range(len(labels)))[::-1]
        err = [[r.step_ms - r.p25_ms for r in t.rows], [r.p75_ms - r.step_ms for r in t.rows]]
        colours = [
            "0.6" if r.config == "compute" else "C0" if r.config.startswith("gloo") else "C1" for r in t.rows
        ]
        ax.barh(y[: len(t.rows)], [r.step_ms for r in t.rows], xerr=err, color=colours, height=0.7, capsize=2)
        serial = [(yy, r.serial_ms) for yy, r in zip(y, t.rows) if r.serial_ms is not None]
        if serial:
            ax.plot(
                [s for _, s in serial],
                [yy for yy, _ in serial],
                "k|",
                markersize=10,
                label="compute + comm-only",
            )
            ax.legend(fontsize=7, loc="lower right")
        ax.set_yticks(y)
        ax.set_yticklabels(labels, fontsize=7)
        where = WHERE[t.network]
        ax.set(xlabel="median step time (ms), bars: 25-75%", title=f"{t.model}, {t.ranks} ranks, {where}")
        ax.grid(True, axis="x", alpha=0.3)
    for ax in list(axes.flat)[len(tables) :]:
        ax.axis("off")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    log(f"plot written to {path}")


def report(saved: dict, args) -> int:
    """Tables and targets of a run's saved results (ddp_step.json), then the CSV and the plot;
    1 when a target missed and args.require_targets, else 0."""
    tables = [
        make_table(j["network"], j["timing"], j["accuracy"], j["failed"])
        for j in saved["jobs"]
        if j["timing"]
    ]
    for j in saved["jobs"]:
        if not j["timing"]:
            print(
                f"\n### {j['model']}, {j['ranks']} ranks, {j['network']}: "
                f"every configuration failed: {j['failed']}"
            )
    for t in tables:
        print_table(t)
    confirms = {
        (j["model"], j["ranks"], j["network"]): make_table(j["network"], j["confirm"], None, j["failed"])
        for j in saved["jobs"]
        if j.get("confirm")
    }
    for t in confirms.values():
        print("\nconfirmation run (--confirm-steps): zcoll-auto against the first run's fastest fixed method")
        print_table(t)
    found = speed_targets(tables)
    print_targets(found, "the training step; value = speed-up, or serial sum / step")
    auto = auto_targets(tables, getattr(args, "out", None), confirms)
    if auto:
        print_targets(auto, "compression='auto' and the guard")
        found += auto
    write_csv(tables, args.csv)
    plot(tables, args.png)
    missed = [t for t in found if t.status == "MISS"]
    return 1 if missed and args.require_targets else 0
