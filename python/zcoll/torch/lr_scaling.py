"""The learning-rate rule for a changed global batch: when ranks x micro-batch x accumulation steps
differs from the batch the learning rate was tuned for, the rate follows a declared rule.

- ``linear``: lr x (batch / base_batch) (Goyal et al. 2017, for SGD; with a gradual warm-up);
- ``sqrt``: lr x sqrt(batch / base_batch) (Malladi et al. 2022, for Adam and AdamW);
- ``none``: unchanged.

The new rate is reached over ``warmup_steps`` optimizer updates, linearly from the rate in force
when the batch changed (at the start: from the base rate), so a jump in batch size (a world
that shrinks or grows, more accumulation steps) never jumps the rate. It is a torch LR scheduler
that sets each group's rate to its base rate times the factor: call ``step()`` after each
optimizer update.

Example::

    opt = zcoll.torch.optim.Adam(ddp.parameters(), lr=1e-3, gradient_accumulation_steps=4, model=ddp)
    scaling = zcoll.torch.LRScaling(opt, base_batch=256, rule="sqrt", warmup_steps=50)
    scaling.set_batch(zcoll.torch.global_batch(32, world_size, 4))   # 32 rows per rank per micro-batch
    for x, y in loader:
        loss_fn(ddp(x), y).backward(); opt.step(); opt.zero_grad()
        if getattr(opt, "updated", True):
            scaling.step()
"""

from __future__ import annotations

import math
from typing import Any, List

from torch.optim.lr_scheduler import LRScheduler

RULES = ("linear", "sqrt", "none")


def global_batch(micro_batch: int, ranks: int, accumulation_steps: int = 1) -> int:
    """Rows per optimizer update over the job: micro-batch rows per rank x ranks x accumulation."""
    for name, v in (("micro_batch", micro_batch), ("ranks", ranks), ("accumulation_steps", accumulation_steps)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    return micro_batch * ranks * accumulation_steps


def scale_factor(rule: str, batch: int, base_batch: int) -> float:
    """How many times the base rate `rule` gives a global batch of `batch` rows."""
    if rule not in RULES:
        raise ValueError(f"unknown learning-rate rule {rule!r}; choose from {', '.join(RULES)}")
    if batch < 1 or base_batch < 1:
        raise ValueError(f"batch sizes must be >= 1, got batch {batch} and base_batch {base_batch}")
    ratio = batch / base_batch
    return ratio if rule == "linear" else math.sqrt(ratio) if rule == "sqrt" else 1.0


class LRScaling(LRScheduler):
    """Scales every parameter group's rate by the rule's factor for the current global batch,
    ramped over warmup_steps updates (see the module docstring)."""

    def __init__(self, optimizer: Any, base_batch: int, rule: str = "linear", warmup_steps: int = 0,
                 batch: int = None, last_epoch: int = -1):  # fmt: skip
        scale_factor(rule, base_batch, base_batch)  # validates
        if not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {warmup_steps!r}")
        self.rule, self.base_batch, self.warmup_steps = rule, int(base_batch), warmup_steps
        self.batch = int(base_batch if batch is None else batch)
        self._from, self._to, self._since = 1.0, scale_factor(rule, self.batch, self.base_batch), 0
        super().__init__(optimizer, last_epoch)

    @property
    def factor(self) -> float:
        """The factor in force: between the old and the new batch's while warming up."""
        if self.warmup_steps == 0:
            return self._to
        done = min(1.0, max(0, self.last_epoch - self._since) / self.warmup_steps)
        return self._from + (self._to - self._from) * done

    def set_batch(self, batch: int) -> None:
        """The global batch is now `batch` rows (a world that shrank, more accumulation steps):
        the rate moves to the rule's factor for it over the next warmup_steps updates."""
        target = scale_factor(self.rule, batch, self.base_batch)
        self._from, self._to, self._since, self.batch = self.factor, target, self.last_epoch, int(batch)
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr

    def get_lr(self) -> List[float]:
        return [base * self.factor for base in self.base_lrs]
