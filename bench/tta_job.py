"""One time-to-accuracy job, under mpirun (bench/tta.py launches it): one workload and one seed;
every method trains its own copy of the model, the same initial weights and batches, in turns of
`--block` steps (the order rotating each turn), so what else the machine does falls on every method
alike. Each method's clock counts only its own training steps (forward, backward, communication,
optimizer: auto's calibration and trials, guard checks and codec work happen inside them); the
evaluation every `eval_every` steps is timed apart. At each evaluation the clock is each rank's
sum of its steps; the JSON holds the slowest rank's.

    mpirun -n 2 python bench/tta_job.py --workload cnn --seed 0 --out job.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel as DDP

import zcoll
import zcoll.torch
from zcoll.compression.methods import make_compressor
from tta_workloads import WORKLOADS, Workload, gradient_bytes

# The lossy codecs' configuration the docs recommend (docs/compression.md): a dense warm-up of a
# tenth of the steps, then momentum correction (the optimizer's momentum in the hook).
RECIPE_WARMUP = 0.1
POWERSGD_RANK = 4


@dataclass(frozen=True)
class Method:
    group: Optional[str]  # "gloo" or "zcoll"; None: no DDP (each rank alone: the compute-only step)
    hook: Optional[str] = None  # torch's hooks on gloo: "fp16", "powersgd"
    codec: Optional[str] = None  # zcoll: a zcoll.compression.methods name, or "auto"
    recipe: bool = False  # warm-up and momentum correction (apply_gradient_compression)


# What each auto decision records in the JSON: the trials' measured error per candidate, among others.
DECISION_FIELDS = (
    "step",
    "bucket",
    "bytes",
    "method",
    "reason",
    "trial_error",
    "predicted_error",
    "exposed_none_s",
    "trial_step_s",
    "error_bound",
)

METHODS: Dict[str, Method] = {
    # not a way to train: each rank steps its own model on its own batch, no communication; its
    # step time times another method's steps to target is that method's compute-only bound
    "compute": Method(None),
    "gloo": Method("gloo"),
    "gloo-fp16": Method("gloo", hook="fp16"),
    "gloo-powersgd": Method("gloo", hook="powersgd"),
    "zcoll": Method("zcoll"),
    "zcoll-bf16": Method("zcoll", codec="bf16"),
    "zcoll-int8": Method("zcoll", codec="int8"),
    "zcoll-int4": Method("zcoll", codec="int4", recipe=True),
    "zcoll-sign": Method("zcoll", codec="sign", recipe=True),
    "zcoll-top1%": Method("zcoll", codec="top1%", recipe=True),
    "zcoll-auto": Method("zcoll", codec="auto"),
}


class NonFinite(FloatingPointError):
    pass


class Run:
    """One method's model, optimizer and clock."""

    def __init__(self, name: str, workload: Workload, groups: Dict[str, Any], seed: int):
        self.name, self.workload, self.method = name, workload, METHODS[name]
        self.clock = 0.0  # this rank's seconds in training steps
        self.step = 0
        self.evals: List[List[float]] = []  # [step, clock, quality]
        self.step_s: List[float] = []
        self.failure: Optional[str] = None
        self.state: Any = None
        self.model = self._build(workload.make_model(seed), groups)

    def _build(self, module: torch.nn.Module, groups: Dict[str, Any]) -> torch.nn.Module:
        m = self.method
        self.optimizer = torch.optim.Adam(module.parameters(), lr=self.workload.lr, fused=True)
        if m.group is None:
            return module
        # PowerSGD on gloo: one bucket. With DDP's default small first bucket, the two buckets'
        # hook callbacks issue their allreduces in whichever order their futures complete,
        # which differs between ranks: gloo aborted or hung (collective mismatch) on every
        # two-bucket model here. bucket_cap_mb given explicitly makes the first bucket 25 MB too.
        extra = {"bucket_cap_mb": 25} if m.hook == "powersgd" else {}
        ddp = DDP(module, process_group=groups[m.group], **extra)
        if m.hook == "fp16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            ddp.register_comm_hook(groups["gloo"], default_hooks.fp16_compress_hook)
        elif m.hook == "powersgd":
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

            self.state = psgd.PowerSGDState(process_group=groups["gloo"], matrix_approximation_rank=POWERSGD_RANK,
                                            start_powerSGD_iter=max(2, int(RECIPE_WARMUP * self.workload.steps)))  # fmt: skip
            ddp.register_comm_hook(self.state, psgd.powerSGD_hook)
        elif m.codec == "auto":
            self.state = zcoll.torch.apply_gradient_compression(ddp, "auto")
        elif m.codec is not None:
            warmup = int(RECIPE_WARMUP * self.workload.steps) if m.recipe else 0
            optimizer = self.optimizer if m.recipe else None
            self.state = zcoll.torch.apply_gradient_compression(
                ddp, make_compressor(m.codec), warmup, optimizer=optimizer
            )
        return ddp

    def train(self, steps: int, data: Any, rank: int, size: int) -> None:
        for _ in range(steps):
            if self.failure is not None or self.step >= self.workload.steps:
                return
            x, y = data.batch(self.step, rank, size)
            t0 = time.perf_counter()
            try:
                logits = self.model(x)
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
                loss.backward()
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
            except Exception as e:  # a hook or backend that fails is reported, not dropped
                self.failure = f"step {self.step}: {type(e).__name__}: {' '.join(str(e).split())[:400]}"
                return
            spent = time.perf_counter() - t0
            self.clock += spent
            self.step_s.append(spent)
            if not math.isfinite(loss.item()):
                raise NonFinite(
                    f"non-finite training loss {loss.item()} at step {self.step} with method {self.name}"
                )
            self.step += 1
            if self.step % self.workload.eval_every == 0 or self.step == self.workload.steps:
                self.evaluate(data)

    def evaluate(self, data: Any) -> None:
        quality = data.evaluate(getattr(self.model, "module", self.model))
        if not math.isfinite(quality):
            raise NonFinite(f"non-finite {self.workload.quality} at step {self.step} with method {self.name}")
        self.evals.append([self.step, self.clock, quality])

    def result(self, world: Any) -> Dict[str, Any]:
        """Collective: this method's figures, clocks the slowest rank's."""
        clocks = np.array([e[1] for e in self.evals] or [0.0])
        width = world.allreduce(len(clocks), op=MPI.MAX)
        padded = np.zeros(width)
        padded[: len(clocks)] = clocks
        world.Allreduce(MPI.IN_PLACE, padded, op=MPI.MAX)
        failures = [f for f in world.allgather(self.failure) if f]
        evals = [[s, float(c), q] for (s, _, q), c in zip(self.evals, padded)]
        reached = next((e for e in evals if self.workload.reached(e[2])), None)
        out = {"evals": evals, "failure": failures[0] if failures else None, "steps": self.step,
               "step_s_median": float(np.median(self.step_s)) if self.step_s else None,
               "reached": None if reached is None else {"step": reached[0], "seconds": reached[1], "quality": reached[2]},
               "final": evals[-1][2] if evals and self.step == self.workload.steps else None}  # fmt: skip
        if self.method.codec == "auto" and self.state is not None:
            report = self.state.compressor.report()
            events = self.state.compressor.events
            out["auto"] = {"decided_at_step": report["decided_at_step"], "in_use": report["in_use"],
                           "decisions": [{k: e.get(k) for k in DECISION_FIELDS} for e in events if e["event"] == "decision"],
                           "other_events": [e for e in events if e["event"] not in ("decision", "bucket")][:50]}  # fmt: skip
        return out


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=sorted(WORKLOADS), required=True)
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of: {', '.join(METHODS)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, help="override the workload's budget (a quick run)")
    p.add_argument("--target", type=float, help="override the workload's quality target")
    p.add_argument("--lr", type=float, help="override the workload's learning rate")
    p.add_argument("--block", type=int, default=10, help="steps per method per turn (default 10)")
    p.add_argument("--setup", default="", help="a label written into the JSON")
    p.add_argument("--out", required=True, help="the JSON to write (rank 0)")
    return p.parse_args()


def main() -> int:
    args = parse()
    torch.set_num_threads(1)
    w = WORKLOADS[args.workload]
    if args.steps:
        w = Workload(**{**w.__dict__, "steps": args.steps, "eval_every": min(w.eval_every, args.steps)})
    for field in ("target", "lr"):
        if getattr(args, field) is not None:
            w = Workload(**{**w.__dict__, field: getattr(args, field)})
    world = MPI.COMM_WORLD
    groups = zcoll.torch.init_gloo_beside_zcoll(world, timeout=datetime.timedelta(seconds=120))
    data = w.make_data(args.seed)
    names = [m for m in args.methods.split(",") if m]
    runs = [Run(n, w, groups, args.seed) for n in names]
    progress = world.rank == 0 and sys.stderr.isatty()
    t0 = time.perf_counter()
    for turn in range(math.ceil(w.steps / args.block)):
        for run in runs[turn % len(runs) :] + runs[: turn % len(runs)]:
            run.train(args.block, data, world.rank, world.size)
        if world.rank == 0:
            print(f"  {args.setup} {w.name} seed {args.seed}: step {min(w.steps, (turn + 1) * args.block)}/{w.steps} "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, end="\r" if progress else "\n", flush=True)  # fmt: skip
    results = {r.name: r.result(world) for r in runs}
    if world.rank == 0:
        doc = {"setup": args.setup, "workload": w.name, "quality": w.quality, "higher_is_better": w.higher_is_better,
               "target": w.target, "steps": w.steps, "seed": args.seed, "ranks": world.size,
               "gradient_bytes": gradient_bytes(getattr(runs[0].model, "module", runs[0].model)), "methods": results,
               "wall_s": time.perf_counter() - t0, "host_pid": os.getpid()}  # fmt: skip
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1, default=str)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except NonFinite as e:
        print(f"TTA-STOPPED {e}", flush=True)
        traceback.print_exc()
        os._exit(3)
