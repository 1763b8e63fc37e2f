#!/usr/bin/env python3
"""DDP training-step benchmark: step time and final accuracy of gloo and zcoll configurations.

    python bench/ddp_step.py                      # 3 models x 2 and 4 ranks x shm and the link (long)
    python bench/ddp_step.py --models mlp --ranks 2 --networks slow --accuracy-epochs 0   # minutes
    python bench/ddp_step.py --quick --models mlp --ranks 2 --networks shm                # a smoke run

For each model (bench/ddp_workload.py: an MLP of 2.18M parameters, a small CNN, a small
transformer encoder, on scikit-learn's digits), each rank count and each network, one mpirun job
(bench/ddp_step_job.py, run by bench/ddp_runner.py) trains every configuration side by side:
compute only (no DDP), gloo, gloo + torch's fp16_compress_hook, gloo + torch's PowerSGD hook,
zcoll, zcoll + fp16, int8, int4, sign and top-1%, each DDP configuration at DDP's default buckets
and at the other --buckets settings. Steps:

1. Networks: ``shm``, the ranks of one machine as they are (MPICH and zcoll over shared memory,
   gloo over loopback TCP); ``slow``, the emulated link: a network namespace whose loopback is
   limited to --rate (zcoll.tools.netns: tc tbf), MPICH over TCP, zcoll without shared memory
   (ZCOLL_SHM=0), gloo on the same loopback. ``slow`` needs root; refused with exit status 3 else.
2. Timing job: every configuration at every bucket setting takes turns with the others in rounds,
   plus each one's communication alone (its gradients through its collective, bucket by bucket);
   warm-up excluded; a step's time is the slowest rank's; a row shows the median over steps.
3. Accuracy job (once per model and rank count, on shared memory: accuracy does not depend on the
   link): each configuration trains --accuracy-epochs epochs at DDP's default buckets (and at the
   caps of --accuracy-buckets) from the same initial weights and data order; test accuracy, and
   whether every rank ended with the same parameter bits.
4. A configuration that crashes or hangs (torch's PowerSGD hook on gloo does) is named in the
   table with the reason, and its job runs again without it.
5. Tables per (model, ranks, network): median step time, speed-up over gloo at the same bucket
   setting (``suggested``: gloo at its own suggestion) and over gloo's best bucket setting,
   communication-only time, the serial sum (compute-only + communication-only: a step slower
   than that hides nothing and adds overhead), bytes each rank sends per step, test accuracy.
   Then the targets (bench/ddp_report.py: the training step's speed-ups, compression='auto' and
   the guard), PASS or MISS with the numbers; a CSV, the raw JSON (--from-json reprints from it)
   and a PNG plot in --out.

Exit status: 0 when every job finished (configurations that failed are in the tables), 1 with
--require-targets when a checked target missed, 2 when a job failed for a reason no configuration
explains, 3 when the emulated network cannot be set up here.
"""

from __future__ import annotations

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Dict

import ddp_workload as wl
from ddp_report import make_table, print_table, report
from ddp_runner import BIN, JobFailed, JobSpec, confirm, log, run_job
from zcoll.tools import netns

HERE = Path(__file__).resolve().parent
NETWORKS = ("shm", "slow")
QUICK = dict(steps=4, rounds=2, warmup=2, settle=0, accuracy_epochs=2)
FULL = dict(steps=20, rounds=4, warmup=3, settle=1, accuracy_epochs=15)


# -- the command line -----------------------------------------------------------------------------
def _what_to_run(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--models", default=",".join(wl.MODELS), help=f"comma-separated subset of {','.join(wl.MODELS)}"
    )
    p.add_argument("--ranks", default="2,4", help="comma-separated rank counts (default 2,4)")
    p.add_argument("--networks", default="shm,slow", help="comma-separated subset of shm,slow (default both)")
    p.add_argument(
        "--configs",
        default="all",
        help="comma-separated configurations, or all (every one but the compression='auto' ones): "
        + ",".join(wl.CONFIGS).replace("%", "%%"),
    )
    p.add_argument(
        "--buckets",
        default="default,suggested",
        help="bucket settings of each DDP configuration: default (DDP's 25 MB), suggested "
        "(the profiler's, per configuration), or a cap in MB (default: default,suggested)",
    )
    p.add_argument(
        "--accuracy-buckets",
        default="default",
        help="bucket settings of the accuracy job: default and caps in MB (default: default)",
    )
    p.add_argument(
        "--suggested-fallback-mb",
        type=float,
        default=1.0,
        help="the cap 'suggested' uses while no profiler suggests one (default 1)",
    )
    p.add_argument("--rate", default="1gbit", help="the emulated link's rate, tc syntax (default 1gbit)")


def _how_long(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--steps", type=int, help=f"timed steps per entry (default {FULL['steps']}, quick {QUICK['steps']})"
    )
    p.add_argument(
        "--rounds", type=int, help=f"rounds the timed steps are split into (default {FULL['rounds']})"
    )
    p.add_argument("--warmup", type=int, help=f"untimed steps per entry first (default {FULL['warmup']})")
    p.add_argument(
        "--settle", type=int, help=f"untimed steps at each block's start (default {FULL['settle']})"
    )
    p.add_argument(
        "--accuracy-epochs",
        type=int,
        help=f"epochs of the accuracy job, 0 to skip it (default {FULL['accuracy_epochs']}, "
        f"quick {QUICK['accuracy_epochs']})",
    )
    p.add_argument(
        "--quick", action="store_true", help="few steps and epochs: a smoke run, not a measurement"
    )
    p.add_argument(
        "--hang-after",
        type=float,
        default=120.0,
        help="seconds without a finished step before a job is ended as hung (default 120)",
    )
    p.add_argument("--job-timeout", type=float, default=3600.0, help="seconds one job may run (default 3600)")
    p.add_argument(
        "--confirm-steps",
        type=int,
        default=0,
        help="with zcoll-auto among the configurations: after each timing job, a second one of this many "
        "timed steps with zcoll-auto and the fastest fixed method of the first only (and on shm zcoll and "
        "zcoll-again, an identical second model: the comparison's noise), "
        "which the auto targets are judged on (the fastest of several noisy medians is biased low; 0: "
        "off, the default)",
    )


def _training(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int, default=32, help="rows per rank per step (default 32)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 1e-3)")
    p.add_argument(
        "--optimizer",
        choices=wl.OPTIMIZERS,
        default="adam",
        help="adam: torch's default on the CPU, whose step slows where second moments are exactly 0; "
        "adam-fused: its fused CPU kernel, which does not (default adam)",
    )
    p.add_argument("--seed", type=int, default=0)


def _outputs(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out",
        type=Path,
        default=HERE / "results",
        help="directory for CSV, JSON and PNG (default bench/results)",
    )
    p.add_argument("--csv", type=Path, help="CSV path (default OUT/ddp_step.csv)")
    p.add_argument("--png", type=Path, help="plot path (default OUT/ddp_step.png)")
    p.add_argument(
        "--from-json",
        type=Path,
        help="print tables, targets, CSV and plot from a saved ddp_step.json; run nothing",
    )
    p.add_argument("--require-targets", action="store_true", help="exit 1 when a checked target missed")


def options(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for group in (_what_to_run, _how_long, _training, _outputs):
        group(p)
    a = p.parse_args(argv)
    for key in FULL:
        if getattr(a, key) is None:
            setattr(a, key, (QUICK if a.quick else FULL)[key])
    a.models = _subset(p, "model", a.models, wl.MODELS)
    a.networks = _subset(p, "network", a.networks, NETWORKS)
    # "all": the fixed configurations; the compression='auto' ones and the A/A control by name
    every = [c for c in wl.CONFIGS if not (wl.CONFIGS[c].auto or wl.CONFIGS[c].control)]
    a.configs = every if a.configs == "all" else _subset(p, "configuration", a.configs, wl.CONFIGS)
    try:
        a.ranks = [int(r) for r in a.ranks.split(",")]
    except ValueError:
        p.error(f"--ranks: comma-separated integers, got {a.ranks!r}")
    if any(r < 2 for r in a.ranks):
        p.error("--ranks: DDP needs at least 2 ranks")
    if a.steps < 1 or not 1 <= a.rounds <= a.steps:
        p.error(f"need 1 <= --rounds ({a.rounds}) <= --steps ({a.steps})")
    if a.warmup < 2:
        p.error(f"--warmup must be >= 2 (DDP rebuilds its buckets in the second step), got {a.warmup}")
    try:
        wl.parse_buckets(a.buckets)
        wl.parse_buckets(a.accuracy_buckets, allow_suggested=False)
    except ValueError as e:
        p.error(str(e))
    a.csv = a.csv or a.out / "ddp_step.csv"
    a.png = a.png or a.out / "ddp_step.png"
    return a


def _subset(p: argparse.ArgumentParser, what: str, text: str, allowed) -> list:
    items = [x for x in text.split(",") if x]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        p.error(f"unknown {what} {bad or text!r}; choose from {', '.join(allowed)}")
    return items


# -- main -----------------------------------------------------------------------------------------
def header(args) -> None:
    import torch

    zvars = {k: v for k, v in os.environ.items() if k.startswith("ZCOLL_")}
    log(
        f"ddp_step: models {','.join(args.models)}, ranks {args.ranks}, networks {','.join(args.networks)}, "
        f"buckets {args.buckets}; {args.steps} timed steps per entry in {args.rounds} rounds, "
        f"warm-up {args.warmup}, settle {args.settle}; accuracy {args.accuracy_epochs} epochs; "
        f"optimizer {args.optimizer}; "
        f"torch {torch.__version__}, {os.cpu_count()} cores"
        + (f"; environment {zvars}" if zvars else "")
        + ("; QUICK: not a measurement" if args.quick else "")
    )


def run_all(args, ns, saved: dict) -> None:
    """Every (model, ranks): the accuracy job, then a timing job (and its confirmation) per
    network, each one's results appended to saved["jobs"] and its table printed."""
    for model in args.models:
        for ranks in args.ranks:
            # A configuration that failed in one job of this model and rank count is not run
            # again in the next ones (PowerSGD would cost a hang per job); the reason says where.
            failed: Dict[str, str] = {}
            accuracy = None
            if args.accuracy_epochs > 0:
                accuracy = run_job(JobSpec("accuracy", model, ranks, "shm"), args, args.configs, None, failed)
            for network in args.networks:
                spec = JobSpec("timing", model, ranks, network)
                timing = run_job(spec, args, args.configs, ns, failed)
                job = dict(
                    model=model,
                    ranks=ranks,
                    network=network,
                    timing=timing,
                    accuracy=accuracy,
                    failed=dict(failed),
                    confirm=confirm(spec, timing, args, ns, failed),
                )
                saved["jobs"].append(job)
                if timing:
                    print_table(make_table(network, timing, accuracy, failed))


def main(argv=None) -> int:
    args = options(argv)
    if args.from_json:
        return report(json.loads(args.from_json.read_text()), args)
    if not (BIN / "mpirun").exists():
        print(
            f"ddp_step.py: mpirun not found in {BIN}; run with the venv's python (./dev.sh test sets it up)",
            file=sys.stderr,
        )
        return 2
    header(args)
    ns = None
    if "slow" in args.networks:
        try:
            ns = netns.RateLimitedLoopback(args.rate, log=log)
        except netns.Unavailable as e:
            print(f"ddp_step.py: --networks slow: {e}", file=sys.stderr)
            return 3
    zvars = {k: v for k, v in os.environ.items() if k.startswith("ZCOLL_")}
    saved: dict = dict(
        args={k: str(v) for k, v in vars(args).items()}, cores=os.cpu_count(), env=zvars, jobs=[]
    )
    try:
        run_all(args, ns, saved)
    except JobFailed as e:
        print(f"ddp_step.py: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        if ns is not None:
            ns.close()
    args.out.mkdir(parents=True, exist_ok=True)
    raw = args.out / "ddp_step.json"
    raw.write_text(json.dumps(saved))
    log(f"raw results written to {raw}")
    print("\n## Summary")
    return report(saved, args)


if __name__ == "__main__":
    sys.exit(main())
