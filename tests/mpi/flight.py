"""The flight recorder at any world size >= 2: dumps on failure, on zcoll.dump() and on SIGUSR1,
and `zcoll report` saying where the ranks diverged (ranks made to diverge on purpose).

    ZCOLL_DUMP_DIR=DIR PYTHONPATH=tests mpirun -n P python -m mpi4py tests/mpi/flight.py [case ...]

Each case uses its own communicator (with a short timeout), so the report has one block per
communicator and the cases do not see each other's records.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time


from harness import WORLD, Checks, run_cases

# isort: split
import numpy as np
import zcoll

TIMEOUT = 1.0
LAST = WORLD.size - 1


def report_block(comm_id: str) -> str:
    """`zcoll report` on the dump directory (run on rank 0), the lines of this communicator."""
    WORLD.Barrier()
    text = ""
    if WORLD.rank == 0:
        out = subprocess.run([sys.executable, "-m", "zcoll", "report", zcoll._C.dump_directory()],
                             capture_output=True, text=True, timeout=60)
        text = out.stdout + out.stderr
    text = WORLD.bcast(text)
    block, inside = [], False
    for line in text.splitlines():
        if line.startswith("communicator "):
            inside = line.startswith(f"communicator {comm_id}:")
        if inside:
            block.append(line)
    return "\n".join(block)


def case_a_rank_that_skips_a_call(ck: Checks):
    """The last rank skips allreduce #4: the others time out there; the report says the last
    rank never entered #4 and that the others' waits lead to it."""
    comm = zcoll.Communicator(timeout=TIMEOUT)
    x = np.ones(256, np.float32)
    for _ in range(3):
        comm.allreduce(x, out=x)
    if comm.rank != LAST:
        e = ck.raises(zcoll.TimeoutError, lambda: comm.allreduce(x, out=x), "allreduce #4", f"rank {LAST}")
        ck.check(e is not None and e.dump_path and os.path.exists(e.dump_path), "the failure dumped",
                 f"dump_path {getattr(e, 'dump_path', None)}")
        if e is not None and e.dump_path:
            with open(e.dump_path) as f:
                d = json.load(f)
            last = d["calls"][-1]
            ck.check((last["seq"], last["collective"], last["state"]) == (4, "allreduce", "in_progress"),
                     "the dump's last record is the failing call, in progress", str(last))
            ck.check(d["comm"] == comm.id and d["rank"] == comm.rank and d["size"] == comm.size, "dump header",
                     str({k: d[k] for k in ("comm", "rank", "size")}))
    else:
        time.sleep(TIMEOUT + 1.5)  # away until the others have failed
        paths = zcoll.dump()
        ck.check(any(comm.id in p for p in paths), "zcoll.dump() wrote this communicator", str(paths))
    block = report_block(comm.id)
    others = "ranks 0-%d" % (LAST - 1) if LAST > 1 else "rank 0"
    ck.check(f"{others} {'are' if LAST > 1 else 'is'} in allreduce #4" in block, "others in allreduce #4", block)
    ck.check(f"rank {LAST} is in allreduce #3 (done)" in block, "the last rank's frontier", block)
    ck.check(f"rank {LAST} never entered #4" in block, "names the rank that never came", block)
    ck.check(f"the waits lead to rank {LAST}" in block, "the wait chain", block)
    ck.check("MISMATCH" not in block, "no mismatch: a missing call is no different call", block)
    comm.free()


def case_ranks_that_call_different_collectives(ck: Checks):
    """At #3 the last rank broadcasts while the others allreduce: the report names the first
    call the ranks made differently."""
    comm = zcoll.Communicator(timeout=TIMEOUT)
    x = np.ones(256, np.float32)
    for _ in range(2):
        comm.allreduce(x, out=x)
    try:
        if comm.rank == LAST:
            comm.broadcast(x, root=0)
        else:
            comm.allreduce(x, out=x)
    except zcoll.TimeoutError:
        pass
    time.sleep(0.5)
    zcoll.dump()
    block = report_block(comm.id)
    ck.check("MISMATCH: the ranks made different calls at #3" in block, "mismatch at #3", block)
    ck.check(f"rank {LAST} called broadcast #3" in block, "names the broadcast", block)
    comm.free()


def case_sigusr1_dumps_every_communicator(ck: Checks):
    """SIGUSR1 makes the process dump every live communicator (a thread of zcoll's writes)."""
    comm = zcoll.Communicator()
    x = np.ones(16, np.float32)
    comm.allreduce(x, out=x)
    path = os.path.join(zcoll._C.dump_directory(), f"zcoll-flight-{comm.id}-rank{comm.rank}.json")
    if os.path.exists(path):
        os.remove(path)
    os.kill(os.getpid(), signal.SIGUSR1)
    end = time.monotonic() + 10
    while not os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.02)
    ok = os.path.exists(path)
    ck.check(ok, "SIGUSR1 wrote the dump", path)
    if ok:
        with open(path) as f:
            d = json.load(f)
        ck.check(d["reason"] == "SIGUSR1" and d["calls"][-1]["state"] == "done", "reason and record",
                 str(d["reason"]))
    comm.barrier()
    comm.free()


if __name__ == "__main__":
    run_cases(globals())
