#!/usr/bin/env python3
"""compression="auto" without DDP: a manual data-parallel loop, as a Horovod-style user writes it
(after the backward pass, each parameter's gradient averaged by ``comm.allreduce(p.grad,
op="avg", compression=..., key=name, out=p.grad)``), auto against uncompressed and every fixed
method, in one job.

    mpirun -n 2 python bench/auto_calls.py [--model mlp] [--rounds 8] [--block 8]
    python -m zcoll.tools.testbed --nodes 1,1 --inter 1gbit -- python bench/auto_calls.py   # 1 Gbit/s link

Every configuration trains its own copy of the model (the same initial weights, the same batches of
scikit-learn's digits, torch's fused Adam). All first run --warmup steps (auto's trials and
decision fall in them: it decides by step 49), then they take turns in blocks of --block steps
for --rounds rounds, the order reversed every other round; the first step of a block is not
counted; a step starts at a barrier and lasts as long as its slowest rank. Prints per
configuration the median step, its ratio to the best fixed method and to uncompressed, the test
accuracy after the run, and auto's decisions; with none-again, the A/A control's ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("MPIR_CVAR_DEVICE_COLLECTIVES", "none")
import ddp_workload as wl  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import zcoll  # noqa: E402
from zcoll.tune import compression_model as cm  # noqa: E402

FIXED = ("bf16", "int8", "int4", "top10%", "sign", "top1%")


def options(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="mlp", choices=wl.MODELS)
    p.add_argument(
        "--configs",
        default="none," + ",".join(FIXED) + ",auto",
        help="comma-separated: none, the fixed methods' names, auto, none-again (a second "
        "uncompressed model: an A/A control) (default: all but none-again)",
    )
    p.add_argument("--warmup", type=int, default=55, help="steps before the timed rounds (default 55)")
    p.add_argument("--rounds", type=int, default=8, help="rounds of blocks (default 8)")
    p.add_argument("--block", type=int, default=8, help="steps per block, the first not counted (default 8)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


class Run:
    """One configuration: its model, optimizer, batches, compressor and step times."""

    def __init__(self, name: str, comm, data, args):
        self.name, self.comm = name, comm
        self.model = wl.make_model(args.model, args.seed)
        self.opt = wl.make_optimizer("adam-fused", self.model, args.lr)
        self.batches = wl.Batches(data, args.batch, comm.rank, comm.size, args.seed)
        self.compression = (
            None
            if name in ("none", "none-again")
            else zcoll.AutoCompression()
            if name == "auto"
            else cm.make_compressor(name)
        )
        self.params = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        self.times: list = []

    def step(self) -> float:
        x, y, _ = self.batches.next()
        self.comm.barrier()
        t0 = time.perf_counter()
        wl.loss_of(self.model, x, y).backward()
        for name, p in self.params:
            g = p.grad
            if self.compression is None:
                self.comm.allreduce(g, op="avg", out=g)
            else:
                self.comm.allreduce(g, op="avg", compression=self.compression, key=name, out=g)
        self.opt.step()
        self.opt.zero_grad()
        return time.perf_counter() - t0

    def block(self, n: int) -> None:
        self.step()  # the switch from the other models: caches
        mine = np.array([self.step() for _ in range(n - 1)])
        self.times.extend(self.comm.allreduce(mine, op="max").tolist())  # the slowest rank's step


def main(argv=None) -> int:
    args = options(argv)
    torch.set_num_threads(1)
    comm = zcoll.Communicator()
    names = [c for c in args.configs.split(",") if c]
    unknown = [c for c in names if c not in ("none", "auto", "none-again", *FIXED)]
    if unknown:
        raise SystemExit(
            f"unknown configurations {unknown}; known: none, {', '.join(FIXED)}, auto, none-again"
        )
    data = wl.load_digits(args.seed)
    runs = [Run(n, comm, data, args) for n in names]
    say = (lambda text: print(text, flush=True)) if comm.rank == 0 else (lambda text: None)
    say(f"{args.model}, {comm.size} ranks, {len(runs)} configurations: {args.warmup} warm-up steps each")
    for r in runs:
        for _ in range(args.warmup):
            r.step()
    for i in range(args.rounds):
        for r in runs if i % 2 == 0 else runs[::-1]:
            r.block(args.block)
        say(f"  round {i + 1}/{args.rounds}")
    if comm.rank == 0:
        report(args, comm, runs, data)
    return 0


def report(args, comm, runs, data) -> None:
    step = {r.name: statistics.median(r.times) for r in runs}
    fixed = [n for n in step if n not in ("auto", "none-again")]
    best = min(fixed, key=step.get) if fixed else None
    print(
        f"\n{args.model}, {comm.size} ranks, {len(runs[0].times)} timed steps each "
        "(median step, slowest rank):"
    )
    print("| config | step ms | vs best fixed | vs uncompressed | test accuracy |")
    print("|---|---|---|---|---|")
    for r in runs:
        vs_best = f"{step[best] / step[r.name]:.2f}x" if best else "-"
        vs_none = f"{step['none'] / step[r.name]:.2f}x" if "none" in step else "-"
        acc = wl.accuracy_on_test_set(r.model, data)
        print(f"| {r.name} | {step[r.name] * 1e3:.1f} | {vs_best} | {vs_none} | {acc:.2%} |")
    auto = next((r.compression for r in runs if r.name == "auto"), None)
    if auto is not None:
        chosen = {k: p[-1] for k, p in auto.guard.path.items()}
        print(f"auto decided at step {auto.decided_step}: {chosen}; best fixed: {best}")
    if "none" in step and "none-again" in step:
        print(f"A/A: none-again {step['none'] / step['none-again']:.2f}x of none")


if __name__ == "__main__":
    sys.exit(main())
