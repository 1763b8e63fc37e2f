"""A rank is SIGKILLed in the middle of a loop of steps; the survivors shrink the communicator
(zcoll.Communicator.shrink, Open MPI with ULFM), roll back to the last step every survivor
completed, and go on to the end. Run by tests/core/test_shrink.py under
`mpirun --with-ft ulfm` of the Open MPI environment.

A step adds the allreduce (sum) of each rank's x = rank + 1 (its rank in the first communicator)
to a state vector: small integers, exact in any order, so the final state is known in closed
form: ZCOLL-STATE prints it with the value expected from the step the survivors resumed at.
Afterwards, on the survivors' communicator, every algorithm reduces inputs that depend on the new
rank and the index (normal draws: the bits depend on the order of summation) and prints a digest
per (algorithm, count); with --fresh the job has no victim and starts on a fresh communicator, so
a test compares the digests of the shrunk job with those of a fresh job of the survivors.

Not on the result protocol of tests/harness.py (one rank never reaches its end). Each rank prints

    ZCOLL-PID rank=R pid=P
    ZCOLL-VICTIM rank=R t=T step=S               the victim, just before SIGKILL in (or before) step S
    ZCOLL-RAISED rank=R type=NAME t=T step=S     a survivor's failed step
    ZCOLL-SHRUNK rank=R new_rank=Q size=N kept=0,2,.. lost=1,.. t=T shrink_s=S
    ZCOLL-RESUMED rank=R step=S t=T              the step every survivor goes on from
    ZCOLL-STATE rank=R ok=0|1 got=G want=W       the final state and its closed form
    ZCOLL-DIGEST rank=R algorithm=A count=C sha=H
    ZCOLL-DONE rank=R

    mpirun --with-ft ulfm --oversubscribe -n 4 python shrink_recovery.py --victim 1
    mpirun --oversubscribe -n 3 python shrink_recovery.py --fresh
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import threading
import time

import numpy as np

ALGORITHMS = ("ring", "tree", "recursive_doubling", "halving_doubling", "shm", "auto", "mpi")
COUNTS = (1, 7, 1000, 65537)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--victim", type=int, default=-1, help="the rank that is killed (default: the last)")
    p.add_argument("--after", type=int, default=10, help="steps completed before the victim dies")
    p.add_argument("--steps", type=int, default=30, help="steps in all")
    p.add_argument("--count", type=int, default=4096, help="float32 elements of the state")
    p.add_argument("--algorithm", default="ring", help="the steps' allreduce algorithm")
    p.add_argument("--timeout", type=float, default=5.0, help="the communicator's deadline, seconds")
    p.add_argument(
        "--mid-call",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="the victim dies this fraction of its mean step time after entering its step (inside the "
        "collective) instead of before it",
    )
    p.add_argument(
        "--fresh", action="store_true", help="no victim: only the digests, on a fresh communicator"
    )
    return p.parse_args()


def say(line: str) -> None:
    print(line, flush=True)


def digests(comm, rank0: int) -> None:
    """Each algorithm on inputs f(new rank, index); one line per (algorithm, count)."""
    for count in COUNTS:
        x = np.random.default_rng(1000 * comm.rank + count).standard_normal(count).astype(np.float32)
        for algorithm in ALGORITHMS:
            y = comm.allreduce(x, algorithm=algorithm)
            sha = hashlib.sha1(y.tobytes()).hexdigest()[:16]
            say(f"ZCOLL-DIGEST rank={rank0} algorithm={algorithm} count={count} sha={sha}")


def kill_me(rank: int, delay: float, progress: list) -> None:
    """SIGKILL after `delay` seconds (from a timer thread), naming the step the main thread is in
    then (progress[0]): a call can end sooner than its mean, so the step is read, not assumed."""

    def die() -> None:
        say(f"ZCOLL-VICTIM rank={rank} t={time.time():.3f} step={progress[0]}")
        os.kill(os.getpid(), signal.SIGKILL)

    if delay > 0:
        threading.Timer(delay, die).start()
    else:
        die()


def train(args: argparse.Namespace) -> None:
    import zcoll

    comm = zcoll.Communicator(timeout=args.timeout)
    rank0, n0 = comm.rank, comm.size
    say(f"ZCOLL-PID rank={rank0} pid={os.getpid()}")
    victim = args.victim % n0
    x = np.full(args.count, rank0 + 1, np.float32)
    state = np.zeros(args.count, np.float32)
    kept_states = {0: state.copy()}  # the state after each completed step, kept in memory
    step, resumed = 0, args.steps
    progress, took = [0], []  # the step the loop is in; each call's seconds
    while step < args.steps:
        progress[0] = step
        if rank0 == victim and step == args.after:
            kill_me(rank0, args.mid_call * sum(took) / max(1, len(took)), progress)
        try:
            start = time.perf_counter()
            total = comm.allreduce(x, algorithm=args.algorithm)
            took.append(time.perf_counter() - start)
        except zcoll.TimeoutError as e:
            say(f"ZCOLL-RAISED rank={rank0} type={type(e).__name__} t={time.time():.3f} step={step}")
            comm = comm.shrink()
            info = comm.shrunk_from
            kept, lost = (",".join(map(str, info[k])) for k in ("kept", "lost"))
            say(
                f"ZCOLL-SHRUNK rank={rank0} new_rank={comm.rank} size={comm.size} kept={kept} lost={lost} "
                f"t={time.time():.3f} shrink_s={info['seconds']:.6f}"
            )
            # the last step every survivor completed; those ahead of it roll back to it
            step = resumed = int(comm.allreduce(np.array([step], np.int64), op="min")[0])
            state = kept_states[step].copy()
            say(f"ZCOLL-RESUMED rank={rank0} step={step} t={time.time():.3f}")
            continue
        state += total
        step += 1
        kept_states[step] = state.copy()
        kept_states.pop(step - 2, None)
    # the closed form: each step before the loss added the sum over every rank, each after it the
    # sum over the survivors
    kept = comm.shrunk_from["kept"] if comm.shrunk_from else list(range(n0))
    want = resumed * (n0 * (n0 + 1) // 2) + (args.steps - resumed) * sum(r + 1 for r in kept)
    ok = bool(np.all(state == want))
    say(f"ZCOLL-STATE rank={rank0} ok={int(ok)} got={float(state[0]):.0f} want={want}")
    digests(comm, rank0)
    comm.free()
    say(f"ZCOLL-DONE rank={rank0}")


def fresh(args: argparse.Namespace) -> None:
    import zcoll

    comm = zcoll.Communicator(timeout=args.timeout)
    say(f"ZCOLL-PID rank={comm.rank} pid={os.getpid()}")
    rank = comm.rank
    digests(comm, rank)
    comm.free()
    say(f"ZCOLL-DONE rank={rank}")


if __name__ == "__main__":
    a = parse()
    fresh(a) if a.fresh else train(a)
