"""Ways to start the zcoll backend, and the errors when it cannot start. One mode per launch:

  plain        dist.init_process_group("zcoll") under mpirun, no MASTER_ADDR
  helper       zcoll.torch.init_process_group(), then again on an MPI sub-communicator
  gloo_local   gloo under mpirun without MASTER_ADDR: a clear error, not a hang
  gloo_hook    gloo (MASTER_ADDR from rank 0) + DDP: apply_gradient_compression refuses it
  torchrun     under torchrun with 2 processes: a clear error telling to use mpirun

Prints "STARTUP-OK <mode>" on success.
"""

import sys

import torch
import torch.distributed as dist
import zcoll.torch

mode = sys.argv[1]


def allreduce_check(group=None):
    t = torch.full((3,), float(dist.get_rank(group) + 1))
    dist.all_reduce(t, group=group)
    n = dist.get_world_size(group)
    assert t.eq(n * (n + 1) / 2).all(), t


def expect_error(fn, exc, *words):
    try:
        fn()
    except exc as e:
        missing = [w for w in words if w not in str(e)]
        assert not missing, f"{missing} not in {e}"
        return
    raise AssertionError("no error")


if mode == "plain":
    dist.init_process_group("zcoll")
    assert dist.get_backend() == "zcoll"
    allreduce_check()
    dist.destroy_process_group()
elif mode == "helper":
    from mpi4py import MPI

    zcoll.torch.init_process_group()
    allreduce_check()
    dist.destroy_process_group()
    world = MPI.COMM_WORLD
    half = world.Split(color=world.rank % 2, key=world.rank)
    zcoll.torch.init_process_group(comm=half)
    assert dist.get_world_size() == half.size and dist.get_rank() == half.rank
    allreduce_check()
    if half.size > 1:
        allreduce_check(dist.new_group([half.size - 1, 0]))  # a subgroup of a sub-communicator
    dist.destroy_process_group()
    half.Free()
elif mode == "gloo_local":
    expect_error(lambda: dist.init_process_group("gloo"), Exception, "MASTER_ADDR")
elif mode == "gloo_hook":
    import os
    import socket

    from mpi4py import MPI

    port = None
    if MPI.COMM_WORLD.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(MPI.COMM_WORLD.bcast(port)))
    dist.init_process_group("gloo", rank=MPI.COMM_WORLD.rank, world_size=MPI.COMM_WORLD.size)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    expect_error(lambda: zcoll.torch.apply_gradient_compression(model), ValueError, "zcoll backend", "gloo")
    dist.destroy_process_group()
elif mode == "torchrun":
    expect_error(lambda: dist.init_process_group("zcoll"), Exception, "mpirun", "torchrun")
    expect_error(zcoll.torch.init_process_group, RuntimeError, "mpirun", "torchrun")
else:
    raise SystemExit(f"unknown mode {mode}")
print(f"STARTUP-OK {mode}", flush=True)
