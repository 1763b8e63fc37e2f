"""zcoll.torch.elastic.ElasticLoop under `mpirun --with-ft ulfm` (Open MPI): a small MLP under
DDP learns a fixed nonlinear regression task; the survivors of lost ranks recover in place and
finish. Run by tests/torch/test_elastic.py (one victim that SIGKILLs itself at a step) and by
tests/chaos_shrink.py (faults from outside, --state). Data: the micro-batch k of step s on rank
r (the rank in the current group) is drawn from seed (s, r, k); the quality is the mean squared
error on 1,024 held-out rows (the same on every rank). Each rank prints

    ZCOLL-VICTIM rank=R t=T
    ZCOLL-RECOVERED rank=R lost=1,2 world=4,2 resumed=S accumulation=A attempts=N seconds=X t=T(done)
    ZCOLL-FINAL rank=R steps=N world=W loss0=L loss=L digest=H     (digest: the parameters', equal on every survivor)

With --state DIR each rank keeps DIR/rank-R.txt (R: its first rank) at one line, replaced at every
change: ``rank=R pid=P phase=PHASE step=S world=W t=T``, PHASE start | train (step S done) |
recover (a recovery began at step S) | done.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import signal
import time

import torch
import torch.distributed as dist
import zcoll.torch
from torch.nn.parallel import DistributedDataParallel as DDP
from zcoll.torch.elastic import ElasticLoop


def options() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--victim", type=int, default=-1, help="the rank that SIGKILLs itself (default: none)")
    p.add_argument("--after", type=int, default=6, help="the step at whose start the victim dies")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--timeout", type=float, default=5.0, help="the process group's timeout, seconds")
    p.add_argument("--policy", choices=ElasticLoop.POLICIES, default="accumulate")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=32, help="rows per rank per micro-batch")
    p.add_argument(
        "--step-seconds", type=float, default=0.0, help="sleep this long in each step (slower steps)"
    )
    p.add_argument("--state", default=None, help="keep DIR/rank-R.txt at this rank's phase (docstring)")
    return p.parse_args()


class State:
    """This rank's line in --state (module docstring)."""

    def __init__(self, where: str | None, rank: int, loop_world) -> None:
        self.path = os.path.join(where, f"rank-{rank}.txt") if where else None
        self.rank, self.world = rank, loop_world

    def __call__(self, phase: str, step: int) -> None:
        if self.path is None:
            return
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            f.write(f"rank={self.rank} pid={os.getpid()} phase={phase} step={step} world={self.world()} "
                    f"t={time.time():.4f}\n")  # fmt: skip
        os.replace(tmp, self.path)


def main() -> None:
    args = options()
    zcoll.torch.init_process_group(timeout=datetime.timedelta(seconds=args.timeout))
    rank0 = dist.get_rank()
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(16, args.hidden), torch.nn.Tanh(), torch.nn.Linear(args.hidden, 1)
    )
    w_true = torch.randn(16, generator=torch.Generator().manual_seed(7)) / 4
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    scaling = zcoll.torch.LRScaling(opt, base_batch=dist.get_world_size() * args.micro_batch, rule="linear")
    state = State(args.state, rank0, lambda: dist.get_world_size())
    loop = ElasticLoop(net, opt, wrap=lambda m, g: DDP(m, process_group=g), policy=args.policy,
                       scaling=scaling if args.policy == "lr" else None, micro_batch=args.micro_batch,
                       on_phase=state)  # fmt: skip

    def batch(seed: int, rows: int = args.micro_batch) -> tuple:
        x = torch.randn(rows, 16, generator=torch.Generator().manual_seed(seed))
        return x, torch.sin(x @ w_true)

    held_out = batch(123_456_789, 1024)

    def loss_of(model) -> float:
        x, y = held_out
        with torch.no_grad():
            return float(((model(x).squeeze(1) - y) ** 2).mean())

    def step_fn(step: int, model) -> None:
        if rank0 == args.victim and step == args.after:
            print(f"ZCOLL-VICTIM rank={rank0} t={time.time():.3f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        opt.zero_grad()
        for k in range(loop.accumulation):
            x, y = batch(1_000_000 * step + 1000 * dist.get_rank() + k)
            (((model(x).squeeze(1) - y) ** 2).mean() / loop.accumulation).backward()
        time.sleep(args.step_seconds)
        opt.step()
        if args.policy == "lr":
            scaling.step()
        state("train", step + 1)

    loss0 = loss_of(net)
    state("train", 0)
    loop.run(step_fn, args.steps)
    for r in loop.recoveries:
        print(
            f"ZCOLL-RECOVERED rank={rank0} lost={','.join(map(str, r['lost']))} world={r['world'][0]},{r['world'][1]} "
            f"resumed={r['resumed_at']} accumulation={r['accumulation']} attempts={r['attempts']} "
            f"seconds={r['seconds']:.3f} t={r['finished']:.3f}",
            flush=True,
        )
    digest = hashlib.sha1(b"".join(t.detach().numpy().tobytes() for t in net.parameters())).hexdigest()[:16]
    print(
        f"ZCOLL-FINAL rank={rank0} steps={loop.step} world={dist.get_world_size()} loss0={loss0:.5f} "
        f"loss={loss_of(net):.5f} digest={digest}",
        flush=True,
    )
    state("done", loop.step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
