"""zcoll.torch.elastic.ElasticLoop under `mpirun --with-ft ulfm` (Open MPI): a small MLP under
DDP learns a fixed nonlinear regression task; the survivors of lost ranks recover in place and
finish. Run by tests/torch/test_elastic.py (one victim that SIGKILLs or SIGSTOPs itself at a
step; with --kill-too a second one SIGKILLs itself at the same step) and by tests/chaos_shrink.py
(faults from outside, --state). Data: the micro-batch k of step s of first-group rank q is drawn
from seed (s, q, k), whichever rank computes it (the loop's ``micro_batches``: with policy
accumulate the survivors take the lost ranks' over, so the trajectory is the fault-free one); the
quality is the mean squared error on 1,024 held-out rows (the same on every rank). Each rank prints

    ZCOLL-VICTIM rank=R pid=P signal=kill|stop t=T
    ZCOLL-RECOVERED rank=R lost=1,2 world=4,2 resumed=S accumulation=A attempts=N seconds=X t=T(done) how=failed|excluded
    ZCOLL-FINAL rank=R steps=N world=W loss0=L loss=L digest=H     (digest: the parameters', equal on every survivor)

A stopped victim (--signal stop) is left out by the survivors; the first of them then, with
--stopped resume, sends it SIGCONT as soon as they train again (it must raise ExcludedError,
printed as ``ZCOLL-EXCLUDED rank=R error=...``, and end; the others must not notice) and, after
its final line, SIGKILLs it if it is still there (``ZCOLL-STOPPED-KILLED rank=R pid=P``; with
--stopped kill at once).

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
from zcoll.torch.elastic import ElasticLoop, ExcludedError


def options() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--victim", type=int, default=-1, help="the rank that signals itself (default: none)")
    p.add_argument("--signal", choices=("kill", "stop"), default="kill", help="what the victim sends itself")
    p.add_argument(
        "--stopped",
        choices=("kill", "resume"),
        default="kill",
        help="the survivors' end for a stopped victim",
    )
    p.add_argument(
        "--kill-too",
        type=int,
        default=-1,
        help="a second victim that SIGKILLs itself at the same step (a stopped and a dead rank at once)",
    )
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


class Stopped:
    """What the survivors do with a victim that stopped itself (--signal stop, module docstring)."""

    def __init__(self, args: argparse.Namespace, state: State) -> None:
        pids = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
        dist.all_gather(pids, torch.tensor([os.getpid()], dtype=torch.int64))
        self.args, self.state, self.pids, self.resumed = args, state, [int(p) for p in pids], False

    def on_phase(self, phase: str, step: int) -> None:
        self.state(phase, step)
        victim = self.args.victim
        if (
            phase == "train"
            and self.args.signal == "stop"
            and self.args.stopped == "resume"
            and not self.resumed
        ):
            if dist.get_rank() == 0 and 0 <= victim != self.state.rank:
                os.kill(self.pids[victim], signal.SIGCONT)
                print(
                    f"ZCOLL-CONTINUED rank={victim} pid={self.pids[victim]} t={time.time():.3f}", flush=True
                )
            self.resumed = True

    def end(self) -> None:
        """After the final line: the first survivor ends a stopped victim that is still there."""
        victim = self.args.victim
        if self.args.signal != "stop" or dist.get_rank() != 0 or not 0 <= victim != self.state.rank:
            return
        pid, deadline = self.pids[victim], time.time() + (30 if self.args.stopped == "resume" else 0)
        while there(pid) and time.time() < deadline:
            time.sleep(0.1)
        if there(pid):
            os.kill(pid, signal.SIGKILL)
            print(f"ZCOLL-STOPPED-KILLED rank={victim} pid={pid}", flush=True)


def there(pid: int) -> bool:
    """Whether process pid exists and is no zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def report(loop: ElasticLoop, net: torch.nn.Module, rank0: int, loss0: float, loss: float) -> None:
    for r in loop.recoveries:
        print(
            f"ZCOLL-RECOVERED rank={rank0} lost={','.join(map(str, r['lost']))} world={r['world'][0]},{r['world'][1]} "
            f"resumed={r['resumed_at']} accumulation={r['accumulation']} attempts={r['attempts']} "
            f"seconds={r['seconds']:.3f} t={r['finished']:.3f} how={r['how']}",
            flush=True,
        )
    digest = hashlib.sha1(b"".join(t.detach().numpy().tobytes() for t in net.parameters())).hexdigest()[:16]
    print(
        f"ZCOLL-FINAL rank={rank0} steps={loop.step} world={dist.get_world_size()} loss0={loss0:.5f} "
        f"loss={loss:.12f} digest={digest}",
        flush=True,
    )


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
    stopped = Stopped(args, state)
    loop = ElasticLoop(net, opt, wrap=lambda m, g: DDP(m, process_group=g), policy=args.policy,
                       scaling=scaling if args.policy == "lr" else None, micro_batch=args.micro_batch,
                       on_phase=stopped.on_phase)  # fmt: skip

    def batch(seed: int, rows: int = args.micro_batch) -> tuple:
        x = torch.randn(rows, 16, generator=torch.Generator().manual_seed(seed))
        return x, torch.sin(x @ w_true)

    held_out = batch(123_456_789, 1024)

    def held_out_loss(model) -> float:
        x, y = held_out
        with torch.no_grad():
            return float(((model(x).squeeze(1) - y) ** 2).mean())

    def step_fn(step: int, model) -> None:
        if rank0 in (args.victim, args.kill_too) and step == args.after:
            how = args.signal if rank0 == args.victim else "kill"
            print(f"ZCOLL-VICTIM rank={rank0} pid={os.getpid()} signal={how} t={time.time():.3f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        opt.zero_grad()

        def loss_of(rank: int, k: int) -> torch.Tensor:  # micro-batch k of first-group rank `rank`
            x, y = batch(1_000_000 * step + 1000 * rank + k)
            return ((model(x).squeeze(1) - y) ** 2).mean()

        loop.backward(model, loss_of)
        time.sleep(args.step_seconds)
        opt.step()
        if args.policy == "lr":
            scaling.step()
        state("train", step + 1)

    loss0 = held_out_loss(net)
    state("train", 0)
    try:
        loop.run(step_fn, args.steps)
    except ExcludedError as e:  # the stopped victim, continued: the others went on without it
        print(f"ZCOLL-EXCLUDED rank={rank0} error={e}", flush=True)
        os._exit(0)  # its communicators hold ranks that left it: nothing of them to free or finalize
    report(loop, net, rank0, loss0, held_out_loss(net))
    stopped.end()
    state("done", loop.step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
