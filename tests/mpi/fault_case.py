"""One case of the failure-path matrix (tests/fault_matrix.py): a loop of one collective in which
one rank, the victim, fails just before call --after; every other rank must raise
zcoll.TimeoutError (RankLostError for a process that is gone) naming it. One mpirun job per case:

    PYTHONPATH=tests mpirun -n 4 python tests/mpi/fault_case.py --method ring --fault stop \\
        --victim 1 --bytes 262144 --timeout 3

--method: an allreduce algorithm (ring, tree, recursive_doubling, halving_doubling, shm,
hierarchical, ordered_ring, auto, mpi), a compression (allreduce with compression=: q8, q4, q1
= GradientQuantizer bits 8 / 4 / 1; fp16, bf16 = HalfPrecision; topk, randomk, threshold), or
another collective (reduce_scatter, allgather, broadcast from root 0). hierarchical needs ranks
on two emulated nodes (ZCOLL_NODE_ID per rank: the runner's launcher sets it).
--fault: stop (SIGSTOP to itself), kill (SIGKILL to itself), just before the call or, with
--when during, half a call's time into it (from a timer thread); raise (a Python exception escapes
the victim's script before the call: its process goes on to exit as any Python program with an
uncaught exception does; docs/errors.md says what the others see).
--bytes: the float32 buffer of one rank (allgather: the gathered result, nccl-tests' S).

Reporting (lose_rank.py's protocol; the runner reads it):

    ZCOLL-PID rank=R pid=P                               at start
    ZCOLL-BUILD rank=R extension=PATH asan=0|1           the zcoll._C it runs, AddressSanitizer loaded
    ZCOLL-VICTIM rank=R signal=STOP|KILL|RAISE t=T        just before the victim fails
    ZCOLL-RAISED rank=R type=NAME t=T missing=[..] lost=[..] seq=N   (also $ZCOLL_TEST_REPORTS/rank-R.txt)
    ZCOLL-MESSAGE rank=R <the exception's message>
    ZCOLL-BROKEN rank=R BrokenError                      the next call raised BrokenError at once

each also in a file of $ZCOLL_TEST_REPORTS when that is set: pid-R.txt, victim.txt, rank-R.txt
(RAISED, MESSAGE, BROKEN).

    ZCOLL-CALLS rank=R completed_after_fault=N since=T started=T   calls done from the failing call
                                                         on, and when the call that raised began
    ZCOLL-NOT-RAISED rank=R t=T                          --run-for passed with every call completed

A survivor that raised anything else reports it the same way (type=<its class>). Afterwards it
sleeps --linger seconds, then (--wait-others) until every other survivor has reported (so that
every survivor reports before the launcher tears the job down) and lets the exception escape: a process ending on a zcoll failure exits with status 75
without MPI_Finalize (zcoll.core.communicator), which also ends the job.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

import numpy as np
from fault_matrix import ALLREDUCE, COMPRESSED, FAULTS, METHODS
from lose_rank import report


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", choices=METHODS, required=True)
    p.add_argument("--fault", choices=FAULTS, required=True)
    p.add_argument("--victim", type=int, required=True)
    p.add_argument("--bytes", type=int, default=4096)
    p.add_argument("--timeout", type=float, default=3.0, help="the communicator's timeout, seconds")
    p.add_argument("--after", type=int, default=3, help="calls completed before the victim fails")
    p.add_argument("--linger", type=float, default=1.5)
    p.add_argument(
        "--run-for",
        type=float,
        default=8.0,
        help="seconds a survivor goes on calling from the victim's failing call on (a training "
        "loop does not stop at one call): one whose calls do not need the victim completes them "
        "until one does, or until this ends (ZCOLL-NOT-RAISED: the runner's miss)",
    )
    p.add_argument(
        "--wait-others",
        type=float,
        default=0.0,
        help="with $ZCOLL_TEST_REPORTS: a survivor that raised stays until every other survivor "
        "has reported, up to this many seconds from the failing call (the runner sets it)",
    )
    p.add_argument(
        "--gap",
        type=float,
        default=0.002,
        help="seconds between calls from the failing call on (a training step's compute; it also "
        "bounds what a rank that runs ahead leaves queued at a blocked one)",
    )
    p.add_argument(
        "--end",
        choices=["raise", "return"],
        default="raise",
        help="how a survivor ends after its report: the error escapes (status 75), or it returns "
        "from the script normally (MPI_Finalize, which zcoll ends after 5 s with status 75 "
        "if a rank cannot finalize)",
    )
    p.add_argument(
        "--when",
        choices=["before", "during"],
        default="before",
        help="during: a stop or kill lands half a call's time into the victim's call (a timer thread)",
    )
    return p.parse_args()


def compressor(method: str):
    from zcoll.compression import GradientQuantizer, HalfPrecision, RandomK, Threshold, TopK

    return {
        "q8": lambda: GradientQuantizer(bits=8),
        "q4": lambda: GradientQuantizer(bits=4),
        "q1": lambda: GradientQuantizer(bits=1),
        "fp16": lambda: HalfPrecision("fp16"),
        "bf16": lambda: HalfPrecision("bf16"),
        "topk": lambda: TopK(ratio=0.01),
        "randomk": lambda: RandomK(ratio=0.01),
        "threshold": lambda: Threshold(1.5),  # about 13% of a standard normal's values
    }[method]()


def ring_topology(p: int) -> np.ndarray:
    """Bandwidths whose best ring is 0, 2, 4, ..., 1, 3, ... (not rank order): fast links along
    it, slow ones elsewhere."""
    order = list(range(0, p, 2)) + list(range(1, p, 2))
    bw = np.full((p, p), 0.2e9)
    for a, b in zip(order, order[1:] + order[:1]):
        bw[a, b] = 1e9
    return bw


def make_call(comm, method: str, nbytes: int):
    """The collective of this case as a function of no arguments, on buffers made here."""
    p, rank = comm.size, comm.rank
    count = max(1, nbytes // 4)
    rng = np.random.default_rng(rank)
    if method in COMPRESSED:
        x = rng.standard_normal(count).astype(np.float32)
        out = np.empty_like(x)
        c = compressor(method)
        return lambda: comm.allreduce(x, out=out, compression=c, key="x")
    if method in ALLREDUCE:
        if method == "ordered_ring":
            comm.set_topology(ring_topology(p))
        x = np.ones(count, np.float32)
        out = np.empty_like(x)
        return lambda: comm.allreduce(x, algorithm=method, out=out)
    if method == "reduce_scatter":
        x = np.ones(count, np.float32)
        return lambda: comm.reduce_scatter(x)
    if method == "allgather":
        x = np.full(max(1, count // p), rank, np.float32)
        out = np.empty((p, x.size), np.float32)
        return lambda: comm.allgather(x, out=out)
    x = np.full(count, rank, np.float32)
    return lambda: comm.broadcast(x, root=0)


def asan_loaded() -> bool:
    with open("/proc/self/maps") as f:
        return "libasan" in f.read()


def note(rank: int, line: str, name: str = "") -> None:
    """A protocol line, on stdout and in $ZCOLL_TEST_REPORTS/<name or rank-R.txt> (appended): the
    launcher merges the ranks' output in chunks, so a line can come out with another inside it."""
    print(line, flush=True)
    where = os.environ.get("ZCOLL_TEST_REPORTS")
    if where:
        with open(os.path.join(where, name or f"rank-{rank}.txt"), "a") as f:
            f.write(line + "\n")


def fail_here(fault: str, rank: int, seq: int) -> None:
    """The victim's fault, just before its call #seq."""
    note(rank, f"ZCOLL-VICTIM rank={rank} signal={fault.upper()} t={time.time():.3f}", "victim.txt")
    if fault == "raise":
        raise RuntimeError(f"fault_case.py: a deliberate error on rank {rank} before call #{seq}")
    os.kill(os.getpid(), signal.SIGSTOP if fault == "stop" else signal.SIGKILL)


def fail_later(delay: float, fault: str, rank: int, seq: int) -> None:
    """The fault half a call's time into the victim's call #seq (--when during)."""
    time.sleep(delay)
    fail_here(fault, rank, seq)


def calls_after(rank: int, step: int, after: int, since: float | None, started: float) -> None:
    """How many calls this rank completed from the victim's failing call on, since when, and
    when its last call (the one that raised) began."""
    done = max(0, step - after)
    note(
        rank,
        f"ZCOLL-CALLS rank={rank} completed_after_fault={done} since={since or 0:.3f} started={started:.3f}",
        f"calls-{rank}.txt",
    )


def wait_for_others(rank: int, victim: int, size: int, since: float | None, args) -> None:
    """Keeps this survivor (and so the job: its exit makes the launcher end the others) until
    every other survivor has reported, for up to --wait-others seconds from the failing call:
    one whose calls did not need the victim raises later, on the first call that does."""
    where = os.environ.get("ZCOLL_TEST_REPORTS")
    if not where or since is None:
        return
    others = [r for r in range(size) if r not in (rank, victim)]

    def reported(r: int) -> bool:
        return any(os.path.exists(os.path.join(where, f"{n}-{r}.txt")) for n in ("calls", "done"))

    while time.time() < since + args.wait_others and not all(reported(r) for r in others):
        time.sleep(0.05)


def main() -> None:
    args = parse()
    import zcoll

    comm = zcoll.Communicator(timeout=args.timeout)
    rank, victim = comm.rank, args.victim % comm.size
    note(rank, f"ZCOLL-PID rank={rank} pid={os.getpid()}", f"pid-{rank}.txt")
    note(rank, f"ZCOLL-BUILD rank={rank} extension={zcoll._C.__file__} asan={int(asan_loaded())}")
    call = make_call(comm, args.method, args.bytes)
    took = []
    since = None  # when this rank began the call the victim fails before
    step, started = 0, 0.0
    try:
        while since is None or time.time() - since < args.run_for:
            if step == args.after:
                since = time.time()
            if rank == victim and step == args.after:
                if args.when == "before" or args.fault == "raise":
                    fail_here(args.fault, rank, step + 1)
                else:
                    delay = 0.5 * sum(took) / max(1, len(took))
                    threading.Thread(
                        target=fail_later, args=(delay, args.fault, rank, step + 1), daemon=True
                    ).start()
            started = time.time()
            start = time.perf_counter()
            call()
            took.append(time.perf_counter() - start)
            step += 1
            if since is not None and args.gap:
                time.sleep(args.gap)
    except Exception as e:
        if rank == victim:
            raise  # the fault itself (raise), uncaught
        report(rank, e)
        calls_after(rank, step, args.after, since, started)
        try:
            call()
        except zcoll.BrokenError as again:
            note(rank, f"ZCOLL-BROKEN rank={rank} {type(again).__name__}")
        except Exception as again:  # noqa: BLE001 - any other error is what the runner reports
            note(rank, f"ZCOLL-NOT-BROKEN rank={rank} {type(again).__name__}")
        sys.stdout.flush()
        time.sleep(args.linger)
        wait_for_others(rank, victim, comm.size, since, args)
        if args.end == "raise":
            raise
        note(rank, f"ZCOLL-RETURNED rank={rank} t={time.time():.3f}")
        return
    calls_after(rank, step, args.after, since, started)
    note(rank, f"ZCOLL-NOT-RAISED rank={rank} t={time.time():.3f}", f"done-{rank}.txt")
    sys.exit(4)


if __name__ == "__main__":
    main()
