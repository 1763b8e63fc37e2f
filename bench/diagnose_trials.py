#!/usr/bin/env python3
"""Randomized trials of zcoll's link diagnosis (comm.diagnose(), python/zcoll/diagnose.py) on the
emulated cluster of zcoll.tools.testbed: 4 ranks on 4 nodes, 200 Mbit/s links (see --rate), and in
each trial one of four situations, chosen at random (the kinds in turn, the places at random):

  healthy    nothing wrong
  slow rank  rank k sleeps, before every collective, twice its own collective time (measured
             over the first --warmup collectives, which run without the sleep)
  slow link  the directed link i->j shaped to 1/4 of the rate (tc, from the job's start)
  slow node  every link from and to node k shaped to 1/4 of the rate

Every trial is one MPI job (this file with --job) running --collectives allreduces of --bytes,
alternating ring and halving-doubling so that most links carry traffic (a ring alone uses 4 of
the 12 directed links of 4 ranks; with halving-doubling's partners 10 are used, and the slow link
is drawn among those). Every --window collectives each rank calls comm.diagnose(); rank 0 prints
the verdict (the label that three consecutive windows agreed on).

What is scored:
  * the label after the last window is right in >= 95% of the trials;
  * it appears within 20 collectives of the fault's start (collective 0 for links and nodes,
    --warmup for the slow rank);
  * no false alarm: in the healthy trials, no window's label is anything but healthy, over
    >= 1000 healthy collectives in all.

    python bench/diagnose_trials.py --trials 100           # root: network namespaces, tc
    python bench/diagnose_trials.py --trials 8 --json r.json

Exit status 0 when every criterion holds, 1 when one does not, 3 when the machine refuses
namespaces (zcoll.tools.testbed.Refused).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import List, Optional, Tuple

KINDS = ("healthy", "slow rank", "slow link", "slow node")
ALGORITHMS = ("ring", "halving_doubling")
_VERDICT = re.compile(r"TRIAL-VERDICT after=(\d+) label=(\S+(?: \S+)?) who=(\S+)")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ranks", type=int, default=4, help="ranks, one per emulated node")
    p.add_argument("--rate", default="200mbit",
                   help="every link's rate (a tc rate); below what the machine's CPUs move through the "
                        "namespaces' TCP, or the shaping decides nothing (a loaded 2-core machine moves "
                        "25-50 MB/s: 1gbit links are then all alike, shaped or not)")
    p.add_argument("--slow-factor", type=float, default=4.0, help="a slow link or node runs at rate / this")
    p.add_argument("--bytes", type=int, default=1 << 20, help="bytes per allreduce")
    p.add_argument("--collectives", type=int, default=40, help="collectives per trial")
    p.add_argument("--window", type=int, default=5, help="collectives between diagnoses")
    p.add_argument("--warmup", type=int, default=5, help="collectives before the slow rank starts sleeping")
    p.add_argument("--within", type=int, default=20, help="collectives allowed to detect a fault")
    p.add_argument("--timeout", type=float, default=300, help="seconds per trial")
    p.add_argument("--json", help="write every trial's result here")
    # inside a trial's job
    p.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sleep-rank", type=int, default=-1, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# -- the job -----------------------------------------------------------------------------------
def job(args: argparse.Namespace) -> int:
    import numpy as np

    import zcoll

    comm = zcoll.Communicator()
    nodes = [comm.node_of(r) for r in range(comm.size)] if hasattr(comm, "node_of") else None
    x = np.ones(args.bytes // 4, np.float32)
    warm: List[float] = []
    sleep = 0.0
    for algorithm in ALGORITHMS:  # untimed: MPI connects pairs of ranks on their first message
        comm.allreduce(x, algorithm=algorithm, out=x)
    comm.link_stats(reset=True)
    for n in range(args.collectives):
        if comm.rank == args.sleep_rank and n >= args.warmup:
            time.sleep(sleep)
        x.fill(1.0)
        start = time.perf_counter()
        comm.allreduce(x, algorithm=ALGORITHMS[n % len(ALGORITHMS)], out=x)
        if n < args.warmup:
            warm.append(time.perf_counter() - start)
            sleep = 2 * statistics.mean(warm)  # twice its own collective time
        if (n + 1) % args.window == 0:
            v = comm.diagnose(nodes)
            if comm.rank == 0:
                who = {"slow rank": v.rank, "slow link": v.link and f"{v.link[0]}->{v.link[1]}",
                       "slow node": v.node}.get(v.label, "-")
                print(f"TRIAL-VERDICT after={n + 1} label={v.label} who={who} evidence={v.evidence}", flush=True)
    if comm.rank == args.sleep_rank:
        print(f"TRIAL-SLEEP rank={comm.rank} seconds={sleep:.6f}", flush=True)
    comm.free()
    return 0


# -- the driver --------------------------------------------------------------------------------
def used_links(p: int) -> List[Tuple[int, int]]:
    """The directed links the job's collectives use: ring neighbours and halving-doubling's
    partners (rank ^ 2^s), for a power-of-two p."""
    links = {(r, (r + 1) % p) for r in range(p)}
    d = 1
    while d < p:
        links |= {(r, r ^ d) for r in range(p) if r ^ d < p}
        d *= 2
    return sorted(links)


def plan(args: argparse.Namespace) -> List[dict]:
    rng = random.Random(args.seed)
    links = used_links(args.ranks)
    trials = []
    for t in range(args.trials):
        kind = KINDS[t % len(KINDS)]
        truth: object = None
        if kind == "slow rank" or kind == "slow node":
            truth = rng.randrange(args.ranks)
        elif kind == "slow link":
            truth = rng.choice(links)
        trials.append({"trial": t, "kind": kind, "truth": truth})
    rng.shuffle(trials)
    return trials


def score(trial: dict, verdicts: List[Tuple[int, str, str]], args: argparse.Namespace) -> dict:
    kind, truth = trial["kind"], trial["truth"]
    want = "-" if kind == "healthy" else (f"{truth[0]}->{truth[1]}" if kind == "slow link" else str(truth))
    right = [(n, label == kind and who == want) for n, label, who in verdicts]
    start = args.warmup if kind == "slow rank" else 0
    detected = next((n for n, ok in right if ok), None)
    result = dict(trial)
    result["verdicts"] = [f"{n}:{label}:{who}" for n, label, who in verdicts]
    result["correct"] = bool(right) and right[-1][1] and (kind != "healthy" or all(ok for _, ok in right))
    result["detected_after"] = None if detected is None or kind == "healthy" else detected - start
    result["false_alarm_collectives"] = (
        sum(args.window for _, label, _ in verdicts if label != "healthy") if kind == "healthy" else 0)
    return result


def run_trials(args: argparse.Namespace) -> int:
    from zcoll.tools.testbed import Refused, Testbed, parse_rate  # the emulated cluster

    slow = f"{int(parse_rate(args.rate) / args.slow_factor)}bit"
    results: List[dict] = []
    try:
        tb = Testbed(nodes=[1] * args.ranks, inter=args.rate)
        tb.create()
    except Refused as e:
        print(f"diagnose_trials: {e}", file=sys.stderr)
        return 3
    try:
        for i, trial in enumerate(plan(args)):
            for a in range(args.ranks):
                for b in range(args.ranks):
                    if a != b and tb.rates[(a, b)] != args.rate:
                        tb.set_rate(a, b, args.rate)
            if trial["kind"] == "slow link":
                tb.set_rate(*trial["truth"], slow)
            elif trial["kind"] == "slow node":
                tb.set_node_rate(trial["truth"], slow)
            job_argv = [sys.executable, __file__, "--job", "--bytes", args.bytes, "--collectives", args.collectives,
                        "--window", args.window, "--warmup", args.warmup,
                        "--sleep-rank", trial["truth"] if trial["kind"] == "slow rank" else -1]
            started = time.monotonic()
            rc, out = tb.run([str(a) for a in job_argv], timeout=args.timeout)
            verdicts = [(int(m[1]), m[2], m[3]) for m in _VERDICT.finditer(out)]
            result = score(trial, verdicts, args)
            result["seconds"] = round(time.monotonic() - started, 1)
            result["returncode"] = rc
            if rc != 0:
                result["correct"] = False
                result["output_tail"] = out[-2000:]
            results.append(result)
            print(f"trial {i + 1:3d}/{args.trials}: {trial['kind']:9s} {str(trial['truth']):8s} "
                  f"{'right' if result['correct'] else 'WRONG'}  detected after {result['detected_after']}  "
                  f"verdicts {' '.join(result['verdicts'])}", flush=True)
    finally:
        tb.close()
    return summarize(results, args)


def summarize(results: List[dict], args: argparse.Namespace) -> int:
    n = len(results)
    right = sum(r["correct"] for r in results)
    lines = [f"diagnose_trials: {n} trials, {args.ranks} ranks on {args.ranks} emulated nodes, {args.rate} links "
             f"(slow: 1/{args.slow_factor:g}), {args.bytes} B allreduces ({', '.join(ALGORITHMS)} alternating), "
             f"a diagnosis every {args.window} collectives"]
    for kind in KINDS:
        of_kind = [r for r in results if r["kind"] == kind]
        if of_kind:
            lines.append(f"  {kind:9s}: {sum(r['correct'] for r in of_kind)}/{len(of_kind)} right")
    accuracy = right / n if n else 0.0
    lines.append(f"right: {right}/{n} ({100 * accuracy:.1f}%; required 95%)")
    detected = [r["detected_after"] for r in results if r["kind"] != "healthy" and r["detected_after"] is not None]
    late = [r for r in results if r["kind"] != "healthy" and r["correct"]
            and (r["detected_after"] is None or r["detected_after"] > args.within)]
    if detected:
        lines.append(f"detected after: median {statistics.median(detected):g}, max {max(detected)} collectives "
                     f"from the fault's start (allowed {args.within}); {len(late)} right trials detected later")
    healthy = [r for r in results if r["kind"] == "healthy"]
    healthy_collectives = len(healthy) * args.collectives
    alarms = sum(r["false_alarm_collectives"] for r in healthy)
    lines.append(f"false alarms: {alarms} collectives under a wrong label in {healthy_collectives} healthy ones "
                 f"(required: 0 in >= 1000)")
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "trials": results, "summary": lines}, indent=1))
    ok = accuracy >= 0.95 and not late and alarms == 0 and healthy_collectives >= 1000
    return 0 if ok else 1


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    return job(args) if args.job else run_trials(args)


if __name__ == "__main__":
    sys.exit(main())
