"""Time to a trained model, MLPerf-style: every method trains the same model from the same seeds
for the workload's step budget; what counts is the wall-clock time until the quality target is
first reached (evaluation timed apart), and the quality at equal steps.

    python bench/tta.py                       # the full run: 4 set-ups x 3 workloads x 3 seeds
    python bench/tta.py --quick               # one small workload, 2 ranks, a minute or two
    python bench/tta.py --from tta-out/       # the report again from a run's JSON files

Set-ups: ``shm2`` / ``shm4`` (2 and 4 ranks on this machine, shared memory), ``net1g`` / ``net100m``
(2 nodes of one rank on the full-duplex two-node test bed of zcoll.tools.testbed: network
namespaces joined by veth pairs through a switch, every direction shaped to 1 Gbit/s or 100
Mbit/s; needs root). Workloads and methods: bench/tta_workloads.py, bench/tta_job.py. One mpirun
job per (set-up, workload, seed) trains every method in turns. Output in --out: each job's JSON,
tta.md (the table), tta.csv, and tta-<setup>.png (quality against wall-clock time, one curve per
method, one panel per workload).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import tta_report
from tta_job import METHODS
from tta_workloads import WORKLOADS

from zcoll.tools.testbed import Refused, Testbed

HERE = Path(__file__).resolve().parent
SETUPS = {"shm2": (2, None), "shm4": (4, None), "net1g": (2, "1gbit"), "net100m": (2, "100mbit")}
# Methods run in a job of their own: torch's PowerSGD hook on gloo aborts the whole process
# (gloo::EnforceNotMet, "collective mismatch", from gloo's thread) on the CNN, which would take
# every other method's run with it; alone, its abort becomes its own reported failure.
ISOLATED = ("gloo-powersgd",)
QUICK = {"setups": "shm2", "workloads": "cnn", "methods": "gloo,zcoll,zcoll-int8,zcoll-auto", "seeds": "0"}
JOB_TIMEOUT = 1800


def parse(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setups", default=",".join(SETUPS), help=f"comma-separated, of {', '.join(SETUPS)}")
    p.add_argument(
        "--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {', '.join(WORKLOADS)}"
    )
    p.add_argument(
        "--methods", default=",".join(METHODS), help="comma-separated (bench/tta_job.py lists them)"
    )
    p.add_argument("--seeds", default="0,1,2", help="comma-separated (default 0,1,2)")
    p.add_argument("--steps", type=int, help="override every workload's budget (quick runs)")
    p.add_argument("--target", type=float, help="override the quality target (one workload)")
    p.add_argument("--lr", type=float, help="override the learning rate (one workload)")
    p.add_argument("--block", type=int, default=10, help="steps per method per turn (default 10)")
    p.add_argument("--quick", action="store_true", help=f"a smoke run: {QUICK}")
    p.add_argument("--out", default="tta-out", help="directory for the JSON files, table and plots")
    p.add_argument("--from", dest="source", metavar="DIR", help="only the report, from a run's JSON files")
    args = p.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    for field, known in (("setups", SETUPS), ("workloads", WORKLOADS), ("methods", METHODS)):
        bad = [x for x in getattr(args, field).split(",") if x not in known]
        if bad:
            p.error(f"unknown {field}: {', '.join(bad)}; known: {', '.join(known)}")
    return args


def job_argv(args: argparse.Namespace, setup: str, workload: str, seed: int, out: Path) -> List[str]:
    argv = [sys.executable, str(HERE / "tta_job.py"), "--workload", workload, "--seed", str(seed),
            "--methods", args.methods, "--block", str(args.block), "--setup", setup, "--out", str(out)]  # fmt: skip
    for flag in ("steps", "target", "lr"):
        if getattr(args, flag) is not None:
            argv += [f"--{flag}", str(getattr(args, flag))]
    return argv


def run_job(argv: List[str], setup: str) -> subprocess.CompletedProcess:
    """One job: mpirun here, or on the two-node test bed."""
    ranks, rate = SETUPS[setup]
    env = {"ZCOLL_TIMEOUT": "120"}
    if rate is None:
        mpirun = str(Path(sys.executable).parent / "mpirun")
        full = {**os.environ, **env, "MPIR_CVAR_DEVICE_COLLECTIVES": "none"}
        return subprocess.run(
            [mpirun, "-n", str(ranks), *argv], env=full, capture_output=True, text=True, timeout=JOB_TIMEOUT
        )
    with Testbed(nodes=[1] * ranks, inter=rate) as tb:
        env.update(MASTER_ADDR=tb.ip(0), GLOO_SOCKET_IFNAME="eth0")
        done = tb.run(argv, env=env, timeout=JOB_TIMEOUT)
        return subprocess.CompletedProcess(argv, done.returncode, done.output, "")


def run_all(args: argparse.Namespace, out: Path) -> None:
    jobs = [(s, w, int(seed)) for s in args.setups.split(",") for w in args.workloads.split(",")
            for seed in args.seeds.split(",")]  # fmt: skip
    start = time.perf_counter()
    for i, (setup, workload, seed) in enumerate(jobs):
        path = out / f"{setup}-{workload}-seed{seed}.json"
        print(
            f"[{i + 1}/{len(jobs)}] {setup} {workload} seed {seed} (at {time.perf_counter() - start:.0f} s)",
            flush=True,
        )
        methods = args.methods.split(",")
        shared = [m for m in methods if m not in ISOLATED] or methods[:1]  # a job of isolated ones alone
        why = _job(
            argparse.Namespace(**{**vars(args), "methods": ",".join(shared)}), setup, workload, seed, path
        )
        for name in (m for m in methods if m in ISOLATED and m not in shared):
            alone = path.with_suffix(f".{name}.json")
            failed = _job(argparse.Namespace(**{**vars(args), "methods": name}), setup, workload, seed, alone)
            if why is None:
                _merge_alone(path, alone, name, failed)
    print(f"all jobs in {time.perf_counter() - start:.0f} s", flush=True)


def _job(args: argparse.Namespace, setup: str, workload: str, seed: int, path: Path) -> Optional[str]:
    """Runs one job writing `path`; on failure writes a failed job's JSON and returns why."""
    try:
        done = run_job(job_argv(args, setup, workload, seed, path), setup)
    except (Refused, subprocess.TimeoutExpired, TimeoutError) as e:
        why = f"{type(e).__name__}: {str(e)[-600:]}"
        _write_failed(path, setup, workload, seed, why)
        return why
    stopped = [line for line in done.stdout.splitlines() if line.startswith("TTA-STOPPED")]
    if done.returncode == 0 and path.exists():
        return None
    why = stopped[0] if stopped else f"exit status {done.returncode}: {(done.stdout + done.stderr)[-1500:]}"
    _write_failed(path, setup, workload, seed, why)
    print(f"  failed ({args.methods}): {why}", flush=True)
    return why


def _merge_alone(path: Path, alone: Path, name: str, failed: Optional[str]) -> None:
    """Moves an isolated method's result into its job's JSON; a job it aborted becomes that
    method's failure (reported in the table, not dropped)."""
    doc, other = json.loads(path.read_text()), json.loads(alone.read_text())
    doc["methods"][name] = other["methods"].get(name) or {
        "evals": [], "failure": f"its job aborted: {(failed or '')[-700:]}", "steps": 0,
        "step_s_median": None, "reached": None, "final": None}  # fmt: skip
    path.write_text(json.dumps(doc, indent=1))
    alone.unlink()


def _write_failed(path: Path, setup: str, workload: str, seed: int, why: str) -> None:
    w = WORKLOADS[workload]
    doc = {"setup": setup, "workload": workload, "seed": seed, "quality": w.quality, "higher_is_better": w.higher_is_better,
           "target": w.target, "steps": w.steps, "job_failure": why, "methods": {}}  # fmt: skip
    path.write_text(json.dumps(doc, indent=1))


def main(argv: Optional[List[str]] = None) -> int:
    args = parse(argv)
    out = Path(args.source or args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.source:
        run_all(args, out)
    docs: List[Dict] = [
        json.loads(p.read_text()) for p in sorted(out.glob("*-seed*.json")) if p.name.count(".") == 1
    ]
    if not docs:
        print(f"no job results in {out}", file=sys.stderr)
        return 2
    table = tta_report.write(docs, out)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
