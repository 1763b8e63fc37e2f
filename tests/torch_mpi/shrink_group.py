"""torch.distributed.shrink_group on the zcoll backend; run by tests/torch/test_shrink_group.py.

--mode checks (any engine, 3 ranks): torch's own validation messages for bad input on a healthy
  default group (not a list, empty, out of range, duplicates, every rank, a call from an excluded
  rank), then ranks 0 and 1 shrink the default group to themselves while rank 2, alive, is left
  out (it never calls); all_reduce on the new group sums ranks 0 and 1 only.
--mode kill (Open MPI under `mpirun --with-ft ulfm`, 4 ranks): rank --victim is SIGKILLed in a
  loop of all_reduce; the survivors catch the error, shrink_group([victim]) and go on.

Not on the result protocol of tests/harness.py (ranks leave the job). Each rank prints

    ZCOLL-CHECK rank=R name=NAME ok=0|1 [what]
    ZCOLL-VICTIM rank=R t=T
    ZCOLL-RAISED rank=R t=T type=NAME zcoll=0|1
    ZCOLL-SHRUNK rank=R new_rank=Q size=N t=T
    ZCOLL-DONE rank=R
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import torch
import torch.distributed as dist
import zcoll
import zcoll.torch

RANK0 = [0]  # this process's rank in the first default group (ranks change with a shrink)


def say(line: str) -> None:
    print(line, flush=True)


def check(name: str, ok: bool, what: str = "") -> None:
    line = f"ZCOLL-CHECK rank={RANK0[0]} name={name} ok={int(bool(ok))} {' '.join(what.split())}"
    say(line)
    # the launcher can put another rank's output inside a line: the test reads a file per rank too
    where = os.environ.get("ZCOLL_TEST_REPORTS")
    if where:
        with open(os.path.join(where, f"rank-{RANK0[0]}.txt"), "a") as f:
            f.write(line + "\n")


def raises(name: str, kind: type, words: str, fn) -> None:
    try:
        fn()
    except kind as e:
        check(name, words in str(e), f"{type(e).__name__}: {e}")
        return
    except Exception as e:  # noqa: BLE001 - reported as the check's failure
        check(name, False, f"raised {type(e).__name__}: {e}")
        return
    check(name, False, "did not raise")


def bad_input_then_leave_one_out() -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    raises("not_a_list", TypeError, "ranks_to_exclude must be a list", lambda: dist.shrink_group(2))
    raises("empty", ValueError, "ranks_to_exclude cannot be empty", lambda: dist.shrink_group([]))
    raises(
        "out_of_range", ValueError, f"out of bounds for group size {size}", lambda: dist.shrink_group([size])
    )
    raises("duplicate", ValueError, "Duplicate rank 1", lambda: dist.shrink_group([1, 1]))
    raises(
        "everyone",
        ValueError,
        f"Cannot exclude all {size} ranks",
        lambda: dist.shrink_group(list(range(size))),
    )
    raises(
        "excluded_caller",
        RuntimeError,
        f"Current rank {rank} is in the exclusion list",
        lambda: dist.shrink_group([rank]),
    )
    raises("bad_flags", ValueError, "Invalid shrink_flags", lambda: dist.shrink_group([2], shrink_flags=7))
    t = torch.ones(4)
    dist.all_reduce(t)  # the group is still whole and working after the refusals
    check("still_whole", bool(torch.all(t == size)), str(t.tolist()))
    if rank == size - 1:
        return  # left out: it never calls shrink_group
    group = dist.shrink_group([size - 1])
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    want = sum(r + 1 for r in range(size - 1))
    check(
        "left_out_alive",
        group.size() == size - 1 and dist.get_world_size() == size - 1 and bool(torch.all(t == want)),
        f"size {group.size()} sum {t[0].item()} want {want}",
    )
    check("is_zcoll", dist.get_backend() == "zcoll" and group.rank() == rank, dist.get_backend())


def kill_and_shrink(victim: int, after: int, steps: int) -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    x = torch.full((4096,), float(rank + 1))
    step = 0
    while step < steps:
        if rank == victim and step == after:
            say(f"ZCOLL-VICTIM rank={rank} t={time.time():.3f}")
            os.kill(os.getpid(), signal.SIGKILL)
        t = x.clone()
        try:
            dist.all_reduce(t)
        except Exception as e:  # noqa: BLE001 - zcoll.TimeoutError, or torch's error quoting it
            say(
                f"ZCOLL-RAISED rank={rank} t={time.time():.3f} type={type(e).__name__} zcoll={int('zcoll' in str(e))}"
            )
            group = dist.shrink_group([victim])
            say(f"ZCOLL-SHRUNK rank={rank} new_rank={group.rank()} size={group.size()} t={time.time():.3f}")
            continue  # the step again, on the survivors
        want = (
            sum(r + 1 for r in range(size))
            if dist.get_world_size() == size
            else (sum(r + 1 for r in range(size) if r != victim))
        )
        check(f"step{step}", bool(torch.all(t == want)), f"{t[0].item()} want {want}")
        step += 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["checks", "kill"], default="checks")
    p.add_argument("--victim", type=int, default=1)
    p.add_argument("--after", type=int, default=5)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--timeout", type=float, default=5.0)
    args = p.parse_args()
    import datetime

    zcoll.torch.init_process_group(timeout=datetime.timedelta(seconds=args.timeout))
    rank = RANK0[0] = dist.get_rank()
    if args.mode == "checks":
        bad_input_then_leave_one_out()
    else:
        kill_and_shrink(args.victim, args.after, args.steps)
    say(f"ZCOLL-DONE rank={rank}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
