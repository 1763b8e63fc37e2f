#!/usr/bin/env python3
"""What the compression guard costs a training step, measured as a difference of step times.

    mpirun -n 2 python bench/guard_overhead.py [--model mlp] [--method sign] [--blocks 40]
    mpirun -n 2 python bench/guard_overhead.py --compare auto-none [--model mlp]

Two DDP models from the same initial weights, on the same batches of scikit-learn's digits, with
the same compressed method through zcoll.AutoCompression(methods=[METHOD]): one with the guard
off (guard=False), one with it on (per-step metrics, the residual-to-gradient ratio, an exact
check every --check-every steps; no residual bound, so both send the same method throughout).
They train in alternating blocks of --block steps (A B B A, so that drift cancels), each step
starting at a barrier and lasting as long as its slowest rank; the first step of each block is
not counted. Prints the median step of each, the overhead (guarded / unguarded - 1) with the
spread of the per-round ratios, and the guard's own time per step as it times itself
(AutoCompression.guard_seconds: wall time on the hook's worker, GIL waits included; and
guard_cpu_seconds: the worker thread's CPU time in it).

--compare auto-none measures instead what compression="auto" costs where it decided to send
uncompressed (shared memory): plain zcoll (DDP's own allreduce through the zcoll backend, no
hook) against zcoll.AutoCompression(methods=["none"]) through the compression hook (its trial
steps, then every bucket on auto's decided-uncompressed path, the drift checks every
--check-every steps), in the same A B B A blocks.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("MPIR_CVAR_DEVICE_COLLECTIVES", "none")
import ddp_workload as wl  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import zcoll  # noqa: E402
import zcoll.torch  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def options(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--compare",
        default="guard",
        choices=["guard", "auto-none"],
        help="guard: the guard off against on (default); "
        "auto-none: plain zcoll against auto decided uncompressed",
    )
    p.add_argument("--model", default="mlp", choices=["mlp", "cnn", "transformer"])
    p.add_argument("--method", default="sign", help="the compressed method (zcoll.compression.methods' names)")
    p.add_argument("--blocks", type=int, default=40, help="blocks per model (default 40)")
    p.add_argument("--block", type=int, default=8, help="steps per block, the first not counted (default 8)")
    p.add_argument("--check-every", type=int, default=50, help="steps between the guard's exact checks")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


class Run:
    """One model, its optimizer, its batches and its step times."""

    def __init__(self, args, auto, data, rank: int, size: int):
        """auto: the model's zcoll.AutoCompression, or None for plain zcoll (no hook)."""
        self.ddp = DDP(wl.make_model(args.model, args.seed))
        self.auto = auto
        if auto is not None:
            zcoll.torch.apply_gradient_compression(self.ddp, auto)
        self.opt = torch.optim.Adam(self.ddp.parameters(), lr=1e-3)
        self.batches = wl.Batches(data, args.batch, rank, size, args.seed)
        self.times: list = []

    def step(self) -> float:
        x, y, _ = self.batches.next()
        dist.barrier()
        t0 = time.perf_counter()
        wl.loss_of(self.ddp, x, y).backward()
        self.opt.step()
        self.opt.zero_grad()
        return time.perf_counter() - t0

    def block(self, n: int) -> None:
        self.step()  # the switch from the other model: caches, the worker
        mine = torch.tensor([self.step() for _ in range(n - 1)], dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # a step lasts as long as its slowest rank
        self.times.append(mine.tolist())


def main(argv=None) -> int:
    args = options(argv)
    zcoll.torch.init_process_group()
    torch.set_num_threads(1)
    rank, size = dist.get_rank(), dist.get_world_size()
    data = wl.load_digits(args.seed)
    if args.compare == "guard":
        a = zcoll.AutoCompression(methods=[args.method], guard=False, check_every=args.check_every)
        b = zcoll.AutoCompression(methods=[args.method], guard=True, check_every=args.check_every)
    else:
        a, b = None, zcoll.AutoCompression(methods=["none"], check_every=args.check_every)
    first, second = Run(args, a, data, rank, size), Run(args, b, data, rank, size)
    for r in (first, second):  # warm-up: DDP's bucket rebuild, the trial steps (1 method x 4)
        for _ in range(10):
            r.step()
    spent0 = guard_spent(second.auto)
    for i in range(args.blocks // 2):
        for r in (first, second, second, first):  # A B B A
            r.block(args.block)
        if rank == 0 and (i + 1) % 5 == 0:
            print(f"  round {i + 1}/{args.blocks // 2}", flush=True)
    wall, cpu = (after - before for after, before in zip(guard_spent(second.auto), spent0))
    if rank == 0:
        report(args, first, second, wall, cpu)
    dist.destroy_process_group()
    return 0


def guard_spent(auto) -> tuple:
    """The guard's wall and CPU seconds so far (those since its last check included)."""
    return auto.guard.seconds + auto.guard.spent.wall, auto.guard.cpu_seconds + auto.guard.spent.cpu


def report(args, first: Run, second: Run, guard_s: float, guard_cpu_s: float) -> None:
    a = [t for block in first.times for t in block]
    b = [t for block in second.times for t in block]
    ma, mb = statistics.median(a), statistics.median(b)
    # per round (A B B A): the second's blocks' median over the first's
    ratios = sorted(
        statistics.median(second.times[2 * i] + second.times[2 * i + 1])
        / statistics.median(first.times[2 * i] + first.times[2 * i + 1])
        for i in range(len(first.times) // 2)
    )
    q1, q3 = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]
    own, cpu = (guard_s / len(b), guard_cpu_s / len(b)) if b else (0.0, 0.0)
    if args.compare == "guard":
        what, names = f"{args.method}, ", ("unguarded", "guarded")
    else:
        what, names = "", ("plain zcoll", "auto (decided none)")
    print(
        f"{args.model}, {what}{dist.get_world_size()} ranks, {len(a)} + {len(b)} timed steps:\n"
        f"  {names[0]} {ma * 1e3:.2f} ms, {names[1]} {mb * 1e3:.2f} ms a step: overhead {mb / ma - 1:+.1%} "
        f"(per-round ratios: median {statistics.median(ratios) - 1:+.1%}, "
        f"quartiles {q1 - 1:+.1%} .. {q3 - 1:+.1%})"
    )
    if args.compare == "auto-none":
        auto = second.auto
        print(
            f"  auto decided at step {auto.decided_step}; its bucket calls by method: {auto.calls_by_method}"
        )
    else:
        print(
            f"  the guard's own time: {own * 1e3:.3f} ms a step ({own / mb:.1%}), "
            "wall time on the hook's worker; "
            f"its CPU time {cpu * 1e3:.3f} ms ({cpu / mb:.1%})"
        )


if __name__ == "__main__":
    sys.exit(main())
