"""The zcoll backend under mpirun and under torchrun: one script, its results compared bitwise.

Under torchrun nothing of MPI may start before the process group (zcoll.core.store_launch joins
the workers into one MPI job through torch's store), so the group is created first and the
harness (which imports mpi4py.MPI) after it. Under mpirun, ``python -m mpi4py`` starts MPI first.

Cases (harness protocol); each prints, from rank 0, ``ZCOLL-DIGEST <case> <hex>``: a sha256 over
every rank's results, which tests/torch/test_torchrun.py compares between the two launchers
(collectives also ``ZCOLL-DIGEST collectives/<algorithm> <hex>``, one per algorithm).
  collectives   every algorithm of the group's Communicator (shm too, on one node) on float32
                inputs whose sums round (the reduction order shows in the bits) and on exact
                int32; then reduce_scatter, allgather, broadcast, reduce
  torch_ops     the backend through torch.distributed: all_reduce (sum, avg, max), broadcast,
                reduce, all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single,
                send/recv around a ring, barrier, a subgroup
  nodes         MPI's and zcoll's nodes (--nodes=K expected) and the hierarchical allreduce
Faults (--faults=size,missing,store; torchrun, 2 workers), before the cases: each fault in a store
of its own under the launcher's, every rank done with one before the next; each rank prints
``ZCOLL-ERROR <fault> rank <r> after <s> s: <text>`` when creating the group failed,
``ZCOLL-NOERROR <fault> rank <r>`` when not. Then the group is created as usual and the cases run
(a failed start must leave nothing behind):
  size      the last rank states WORLD_SIZE + 1; every rank must name the mismatch (timeout 30 s)
  missing   rank 1 never creates the group; rank 0 must name it after the timeout (4 s)
  store     rank 0 hosts the store the group meets in, then closes it: rank 1 must name the
            store (timeout 30 s)

Run: PYTHONPATH=tests mpirun -n 2 python -m mpi4py tests/torch_mpi/launchers.py [case ...]
     PYTHONPATH=tests torchrun --standalone --nproc-per-node 2 tests/torch_mpi/launchers.py
     PYTHONPATH=tests torchrun --standalone --nproc-per-node 2 tests/torch_mpi/launchers.py \
         --faults=size,missing,store
"""

import gc
import hashlib
import os
import sys
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import zcoll.torch
from torch.distributed import distributed_c10d as c10d

ARGS = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
TIMEOUT = float(ARGS.get("timeout", "60"))
SIZES = [0, 1, 7, 33, 1000, 65537]


FAULT_TIMEOUTS = {"size": 30.0, "missing": 4.0, "store": 30.0}


def faults(names: list) -> None:
    """Each fault of `names` in turn (the module docstring); every rank done with one before
    the next starts, and with the last before the real group."""
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    for k, name in enumerate(names):
        fault(name, dist.PrefixStore(f"zcoll-fault/{k}/", agent), rank, size)
        agent.add(f"zcoll-fault/{k}/done", 1)
        deadline = time.monotonic() + 60
        while agent.add(f"zcoll-fault/{k}/done", 0) < size and time.monotonic() < deadline:
            time.sleep(0.02)


def fault(name: str, store, rank: int, size: int) -> None:
    """One fault; prints whether creating the group raised."""
    start = time.monotonic()
    kwargs = {
        "store": store,
        "rank": rank,
        "world_size": size,
        "timeout": timedelta(seconds=FAULT_TIMEOUTS[name]),
    }
    if name == "missing" and rank == 1:
        return
    if name == "size" and rank == size - 1:
        kwargs.update(world_size=size + 1)
    if name == "store":
        if rank == 0:
            return host_store_then_close(store, FAULT_TIMEOUTS[name])
        kwargs.update(store=dist.TCPStore(os.environ["MASTER_ADDR"], int(store.get("port")), is_master=False))
    try:
        dist.init_process_group("zcoll", **kwargs)
    except RuntimeError as e:
        print(f"ZCOLL-ERROR {name} rank {rank} after {time.monotonic() - start:.1f} s: {e}", flush=True)
        return
    print(f"ZCOLL-NOERROR {name} rank {rank}", flush=True)
    dist.destroy_process_group()


def host_store_then_close(agent, timeout: float) -> None:
    """Rank 0 of the store fault: hosts the group's store, waits until rank 1 wrote into it
    (its arrival), then closes it without creating the group: the store goes away."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], 0, world_size=2, is_master=True, wait_for_workers=False)
    agent.set("port", str(store.port))
    keys = store.num_keys()
    deadline = time.monotonic() + timeout
    while store.num_keys() <= keys and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)
    del store
    gc.collect()  # the last reference: its server stops


if "faults" in ARGS:
    faults(ARGS["faults"].split(","))  # then the group as usual: a failed start leaves nothing behind

dist.init_process_group("zcoll", timeout=timedelta(seconds=TIMEOUT))

# isort: split
from harness import WORLD, Checks, run_cases, say

R, N = dist.get_rank(), dist.get_world_size()
COMM = c10d._get_default_group().communicator


def inexact(rank: int, n: int) -> np.ndarray:
    """float32 values whose sums round: the bits depend on the order of reduction."""
    return np.sin(np.arange(n, dtype=np.float64) * 0.37 + rank * 1.3).astype(np.float32) * 1e3


def exact(rank: int, n: int) -> np.ndarray:
    return ((np.arange(n) * 7 + rank * 5) % 13 + rank).astype(np.int32)


def report(case: str, h) -> None:
    """Rank 0 prints the digest of every rank's results, in rank order."""
    digests = WORLD.gather(h.digest(), root=0)
    if R == 0:
        say(f"ZCOLL-DIGEST {case} {hashlib.sha256(b''.join(digests)).hexdigest()}")


def case_collectives(ck: Checks):
    h = hashlib.sha256()
    by_algorithm = {}
    for alg in zcoll.ALGORITHMS:
        if alg == "shm" and COMM.node_count > 1 or alg == "ordered_ring":
            continue  # shm: every rank on one node; ordered_ring: measured links (zcoll probe)
        h_alg = by_algorithm[alg] = hashlib.sha256()
        for n in SIZES:
            y = COMM.allreduce(inexact(R, n), algorithm=alg)
            ref = sum(inexact(r, n).astype(np.float64) for r in range(N))
            ck.check(np.allclose(y, ref, rtol=1e-5, atol=1e-2), f"{alg} float32 n={n}")
            yi = COMM.allreduce(exact(R, n), algorithm=alg)
            ck.check(np.array_equal(yi, sum(exact(r, n) for r in range(N))), f"{alg} int32 n={n}")
            ck.same_on_all_ranks(f"{alg} n={n}", y.tobytes() + yi.tobytes())
            h.update(y.tobytes() + yi.tobytes())
            h_alg.update(y.tobytes() + yi.tobytes())
    x = inexact(R, 1000)
    parts = [COMM.reduce_scatter(x), COMM.allgather(x), COMM.broadcast(x.copy(), root=N - 1)]
    red = COMM.reduce(x, root=0)
    parts.append(red if red is not None else np.zeros(0, np.float32))
    ck.check(np.array_equal(parts[1][R], x), "allgather holds this rank's block")
    ck.check(np.array_equal(parts[2], inexact(N - 1, 1000)), "broadcast from the last rank")
    for p in parts:
        h.update(np.ascontiguousarray(p).tobytes())
    report("collectives", h)
    for alg, h_alg in by_algorithm.items():  # launchers whose node maps differ compare these
        report(f"collectives/{alg}", h_alg)


def case_torch_ops(ck: Checks):
    h = hashlib.sha256()
    ref = torch.from_numpy(sum(inexact(r, 1000).astype(np.float64) for r in range(N)))
    for op, want in ((dist.ReduceOp.SUM, ref), (dist.ReduceOp.AVG, ref / N)):
        t = torch.from_numpy(inexact(R, 1000))
        dist.all_reduce(t, op=op)
        ck.check(torch.allclose(t.double(), want, rtol=1e-5, atol=1e-2), f"all_reduce {op}")
        h.update(t.numpy().tobytes())
    t = torch.from_numpy(exact(R, 1000))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    ck.check(torch.equal(t, torch.from_numpy(np.max([exact(r, 1000) for r in range(N)], axis=0))), "max")
    x = torch.from_numpy(inexact(R, 64 * N))
    outs = [x.clone(), torch.empty(N * x.numel()), torch.empty(x.numel() // N), torch.empty_like(x)]
    dist.broadcast(outs[0], src=N - 1)
    dist.all_gather_into_tensor(outs[1], x)
    dist.reduce_scatter_tensor(outs[2], x)
    dist.all_to_all_single(outs[3], x)
    ck.check(torch.equal(outs[0], torch.from_numpy(inexact(N - 1, 64 * N))), "broadcast")
    ck.check(torch.equal(outs[1][R * x.numel() : (R + 1) * x.numel()], x), "all_gather_into_tensor")
    red = x.clone()
    dist.reduce(red, dst=0)
    got = torch.empty_like(x)
    if N > 1:
        sent = dist.isend(x, (R + 1) % N)
        dist.recv(got, (R - 1) % N)
        sent.wait()
        ck.check(torch.equal(got, torch.from_numpy(inexact((R - 1) % N, 64 * N))), "send/recv ring")
    dist.barrier()
    sub = dist.new_group(list(range(0, N, 2)))
    if R % 2 == 0:
        s = x.clone()
        dist.all_reduce(s, group=sub)
        h.update(s.numpy().tobytes())
    for t in (*outs, red if R == 0 else torch.empty(0), got):
        h.update(t.numpy().tobytes())
    report("torch_ops", h)


def case_nodes(ck: Checks):
    from mpi4py import MPI

    want = int(ARGS.get("nodes", "1"))
    shared = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    mpi_nodes = MPI.COMM_WORLD.allreduce(1 if shared.rank == 0 else 0)
    shared.Free()
    ck.check(mpi_nodes == want, "MPI's nodes", f"MPI_Comm_split_type(SHARED) found {mpi_nodes}, want {want}")
    ck.check(COMM.node_count == want, "zcoll's nodes", f"node_count() {COMM.node_count}, want {want}")
    y = COMM.allreduce(exact(R, 1000), algorithm="hierarchical")
    ck.check(np.array_equal(y, sum(exact(r, 1000) for r in range(N))), "hierarchical allreduce")
    h = hashlib.sha256(y.tobytes())
    report("nodes", h)
    if R == 0:
        say(f"ZCOLL-NODES mpi={mpi_nodes} zcoll={COMM.node_count} local_size={COMM.local_size}")


if __name__ == "__main__":
    run_cases(globals(), teardown=dist.destroy_process_group)
