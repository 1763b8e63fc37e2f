"""The `zcoll` command: `info` (this installation), `run` (restart a job from its last checkpoint:
zcoll/launcher.py), `probe` (the network between the ranks), `report` (step traces or flight-recorder dumps).
"""
from __future__ import annotations

import argparse
import sys

from . import launcher


def _info(_args: argparse.Namespace) -> int:
    from . import _C, __version__

    print(f"zcoll {__version__}")
    print(f"MPI: {_C.mpi_library_version().splitlines()[0].strip()}")
    print(f"SIMD: {_C.simd_level()} (detected {_C.detected_simd_level()}; override with ZCOLL_SIMD)")
    print(f"CUDA kernels built: {_C.with_cuda}")
    print("\nSettings (ZCOLL_* environment variables; an explicit argument beats them):")
    rows = _C.env_settings()
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        print(f"  {r['name']:<{width}}  {r['value']:<8} ({r['source']})  {r['help']}")
        print(f"  {'':<{width}}  valid: {r['valid']}")
    return 0


def _report(args: argparse.Namespace) -> int:
    """What the paths hold decides the report: step traces (zcoll-trace-rank*.json, written by
    zcoll.torch.profile or ZCOLL_TRACE) get the step summary and a PNG timeline; flight-recorder
    dumps (zcoll-flight-*.json) say where the ranks diverged; guarded compression's metrics logs
    (*.jsonl, given or in a directory) their decisions, checks and escalations."""
    from pathlib import Path

    from . import flight, metrics

    paths = args.paths or [_C_dump_directory()]
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        print(f"zcoll report: {', '.join(missing)} does not exist", file=sys.stderr)
        return 2
    logs = [q for p in paths for q in ([p] if not Path(p).is_dir() else sorted(Path(p).glob("*.jsonl")))]
    logs = [q for q in logs if metrics.is_metrics_log(q)]  # guarded compression (compression="auto")
    for q in logs:
        print(metrics.report(q))
    if len(paths) == 1 and Path(paths[0]).is_dir() and any(Path(paths[0]).glob("zcoll-trace-rank*.json")):
        return _step_report(Path(paths[0]), args)
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


def _C_dump_directory() -> str:
    from . import _C

    return _C.dump_directory()


def _step_report(directory, args: argparse.Namespace) -> int:
    from . import step_report, trace

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zcoll", description="zcoll collective communication tools")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="show the version, MPI library and SIMD level in use")
    p.set_defaults(func=_info)
    from . import probe

    for command, module, entry, summary in (
        ("run", launcher, launcher.run, "run an MPI job, restarting it from its last checkpoint when it fails"),
        ("probe", probe, probe.main,
         "measure every rank pair's latency and bandwidth (run under mpirun); tiers, hotspots, placement"),
    ):  # fmt: skip
        p = sub.add_parser(
            command, help=summary, description=module.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        module.add_arguments(p)
        p.set_defaults(func=entry)

    p = sub.add_parser(
        "report",
        help="summarise step traces (zcoll.torch.profile / ZCOLL_TRACE) or flight-recorder dumps",
        description="Step traces (a directory of zcoll-trace-rank*.json): per-rank phase and bucket times, "
        "communication, exposed communication, overlap, achieved bytes/s against the link's measured capacity, "
        "the slowest rank per step, and a verdict (compute-, link- or overhead-bound) with suggestions (bucket "
        "size, compression, gradient accumulation) and the step time each predicts; writes DIR/zcoll-report.txt, "
        "DIR/zcoll-timeline.png and the merged Chrome trace DIR/zcoll-trace.json (ui.perfetto.dev); the model: "
        "docs/profiler.md. Flight-recorder dumps (zcoll-flight-*.json, written when a collective fails, on "
        "SIGUSR1 and on zcoll.dump()): each rank's last call and its state, whom it waits for, ranks that never "
        "entered the last call or left no dump, and the first call the ranks made differently (docs/diagnose.md).",
    )
    p.add_argument("paths", nargs="*", help="a trace directory, or dump files or directories (default: ZCOLL_DUMP_DIR)")
    p.add_argument("--warmup", type=int, default=3, help="first steps left out of the analysis (default 3)")
    p.add_argument("--steps", type=int, default=3, help="steps drawn in the timeline (default 3)")
    p.add_argument(
        "--png", default=None, help="where to draw the timeline (default DIR/zcoll-timeline.png; '' for none)"
    )
    p.set_defaults(func=_report)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
