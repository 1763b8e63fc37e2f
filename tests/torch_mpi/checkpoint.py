"""zcoll.torch.checkpoint under mpirun: DDP with compression resumes bit-exactly (several buckets,
per-rank residuals), a rank that cannot write makes every rank raise, and a checkpoint of N
ranks loads on another rank count with the residuals averaged.
Run: PYTHONPATH=tests mpirun -n 2 python -m mpi4py tests/torch_mpi/checkpoint.py [case ...]
"""

import os
import tempfile


from harness import Checks, run_cases

# isort: split
import hashlib
import shutil

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
import zcoll
import zcoll.torch
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel as DDP
from zcoll.core import checkpoint_files
from zcoll.torch import checkpoint

dist.init_process_group("zcoll")
R, N = dist.get_rank(), dist.get_world_size()
WORLD = MPI.COMM_WORLD
SCRATCH = WORLD.bcast(tempfile.mkdtemp(prefix="zcoll-ckpt-") if R == 0 else None)


def fresh_dir(name):
    path = os.path.join(SCRATCH, name)
    WORLD.barrier()
    return path


def training():
    """DDP with several buckets, int4 compression with error feedback, Adam."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    model = DDP(net, bucket_cap_mb=0.0005)  # 512-byte buckets: 3 of them
    # dense_below=0: these buckets (128 elements) would otherwise go uncompressed
    state = zcoll.torch.apply_gradient_compression(model, zcoll.GradientQuantizer(bits=4), dense_below=0)
    opt = zcoll.torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, opt, state


def steps(model, opt, first, count):
    for step in range(first, first + count):
        g = torch.Generator().manual_seed(1000 * step + R)  # each rank its own data
        x, y = torch.randn(8, 10, generator=g), torch.randint(0, 4, (8,), generator=g)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def any_backward(model):
    return lambda: F.cross_entropy(model(torch.zeros(2, 10)), torch.zeros(2, dtype=torch.long)).backward()


def case_ddp_with_compression_resumes_bit_exactly(ck: Checks):
    directory = fresh_dir("exact")
    model, opt, state = training()
    steps(model, opt, 0, 3)
    saved = dict(model=model, optimizer=opt, compression_state=state)
    checkpoint.save(directory, 3, data_position=3, **saved)
    residuals = state.compressor.state_dict()["residuals"]
    ck.check(len(residuals) >= 2, "several buckets", f"keys {sorted(residuals)}")  # and the initial one
    mine = b"".join(residuals[k].tobytes() for k in sorted(residuals))
    ck.check(len(set(WORLD.allgather(hashlib.sha1(mine).digest()))) == N, "residuals differ between ranks")
    steps(model, opt, 3, 3)
    reference = flat(model)

    model2, opt2, state2 = training()
    resumed = checkpoint.load(directory, rebuild_buckets=any_backward(model2), model=model2, optimizer=opt2,
                              compression_state=state2)  # fmt: skip
    ok = resumed is not None and resumed.step == 3 and resumed.data_position == 3
    ck.check(ok, "resumed", repr(resumed))
    back = state2.compressor.state_dict()["residuals"]
    ck.check(sorted(back) == sorted(residuals), "keys", f"{sorted(back)} != {sorted(residuals)}")
    ck.check(all(np.array_equal(back[k], residuals[k]) for k in residuals), "this rank's own residuals back")
    steps(model2, opt2, 3, 3)
    ck.check(torch.equal(flat(model2), reference), "bit-identical after 3 more steps")
    ck.same_on_all_ranks("parameters", flat(model2).numpy().tobytes())

    # without rebuild_buckets DDP's first step after the resume has its initial bucket; the hook
    # compresses it as the saved buckets it is made of, so the bits agree too
    model3, opt3, state3 = training()
    checkpoint.load(directory, model=model3, optimizer=opt3, compression_state=state3)
    steps(model3, opt3, 3, 3)
    ck.check(torch.equal(flat(model3), reference), "bit-identical without rebuild_buckets (saved layouts)")


def case_a_rank_that_cannot_write_makes_every_rank_raise(ck: Checks):
    directory = fresh_dir("failing")
    model = torch.nn.Linear(3, 2)
    checkpoint.save(directory, 1, model=model)
    write_part = checkpoint_files.write_part
    if R == N - 1:
        checkpoint_files.write_part = lambda *a, **k: (_ for _ in ()).throw(OSError("disk full"))
    try:
        save = lambda: checkpoint.save(directory, 2, model=model)  # noqa: E731
        ck.raises(RuntimeError, save, f"rank {N - 1}", "disk full")
    finally:
        checkpoint_files.write_part = write_part
    ck.check(checkpoint.latest(directory).step == 1, "step 2 not committed")


def case_another_rank_count_gets_the_mean_residual(ck: Checks):
    directory = fresh_dir("resized")
    model, opt, state = training()
    steps(model, opt, 0, 2)
    checkpoint.save(directory, 2, model=model, optimizer=opt, compression_state=state)
    key = sorted(state.compressor.state_dict()["residuals"])[0]
    everyone = WORLD.allgather(state.compressor.residual(key))
    # every rank alone (COMM_SELF: one rank) loads the N-rank checkpoint
    bare = zcoll.torch.CompressionState(compressor=zcoll.GradientQuantizer(bits=4))
    load = lambda: checkpoint.load(directory, compression_state=bare, comm=MPI.COMM_SELF)  # noqa: E731
    ck.raises(ValueError, load, "parameters=")  # the layouts name the model's parameters
    alone = zcoll.torch.CompressionState(
        compressor=zcoll.GradientQuantizer(bits=4), parameters=list(model.parameters())
    )
    resumed = checkpoint.load(directory, compression_state=alone, comm=MPI.COMM_SELF)
    ok = resumed.resized and resumed.saved_world_size == N and resumed.world_size == 1
    ck.check(ok, "resized", repr(resumed))
    want = (np.sum(np.stack(everyone).astype(np.float64), axis=0) / N).astype(np.float32)
    ck.check(np.array_equal(alone.compressor.residual(key), want), "mean of the ranks' residuals")
    ck.check(alone.step == state.step, "counters from old rank 0", f"{alone.step} != {state.step}")


def teardown():
    WORLD.barrier()
    if R == 0:
        shutil.rmtree(SCRATCH, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    run_cases(globals(), teardown=teardown)
