"""A small DDP training run on the zcoll backend that checkpoints and resumes, for torchrun's
elastic restart: with --kill-at=STEP, rank 1 of the first attempt (TORCHELASTIC_RESTART_COUNT=0)
kills itself with SIGKILL at that step; torchrun (--max-restarts >= 1) restarts every worker, the
group forms again, and training continues from the latest checkpoint. Rank 0 prints

    ZCOLL-ELASTIC attempt=<restart count> start=<step resumed from> steps=<n> digest=<sha256 of the weights>

so a restarted run can be compared with one that was never interrupted (the resume is bit-exact).

Run: torchrun --standalone --nproc-per-node 2 --max-restarts 1 tests/torch_mpi/elastic_train.py \
         --ckpt=/tmp/ck --steps=40 --kill-at=23
"""

import hashlib
import os
import signal
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from zcoll.torch import checkpoint  # (importing zcoll.torch registers the backend)

ARGS = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
STEPS, KILL_AT, EVERY = int(ARGS.get("steps", "40")), int(ARGS.get("kill-at", "-1")), 5
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

dist.init_process_group("zcoll", timeout=timedelta(seconds=60))
rank, size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def batch(step: int):
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(32, 16, generator=g)
    return x, x.sum(1, keepdim=True).sin()


def loss_at(step: int):
    x, y = batch(step)
    return torch.nn.functional.mse_loss(model(x), y)


resumed = checkpoint.load(
    ARGS["ckpt"], model=model, optimizer=opt, rebuild_buckets=lambda: loss_at(0).backward()
)
start = resumed.data_position if resumed else 0
for step in range(start, STEPS):
    if ATTEMPT == 0 and rank == 1 and step == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)
    opt.zero_grad()
    loss_at(step).backward()
    opt.step()
    if (step + 1) % EVERY == 0:
        checkpoint.save(ARGS["ckpt"], step + 1, model=model, optimizer=opt, data_position=step + 1)
weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
if rank == 0:
    digest = hashlib.sha256(weights).hexdigest()
    print(f"ZCOLL-ELASTIC attempt={ATTEMPT} start={start} steps={STEPS} digest={digest}", flush=True)
dist.destroy_process_group()
