"""zcoll.torch.elastic.ElasticLoop under `mpirun --with-ft ulfm` (Open MPI): a DDP model trains
on a fixed regression task; rank --victim is SIGKILLed at step --after; the survivors recover in
place and finish. Run by tests/torch/test_elastic.py. Each survivor prints

    ZCOLL-VICTIM rank=R t=T
    ZCOLL-RECOVERED rank=R lost=1 world=4,3 resumed=S accumulation=A seconds=X t=T
    ZCOLL-FINAL rank=R steps=N loss0=L loss=L digest=H      the parameters' digest (equal on every survivor)
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--victim", type=int, default=2)
    p.add_argument("--after", type=int, default=6)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--timeout", type=float, default=5.0)
    args = p.parse_args()
    zcoll.torch.init_process_group(timeout=datetime.timedelta(seconds=args.timeout))
    rank0 = dist.get_rank()
    torch.manual_seed(0)
    net = torch.nn.Linear(16, 1)
    w_true = torch.arange(16, dtype=torch.float32) / 16
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    loop = ElasticLoop(net, opt, wrap=lambda m, g: DDP(m, process_group=g), policy="accumulate")

    def batch(step: int, k: int) -> tuple:
        g = torch.Generator().manual_seed(1000 * step + 100 * dist.get_rank() + k)
        x = torch.randn(32, 16, generator=g)
        return x, x @ w_true

    def loss_of(model) -> float:
        x, y = batch(99999, 0)
        with torch.no_grad():
            return float(((model(x).squeeze(1) - y) ** 2).mean())

    def step_fn(step: int, model) -> None:
        if rank0 == args.victim and step == args.after:
            print(f"ZCOLL-VICTIM rank={rank0} t={time.time():.3f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        opt.zero_grad()
        for k in range(loop.accumulation):
            x, y = batch(step, k)
            (((model(x).squeeze(1) - y) ** 2).mean() / loop.accumulation).backward()
        opt.step()

    loss0 = loss_of(net)
    loop.run(step_fn, args.steps)
    for r in loop.recoveries:
        print(
            f"ZCOLL-RECOVERED rank={rank0} lost={','.join(map(str, r['lost']))} world={r['world'][0]},{r['world'][1]} "
            f"resumed={r['resumed_at']} accumulation={r['accumulation']} seconds={r['seconds']:.3f} "
            f"t={time.time():.3f}",
            flush=True,
        )
    digest = hashlib.sha1(b"".join(t.detach().numpy().tobytes() for t in net.parameters())).hexdigest()[:16]
    print(
        f"ZCOLL-FINAL rank={rank0} steps={loop.step} loss0={loss0:.5f} loss={loss_of(net):.5f} digest={digest}",
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
