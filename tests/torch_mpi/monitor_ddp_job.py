"""A DDP job on the zcoll backend that publishes to `zcoll monitor` until told to stop: the DDP
variant of tests/mpi/monitor_job.py, for bench/monitor_testbed.py inject --job ddp.

    mpirun -n 2 python -m mpi4py monitor_ddp_job.py --url=http://HOST:PORT [--token=T] [--steps=60]
        [--period=0.5] [--window=0.25] [--stop-file=PATH] publish

Every rank trains an MLP (256-512-256-10: about 1 MiB of gradients, so a step's allreduce weighs
what monitor_job's does) under DDP with a LiveMonitor on the optimizer's step hook: the telemetry
windows go through the group's ordered worker, the publisher thread posts the snapshots. The
ranks agree on the step to stop at through one small allreduce per step (a rank that saw
PATH counts), so no rank calls a collective the others skip. The case checks that the job
published and that every rank ends with the same parameters.
"""

import os
import time

from harness import Checks, option, run_cases

# isort: split
import torch
import torch.distributed as dist
import torch.nn.functional as F
import zcoll.torch
from torch.nn.parallel import DistributedDataParallel as DDP
from zcoll.observe.live import LiveMonitor

zcoll.torch.init_process_group()
R = dist.get_rank()
URL = option("url", "http://127.0.0.1:9")
TOKEN = option("token")
STEPS = int(option("steps", "60"))
PERIOD = float(option("period", "0.5"))
WINDOW = float(option("window", "0.25"))
STOP_FILE = option("stop-file")


def case_publish(ck: Checks):
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256),
                                    torch.nn.ReLU(), torch.nn.Linear(256, 10)))  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = LiveMonitor(
        model, URL, period=PERIOD, window=WINDOW, token=TOKEN, labels={"model": "monitor_ddp_job"}
    )
    mon.attach(opt)
    g = torch.Generator().manual_seed(R)
    start, steps = time.perf_counter(), 0
    for _ in range(STEPS):
        x, y = torch.randn(32, 256, generator=g), torch.randint(0, 10, (32,), generator=g)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        steps += 1
        stop = torch.tensor([1.0 if STOP_FILE and os.path.exists(STOP_FILE) else 0.0])
        dist.all_reduce(stop)
        if stop.item() > 0:
            break
    took = time.perf_counter() - start
    mon.close()
    ck.check(
        mon.publisher.sent >= 3 and mon.publisher.failed == 0,
        "published",
        f"sent {mon.publisher.sent}, failed {mon.publisher.failed}, dropped {mon.publisher.dropped}",
    )
    first = torch.cat([p.detach().flatten()[:64] for p in model.parameters()])
    ck.same_on_all_ranks("parameters", first.numpy().tobytes())
    if R == 0:
        print(f"MONITOR-JOB run={mon.run} steps={steps} seconds={took:.3f}", flush=True)


if __name__ == "__main__":
    run_cases(globals(), teardown=dist.destroy_process_group)
