#!/usr/bin/env python3
"""What zcoll monitor costs a training job: step time with a LiveMonitor attached against
without, interleaved in one job.

One MPI job (this file with --job) trains --blocks blocks of --steps steps; the blocks alternate
between "on" (mon.step() after every step: the telemetry windows about every --window seconds,
the publisher thread POSTing snapshots to a monitor served by this process) and "off" (no call;
the publisher thread sleeps on its queue), in an order shuffled per pair of blocks. A step:

  plain   numpy compute (a matrix product of --compute-ms) then comm.allreduce of --bytes
  ddp     a DDP step of an MLP on the zcoll torch backend (the monitor through the optimizer's
          step hook, its windows through the group's worker)

Reported: the median step time of each block (rank 0's clock, the slowest rank's step), the
median over the on blocks against the median over the off blocks, and the spread of the paired
differences (per pair of adjacent blocks) with the 90% bootstrap interval of their median; and
the monitor's CPU in ms per second of "on" blocks, by part and thread (robust to other load,
unlike the step times: docs/monitor.md "What it costs"). Run
it with nothing else on the machine (docs/monitor.md has the commands its table came from):

    flock /tmp/zcoll-bench.lock python bench/monitor_overhead.py --mode ddp --blocks 120 --json /tmp/mon-ddp.json
    flock /tmp/zcoll-bench.lock python bench/monitor_overhead.py --mode plain --blocks 40 --json /tmp/mon-plain.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import time
from pathlib import Path

from monitor_launch import launch, tagged, thread_cpu

_CPU = "MONITOR-CPU "
_BLOCK = re.compile(r"MONITOR-BLOCK (\d+) (on|off) median_ms=([0-9.]+)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("plain", "ddp"), default="plain")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--blocks", type=int, default=20, help="blocks in all, half of them on (default 20)")
    p.add_argument("--steps", type=int, default=40, help="steps per block (default 40)")
    p.add_argument(
        "--bytes", type=int, default=4 << 20, help="plain: allreduce bytes per step (default 4 MiB)"
    )
    p.add_argument("--compute-ms", type=float, default=20.0, help="plain: compute per step (default 20 ms)")
    p.add_argument("--period", type=float, default=1.0, help="the monitor's period in seconds (default 1)")
    p.add_argument("--window", type=float, default=0.25,
                   help="its telemetry window in seconds (default 0.25, LiveMonitor's)")  # fmt: skip
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write the blocks and the summary here")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# -- the job (every rank) ------------------------------------------------------------------------------
def _plain(args: argparse.Namespace):
    import numpy as np
    import zcoll

    comm = zcoll.Communicator()
    x = np.ones(args.bytes // 4, np.float32)
    n = 64
    a = np.random.default_rng(comm.rank).standard_normal((n, n)).astype(np.float32)
    t = time.perf_counter()
    for _ in range(20):
        a @ a
    reps = max(1, int(args.compute_ms * 1e-3 / ((time.perf_counter() - t) / 20)))
    reps = int(comm.allreduce(np.array([reps], np.int64), op="max")[0])

    def step() -> None:
        for _ in range(reps):
            a @ a
        comm.allreduce(x, op="avg", out=x)

    def slowest(seconds: float) -> float:
        return float(comm.allreduce(np.array([seconds]), op="max")[0])

    return comm, step, slowest, None, comm.free


def _ddp(args: argparse.Namespace):
    import torch
    import zcoll.torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    zcoll.torch.init_process_group()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                    torch.nn.ReLU(), torch.nn.Linear(1024, 10)))  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    def slowest(seconds: float) -> float:  # through the group, in order with DDP's own calls
        t = torch.tensor([seconds], dtype=torch.float64)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return float(t[0])

    return model, step, slowest, opt, torch.distributed.destroy_process_group


def _cpu_figures(mon, step_cpu: float, on_s: float) -> dict:
    """This rank's monitor CPU seconds by part and thread (docs/monitor.md's cost table)."""
    if mon.executor is None:  # no torch worker: the windows ran inside step(), counted once
        step_cpu -= mon.cpu["window"]
    return {"rank": mon.rank, "on_s": on_s, "step": step_cpu, "window": mon.cpu["window"],
            "classify": mon.cpu["classify"], "document": mon.publisher.cpu["document"] - mon.cpu["classify"],
            "send": mon.publisher.cpu["send"], "publisher": thread_cpu(mon.publisher.thread),
            "posts": mon.publisher.sent, "windows": getattr(mon._diagnoser, "windows", 0),
            "blended_only": getattr(mon._diagnoser, "skipped", 0)}  # fmt: skip


def job(args: argparse.Namespace) -> int:
    from zcoll.observe.live import LiveMonitor

    target, step, slowest, opt, done = (_plain if args.mode == "plain" else _ddp)(args)
    mon = LiveMonitor(target, args.url, period=args.period, window=args.window)
    monitored, step_cpu, on_s = mon.step, [0.0], 0.0

    def timed_step() -> None:  # the training thread's CPU in mon.step()
        t = time.thread_time()
        monitored()
        step_cpu[0] += time.thread_time() - t

    mon.step = timed_step
    rng = random.Random(args.seed)
    order = []
    for _ in range(args.blocks // 2):
        pair = ["on", "off"]
        rng.shuffle(pair)
        order += pair
    for _ in range(5):
        step()  # warm-up
    for b, mode in enumerate(order):
        handle = mon.attach(opt) if (mode == "on" and opt is not None) else None
        times = []
        start = time.perf_counter()
        for _ in range(args.steps):
            t = time.perf_counter()
            step()
            if mode == "on" and opt is None:
                mon.step()
            times.append(slowest(time.perf_counter() - t))  # the slowest rank's step
        if handle is not None:
            handle.remove()
        on_s += time.perf_counter() - start if mode == "on" else 0.0
        if mon.rank == 0:
            print(f"MONITOR-BLOCK {b} {mode} median_ms={1e3 * statistics.median(times):.4f}", flush=True)
    cpu = _cpu_figures(mon, step_cpu[0], on_s)
    mon.close()
    print(_CPU + json.dumps(cpu), flush=True)
    if mon.rank == 0:
        print(f"MONITOR-PUBLISHED sent={mon.publisher.sent} failed={mon.publisher.failed} "
              f"dropped={mon.publisher.dropped}", flush=True)  # fmt: skip
    done()
    return 0


# -- the driver -------------------------------------------------------------------------------------
def summarize(blocks: list[tuple[int, str, float]]) -> dict:
    on = [t for _, m, t in blocks if m == "on"]
    off = [t for _, m, t in blocks if m == "off"]
    by_index = {b: (m, t) for b, m, t in blocks}
    pairs = []
    for b in range(0, len(blocks) - 1, 2):
        (m1, t1), (_m2, t2) = by_index[b], by_index[b + 1]
        t_on, t_off = (t1, t2) if m1 == "on" else (t2, t1)
        pairs.append(t_on / t_off - 1)
    low, high = bootstrap(pairs)
    return {
        "on_median_ms": statistics.median(on), "off_median_ms": statistics.median(off),
        "overhead": statistics.median(on) / statistics.median(off) - 1,
        "pair_overhead_median": statistics.median(pairs), "pair_overhead_min": min(pairs),
        "pair_overhead_max": max(pairs), "pairs": len(pairs),
        "pair_overhead_low": low, "pair_overhead_high": high,
    }  # fmt: skip


def bootstrap(values: list[float], rounds: int = 4000, level: float = 0.9) -> tuple[float, float]:
    """The `level` interval of the median of `values`, by resampling them with replacement
    (fixed seed: the same blocks give the same interval)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(rounds))
    tail = (1 - level) / 2
    return medians[int(tail * rounds)], medians[int((1 - tail) * rounds) - 1]


def print_cpu(figures: list[dict], run: dict) -> None:
    """The monitor's CPU in ms per second of monitored ("on") time, by part and rank; the
    monitor process's: idle (every second, on or off) and the rest (the POSTs: on time only)."""
    parts = [("step", "training thread: mon.step()"), ("window", "the windows (plain: in step())"),
             ("classify", "publisher: classify (rank 0)"), ("document", "publisher: documents"),
             ("send", "publisher: JSON + POST"), ("publisher", "publisher thread, all")]  # fmt: skip
    ranks = sorted(figures, key=lambda f: f["rank"])
    print("\n  monitor CPU, ms per second monitored: " + "  ".join(f"rank {f['rank']}" for f in ranks))
    for key, name in parts:
        print(f"    {name:34}" + "".join(f"{1e3 * f[key] / f['on_s']:9.2f}" for f in ranks))
    on_s, idle = ranks[0]["on_s"], run["monitor_idle_cpu_per_s"]
    posts = run["monitor_cpu_s"] - idle * run["wall_s"]
    total = sum(f["step"] + f["window"] + f["publisher"] for f in ranks) + posts + idle * on_s
    print(f"    {'monitor process: idle':34}{1e3 * idle:9.2f}")
    print(f"    {'monitor process: the rest (POSTs)':34}{1e3 * posts / on_s:9.2f}")
    print(f"    {'all of it':34}{1e3 * total / on_s:9.2f}   ({ranks[0]['posts']} posts from rank 0, "
          f"{ranks[-1]['posts']} from rank {ranks[-1]['rank']}, {on_s:.1f} s monitored; rank 0 classified "
          f"{ranks[0]['windows'] - ranks[0]['blended_only']} of {ranks[0]['windows']} windows)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.job:
        return job(args)
    run = launch(__file__, argv if argv is not None else sys.argv[1:], args.ranks, args.timeout)
    lines, state = run["lines"], run["state"]
    blocks = [(int(m.group(1)), m.group(2), float(m.group(3))) for m in map(_BLOCK.search, lines) if m]
    if run["rc"] != 0 or len(blocks) < 2:
        print(f"monitor_overhead: the job failed (exit {run['rc']})", file=sys.stderr)
        return 1
    s = summarize(blocks)
    cpu = tagged(lines, _CPU)
    print(
        f"\n{args.mode}: {len(blocks)} blocks of {args.steps} steps, {args.ranks} ranks, period {args.period} s, "
        f"window {args.window} s"
    )
    print(f"  step time, median of block medians: on {s['on_median_ms']:.3f} ms, off {s['off_median_ms']:.3f} ms: "
          f"{100 * s['overhead']:+.2f}%")  # fmt: skip
    print(f"  paired blocks ({s['pairs']}): median {100 * s['pair_overhead_median']:+.2f}% "
          f"(90% bootstrap interval {100 * s['pair_overhead_low']:+.2f}..{100 * s['pair_overhead_high']:+.2f}%), "
          f"min {100 * s['pair_overhead_min']:+.2f}%, max {100 * s['pair_overhead_max']:+.2f}%")  # fmt: skip
    if cpu:
        print_cpu(cpu, run)
    print(f"  load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    snap = state.snapshot()
    print(
        f"  the monitor received {sum(r['publishes'] for r in snap['ranks'].values())} snapshots, "
        f"{snap['verdict_changes']} verdict changes (last: {(snap['verdict'] or {}).get('text')})"
    )
    if args.json:
        out = {
            "args": vars(args),
            "blocks": blocks,
            "summary": s,
            "cpu": cpu,
            "monitor_cpu_s": run["monitor_cpu_s"],
        }
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
