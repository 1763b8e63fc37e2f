"""The `zcoll` command: `info` (this installation), `run` (restart a job from its last checkpoint:
zcoll/launcher.py), `probe` (the network between the ranks), `report DIR` (step traces).
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
    """What DIR holds decides the report: step traces (zcoll-trace-rank*.json, written by
    zcoll.torch.profile or ZCOLL_TRACE) get the step summary and a PNG timeline."""
    from pathlib import Path

    directory = Path(args.dir)
    if not directory.is_dir():
        print(f"zcoll report: {directory} is not a directory", file=sys.stderr)
        return 2
    if any(directory.glob("zcoll-trace-rank*.json")):
        return _step_report(directory, args)
    print(f"zcoll report: {directory} holds no zcoll-trace-rank*.json (step traces: zcoll.torch.profile or "
          "ZCOLL_TRACE=DIR)", file=sys.stderr)
    return 2


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
    p = sub.add_parser(
        "run",
        help="run an MPI job, restarting it from its last checkpoint when it fails",
        description=launcher.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    launcher.add_arguments(p)
    p.set_defaults(func=launcher.run)
    from . import probe

    p = sub.add_parser(
        "probe",
        help="measure every rank pair's latency and bandwidth (run under mpirun); tiers, hotspots, placement",
        description=probe.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    probe.add_arguments(p)
    p.set_defaults(func=probe.main)

    p = sub.add_parser(
        "report",
        help="summarise a directory of traces (step traces from zcoll.torch.profile / ZCOLL_TRACE)",
        description="Step traces: per-rank phase and bucket times, communication, exposed communication, "
        "overlap, achieved bytes/s against the link's measured capacity, the slowest rank per step, and a "
        "verdict (compute-, link- or overhead-bound) with suggestions (bucket size, compression, gradient "
        "accumulation) and the step time each predicts. Writes DIR/zcoll-report.txt, DIR/zcoll-timeline.png "
        "and the merged Chrome trace DIR/zcoll-trace.json (ui.perfetto.dev). The model: docs/profiler.md.",
    )
    p.add_argument("dir", help="the directory the traces were written to")
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
