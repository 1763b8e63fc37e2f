"""Compressed DDP training that keeps its accuracy (zcoll.torch.hooks.CompressionState,
zcoll.torch.bucket_state, zcoll.torch.momentum).

1. Error feedback carries exactly what was not sent, per parameter, across DDP's bucket rebuild:
   over all steps, sum over ranks of the hook's inputs == p * sum of the averaged results + sum
   over ranks of the residuals.
2. Momentum correction without compression is the optimizer itself: torch's SGD with momentum
   (with a bucket rebuild in between), and Adam whose variance freezes after the warm-up.
3. DGC's momentum factor masking: the velocity is zero wherever the value was sent.
4. A checkpoint (state_dict) taken mid-run resumes bit-exactly on a new DDP model (which starts
   with DDP's first-step bucket again).
5. What momentum correction refuses.
(Digits: top-1% and sign end within 1.0 point of uncompressed zcoll: bench/accuracy.py, run by
tests/bench/test_accuracy.py.)
Run: PYTHONPATH=tests mpirun -n 2 python -m mpi4py tests/torch_mpi/accuracy.py [case ...]
"""

import copy

from harness import Checks, run_cases

# isort: split
import torch
import torch.distributed as dist
import torch.nn.functional as F
import zcoll
import zcoll.torch
from torch.nn.parallel import DistributedDataParallel as DDP
from zcoll.torch.hooks import CompressionState, compression_hook

zcoll.torch.init_process_group()
torch.set_num_threads(1)
R, N = dist.get_rank(), dist.get_world_size()
B = 8
NO_COMPRESSION = {"dense_below": 1 << 62}  # momentum correction's path, every bucket uncompressed


def wide_net(seed=0):
    """2.1 MB of gradients: one bucket on the first step, two after DDP's rebuild (1 MiB first)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 4096), torch.nn.Tanh(), torch.nn.Linear(4096, 128))


def batch(step, rows=B):
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(N * rows, 16, generator=g), torch.randint(0, 128, (N * rows,), generator=g)
    return x[R * rows : (R + 1) * rows], y[R * rows : (R + 1) * rows], x, y


def flat(params):
    return torch.cat([p.detach().reshape(-1) for p in params])


def case_error_feedback_carries_across_rebuild(ck: Checks):
    model = DDP(wide_net())
    topk = zcoll.TopK(ratio=0.01)
    state = CompressionState(model.process_group, topk, parameters=list(model.parameters()))
    params = list(model.parameters())
    sent_in = {p: torch.zeros(p.numel(), dtype=torch.float64) for p in params}
    averaged = {p: torch.zeros(p.numel(), dtype=torch.float64) for p in params}
    layouts = []

    def recording_hook(st, bucket):
        buf, ps = bucket.buffer(), list(bucket.parameters())
        layouts.append((bucket.index(), buf.numel()))
        for p, piece in zip(ps, buf.split([p.numel() for p in ps])):
            sent_in[p] += piece.double()

        def add_result(fut):
            out = fut.value()
            for p, piece in zip(ps, out.split([p.numel() for p in ps])):
                averaged[p] += piece.double()
            return out

        return compression_hook(st, bucket).then(add_result)

    model.register_comm_hook(state, recording_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(4):
        x, y, _, _ = batch(step)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    ck.check(len(set(layouts)) == 3, "DDP rebuilt one bucket into two", str(sorted(set(layouts))))
    worst = 0.0
    for p in params:
        e = state.residual(p)
        if not ck.check(e is not None, "every parameter has a residual"):
            continue
        total = torch.stack([sent_in[p], e.reshape(-1).double()])
        dist.all_reduce(total)  # sums over ranks: of the inputs, of the residuals
        lhs, rhs = total[0], N * averaged[p] + total[1]  # the ranks sent N times the average
        worst = max(worst, ((lhs - rhs).abs().max() / lhs.abs().max()).item())
    ck.check(
        worst < 1e-5, "inputs == ranks * averaged + residuals, per parameter", f"relative error {worst:.3g}"
    )
    ck.same_on_all_ranks("parameters", flat(params).numpy().tobytes())


def sgd_run(correct: bool, steps=5):
    model = DDP(wide_net())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-3)
    if correct:
        zcoll.torch.apply_gradient_compression(model, zcoll.TopK(0.01), 0, optimizer=opt, **NO_COMPRESSION)
    for step in range(steps):
        x, y, _, _ = batch(step)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return flat(model.parameters())


def case_momentum_correction_uncompressed_is_sgd(ck: Checks):
    """SGD's momentum moved into the hook (from step 0, across the rebuild) gives SGD's steps."""
    mine, ref, start = sgd_run(True), sgd_run(False), flat(wide_net().parameters())
    err = ((mine - ref).norm() / (ref - start).norm()).item()
    ck.check(err < 1e-5, "the same trajectory as torch.optim.SGD", f"relative distance {err:.3g}")
    ck.same_on_all_ranks("parameters", mine.numpy().tobytes())


def case_adam_variance_freezes_after_warmup(ck: Checks):
    """Adam through the warm-up, then u = b1 u + (1 - b1) g, d frozen, p -= lr / (1 - b1^t) u / d."""
    warm, steps, lr, b1, b2, eps, floor = 3, 7, 1e-3, 0.9, 0.999, 1e-8, 1e-2  # int8: floor 1e-2
    model = DDP(wide_net())
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(b1, b2), eps=eps)
    state = zcoll.torch.apply_gradient_compression(
        model, zcoll.GradientQuantizer(bits=8), warm, optimizer=opt, **NO_COMPRESSION
    )
    ref = wide_net()  # the executable spec, on the whole batch (what the average of the ranks' means is)
    m = [torch.zeros_like(p) for p in ref.parameters()]
    v = [torch.zeros_like(p) for p in ref.parameters()]
    d = None
    for step in range(steps):
        x, y, xa, ya = batch(step)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        ref.zero_grad()
        F.cross_entropy(ref(xa), ya).backward()
        t = step + 1
        with torch.no_grad():
            for i, p in enumerate(ref.parameters()):
                m[i].mul_(b1).add_(p.grad, alpha=1 - b1)
                if step < warm:
                    v[i].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                    p.addcdiv_(m[i], (v[i] / (1 - b2**t)).sqrt() + eps, value=-lr / (1 - b1**t))
                else:
                    if d is None:
                        d = []
                        for vi in v:
                            vh = vi / (1 - b2**warm)
                            d.append(torch.maximum(vh, floor * vh.mean()).sqrt() + eps)
                    p.add_(m[i] / d[i], alpha=-lr / (1 - b1**t))
        if step == warm - 1:  # still plain Adam: the same as a reference Adam up to rounding
            ck.check(not state.momentum.active, "the optimizer runs unchanged during the warm-up")
    err = (
        (flat(model.parameters()) - flat(ref.parameters())).norm()
        / (flat(ref.parameters()) - flat(wide_net().parameters())).norm()
    ).item()
    ck.check(state.momentum.active, "momentum correction took over after the warm-up")
    ck.check(err < 1e-4, "Adam, then the frozen-variance rule", f"relative distance {err:.3g}")
    ck.check(all(p.grad is None for p in model.parameters()), "the optimizer's own update saw no gradients")


def case_momentum_is_masked_where_sent(ck: Checks):
    model = DDP(wide_net())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = zcoll.torch.apply_gradient_compression(model, zcoll.TopK(0.01), 0, optimizer=opt)
    for step in range(3):
        x, y, _, _ = batch(step)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    ck.check(state.momentum.mask, "masking is the default for top-k")
    for key, u in state.velocity.items():
        e = torch.from_numpy(state.compressor.residual(key)).reshape(-1)
        sent = e == 0
        ck.check(sent.any() and (~sent).any(), f"{key}: some values sent, some owed")
        ck.check(torch.all(u[sent] == 0), f"{key}: velocity zero where sent")
        ck.check((u[~sent] != 0).float().mean() > 0.9, f"{key}: velocity kept where not sent")


def case_two_byte_buckets(ck: Checks):
    """A bfloat16 model: float32 velocity and residual, bf16 buckets, identical ranks."""
    model = DDP(wide_net().to(torch.bfloat16))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    state = zcoll.torch.apply_gradient_compression(model, zcoll.TopK(0.01), 2, optimizer=opt)
    for step in range(5):
        x, y, _, _ = batch(step)
        opt.zero_grad()
        F.cross_entropy(model(x.to(torch.bfloat16)).float(), y).backward()
        opt.step()
    params = flat(model.parameters())
    ck.check(torch.isfinite(params.float()).all() and state.momentum.active, "finite, momentum correction on")
    ck.check(all(u.dtype == torch.float32 for u in state.velocity.values()), "float32 velocities")
    ck.same_on_all_ranks("parameters", params.view(torch.int16).numpy().tobytes())


def train_steps(model, opt, first, last):
    for step in range(first, last):
        x, y, _, _ = batch(step)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def case_state_dict_resumes_exactly(ck: Checks):
    def fresh():
        model = DDP(wide_net())
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        state = zcoll.torch.apply_gradient_compression(model, zcoll.TopK(0.01), 2, optimizer=opt)
        return model, opt, state

    model, opt, state = fresh()
    train_steps(model, opt, 0, 4)
    saved = copy.deepcopy((model.module.state_dict(), opt.state_dict(), state.state_dict()))
    train_steps(model, opt, 4, 7)
    uninterrupted = flat(model.parameters())

    model2, opt2, state2 = fresh()
    model2.module.load_state_dict(saved[0])
    opt2.load_state_dict(saved[1])
    state2.load_state_dict(saved[2])
    train_steps(model2, opt2, 4, 7)
    ck.check(torch.equal(flat(model2.parameters()), uninterrupted), "resumed == uninterrupted, bit for bit")


def case_recipes_by_default(ck: Checks):
    """Top-k and sign get their published recipe through apply_gradient_compression (momentum
    correction after a dense warm-up), need the optimizer for it, and are plain one keyword away."""
    hooks = zcoll.torch.hooks
    ck.raises(
        ValueError,
        lambda: zcoll.torch.apply_gradient_compression(DDP(wide_net()), zcoll.TopK(0.01)),
        "optimizer=",
        "plain=True",
    )
    for compressor in (zcoll.TopK(0.01), zcoll.GradientQuantizer(bits=1), zcoll.RandomK(0.01)):
        model = DDP(wide_net())
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        state = zcoll.torch.apply_gradient_compression(model, compressor, optimizer=opt)
        ck.check(
            state.momentum is not None and state.warmup_steps == hooks.RECIPE_WARMUP_STEPS,
            f"{compressor!r}: momentum correction after the default warm-up",
        )
        plain = zcoll.torch.apply_gradient_compression(DDP(wide_net()), compressor, optimizer=opt, plain=True)
        ck.check(plain.momentum is None and plain.warmup_steps == 0, f"{compressor!r}: plain=True, error feedback only")
    for compressor in (zcoll.GradientQuantizer(bits=8), zcoll.GradientQuantizer(bits=4), zcoll.HalfPrecision("bf16")):
        state = zcoll.torch.apply_gradient_compression(DDP(wide_net()), compressor)
        ck.check(state.momentum is None and state.warmup_steps == 0, f"{compressor!r}: no recipe needed")


def case_refusals(ck: Checks):
    model = DDP(wide_net())
    pg = model.process_group
    ck.raises(
        TypeError,
        lambda: CompressionState(pg, zcoll.TopK(0.01), optimizer=torch.optim.RMSprop(model.parameters())),
        "SGD, Adam and AdamW",
    )
    ck.raises(
        ValueError,
        lambda: CompressionState(
            pg,
            zcoll.TopK(0.01),
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True),
        ),
        "nesterov",
    )
    ck.raises(
        ValueError,
        lambda: CompressionState(pg, zcoll.TopK(0.01), optimizer=torch.optim.SGD(model.parameters(), lr=0.1)),
        "momentum=0",
    )
    ck.raises(
        ValueError,
        lambda: CompressionState(
            pg, zcoll.TopK(0.01), optimizer=torch.optim.Adam(model.parameters(), amsgrad=True)
        ),
        "amsgrad",
    )
    acc = zcoll.torch.optim.Adam(model.parameters(), gradient_accumulation_steps=2)
    ck.raises(ValueError, lambda: CompressionState(pg, zcoll.TopK(0.01), optimizer=acc), "accumulation")
    opt = torch.optim.Adam(model.parameters())
    zcoll.torch.apply_gradient_compression(model, zcoll.TopK(0.01), 0, optimizer=opt)
    x, y, _, _ = batch(0)
    ck.raises(RuntimeError, lambda: F.cross_entropy(model(x), y).backward(), "warmup_steps >= 1")


if __name__ == "__main__":
    run_cases(globals(), teardown=dist.destroy_process_group)
