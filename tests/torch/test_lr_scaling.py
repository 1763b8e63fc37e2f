"""zcoll.torch.lr_scaling: the learning-rate rule for a changed global batch (no MPI)."""

from __future__ import annotations

import math

import pytest
import torch
from zcoll.torch import LRScaling, global_batch
from zcoll.torch.lr_scaling import scale_factor


def optimizer(lr: float = 1e-3) -> torch.optim.Optimizer:
    return torch.optim.Adam([torch.nn.Parameter(torch.zeros(3))], lr=lr)


def rates(opt: torch.optim.Optimizer, scaling: LRScaling, updates: int) -> list:
    out = []
    for _ in range(updates):
        opt.step()
        scaling.step()
        out.append(opt.param_groups[0]["lr"])
    return out


def test_global_batch_and_the_rules():
    assert global_batch(32, 4, 2) == 256
    assert scale_factor("linear", 512, 256) == 2.0
    assert scale_factor("sqrt", 1024, 256) == 2.0
    assert scale_factor("none", 1024, 256) == 1.0
    with pytest.raises(ValueError, match="unknown learning-rate rule 'cubic'"):
        scale_factor("cubic", 1, 1)
    with pytest.raises(ValueError, match="ranks must be an integer >= 1"):
        global_batch(32, 0)


def test_warm_up_to_the_scaled_rate_then_hold():
    opt = optimizer(1e-3)
    scaling = LRScaling(opt, base_batch=256, rule="linear", warmup_steps=4, batch=1024)
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3)  # the base rate before any update
    assert rates(opt, scaling, 6) == pytest.approx([1.75e-3, 2.5e-3, 3.25e-3, 4e-3, 4e-3, 4e-3])


def test_a_world_that_shrinks_moves_the_rate_gradually():
    """4 ranks -> 3 ranks (a lost rank, the same micro-batch): the global batch falls to 3/4 and
    the square-root rule's rate with it, over the warm-up, from the rate in force."""
    opt = optimizer(1e-3)
    scaling = LRScaling(opt, base_batch=global_batch(16, 4), rule="sqrt", warmup_steps=2)
    rates(opt, scaling, 3)
    scaling.set_batch(global_batch(16, 3))
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3)  # no jump when the batch changes
    want = 1e-3 * math.sqrt(3 / 4)
    assert rates(opt, scaling, 3) == pytest.approx([1e-3 + (want - 1e-3) / 2, want, want])
    assert scaling.batch == 48


def test_without_warm_up_the_rate_changes_at_once():
    opt = optimizer(2e-3)
    scaling = LRScaling(opt, base_batch=64, rule="linear")
    scaling.set_batch(32)
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3)
    with pytest.raises(ValueError, match="warmup_steps must be an integer >= 0"):
        LRScaling(optimizer(), base_batch=64, warmup_steps=-1)
