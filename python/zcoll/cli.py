"""The `zcoll` command: `info` (this installation), `run` (restart a job from its last checkpoint:
zcoll/launcher.py), `probe` (the network between the ranks)."""
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
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
