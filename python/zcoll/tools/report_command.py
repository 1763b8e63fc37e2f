"""`zcoll report`: step traces, flight-recorder dumps and guarded compression's metrics logs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import _C
from ..observe import flight, guard_metrics, step_report, trace


def report(args: argparse.Namespace) -> int:
    """What the paths hold decides the report: step traces (zcoll-trace-rank*.json, written by
    zcoll.torch.profile or ZCOLL_TRACE) get the step summary and a PNG timeline; flight-recorder
    dumps (zcoll-flight-*.json) say where the ranks diverged; guarded compression's metrics logs
    (*.jsonl, given or in a directory) their decisions, checks and escalations."""
    paths = args.paths or [_C.dump_directory()]
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        print(f"zcoll report: {', '.join(missing)} does not exist", file=sys.stderr)
        return 2
    logs = [q for p in paths for q in ([p] if not Path(p).is_dir() else sorted(Path(p).glob("*.jsonl")))]
    logs = [q for q in logs if guard_metrics.is_metrics_log(q)]  # guarded compression (compression="auto")
    for q in logs:
        print(guard_metrics.report(q))
    if len(paths) == 1 and Path(paths[0]).is_dir() and any(Path(paths[0]).glob("zcoll-trace-rank*.json")):
        return _step_traces(Path(paths[0]), args)
    if any(flight.is_flight_dump(p) for p in paths):
        print(flight.report(paths))
        return 0
    if logs:
        return 0
    print(
        f"zcoll report: no step traces (zcoll-trace-rank*.json: zcoll.torch.profile or ZCOLL_TRACE=DIR) and no "
        f"flight-recorder dumps ({flight.PATTERN}) in {' '.join(paths)}",
        file=sys.stderr,
    )
    return 2


def _step_traces(directory, args: argparse.Namespace) -> int:
    skipped: list = []
    try:
        docs = trace.load(directory)
        analyses = step_report.analyze(docs, warmup=args.warmup, skipped=skipped)
    except ValueError as e:
        print(f"zcoll report: {e}", file=sys.stderr)
        return 1
    text = step_report.format_text(analyses, str(directory)) + "".join(f"not analysed: {s}\n" for s in skipped)
    print(text)
    (directory / "zcoll-report.txt").write_text(text)
    trace.write_json(directory / trace.MERGED_FILE, trace.chrome_trace(docs))
    if args.png != "":
        png = args.png or str(directory / "zcoll-timeline.png")
        step_report.plot_timeline(docs, analyses, png, steps=args.steps)
        print(f"timeline: {png}")
    print(f"trace for ui.perfetto.dev: {directory / trace.MERGED_FILE}")
    return 0
