"""zcoll monitor's publisher under DDP on the zcoll backend (zcoll.observe.live.LiveMonitor on a
DDP model, stepped by the optimizer's hook): the telemetry windows go through the group's ordered
worker, the training's results stay bit for bit what they are without the monitor, and with the
step profiler running the published steps carry compute, exposed communication and overlap.
Run: PYTHONPATH=tests mpirun -n 2 python -m mpi4py tests/torch_mpi/monitor_ddp.py --url=URL
"""

import tempfile

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
STEPS = 40
PROFILED = 25  # the steps under the first profiler; the second takes the rest


def train(monitor: bool, profiled: tuple = ()):
    """profiled: (first, end) ranges of steps, each under a step profiler of its own."""
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.Tanh(), torch.nn.Linear(256, 4)),
                bucket_cap_mb=0.01)  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # A window at about every step (window=1 ms), so that a verdict is confirmed within the 40
    # steps however fast they run: with the default 0.25 s an idle machine ran them in 2-3 windows.
    mon = LiveMonitor(model, URL, period=0.05, window=0.001, first_window=2) if monitor else None
    if mon is not None:
        mon.attach(opt)
    g = torch.Generator().manual_seed(R)
    starts, ends = {first for first, _ in profiled}, {end for _, end in profiled}
    prof = None
    for step in range(STEPS):
        if step in starts:
            prof = zcoll.torch.profile(
                model, tempfile.mkdtemp(), optimizer=opt, calibrate=False, probe_bytes=0
            )
            prof.__enter__()
        x, y = torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if step + 1 in ends:
            prof.__exit__(None, None, None)
    if mon is not None:
        mon.close()
    return [p.detach().clone() for p in model.parameters()], mon


def case_results_unchanged(ck: Checks):
    plain, _ = train(False)
    watched, mon = train(True)
    ck.check(
        all(torch.equal(a, b) for a, b in zip(plain, watched)),
        "same parameters",
        "the monitor changed training",
    )
    ck.check(
        mon.steps == STEPS and mon.verdict is not None, "windows", f"steps {mon.steps}, verdict {mon.verdict}"
    )
    ck.check(
        mon.links is not None and len(mon.links["bandwidth"]) == dist.get_world_size(),
        "links",
        str(mon.links),
    )


def case_profiled_steps_have_parts(ck: Checks):
    """Two profilers, one after the other: the monitor publishes the steps of both."""
    _, mon = train(True, profiled=((0, PROFILED), (PROFILED, STEPS)))
    ck.check(mon.steps == STEPS, "steps", str(mon.steps))
    if URL.endswith(":9"):
        ck.check(mon.publisher.sent == 0, "nothing sent to a missing monitor", str(mon.publisher.sent))


if __name__ == "__main__":
    run_cases(globals(), teardown=dist.destroy_process_group)
