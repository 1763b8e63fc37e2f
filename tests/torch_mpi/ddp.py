"""DDP on the zcoll backend: training steps with and without hooks against a single-process
reference on the whole batch, identical parameters on every rank, gradient accumulation equal to
the large-batch step with N times fewer bytes.
Run: PYTHONPATH=tests mpirun -n 2 python -m mpi4py tests/torch_mpi/ddp.py [case ...]
"""

from harness import Checks, run_cases

# isort: split
import torch
import torch.distributed as dist
import torch.nn.functional as F
import zcoll.torch
from torch.nn.parallel import DistributedDataParallel as DDP
from zcoll.torch import hooks


dist.init_process_group("zcoll")  # plain torch call: no MASTER_ADDR needed under mpirun
R, N = dist.get_rank(), dist.get_world_size()
B = 4  # rows per rank per micro-batch


def net(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).to(dtype)


def batch(step, rows, dtype=torch.float32):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(rows, 10, generator=g).to(dtype), torch.randint(0, 4, (rows,), generator=g)


def ddp(model):
    # tiny buckets: several buckets per step, so ordering across buckets is exercised
    return DDP(model, bucket_cap_mb=0.002)


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def same_on_every_rank(ck: Checks, model):
    mine = flat(model)
    allp = torch.empty(N * mine.numel(), dtype=mine.dtype)
    dist.all_gather_into_tensor(allp, mine)
    for r in range(N):
        ck.check(torch.equal(allp[r * mine.numel() : (r + 1) * mine.numel()], mine), f"rank {r} differs")


def train_pair(ck: Checks, register=None, dtype=torch.float32, steps=4, opt_cls=torch.optim.SGD, **opt_kw):
    """DDP model (rank's share of each batch) and a local reference (whole batch)."""
    model, ref = ddp(net(dtype)), net(dtype)
    if register is not None:
        register(model)
    opt, ropt = opt_cls(model.parameters(), **opt_kw), opt_cls(ref.parameters(), **opt_kw)
    for step in range(steps):
        x, y = batch(step, N * B, dtype)
        opt.zero_grad()
        F.cross_entropy(model(x[R * B : (R + 1) * B]), y[R * B : (R + 1) * B]).backward()
        opt.step()
        ropt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ropt.step()
        same_on_every_rank(ck, model.module)
    return model, ref


def assert_close(ck: Checks, model, ref, tol):
    err = (flat(model.module).double() - flat(ref).double()).abs().max().item()
    ck.check(err <= tol, f"max abs difference to the reference {err} > {tol}")


def case_ddp_builtin_allreduce(ck: Checks):
    assert_close(ck, *train_pair(ck, lr=0.1, momentum=0.9), tol=1e-5)


def case_ddp_allreduce_hook(ck: Checks):
    model, ref = train_pair(ck, lambda m: m.register_comm_hook(None, hooks.allreduce_hook), lr=0.1)
    assert_close(ck, model, ref, tol=1e-5)


def case_ddp_compression_hook_uncompressed_path(ck: Checks):
    states = []

    def register(m):
        states.append(zcoll.torch.apply_gradient_compression(m, compressor=None))

    model, ref = train_pair(ck, register, opt_cls=torch.optim.Adam, lr=1e-2)
    assert_close(ck, model, ref, tol=1e-5)
    ck.check(states[0].step == 4 and not states[0].compressing)


def case_ddp_bfloat16_and_float16_buckets(ck: Checks):
    for dtype in (torch.bfloat16, torch.float16):
        assert_close(
            ck,
            *train_pair(ck, lambda m: m.register_comm_hook(None, hooks.allreduce_hook), dtype=dtype, lr=0.1),
            tol=5e-2,
        )


def case_ddp_warmup_counts_steps(ck: Checks):
    state = hooks.CompressionState(compressor=object(), warmup_steps=3)  # never used during warm-up
    model = ddp(net())
    model.register_comm_hook(state, hooks.compression_hook)
    for step in range(3):
        ck.check(not state.compressing)
        x, y = batch(step, B)
        F.cross_entropy(model(x), y).backward()
    ck.check(state.step == 3 and state.compressing)


def _accumulate(opt_factory, steps_n, micro_batches, count_from):
    """Trains with the usual loop; returns (model, bytes sent from micro-batch `count_from` on:
    DDP rebuilds its buckets after its first synchronised step and broadcasts the new layout)."""
    model = ddp(net())
    opt = opt_factory(model, steps_n)
    comm = model.process_group.communicator
    for k in range(micro_batches):
        if k == count_from:
            comm.reset_stats()
        x, y = batch(k // steps_n, N * B * steps_n)
        lo = ((k % steps_n) * N + R) * B  # micro-batch k % n of this step, this rank's share
        F.cross_entropy(model(x[lo : lo + B]), y[lo : lo + B]).backward()
        opt.step()
        opt.zero_grad()
    return model, comm.stats()["bytes_sent"]


def _reference(opt_cls, updates, steps_n, **kw):
    ref = net()
    opt = opt_cls(ref.parameters(), **kw)
    for s in range(updates):
        x, y = batch(s, N * B * steps_n)
        opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        opt.step()
    return ref


def case_gradient_accumulation_adam_equals_large_batch(ck: Checks):
    n = 4
    model, sent = _accumulate(
        lambda m, k: zcoll.torch.optim.Adam(m.parameters(), lr=1e-2, gradient_accumulation_steps=k, model=m),
        n,
        4 * n,
        2 * n,
    )
    assert_close(ck, model, _reference(torch.optim.Adam, 4, n, lr=1e-2), tol=1e-5)
    same_on_every_rank(ck, model.module)
    _, sent_every_step = _accumulate(
        lambda m, k: zcoll.torch.optim.Adam(m.parameters(), lr=1e-2), 1, 4 * n, 2 * n
    )
    ck.check(sent * n == sent_every_step, f"bytes with accumulation {sent}, without {sent_every_step}")


def case_gradient_accumulator_wraps_any_optimizer(ck: Checks):
    n = 3
    model, _ = _accumulate(
        lambda m, k: zcoll.torch.GradientAccumulator(
            torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), k, model=m
        ),
        n,
        2 * n,
        0,
    )
    assert_close(ck, model, _reference(torch.optim.SGD, 2, n, lr=0.1, momentum=0.9), tol=1e-5)


def case_zero_grad_keeps_gradients_between_updates(ck: Checks):
    model = ddp(net())
    opt = zcoll.torch.optim.SGD(model.parameters(), lr=0.1, gradient_accumulation_steps=2, model=model)
    x, y = batch(0, B)
    F.cross_entropy(model(x), y).backward()
    g1 = model.module[0].weight.grad.clone()
    opt.step()
    opt.zero_grad()
    ck.check(not opt.updated and torch.equal(model.module[0].weight.grad, g1))
    ck.check(model.require_backward_grad_sync)  # the next backward is the 2nd of 2: it communicates
    F.cross_entropy(model(x), y).backward()
    opt.step()
    ck.check(opt.updated)
    opt.zero_grad()
    ck.check(model.module[0].weight.grad is None and not model.require_backward_grad_sync)


def case_apply_gradient_compression_needs_ddp(ck: Checks):
    try:
        zcoll.torch.apply_gradient_compression(net(), compressor=None)
    except TypeError as e:
        ck.check("DistributedDataParallel" in str(e))
    else:
        ck.fail("no TypeError")


if __name__ == "__main__":
    run_cases(globals(), teardown=dist.destroy_process_group)
