"""DDP with compression_hook and each zcoll compressor (needs the compression API:
``comm.allreduce(x, op="avg", compression=..., key=...)`` and the compressor classes).

Every case trains a small model on the same data with the hook and without it (uncompressed
zcoll), checks that every rank holds identical parameters after every step, that the compressed
run stays within the compressor's tolerance of the uncompressed one, and where the compressor
shrinks the payload that fewer bytes crossed the network.
Run: PYTHONPATH=tests mpirun -n 2 python -m mpi4py tests/torch_mpi/compression.py [case ...]
"""

from harness import Checks, run_cases

# isort: split
import torch
import torch.distributed as dist
import torch.nn.functional as F
import zcoll
import zcoll.torch
from torch.nn.parallel import DistributedDataParallel as DDP


zcoll.torch.init_process_group()
R, N = dist.get_rank(), dist.get_world_size()
B, STEPS = 8, 6


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def same_on_every_rank(ck: Checks, model):
    mine = flat(model)
    allp = torch.empty(N * mine.numel())
    dist.all_gather_into_tensor(allp, mine)
    for r in range(N):
        ck.check(torch.equal(allp[r * mine.numel() : (r + 1) * mine.numel()], mine), f"rank {r} differs")


def train(ck: Checks, compressor=None, warmup=0, steps=STEPS, hook=True, fixed_batch=False):
    """Returns (model, hook state, bytes sent, losses); fixed_batch: the same batch every step."""
    model = DDP(net(), bucket_cap_mb=0.004)
    state = zcoll.torch.apply_gradient_compression(model, compressor, warmup_steps=warmup, plain=True) if hook else None
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    comm = model.process_group.communicator
    sent = 0  # bytes of the training steps only (not of the parameter checks below)
    losses = []
    for step in range(steps):
        before = comm.stats()["bytes_sent"]
        g = torch.Generator().manual_seed(0 if fixed_batch else step)
        x, y = torch.randn(N * B, 16, generator=g), torch.randint(0, 4, (N * B,), generator=g)
        loss = F.cross_entropy(model(x[R * B : (R + 1) * B]), y[R * B : (R + 1) * B])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sent += comm.stats()["bytes_sent"] - before
        same_on_every_rank(ck, model.module)
        losses.append(loss.item())
    return model, state, sent, losses


REFERENCE = None


def reference(ck: Checks):
    global REFERENCE
    if REFERENCE is None:
        REFERENCE = train(ck, None)
    return REFERENCE


def compare_with_uncompressed(ck: Checks, compressor, rel_tol, max_byte_ratio=None):
    """Trains with compressor. rel_tol bounds the distance of its parameters to those of the
    uncompressed run, relative to how far that run moved from the start: 1.0 is as far off as a
    model that never moved, so every rel_tol is below it."""
    model, state, sent, _ = train(ck, compressor)
    ref_model, _, ref_sent, _ = reference(ck)
    diff = (flat(model.module) - flat(ref_model.module)).norm() / (
        flat(ref_model.module) - flat(net())
    ).norm()
    ck.check(diff <= rel_tol, f"{compressor!r}: distance to the uncompressed run {diff:.3g} > {rel_tol}")
    keys = state.keys
    ck.check(keys and all(k.startswith("ddp/bucket") for k in keys.values()), message=str(keys))
    if max_byte_ratio is not None:
        ck.check(sent <= max_byte_ratio * ref_sent, f"{compressor!r}: {sent} bytes, {ref_sent} uncompressed")


def case_int8_quantizer(ck: Checks):
    q = zcoll.GradientQuantizer(bits=8, block=256, error_feedback=True)
    compare_with_uncompressed(ck, q, rel_tol=0.02, max_byte_ratio=0.35)


def case_int4_quantizer(ck: Checks):
    q = zcoll.GradientQuantizer(bits=4, block=256, error_feedback=True)
    compare_with_uncompressed(ck, q, rel_tol=0.15, max_byte_ratio=0.25)


def case_sign_quantizer(ck: Checks):
    q = zcoll.GradientQuantizer(bits=1, block=256, error_feedback=True)
    compare_with_uncompressed(ck, q, rel_tol=0.8, max_byte_ratio=0.15)


def case_int8_stochastic_rounding(ck: Checks):
    q = zcoll.GradientQuantizer(bits=8, stochastic=True, error_feedback=True)
    compare_with_uncompressed(ck, q, rel_tol=0.05)


def case_topk(ck: Checks):
    compare_with_uncompressed(ck, zcoll.TopK(ratio=0.1, error_feedback=True), rel_tol=0.8, max_byte_ratio=0.5)


def case_randomk(ck: Checks):
    # 0.735 measured on 2 ranks (a quarter of the coordinates per step, the rest owed by error
    # feedback); the bound was 1.0, which a hook that sends nothing meets too
    compare_with_uncompressed(ck, zcoll.RandomK(ratio=0.25, seed=1), rel_tol=0.9)


def case_threshold(ck: Checks):
    compare_with_uncompressed(ck, zcoll.Threshold(1e-3), rel_tol=0.5)


def case_half_precision(ck: Checks):
    for fmt in ("fp16", "bf16"):
        compare_with_uncompressed(ck, zcoll.HalfPrecision(fmt), rel_tol=0.02, max_byte_ratio=0.6)


def case_warmup_is_exactly_uncompressed(ck: Checks):
    warm = 3
    topk = zcoll.TopK(ratio=0.01, error_feedback=True)
    model, state, _, losses = train(ck, topk, warmup=warm, steps=warm)
    ref_model, _, _, ref_losses = train(ck, None, steps=warm)
    ck.check(torch.equal(flat(model.module), flat(ref_model.module)) and losses == ref_losses)
    ck.check(state.step == warm and state.compressing and not state.keys)


def case_compressed_training_still_learns(ck: Checks):
    int4 = zcoll.GradientQuantizer(bits=4, error_feedback=True)
    _, _, _, losses = train(ck, int4, steps=20, fixed_batch=True)
    ck.check(sum(losses[-5:]) < sum(losses[:5]), message=f"{losses}")


if __name__ == "__main__":
    run_cases(globals(), teardown=dist.destroy_process_group)
