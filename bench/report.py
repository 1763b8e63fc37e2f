#!/usr/bin/env python3
"""Turns a `zcoll_*_perf --csv FILE` table into a markdown table and a PNG plot.

    mpirun -n 2 zcoll_allreduce_perf -a all --csv ar.csv
    python bench/report.py ar.csv --png ar.png     # prints the markdown table

Table: busbw (GB/s) per algorithm and size, the best zcoll algorithm's speed-up over MPI and
`auto`'s time relative to the best zcoll algorithm. Plot: busbw against size, one line per
algorithm (log-log).
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict

from zcoll.tools import perf_table


def human(size: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size // scale} {unit}"
    return f"{size} B"


def load(path: str):
    rows = perf_table.read_csv(path)
    if not rows:
        raise SystemExit(f"{path}: no rows")
    table = defaultdict(dict)  # size -> algorithm -> row
    algos = []
    for r in rows:
        table[r.size][r.algorithm] = r
        if r.algorithm not in algos:
            algos.append(r.algorithm)
    return rows[0], table, algos


def markdown(table, algos) -> str:
    zcoll = [a for a in algos if a != "mpi"]
    head = ["size", *algos, "best zcoll / mpi", "auto / best"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for size in sorted(table):
        row = table[size]
        best = min((row[a] for a in zcoll if a in row), key=lambda r: r.time_us)
        cells = [human(size)]
        cells += [f"{row[a].busbw_gbs:.2f}" if a in row else "" for a in algos]
        cells.append(f"{row['mpi'].time_us / best.time_us:.2f}x ({best.algorithm})")
        auto = row.get("auto")
        cells.append(f"{auto.time_us / best.time_us:.2f}" if auto else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(first, table, algos, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    sizes = sorted(table)
    for a in algos:
        pts = [(s, table[s][a].busbw_gbs) for s in sizes if a in table[s]]
        style = "k--" if a == "mpi" else "-"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker=".", label=a)
    ax.set(xscale="log", yscale="log", xlabel="bytes per rank", ylabel="busbw (GB/s)",
           title=f"{first.collective}, {first.ranks} ranks, {first.type} {first.redop}")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", help="a file written by zcoll_*_perf --csv")
    p.add_argument("--png", help="also write a plot of busbw against size")
    args = p.parse_args(argv)
    first, table, algos = load(args.csv)
    print(markdown(table, algos))
    if args.png:
        plot(first, table, algos, args.png)
        print(f"\nplot: {args.png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
