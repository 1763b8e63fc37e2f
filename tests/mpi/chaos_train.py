"""The training program of the chaos run (tests/chaos_run.py): a small MLP under DDP on the zcoll
backend, run by `zcoll run`, resumed from its newest checkpoint after every failure.

    zcoll run -n 2 --max-restarts 30 --checkpoint-dir D -- \\
        python tests/mpi/chaos_train.py --steps 300 --checkpoint-every 10 --out D/final.txt

1. Deterministic: every rank starts from the same weights (seed), the batch of step s on rank r
   depends only on (seed, s, r), SGD with momentum; a checkpoint every --checkpoint-every steps
   through zcoll.torch.checkpoint (model, optimizer, RNGs, the step as data position). A run
   resumed from a checkpoint on the same rank count computes the same bits as one never stopped.
2. Where it is, for the runner: $ZCOLL_CHAOS_STATE/rank-R.txt holds one line,
   ``launch=K rank=R pid=P phase=PHASE step=S t=T``, replaced (write + rename) at every change.
   Phases: start (the process began: imports, MPI, the process group, DDP), load (reading the
   checkpoint), train (step S done), checkpoint (writing the checkpoint of step S), done.
3. At the end rank 0 writes ``digest=<sha256 of the final parameters> steps=N`` to --out
   (temporary file + rename) and prints ``CHAOS-DONE digest=... steps=N``.
4. Start-up guard: MPI's start-up (MPI_Init, the communicators' creation) waits for every rank
   with no deadline, so a rank stopped there would hold the others forever. faulthandler's timer
   (--startup-deadline seconds, armed before any import that starts MPI) ends the process with
   status 1 if the process group is not up by then; mpirun then ends the job and `zcoll run`
   restarts it. From there on every wait is a zcoll collective under the group's --timeout (the
   checkpoint's exchanges included: they go through the process group).
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import hashlib
import os
import time
from pathlib import Path

STARTED = time.time()


def options() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300, help="training steps in all (default 300)")
    p.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints (default 10)")
    p.add_argument("--hidden", type=int, default=256, help="the MLP's hidden width (default 256)")
    p.add_argument("--batch", type=int, default=32, help="rows per rank and step (default 32)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=3.0, help="the process group's timeout, seconds")
    p.add_argument(
        "--startup-deadline",
        type=float,
        default=40.0,
        help="seconds the start-up (imports, MPI, process group) may take before the process ends itself",
    )
    p.add_argument(
        "--checkpoint-dir",
        default=None,
        help="default: ZCOLL_CHECKPOINT_DIR (set by `zcoll run --checkpoint-dir`)",
    )
    p.add_argument("--out", required=True, help="where rank 0 writes the final parameters' digest")
    return p.parse_args()


class State:
    """This rank's line in $ZCOLL_CHAOS_STATE (module docstring, 2.); nothing when it is unset."""

    def __init__(self, rank: int) -> None:
        where = os.environ.get("ZCOLL_CHAOS_STATE")
        self.path = Path(where) / f"rank-{rank}.txt" if where else None
        self.rank = rank
        self.launch = os.environ.get("ZCOLL_RESTART", "0")

    def __call__(self, phase: str, step: int) -> None:
        if self.path is None:
            return
        line = f"launch={self.launch} rank={self.rank} pid={os.getpid()} phase={phase} step={step} t={time.time():.4f}\n"
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        tmp.write_text(line)
        os.replace(tmp, self.path)


# Before any import that starts MPI (module docstring, 4.); the rank from the launcher's
# environment, as MPI is not up yet.
ARGS = options()
RANK = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
STATE = State(RANK)
STATE("start", 0)
faulthandler.dump_traceback_later(ARGS.startup_deadline, exit=True)

import torch
import torch.distributed as dist
import torch.nn.functional as F
import zcoll.torch
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    args, rank, state = ARGS, RANK, STATE
    torch.set_num_threads(1)
    zcoll.torch.init_process_group(timeout=datetime.timedelta(seconds=args.timeout))
    faulthandler.cancel_dump_traceback_later()
    if dist.get_rank() != rank:
        raise SystemExit(f"chaos_train.py: PMI_RANK {rank} but torch rank {dist.get_rank()}")
    torch.manual_seed(args.seed)
    net = torch.nn.Sequential(
        torch.nn.Linear(32, args.hidden), torch.nn.Tanh(), torch.nn.Linear(args.hidden, args.hidden),
        torch.nn.Tanh(), torch.nn.Linear(args.hidden, 8),
    )  # fmt: skip
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def batch(step: int):
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 997 + rank)
        x = torch.randn(args.batch, 32, generator=g)
        return x, torch.sin(x[:, :8] * 2) + 0.1 * x[:, 8:16]

    def forward_backward():
        x, y = batch(0)
        F.mse_loss(model(x), y).backward()

    ckpt = args.checkpoint_dir or os.environ.get("ZCOLL_CHECKPOINT_DIR")
    first = 0
    if ckpt:
        state("load", 0)
        resumed = zcoll.torch.checkpoint.load(
            ckpt, model=model, optimizer=opt, rebuild_buckets=forward_backward
        )
        first = resumed.data_position if resumed else 0
        if rank == 0:
            print(f"# chaos_train: launch {state.launch} resumed from step {first}", flush=True)
    state("train", first)
    for step in range(first, args.steps):
        x, y = batch(step)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        done = step + 1
        if ckpt and (done % args.checkpoint_every == 0 or done == args.steps):
            state("checkpoint", done)
            zcoll.torch.checkpoint.save(ckpt, done, model=model, optimizer=opt, data_position=done)
        state("train", done)
    flat = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])
    digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()
    if rank == 0:
        out = Path(args.out)
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(f"digest={digest} steps={args.steps}\n")
        os.replace(tmp, out)
        print(
            f"CHAOS-DONE digest={digest} steps={args.steps} seconds={time.time() - STARTED:.1f}", flush=True
        )
    state("done", args.steps)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
