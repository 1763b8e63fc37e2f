"""One rank of the job stops (SIGSTOP) or dies (SIGKILL) in the middle of a loop of collectives;
every other rank must raise zcoll.TimeoutError (RankLostError for a dead rank) naming it.

Not on the result protocol of tests/harness.py: that protocol has every rank agree at the end of
each case, and here one rank never does. Each rank prints instead:

    ZCOLL-PID rank=R pid=P                           at start (for the no-process-left check)
    ZCOLL-VICTIM rank=R signal=STOP|KILL|EXIT|RAISE t=T   just before the victim fails
    ZCOLL-RAISED rank=R type=NAME t=T missing=[..] lost=[..] seq=N
    ZCOLL-MESSAGE rank=R <the exception's message>

(the last two also to $ZCOLL_TEST_REPORTS/rank-R.txt when that is set)

then sleeps `--linger` seconds (so that every survivor prints before the launcher tears the job
down), and exits with status 3 without finalising MPI (MPI_Finalize would wait for the lost rank).

    mpirun -n 4 python lose_rank.py --signal STOP --algorithm ring --timeout 3
    mpirun -n 4 python lose_rank.py --ddp ...        # the same through a DDP training loop
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import numpy as np


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--signal", choices=["STOP", "KILL", "EXIT", "RAISE"], default="STOP",
                   help="EXIT: the victim's process ends (os._exit(1)) without a signal; RAISE: an exception "
                        "escapes the victim's script (its process exits as Python does)")
    p.add_argument("--algorithm", default="ring")
    p.add_argument("--timeout", type=float, default=3.0)
    p.add_argument("--victim", type=int, default=-1, help="rank that signals itself (default: the last)")
    p.add_argument("--after", type=int, default=20, help="collectives completed before the victim stops")
    p.add_argument("--count", type=int, default=1024, help="float32 elements per allreduce (4 KiB)")
    p.add_argument("--linger", type=float, default=2.0)
    p.add_argument("--ddp", action="store_true", help="a DDP training loop instead of bare allreduces")
    p.add_argument("--work-wait", action="store_true",
                   help="async dist.all_reduce and work.wait(timeout=--timeout), the group's timeout 600 s")
    return p.parse_args()


def report(rank: int, e: BaseException) -> None:
    import zcoll

    name = type(e).__name__
    if not isinstance(e, zcoll.TimeoutError):
        # DDP passes the worker's error on as a RuntimeError quoting it
        name = f"{name}[{'zcoll.TimeoutError' if 'zcoll:' in str(e) else 'other'}]"
    missing = list(getattr(e, "missing", ()))
    lost = list(getattr(e, "lost", ()))
    seq = getattr(e, "seq", None)
    lines = (f"ZCOLL-RAISED rank={rank} type={name} t={time.time():.3f} missing={missing} lost={lost} seq={seq}\n"
             f"ZCOLL-MESSAGE rank={rank} {' '.join(str(e).split())}\n")
    print(lines, end="", flush=True)
    # the launcher merges the ranks' output in chunks: a message longer than a pipe's atomic
    # write can come out with another rank's line inside it, so the test reads a file too
    where = os.environ.get("ZCOLL_TEST_REPORTS")
    if where:
        with open(os.path.join(where, f"rank-{rank}.txt"), "w") as f:
            f.write(lines)


def victim_step(args: argparse.Namespace, rank: int, victim: int, step: int) -> None:
    if rank == victim and step == args.after:
        print(f"ZCOLL-VICTIM rank={rank} signal={args.signal} t={time.time():.3f}", flush=True)
        if args.signal == "EXIT":
            os._exit(1)
        if args.signal == "RAISE":
            raise RuntimeError(f"lose_rank.py: a deliberate error on rank {rank}")
        os.kill(os.getpid(), getattr(signal, f"SIG{args.signal}"))


def allreduce_loop(args: argparse.Namespace) -> None:
    import zcoll

    comm = zcoll.Communicator(timeout=args.timeout)
    rank, victim = comm.rank, args.victim % comm.size
    print(f"ZCOLL-PID rank={rank} pid={os.getpid()}", flush=True)
    x = np.ones(args.count, np.float32)
    try:
        for step in range(10 * args.after + 100):
            victim_step(args, rank, victim, step)
            comm.allreduce(x, algorithm=args.algorithm, out=x)
            x.fill(1.0)
    except zcoll.TimeoutError as e:
        report(rank, e)
        try:
            comm.allreduce(x, algorithm=args.algorithm)
        except zcoll.BrokenError as again:
            print(f"ZCOLL-BROKEN rank={rank} {type(again).__name__}", flush=True)
        finish(args, 3)
    print(f"ZCOLL-NOT-RAISED rank={rank}", flush=True)
    finish(args, 4)


def ddp_loop(args: argparse.Namespace) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    import zcoll.torch  # noqa: F401  (registers the backend)

    dist.init_process_group("zcoll", timeout=datetime.timedelta(seconds=args.timeout))
    rank, victim = dist.get_rank(), args.victim % dist.get_world_size()
    print(f"ZCOLL-PID rank={rank} pid={os.getpid()}", flush=True)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(32, 64)
    try:
        for step in range(10 * args.after + 100):
            victim_step(args, rank, victim, step)
            opt.zero_grad()
            model(data).square().mean().backward()
            opt.step()
    except Exception as e:  # DDP raises the hook's failure as a RuntimeError quoting it
        if rank == victim:
            raise  # the victim's own error (--signal RAISE), uncaught
        report(rank, e)
        finish(args, 3)
    print(f"ZCOLL-NOT-RAISED rank={rank}", flush=True)
    finish(args, 4)


def work_wait_loop(args: argparse.Namespace) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    import zcoll
    import zcoll.torch  # noqa: F401  (registers the backend)

    dist.init_process_group("zcoll", timeout=datetime.timedelta(seconds=600))
    rank, victim = dist.get_rank(), args.victim % dist.get_world_size()
    print(f"ZCOLL-PID rank={rank} pid={os.getpid()}", flush=True)
    t = torch.ones(args.count)
    try:
        for step in range(10 * args.after + 100):
            victim_step(args, rank, victim, step)
            work = dist.all_reduce(t, async_op=True)
            work.wait(timeout=datetime.timedelta(seconds=args.timeout))
    except zcoll.TimeoutError as e:
        report(rank, e)
        finish(args, 3)
    print(f"ZCOLL-NOT-RAISED rank={rank}", flush=True)
    finish(args, 4)


def finish(args: argparse.Namespace, status: int) -> None:
    sys.stdout.flush()
    time.sleep(args.linger)
    os._exit(status)


if __name__ == "__main__":
    a = parse()
    if a.ddp:
        ddp_loop(a)
    elif a.work_wait:
        work_wait_loop(a)
    else:
        allreduce_loop(a)
