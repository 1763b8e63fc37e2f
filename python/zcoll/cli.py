"""The `zcoll` command: information about this installation (more subcommands follow)."""
from __future__ import annotations

import argparse
import sys


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
    from . import flight

    paths = args.paths or [_C_dump_directory()]
    if not any(flight.is_flight_dump(p) for p in paths):
        print(f"zcoll report: no flight-recorder dumps ({flight.PATTERN}) in {' '.join(paths)}", file=sys.stderr)
        return 2
    print(flight.report(paths))
    return 0


def _C_dump_directory() -> str:
    from . import _C

    return _C.dump_directory()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zcoll", description="zcoll collective communication tools")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="show the version, MPI library and SIMD level in use")
    p.set_defaults(func=_info)
    p = sub.add_parser(
        "report",
        help="where the ranks diverged, from flight-recorder dumps (zcoll-flight-*.json)",
        description="Lines up the ranks' flight-recorder dumps (written when a collective fails, on "
        "SIGUSR1 and on zcoll.dump()) and says where they diverged: each rank's last call and its "
        "state, whom it waits for, ranks that never entered the last call or left no dump, and the "
        "first call the ranks made differently.",
    )
    p.add_argument("paths", nargs="*", help="dump files or directories (default: ZCOLL_DUMP_DIR)")
    p.set_defaults(func=_report)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
