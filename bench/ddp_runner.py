"""The jobs of bench/ddp_step.py: one mpirun of bench/ddp_step_job.py per (phase, model, ranks,
network), a configuration that crashes or hangs dropped and the job run again without it.

1. ``job_argv`` / ``job_env``: the command and environment of one job (on the emulated link: inside
   the rate-limited namespace, MPICH over TCP, zcoll without shared memory, gloo on the loopback).
2. ``run_job``: runs it (zcoll.tools.proc.stream: output echoed, the whole tree killed at
   --job-timeout); when it dies, the ranks' progress files name the configuration it was in
   (zcoll.tools.proc.blamed), whose reason (zcoll.tools.proc.failure_reason) is kept, and the job
   runs again without it. An accuracy job keeps the configurations it finished.
3. ``confirm``: with --confirm-steps, zcoll-auto against the fastest fixed method in a job of their
   own (choosing the fastest of several noisy medians favours the fixed methods by their noise).

Each job's compression='auto' logs go to OUT/AUTO_LOGS/<model>-<ranks>-<network>[CONFIRM].
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import ddp_workload as wl
from zcoll.tools import netns
from zcoll.tools.proc import blamed, failure_reason, stream

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
JOB = HERE / "ddp_step_job.py"
AUTO_LOGS = "auto-logs"  # under --out: <model>-<ranks>-<network>/zcoll-guard-*.jsonl
CONFIRM = "-confirm"  # the auto logs of confirmation jobs: OUT/AUTO_LOGS/<model>-<ranks>-<network>-confirm


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class JobFailed(RuntimeError):
    """A job died for a reason no configuration explains."""


@dataclass
class JobSpec:
    phase: str  # timing | accuracy
    model: str
    ranks: int
    network: str  # shm | slow
    steps: Optional[int] = None  # timed steps and rounds (None: --steps, --rounds)
    rounds: Optional[int] = None
    tag: str = ""  # of the auto logs' directory (CONFIRM for a confirmation job)

    @property
    def logs(self) -> str:
        """The directory name of this job's auto logs, under OUT/AUTO_LOGS."""
        return f"{self.model}-{self.ranks}-{self.network}{self.tag}"


def job_argv(
    spec: JobSpec, args: argparse.Namespace, configs: List[str], result: Path, progress: Path
) -> list:
    flags = {
        "phase": spec.phase,
        "model": spec.model,
        "configs": ",".join(configs),
        "buckets": args.accuracy_buckets if spec.phase == "accuracy" else args.buckets,
        "suggested-fallback-mb": args.suggested_fallback_mb,
        "steps": spec.steps or args.steps,
        "rounds": spec.rounds or args.rounds,
        "warmup": args.warmup,
        "settle": args.settle,
        "accuracy-epochs": args.accuracy_epochs,
        "batch": args.batch,
        "lr": args.lr,
        "optimizer": args.optimizer,
        "seed": args.seed,
        "hang-after": args.hang_after,
        "result": result,
        "progress": progress,
        "metrics-dir": args.out / AUTO_LOGS / spec.logs,
    }
    job = [sys.executable, "-m", "mpi4py", JOB, *[x for k, v in flags.items() for x in (f"--{k}", v)]]
    return [BIN / "mpirun", "-n", spec.ranks, *job]


def job_env(network: str, ns: Optional[netns.RateLimitedLoopback]) -> Dict[str, str]:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    # 3 and 4 ranks on 2 cores: MPICH's own collectives busy-spin without this; one intra-op thread.
    env.update(MPIR_CVAR_DEVICE_COLLECTIVES="none", OMP_NUM_THREADS="1")
    if network == "slow":
        assert ns is not None
        env = ns.env(env)
        env.update(ZCOLL_SHM="0", GLOO_SOCKET_IFNAME="lo")
    return env


def run_job(spec: JobSpec, args, configs: List[str], ns, failures: Dict[str, str]) -> Optional[dict]:
    """Runs a job. A configuration that crashes or hangs is dropped, its reason kept in `failures`,
    and the job runs again without it (an accuracy job keeps the configurations it finished).
    Configurations already in `failures` (from an earlier job) are not run. Returns the result, or
    None when no configuration was left."""
    configs = [c for c in configs if c not in failures]
    finished: List[dict] = []  # accuracy rows of earlier attempts
    while configs:
        with tempfile.TemporaryDirectory(prefix="ddp_step.") as tmp:
            result, progress = Path(tmp) / "result.json", Path(tmp) / "progress"
            progress.mkdir()
            cmd = job_argv(spec, args, configs, result, progress)
            if spec.network == "slow":
                cmd = ns.command(cmd)
            log(
                f"{spec.phase} job: {spec.model}, {spec.ranks} ranks, {spec.network}: "
                f"{len(configs)} configurations"
            )
            t0 = time.time()
            rc, lines = stream(cmd, job_env(spec.network, ns), args.job_timeout, "--job-timeout")
            out = json.loads(result.read_text()) if result.exists() else None
            if rc == 0 and out is not None and not out.get("partial"):
                log(f"{spec.phase} job done in {time.time() - t0:.0f} s")
                if spec.phase == "accuracy":
                    out["accuracy"] = finished + out["accuracy"]
                return out
            culprit = blamed(progress, configs)
        if culprit is None:
            raise JobFailed(
                f"{spec.phase} job {spec.model}/{spec.ranks} ranks/{spec.network} exited {rc}:\n"
                + "\n".join(lines[-40:])
            )
        if out is not None and spec.phase == "accuracy":
            finished += out["accuracy"]
            configs = [c for c in configs if c not in {row["config"] for row in out["accuracy"]}]
        config, phase = culprit
        failures[config] = failure_reason(lines, f"{spec.phase} job, {phase}")
        configs.remove(config)
        log(f"{config} {failures[config]}; running the job again without it")
    return None


def confirm(spec: JobSpec, timing: Optional[dict], args, ns, failures: Dict[str, str]) -> Optional[dict]:
    """--confirm-steps: zcoll-auto against the fastest fixed method of `timing` (and zcoll) again,
    in a job of their own: choosing the fastest of eight medians and comparing auto with it on
    the same data favours the fixed methods by their noise."""
    if not (args.confirm_steps and timing and "zcoll-auto" in args.configs):
        return None
    medians: Dict[str, float] = {}
    for e in timing["entries"]:
        if e["config"] in wl.FIXED and e["kind"] == "step":
            medians[e["config"]] = min(e["median"], medians.get(e["config"], math.inf))
    if not medians:
        return None
    fastest = min(medians, key=medians.get)
    # zcoll too on shared memory, for the target "at most 3% slower than uncompressed", and
    # zcoll-again: how far apart noise alone puts two identical models (that target's resolution)
    shm = ["zcoll", "zcoll-again"] if spec.network == "shm" else []
    configs = list(dict.fromkeys([fastest, "zcoll-auto"] + shm))
    rounds = max(1, args.confirm_steps // 10)
    again = JobSpec(spec.phase, spec.model, spec.ranks, spec.network, args.confirm_steps, rounds, CONFIRM)
    log(f"confirmation: {', '.join(configs)} ({args.confirm_steps} timed steps)")
    return run_job(again, args, configs, ns, failures)
