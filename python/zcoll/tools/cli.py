"""The `zcoll` command: `info` (this installation), `run` (restart a job from its last checkpoint:
zcoll.tools.launcher), `probe` (the network between the ranks), `report` (step traces or flight-recorder dumps),
`monitor` (a live page and Prometheus metrics of a job) and `history` (the runs the monitor recorded).
"""

from __future__ import annotations

import argparse
import os
import sys

from .. import _C
from ..observe import flight, flight_torch, probe
from . import launcher, monitor_command, probe_command, report_command


def _info(_args: argparse.Namespace) -> int:
    print(f"zcoll {_C.__version__}")
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


def _flight(args: argparse.Namespace) -> int:
    paths = args.paths or [_C.dump_directory()]
    if not args.to_torch:
        print(flight.report(paths))
        return 0 if flight.load(paths) else 2
    try:
        groups = dict(flight_torch.parse_group(g) for g in args.group)
        written = flight_torch.to_torch(paths, args.out, groups, args.merge, args.label)
    except ValueError as e:
        print(f"zcoll flight: {e}", file=sys.stderr)
        return 2
    print(f"{len(written)} files for torch's analyzer in {os.path.dirname(written[0])}: "
          f"torchfrtrace {os.path.dirname(written[0])} (add --allow-incomplete-ranks when a rank left no dump)")  # fmt: skip
    return 0


def _add_report(sub: argparse._SubParsersAction) -> None:
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
    p.add_argument(
        "paths", nargs="*", help="a trace directory, or dump files or directories (default: ZCOLL_DUMP_DIR)"
    )
    p.add_argument("--warmup", type=int, default=3, help="first steps left out of the analysis (default 3)")
    p.add_argument("--steps", type=int, default=3, help="steps drawn in the timeline (default 3)")
    p.add_argument(
        "--png", default=None, help="where to draw the timeline (default DIR/zcoll-timeline.png; '' for none)"
    )
    p.set_defaults(func=report_command.report)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zcoll", description="zcoll collective communication tools")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="show the version, MPI library and SIMD level in use")
    p.set_defaults(func=_info)
    for command, module, entry, summary in (
        ("run", launcher, launcher.run, "run an MPI job, restarting it from its last checkpoint when it fails"),
        ("probe", probe, probe_command.main,
         "measure every rank pair's latency and bandwidth (run under mpirun); tiers, hotspots, placement"),
    ):  # fmt: skip
        p = sub.add_parser(
            command,
            help=summary,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        (probe_command if module is probe else module).add_arguments(p)
        p.set_defaults(func=entry)

    _add_report(sub)
    for command, summary, text, add, entry in (
        ("monitor", "a live web page and Prometheus metrics of a running job (or of a finished one)",
         monitor_command.MONITOR_HELP, monitor_command.add_monitor_arguments, monitor_command.monitor),
        ("history", "list, show and compare the runs zcoll monitor recorded", monitor_command.HISTORY_HELP,
         monitor_command.add_history_arguments, monitor_command.history),
    ):  # fmt: skip
        p = sub.add_parser(
            command, help=summary, description=text, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        add(p)
        p.set_defaults(func=entry)

    p = sub.add_parser(
        "flight",
        help="flight-recorder dumps: where the ranks diverged, or --to-torch for torch's analyzer (torchfrtrace)",
        description=flight_torch.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="*", help="dump files or directories (default: ZCOLL_DUMP_DIR)")
    p.add_argument("--to-torch", action="store_true", help="write torch flight-recorder files (one per rank)")
    p.add_argument("--out", default=None, help="where (default: <first directory>/torch-fr)")
    p.add_argument(
        "--merge", default=None, metavar="DIR", help="torch's own dumps of the same job to merge in"
    )
    p.add_argument("--group", action="append", default=[], metavar="ID=NAME[:DESC[:RANKS]]",
                   help="name a communicator's process group (repeatable)")  # fmt: skip
    p.add_argument("--label", default="gloo", help="the backend label torch's analyzer sees (default gloo)")
    p.set_defaults(func=_flight)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
