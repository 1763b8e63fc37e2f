#!/usr/bin/env python3
"""Compressed allreduce on an emulated 1 Gbit/s network.

Steps:
  1. create a network namespace whose loopback is rate-limited by a token bucket
     (ip netns add NS; tc qdisc add dev lo root tbf rate 1gbit burst 256kb latency 50ms);
  2. measure the link: zcoll's uncompressed ring at 16 MiB on 2 ranks, throughput = bytes all
     ranks sent / time (every rank shares the one loopback);
  3. for each rank count: zcoll_allreduce_perf with MPICH over TCP (MPIR_CVAR_NOLOCAL=1,
     ofi netmod, FI_PROVIDER=tcp), rows for MPI_Allreduce, zcoll's ring (-a ring: the
     shared-memory algorithm must not run, the ranks still share a node) and every compression;
  4. print the table: time, speed-up over MPI_Allreduce measured in the same run, bytes each rank
     sent, the time those bytes need at the measured link throughput (p x wire / throughput), and
     time / that link time; check the targets at 2 ranks and 16 MiB; plot time against size;
  5. delete the namespace (also on errors and Ctrl-C).
--from-csv reprints the table, the targets and the plot from a saved emulated_network.csv and
the link throughput that run measured (--throughput), running nothing.
Needs root (or CAP_NET_ADMIN + CAP_SYS_ADMIN) and the `ip` and `tc` tools; refuses with a
message and exit status 3 otherwise. Run from the repository's venv (./dev.sh sets it up).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

from zcoll.tools import netns, perf_table

METHODS = "none,fp16,bf16,int8,int4,sign,topk:0.01,randomk:0.01,threshold:6"
# At 2 ranks and 16 MiB of float32: minimum speed-up over MPI_Allreduce in the same run.
TARGETS = {"int8": 3.7, "int4": 6.5, "sign": 15.0, "topk:0.01": 20.0}
LINK_SLACK = 1.15  # each compressed row within 15% of its wire bytes / link throughput
BIN = Path(sys.executable).parent


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def refuse(msg: str) -> NoReturn:
    print(f"emulated_network.py: {msg}", file=sys.stderr)
    sys.exit(3)


def size_arg(s: str) -> str:
    if not s[:-1].isdigit() and not s.isdigit():
        raise argparse.ArgumentTypeError(f"bad size {s!r} (e.g. 4K, 64M)")
    return s


class Namespace(netns.RateLimitedLoopback):
    """The rate-limited loopback of zcoll.tools.netns, refusing with exit status 3 where the machine
    cannot emulate a network; deleted by close()."""

    def __init__(self, rate: str):
        try:
            super().__init__(rate, log=log)
        except netns.Unavailable as e:
            refuse(str(e))

    def bench(self, ranks: int, flags: list, csv_path: Path, timeout: float) -> list:
        """Runs zcoll_allreduce_perf in the namespace, echoing its rows; returns the CSV rows."""
        env = self.env(dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"))
        cmd = self.command(
            [
                str(BIN / "mpirun"),
                "-n",
                str(ranks),
                str(BIN / "zcoll_allreduce_perf"),
                *flags,
                "--csv",
                str(csv_path),
            ]
        )
        log(f"{ranks} ranks: {' '.join(cmd[cmd.index('-n') - 1 :])}")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        deadline = time.time() + timeout
        for line in proc.stdout:
            print(f"    {line.rstrip()}", flush=True)
            if time.time() > deadline:
                proc.kill()
                raise RuntimeError(f"benchmark exceeded {timeout} s")
        if proc.wait():
            raise RuntimeError(f"zcoll_allreduce_perf exited with status {proc.returncode}")
        return perf_table.read_csv(csv_path)


def measure_link(ns: Namespace, tmp: Path, iters: int) -> float:
    rows = ns.bench(
        2,
        ["-b", "16M", "-e", "16M", "-n", str(iters), "-w", "1", "-c", "0", "-a", "ring", "-z", "none"],
        tmp / "link.csv",
        timeout=300,
    )
    ring = next(r for r in rows if r.algorithm == "ring")
    throughput = 2 * ring.wire_bytes / (ring.time_us * 1e-6)
    log(
        f"link throughput: {throughput / 1e6:.1f} MB/s (zcoll ring, 16 MiB, 2 ranks: "
        f"{2 * ring.wire_bytes / 1e6:.1f} MB in {ring.time_us / 1e3:.1f} ms)"
    )
    return throughput


def report(records: list, throughput: float) -> list:
    """Adds speed-up and link-time columns; prints one table per rank count; returns the rows."""
    mpi = {(r.ranks, r.size): r.time_us for r in records if r.algorithm == "mpi"}
    out = []
    for r in records:
        p, t, wire = r.ranks, r.time_us, r.wire_bytes
        link = p * wire / throughput * 1e6  # MPI's row counts the bytes a ring would send
        out.append(
            dict(
                ranks=p,
                size=r.size,
                method="none (ring)" if r.algorithm == "ring" else r.algorithm,
                time_ms=t / 1e3,
                vs_mpi=mpi[(r.ranks, r.size)] / t,
                wire=wire,
                link_ms=link / 1e3,
                vs_link=t / link if link else float("nan"),
                wrong=r.wrong,
                rel_err=r.rel_err,
            )
        )
    for p in sorted({o["ranks"] for o in out}):
        print(
            f"\n{p} ranks (link {throughput / 1e6:.1f} MB/s shared by all ranks; link time = {p} x wire / link)"
        )
        print(
            f"| {'size':>8} | {'method':<13} | {'time ms':>9} | {'vs MPI':>7} | {'wire/rank B':>12} | "
            f"{'link ms':>9} | {'time/link':>9} | {'rel err':>8} | #wrong |"
        )
        print(
            f"|{'-' * 10}|{'-' * 15}|{'-' * 11}|{'-' * 9}|{'-' * 14}|{'-' * 11}|{'-' * 11}|{'-' * 10}|--------|"
        )
        for o in (o for o in out if o["ranks"] == p):
            print(
                f"| {human(o['size']):>8} | {o['method']:<13} | {o['time_ms']:9.2f} | {o['vs_mpi']:6.2f}x | "
                f"{o['wire']:12.0f} | {o['link_ms']:9.2f} | {o['vs_link']:9.2f} | {o['rel_err']:8.2g} | {o['wrong']:6d} |"
            )
    return out


def human(b: int) -> str:
    for unit, k in (("M", 1 << 20), ("K", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k}{unit}"
    return str(b)


def check_targets(rows: list) -> bool:
    ok = True
    print(
        "\nTargets at 2 ranks, 16 MiB float32 (speed-up over MPI_Allreduce in the same run; time within "
        f"{(LINK_SLACK - 1) * 100:.0f}% of wire bytes / link throughput):"
    )
    for method, want in TARGETS.items():
        row = next(
            (o for o in rows if o["ranks"] == 2 and o["size"] == 16 << 20 and o["method"] == method), None
        )
        if row is None:
            print(f"  {method:<10} not measured")
            continue
        good = row["vs_mpi"] >= want and row["vs_link"] <= LINK_SLACK
        ok &= good
        print(
            f"  {method:<10} {row['vs_mpi']:6.2f}x (target >= {want}x), time/link {row['vs_link']:.2f}: "
            f"{'met' if good else 'MISSED'}"
        )
    return ok


def plot(rows: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted({o["ranks"] for o in rows})
    fig, axes = plt.subplots(1, len(ranks), figsize=(6 * len(ranks), 4.5), squeeze=False)
    for ax, p in zip(axes[0], ranks):
        for method in dict.fromkeys(o["method"] for o in rows if o["ranks"] == p):
            pts = sorted((o["size"], o["time_ms"]) for o in rows if o["ranks"] == p and o["method"] == method)
            style = "k--" if method == "mpi" else "-"
            ax.plot([s for s, _ in pts], [t for _, t in pts], style, marker="o", markersize=3, label=method)
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="bytes per rank (float32)",
            ylabel="time (ms)",
            title=f"allreduce, {p} ranks, 1 Gbit/s emulated link",
        )
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    log(f"plot written to {path}")


def options(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4", help="comma-separated rank counts (default 2,4)")
    ap.add_argument("--min", type=size_arg, default="4K", help="smallest size per rank (default 4K)")
    ap.add_argument("--max", type=size_arg, default="64M", help="largest size per rank (default 64M)")
    ap.add_argument("--factor", type=int, default=4, help="size step (default 4)")
    ap.add_argument("--iters", type=int, default=3, help="timed iterations per row (default 3)")
    ap.add_argument("--methods", default=METHODS, help=f"-z list of the benchmark (default {METHODS})")
    ap.add_argument("--rate", default="1gbit", help="tbf rate of the loopback (default 1gbit)")
    ap.add_argument("--no-check", action="store_true", help="skip the result check (-c 0): faster at 64M")
    ap.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent / "results",
        help="directory for the CSV and the PNG plot (default bench/results)",
    )
    ap.add_argument(
        "--from-csv", type=Path, help="report a saved emulated_network.csv (with --throughput); run nothing"
    )
    ap.add_argument("--throughput", type=float, help="with --from-csv: the link throughput measured, bytes/s")
    args = ap.parse_args(argv)
    if args.from_csv and not args.throughput:
        ap.error("--from-csv needs --throughput (the link's bytes/s, as the run printed it)")
    return args


def run_all(ns: Namespace, args: argparse.Namespace, tmp: Path) -> tuple:
    """(link throughput, CSV rows of every rank count)."""
    throughput = measure_link(ns, tmp, args.iters)
    records = []
    for p in [int(x) for x in args.ranks.split(",")]:
        flags = ["-b", args.min, "-e", args.max, "-f", str(args.factor), "-n", str(args.iters), "-w", "1"]
        flags += ["-c", "0" if args.no_check else "1", "-a", "ring", "-z", args.methods, "-t", "120"]
        records += ns.bench(p, flags, tmp / f"p{p}.csv", timeout=3600)
    return throughput, records


def finish(records: list, throughput: float, out: Path) -> int:
    """Table, targets and plot; 0 when the targets are met and no result was wrong, else 1."""
    rows = report(records, throughput)
    met = check_targets(rows)
    plot(rows, out / "emulated_network.png")
    return 0 if met and all(o["wrong"] == 0 for o in rows) else 1


def main(argv=None) -> int:
    args = options(argv)
    if args.from_csv:
        return finish(perf_table.read_csv(args.from_csv), args.throughput, args.out)
    if not (BIN / "zcoll_allreduce_perf").exists() or not (BIN / "mpirun").exists():
        refuse(
            f"zcoll_allreduce_perf or mpirun not found in {BIN}; run with the venv's python (./dev.sh test builds it)"
        )
    if os.geteuid() != 0:
        log("not root: trying anyway (needs CAP_SYS_ADMIN and CAP_NET_ADMIN)")
    ns = Namespace(args.rate)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            throughput, records = run_all(ns, args, Path(tmp))
        args.out.mkdir(parents=True, exist_ok=True)
        perf_table.write_csv(args.out / "emulated_network.csv", records)
        return finish(records, throughput, args.out)
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        ns.close()


if __name__ == "__main__":
    sys.exit(main())
