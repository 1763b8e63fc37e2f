"""Optimizers that accumulate gradients over N micro-batches (see ``zcoll.torch.accumulate``).

``Adam``, ``AdamW`` and ``SGD`` are the torch optimizers (LR schedulers and ``isinstance`` work)
plus two keyword arguments: ``gradient_accumulation_steps`` (N) and ``model`` (the DDP module,
whose synchronisation is then skipped on micro-batches 1..N-1). ``GradientAccumulator`` wraps
any other optimizer the same way. The accumulation counter is not part of ``state_dict()``.

Example::

    opt = zcoll.torch.optim.Adam(ddp_model.parameters(), lr=1e-3,
                                 gradient_accumulation_steps=4, model=ddp_model)
    for x, y in loader:
        loss_fn(ddp_model(x), y).backward()
        opt.step()          # an Adam update on every 4th call, gradients averaged over the 4
        opt.zero_grad()
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from .accumulate import AccumulationSchedule, GradientAccumulator, scale_grads


class _Accumulating:
    """Mixin in front of a torch optimizer class: step() and zero_grad() follow the schedule."""

    _accumulation: AccumulationSchedule
    updated: bool

    def _init_accumulation(self, steps: int, model: Optional[Any]) -> None:
        self._accumulation = AccumulationSchedule(steps, model)
        self.updated = False

    @property
    def gradient_accumulation_steps(self) -> int:
        return self._accumulation.steps

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.updated = self._accumulation.advance()
        if self.updated:
            scale_grads(self.param_groups, 1.0 / self._accumulation.steps)  # type: ignore[attr-defined]
            super().step()  # type: ignore[misc]
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._accumulation.at_boundary:
            super().zero_grad(set_to_none=set_to_none)  # type: ignore[misc]


def _accumulating(base: type) -> type:
    def __init__(
        self, params, *args, gradient_accumulation_steps: int = 1, model: Optional[Any] = None, **kwargs
    ):
        base.__init__(self, params, *args, **kwargs)
        self._init_accumulation(gradient_accumulation_steps, model)

    doc = (
        f"torch.optim.{base.__name__} with ``gradient_accumulation_steps=N`` and ``model=ddp_model`` "
        "(see zcoll.torch.optim)."
    )
    return type(
        base.__name__, (_Accumulating, base), {"__init__": __init__, "__doc__": doc, "__module__": __name__}
    )


Adam = _accumulating(torch.optim.Adam)
AdamW = _accumulating(torch.optim.AdamW)
SGD = _accumulating(torch.optim.SGD)

__all__ = ["Adam", "AdamW", "SGD", "GradientAccumulator"]
