"""Gradient accumulation that keeps the usual training loop and communicates once per N steps.

The loop stays ``loss.backward(); opt.step(); opt.zero_grad()`` every micro-batch. With
``steps=N``:

1. ``step()`` counts micro-batches; only the N-th runs the optimizer, after dividing the summed
   gradients by N, so the update equals one step on the N-times larger batch (mean losses, equal
   micro-batches).
2. ``zero_grad()`` clears only at a boundary (before the first micro-batch and after a real
   update); in between it keeps the accumulated gradients.
3. Given the DDP model, it switches DDP's gradient synchronisation (``require_backward_grad_sync``,
   what ``no_sync()`` sets) off for micro-batches 1..N-1 and on for the N-th, so gradients cross
   the network once per update: N times fewer bytes. Without the model the result is the same,
   but every backward communicates.

:class:`GradientAccumulator` wraps any optimizer; ``zcoll.torch.optim`` has Adam, AdamW and SGD
taking ``gradient_accumulation_steps=`` directly.

Example::

    opt = GradientAccumulator(torch.optim.SGD(model.parameters(), lr=0.1), steps=4, model=model)
    for x, y in loader:
        loss_fn(model(x), y).backward()
        opt.step()            # updates on every 4th call
        opt.zero_grad()       # clears only after an update
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import torch


class AccumulationSchedule:
    """The counter both forms share: micro-batch index, boundaries, DDP sync switch."""

    __slots__ = ("steps", "micro", "model")

    def __init__(self, steps: int, model: Optional[Any] = None):
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(f"gradient accumulation steps must be an integer >= 1, got {steps!r}")
        if model is not None and not hasattr(model, "require_backward_grad_sync"):
            raise TypeError(
                f"model must be the DistributedDataParallel module (to skip its synchronisation), got "
                f"{type(model).__name__}"
            )
        self.steps = steps
        self.micro = 0  # micro-batches accumulated since the last update
        self.model = model
        self._set_sync()

    @property
    def at_boundary(self) -> bool:
        return self.micro == 0

    def _set_sync(self) -> None:
        if self.model is not None:
            self.model.require_backward_grad_sync = self.micro == self.steps - 1

    def advance(self) -> bool:
        """Counts one micro-batch; True when this one completes an update."""
        self.micro += 1
        update = self.micro == self.steps
        if update:
            self.micro = 0
        self._set_sync()
        return update


def scale_grads(param_groups: Iterable[dict], factor: float) -> None:
    if factor == 1.0:
        return
    for group in param_groups:
        for p in group["params"]:
            if p.grad is not None:
                p.grad.mul_(factor)


class GradientAccumulator:
    """Wraps an optimizer so that it updates every `steps` calls to ``step()`` (module docstring).

    ``optimizer`` stays reachable (LR schedulers take ``acc.optimizer``; step them when
    ``acc.updated``); ``param_groups``, ``state``, ``state_dict`` and ``load_state_dict`` pass through.

    Example::

        acc = GradientAccumulator(torch.optim.Adam(model.parameters(), 1e-3), steps=4, model=ddp_model)
    """

    def __init__(self, optimizer: torch.optim.Optimizer, steps: int, model: Optional[Any] = None):
        self.optimizer = optimizer
        self.schedule = AccumulationSchedule(steps, model)
        self.updated = False  # whether the last step() ran the optimizer

    @property
    def steps(self) -> int:
        return self.schedule.steps

    @property
    def param_groups(self) -> list:
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        return self.optimizer.state

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.updated = self.schedule.advance()
        if self.updated:
            scale_grads(self.optimizer.param_groups, 1.0 / self.steps)
            self.optimizer.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.schedule.at_boundary:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "micro": self.schedule.micro}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.micro = int(state["micro"])
        self.schedule._set_sync()

    def __repr__(self) -> str:
        s = self.schedule
        return f"GradientAccumulator(steps={s.steps}, micro={s.micro}, optimizer={self.optimizer!r})"
