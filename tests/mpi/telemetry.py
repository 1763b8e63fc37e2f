"""Link telemetry through comm.link_stats() and comm.diagnose() at any world size >= 2.

    PYTHONPATH=tests mpirun -n P python -m mpi4py tests/mpi/telemetry.py [case ...]
"""

from __future__ import annotations

import time


from harness import Checks, run_cases

# isort: split
import numpy as np
import zcoll

comm = zcoll.Communicator()
P, RANK = comm.size, comm.rank
CALLS = 6
COUNT = 20000  # float32 elements: 2(p-1) ring steps of COUNT/p


def ring_calls(n=CALLS):
    x = np.ones(COUNT, np.float32)
    for _ in range(n):
        comm.allreduce(x, algorithm="ring", out=x)


def case_link_stats_count_a_ring(ck: Checks):
    comm.link_stats(reset=True)
    ring_calls()
    s = comm.link_stats(reset=True)
    ck.check(s.calls == CALLS, "calls in the window", f"{s.calls}")
    # a ring allreduce: 2(p-1) steps in which every rank sends one of p chunks of COUNT floats
    ck.check(s.bytes.sum() == CALLS * 2 * (P - 1) * COUNT * 4, "bytes on the wire", f"{s.bytes.sum()}")
    ring = np.zeros((P, P), bool)
    for i in range(P):
        ring[i, (i + 1) % P] = True
    ck.check(bool(np.all(s.bytes[~ring] == 0)) and bool(np.all(s.bytes[ring] > 0)), "only ring links carry bytes",
             f"{s.bytes}")
    ck.check(bool(np.all(np.isfinite(s.busy[ring]))) and bool(np.all(s.busy[ring] > 0)), "busy time on ring links",
             f"{s.busy}")
    ck.check(bool(np.all(s.gbps[ring] > 0)), "GB/s on ring links", f"{s.gbps}")
    ck.check(bool(np.all(s.arrival_delay >= 0)) and float(np.min(s.arrival_delay)) == 0.0, "arrival delays",
             f"{s.arrival_delay}")
    ck.check(bool(np.all(s.call_seconds > 0)), "time in calls", f"{s.call_seconds}")
    ck.same_on_all_ranks("gathered alike", s.bytes.tobytes() + s.busy.tobytes() + s.arrival_delay.tobytes())


def case_reset_and_off(ck: Checks):
    comm.link_stats(reset=True)
    s = comm.link_stats()
    ck.check(s.calls == 0 and s.bytes.sum() == 0, "nothing since the reset", f"{s.calls} {s.bytes.sum()}")
    comm.telemetry = False
    ring_calls(2)
    comm.telemetry = True
    s = comm.link_stats(reset=True)
    ck.check(s.calls == 0 and s.bytes.sum() == 0, "nothing timed while off", f"{s.calls} {s.bytes.sum()}")


def case_a_late_rank_is_diagnosed(ck: Checks):
    """The last rank sleeps before every collective (ten times the time of one): after two
    windows every rank's verdict names it."""
    comm.link_stats(reset=True)
    x = np.ones(256, np.float32)
    verdict = None
    for _ in range(3):
        for _ in range(8):
            if RANK == P - 1:
                time.sleep(0.02)
            comm.allreduce(x, algorithm="ring", out=x)
        verdict = comm.diagnose()
    ck.check((verdict.label, verdict.rank) == ("slow rank", P - 1), "slow rank named", str(verdict))
    ck.same_on_all_ranks("the same verdict", str((verdict.label, verdict.rank)).encode())


if __name__ == "__main__":
    run_cases(globals(), teardown=comm.free)
