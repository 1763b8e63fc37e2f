#!/usr/bin/env python3
"""Where zcoll monitor's cost goes: each part of a telemetry window and of publishing, timed on
a 2-rank job (the companion of monitor_overhead.py, which measures the sum on the step time).

One MPI job (this file with --job) of a plain zcoll Communicator: --steps steps of a 1 MiB
allreduce and --compute-ms of sleep, with a LiveMonitor (window --window, period --period)
publishing to a monitor served by this process. Timed on every rank:

  step() call         each mon.step() on the training thread; "window" when it took a window
  link_stats rows     comm._link_stats_rows(reset=True), the collective gather (GIL released)
  from_rows           the rows as LinkStats (numpy)
  broadcast 8 B       one int64 broadcast (what the window's step-count proposal costs)
  diagnoser.update    zcoll.core.diagnose.Diagnoser.update of the window (blend + classify)
  links/verdict dict  the published form of the evidence and the verdict
  document            the snapshot LiveMonitor publishes (mon._document)
  json.dumps          that document as JSON
  POST                one POST of it to the monitor (the publisher's kept-alive connection)
  publisher CPU       the publisher thread's CPU seconds per second of the run (its GIL share
                      at most: the time it can take from the training thread)

The parts are timed --reps times each, one after every step of a second loop (so each window
holds a step's telemetry); wall time on rank 0 and rank 1, median and 90th percentile in us.

    python bench/monitor_breakdown.py [--steps 400] [--reps 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from monitor_launch import launch, tagged, thread_cpu

_LINE = "MONITOR-BREAKDOWN "


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=400, help="monitored steps (default 400)")
    p.add_argument("--reps", type=int, default=200, help="repetitions of each part (default 200)")
    p.add_argument("--compute-ms", type=float, default=10.0, help="sleep per step (default 10 ms)")
    p.add_argument("--window", type=float, default=0.25)
    p.add_argument("--period", type=float, default=1.0)
    p.add_argument("--json", help="write every rank's figures here")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _timer(into: dict, name: str, fn, *args, **kwargs):
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    into.setdefault(name, []).append(time.perf_counter() - t)
    return out


def _monitored_steps(args, comm, mon, x, times: dict) -> float:
    """The training loop with the monitor on: each step() call timed, windows apart."""
    windows = [0]
    take = mon._window

    def counted(*a, **k):
        windows[0] += 1
        return take(*a, **k)

    mon._window = counted
    wrapped = _wrap(comm, "link_stats", times) + _wrap(comm, "_link_stats_rows", times)
    wrapped += _wrap(comm, "broadcast", times)
    wrapped += _wrap(mon._diagnoser, "update", times)
    start = time.perf_counter()
    for _ in range(args.steps):
        comm.allreduce(x, op="sum", out=x)
        time.sleep(args.compute_ms * 1e-3)
        before = windows[0]
        t = time.perf_counter()
        mon.step()
        kind = "step() with a window" if windows[0] > before else "step() without"
        times.setdefault(kind, []).append(time.perf_counter() - t)
    mon._window = take
    for obj, name in wrapped:
        delattr(obj, name)
    return time.perf_counter() - start


def _wrap(obj, name: str, times: dict) -> list:
    """Times obj.name (an instance attribute over the class's method) as "in a window: name"."""
    fn = getattr(obj, name)

    def timed(*a, **k):
        return _timer(times, f"in a window: {name}", fn, *a, **k)

    try:
        setattr(obj, name, timed)
    except AttributeError:
        return []
    return [(obj, name)]


def _parts(args, comm, mon, x, times: dict) -> None:
    import numpy as np
    from zcoll.core.diagnose import Diagnoser, from_rows
    from zcoll.observe.live import links_dict, verdict_dict

    diagnoser = Diagnoser(quiet=True)
    box = np.zeros(1, np.int64)
    for _ in range(args.reps):
        comm.allreduce(x, op="sum", out=x)
        rows = _timer(times, "link_stats rows", comm._link_stats_rows, True)
        stats = _timer(times, "from_rows", from_rows, rows)
        _timer(times, "broadcast 8 B", comm.broadcast, box, 0)
        verdict = _timer(times, "diagnoser.update", diagnoser.update, stats)
        _timer(times, "links/verdict dict", lambda: (links_dict(diagnoser.evidence), verdict_dict(verdict)))
        doc = _timer(times, "document", mon._document, None)
        body = _timer(times, "json.dumps", lambda: json.dumps(doc, default=float).encode())
        if comm.rank == 0 and len(times.get("POST", [])) < 50:
            _timer(times, "POST", mon.publisher._post, body)
        times.setdefault("document bytes", []).append(len(body))


def job(args: argparse.Namespace) -> int:
    import numpy as np
    import zcoll
    from zcoll.observe.live import LiveMonitor

    comm = zcoll.Communicator()
    x = np.ones(1 << 18, np.float32)
    mon = LiveMonitor(comm, args.url, period=args.period, window=args.window)
    times: dict = {}
    cpu0 = thread_cpu(mon.publisher.thread)
    seconds = _monitored_steps(args, comm, mon, x, times)
    publisher_cpu = (thread_cpu(mon.publisher.thread) - cpu0) / seconds
    _parts(args, comm, mon, x, times)
    mon.close()
    out = {k: {"n": len(v), "median_us": 1e6 * statistics.median(v),
               "p90_us": 1e6 * sorted(v)[int(0.9 * (len(v) - 1))]} for k, v in times.items() if k != "document bytes"}  # fmt: skip
    out["document bytes"] = {
        "n": len(times["document bytes"]),
        "median": statistics.median(times["document bytes"]),
    }
    out["publisher CPU"] = {"seconds_per_second": publisher_cpu, "sent": mon.publisher.sent}
    out["windows per second"] = {"value": len(times.get("step() with a window", [])) / seconds}
    print(_LINE + json.dumps({"rank": comm.rank, "figures": out}), flush=True)
    comm.free()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.job:
        return job(args)
    run = launch(__file__, argv if argv is not None else sys.argv[1:], 2, args.timeout)
    rc = run["rc"]
    ranks = {doc["rank"]: doc["figures"] for doc in tagged(run["lines"], _LINE)}
    if rc != 0 or len(ranks) != 2:
        print(f"monitor_breakdown: the job failed (exit {rc})", file=sys.stderr)
        return 1
    print(f"\n{'part':24} {'rank 0 median / p90 us':>24} {'rank 1 median / p90 us':>24}   n")
    for name in ranks[0]:
        cells = []
        for r in (0, 1):
            f = ranks[r].get(name, {})
            if "median_us" in f:
                cells.append(f"{f['median_us']:10.1f} / {f['p90_us']:9.1f}")
            else:
                cells.append(f"{next(iter(v for k, v in f.items() if k not in ('n', 'sent')), 0):24.4g}")
        print(f"{name:24} {cells[0]:>24} {cells[1]:>24}   {ranks[0][name].get('n', '')}")
    print(f"load average: {os.getloadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "ranks": ranks}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
