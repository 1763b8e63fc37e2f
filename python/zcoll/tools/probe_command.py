"""`zcoll probe`: latency and bandwidth of every directed rank pair (run under mpirun), its tiers,
hotspots and a better placement (zcoll.observe.probe measures, zcoll.observe.probe_report writes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..observe import probe, probe_report


def add_arguments(p) -> None:
    """The options of `zcoll probe` (an argparse parser)."""
    p.add_argument("--out", default="zcoll-probe", help="directory for the files (default zcoll-probe)")
    p.add_argument("--message-bytes", type=int, default=1 << 20, help="bandwidth message size (default 1 MiB)")
    p.add_argument("--window", type=int, default=8, help="bandwidth messages in flight (default 8)")
    p.add_argument("--budget", type=float, default=0.3, help="seconds per direction of a pair (default 0.3)")
    p.add_argument("--repeats", type=int, default=2, help="bandwidth streams per direction, the fastest counts (default 2)")
    p.add_argument("--latency-iters", type=int, default=100, help="ping-pongs per pair (default 100)")
    p.add_argument("--serial", action="store_true", help="one pair at a time, even on different nodes")
    p.add_argument("--tier-gap", type=float, default=2.0, help="cut tiers where bandwidth drops this factor (default 2)")
    p.add_argument("--tier-min-share", type=float, default=0.25,
                   help="smaller groups of a kind's links join the nearest tier (default 0.25)")
    p.add_argument("--hotspot-ratio", type=float, default=0.7,
                   help="a link below this times its tier's median is a hotspot (default 0.7)")
    p.add_argument("--traffic", help="CSV of a PxP traffic matrix (bytes rank i sends to j) for the placement; "
                   "default: a ring in rank order")
    p.add_argument("--from", dest="source", metavar="PROBE_JSON",
                   help="analyse a saved probe.json again (no MPI, no measurement)")
    p.add_argument("--no-png", action="store_true", help="no heatmap.png")
    p.add_argument("--no-html", action="store_true", help="no report.html")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def main(args) -> int:
    """`zcoll probe` (see add_arguments); rank 0 prints and writes."""
    traffic = np.loadtxt(args.traffic, delimiter=",", ndmin=2) if args.traffic else None
    rules = dict(gap=args.tier_gap, min_share=args.tier_min_share, ratio=args.hotspot_ratio, traffic=traffic,
                 traffic_name=Path(args.traffic).name if args.traffic else "ring in rank order")
    if args.source:
        result, rank = probe.load(args.source).analyse(**rules), 0
    else:
        from mpi4py import MPI  # (initialises MPI: only when measuring)

        opt = probe.Options(args.message_bytes, args.window, args.budget, args.repeats, args.latency_iters,
                      serial=args.serial)
        progress = None if args.quiet else (lambda line: print(line, flush=True))
        result, rank = probe.measure(MPI.COMM_WORLD, opt, progress, **rules), MPI.COMM_WORLD.rank
    if rank == 0:
        written = probe_report.write_outputs(result, Path(args.out), png=not args.no_png, page=not args.no_html)
        print(probe_report.format_report(result, written), flush=True)
    return 0
