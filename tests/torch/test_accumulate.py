"""Gradient accumulation on one process (zcoll.torch.accumulate, zcoll.torch.optim): the
accumulating optimizers equal the large-batch step, the schedule of DDP's gradient sync, and the
argument errors. With DDP on several ranks: tests/torch/test_ddp.py."""

import pytest
import torch
import torch.nn.functional as F
import zcoll.torch
from zcoll.torch.accumulate import AccumulationSchedule


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _data(rows, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 6, generator=g), torch.randint(0, 3, (rows,), generator=g)


def _train(make_opt, n, updates, micro=4):
    model = _net()
    opt = make_opt(model)
    for u in range(updates):
        x, y = _data(n * micro, u)
        for k in range(n):
            F.cross_entropy(model(x[k * micro : (k + 1) * micro]), y[k * micro : (k + 1) * micro]).backward()
            opt.step()
            opt.zero_grad()
    return model


def _reference(opt_cls, n, updates, micro=4, **kw):
    return _train(lambda m: opt_cls(m.parameters(), **kw), 1, updates, micro * n)


def _max_diff(a, b):
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize(
    "cls,kw",
    [
        (zcoll.torch.optim.Adam, {"lr": 1e-2}),
        (zcoll.torch.optim.AdamW, {"lr": 1e-2}),
        (zcoll.torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
    ],
)
def test_accumulating_optimizers_equal_the_large_batch(cls, kw):
    base = cls.__mro__[2]
    got = _train(lambda m: cls(m.parameters(), gradient_accumulation_steps=4, **kw), 4, 3)
    assert isinstance(got, torch.nn.Module) and issubclass(cls, torch.optim.Optimizer)
    assert _max_diff(got, _reference(base, 4, 3, **kw)) < 1e-6


def test_gradient_accumulator_wraps_any_optimizer():
    got = _train(
        lambda m: zcoll.torch.GradientAccumulator(torch.optim.RMSprop(m.parameters(), lr=1e-2), 3), 3, 2
    )
    assert _max_diff(got, _reference(torch.optim.RMSprop, 3, 2, lr=1e-2)) < 1e-6


def test_steps_one_is_the_plain_optimizer():
    got = _train(lambda m: zcoll.torch.optim.SGD(m.parameters(), lr=0.1), 1, 3)
    assert _max_diff(got, _reference(torch.optim.SGD, 1, 3, lr=0.1)) == 0


def test_update_only_every_nth_step_and_zero_grad_only_after_it():
    model = _net()
    opt = zcoll.torch.optim.SGD(model.parameters(), lr=0.1, gradient_accumulation_steps=3)
    w0 = model[0].weight.detach().clone()
    x, y = _data(4, 0)
    for k in range(1, 4):
        F.cross_entropy(model(x), y).backward()
        g = model[0].weight.grad.clone()
        opt.step()
        opt.zero_grad()
        if k < 3:
            assert (
                not opt.updated and torch.equal(model[0].weight, w0) and torch.equal(model[0].weight.grad, g)
            )
    assert opt.updated and not torch.equal(model[0].weight, w0) and model[0].weight.grad is None


def test_schedule_switches_ddp_sync_for_the_last_micro_batch_only():
    class FakeDDP:
        require_backward_grad_sync = True

    m = FakeDDP()
    s = AccumulationSchedule(3, m)
    seen = []
    for _ in range(6):
        seen.append(m.require_backward_grad_sync)
        s.advance()
    assert seen == [False, False, True, False, False, True]


def test_accumulation_argument_errors():
    with pytest.raises(ValueError, match="integer >= 1"):
        zcoll.torch.optim.Adam(_net().parameters(), gradient_accumulation_steps=0)
    with pytest.raises(TypeError, match="DistributedDataParallel"):
        zcoll.torch.GradientAccumulator(torch.optim.SGD(_net().parameters(), lr=1), 2, model=_net())
