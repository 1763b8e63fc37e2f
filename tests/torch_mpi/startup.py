"""Ways to start the zcoll backend, and the errors when it cannot start. One case per way:

  plain        dist.init_process_group("zcoll") under mpirun, no MASTER_ADDR
  helper       zcoll.torch.init_process_group(), then again on an MPI sub-communicator
  gloo_local   gloo under mpirun without MASTER_ADDR: a clear error, not a hang
  gloo_hook    gloo (MASTER_ADDR from rank 0) + DDP: apply_gradient_compression refuses it

Run: PYTHONPATH=tests mpirun -n 3 python -m mpi4py tests/torch_mpi/startup.py plain helper
"""

import os


from harness import WORLD, Checks, run_cases

# isort: split
import socket

import torch
import torch.distributed as dist
import zcoll.torch


def allreduce_check(ck: Checks, group=None):
    t = torch.full((3,), float(dist.get_rank(group) + 1))
    dist.all_reduce(t, group=group)
    n = dist.get_world_size(group)
    ck.check(t.eq(n * (n + 1) / 2).all(), f"all_reduce on {n} ranks", f"{t}")


def case_plain(ck: Checks):
    dist.init_process_group("zcoll")
    ck.check(dist.get_backend() == "zcoll", message=dist.get_backend())
    allreduce_check(ck)
    dist.destroy_process_group()


def case_helper(ck: Checks):
    zcoll.torch.init_process_group()
    allreduce_check(ck)
    dist.destroy_process_group()
    half = WORLD.Split(color=WORLD.rank % 2, key=WORLD.rank)
    zcoll.torch.init_process_group(comm=half)
    ck.check(dist.get_world_size() == half.size and dist.get_rank() == half.rank)
    allreduce_check(ck)
    if half.size > 1:
        allreduce_check(ck, dist.new_group([half.size - 1, 0]))  # a subgroup of a sub-communicator
    dist.destroy_process_group()
    half.Free()


def case_gloo_local(ck: Checks):
    ck.raises(RuntimeError, lambda: dist.init_process_group("gloo"), "MASTER_ADDR")


def case_gloo_hook(ck: Checks):
    port = None
    if WORLD.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(WORLD.bcast(port)))
    dist.init_process_group("gloo", rank=WORLD.rank, world_size=WORLD.size)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    ck.raises(ValueError, lambda: zcoll.torch.apply_gradient_compression(model), "zcoll backend", "gloo")
    dist.destroy_process_group()


if __name__ == "__main__":
    run_cases(globals())
