"""Momentum correction: once compression starts, the optimizer's momentum moves into the DDP hook.

Why (Deep Gradient Compression, Lin et al. 2018; 1-bit Adam, Tang et al. 2021): error feedback
sends what compression left out later, in one piece. An optimizer that applies momentum (SGD) or
normalises per coordinate (Adam) after the exchange treats those delayed pieces as fresh
gradients: momentum pushes them again for many steps, and Adam's variance, fed spikes T times
larger than the gradient every T steps, shrinks that coordinate's steps by about sqrt(T).
Measured on digits (docs/compression.md): top-1% with Adam lost 5-9 points, sign 3-4.

The rule: before the exchange each rank keeps its own velocity of its local gradient and sends
the step the optimizer would take, compressed; after it, the optimizer only adds the average:

1. Warm-up (CompressionState.warmup_steps): the optimizer runs unchanged on uncompressed
   gradients.
2. At the first compressed step every rank starts its velocity u from the optimizer's momentum
   (SGD: momentum_buffer; Adam: exp_avg) and, for Adam, freezes the variance: the preconditioner
   d = sqrt(max(v, floor * mean(v))) + eps per parameter, v = exp_avg_sq / (1 - beta2^t) (the
   floor, relative to the parameter's mean variance, bounds how far a coordinate that was almost
   never active in the warm-up can be amplified; see ``variance_floor``). SGD: d = 1.
3. Each step, per bucket, on every rank: g' = g + weight_decay * p (SGD, Adam; not AdamW),
   u = beta u + (1 - dampening) g' (Adam: beta1 and 1 - beta1), x = u / d; x is compressed with
   error feedback and averaged over the ranks. Sparsifiers (top-k, threshold, random-k) also
   zero u where this rank sent its value (DGC's momentum factor masking: the velocity that
   pushed a coordinate was just sent with it).
4. The optimizer step becomes p -= lr * avg(x) (Adam: lr / (1 - beta1^t); AdamW first decays
   p *= 1 - lr * weight_decay), done by a step pre-hook on the optimizer, which then leaves the
   gradients None so the optimizer's own update skips them (its state stays as it was at step 2).

Without compression the rule is still an optimizer of its own (Adam with the variance frozen at
the end of the warm-up), so docs/compression.md reports it uncompressed too. Supported: torch's
SGD (no Nesterov), Adam and AdamW (no amsgrad), not maximize, one optimizer step per backward
(no gradient accumulation).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch

SPARSIFIERS = ("TopK", "Threshold", "RandomK")


class MomentumCorrection:
    """The optimizer side of momentum correction (see the module docstring).

    ``optimizer``: a torch.optim.SGD (momentum > 0), Adam or AdamW over the DDP model's
    parameters. ``variance_floor`` (Adam): the preconditioner's floor relative to each parameter's
    mean variance. ``mask``: DGC's momentum factor masking (sparsifiers).

    Example::

        mc = MomentumCorrection(opt, variance_floor=1e-2, mask=True)   # CompressionState does this
    """

    __slots__ = ("optimizer", "kind", "variance_floor", "mask", "active", "_rules", "_t", "_handle")

    def __init__(self, optimizer: Any, variance_floor: float = 1e-2, mask: bool = False):
        self.kind = _kind(optimizer)
        if getattr(optimizer, "gradient_accumulation_steps", 1) != 1:
            raise ValueError(
                "momentum correction needs one optimizer step per backward: no gradient accumulation"
            )
        if not variance_floor >= 0:
            raise ValueError(f"variance_floor must be >= 0, got {variance_floor}")
        self.optimizer = optimizer
        self.variance_floor = float(variance_floor)
        self.mask = bool(mask)
        self.active = False  # True from the first compressed step on
        self._t = 0  # Adam's step count, for its bias correction, once active
        self._rules: Dict[torch.Tensor, Dict[str, Any]] = {}  # parameter -> its group's settings
        for group in optimizer.param_groups:
            _check_group(self.kind, group)
            for p in group["params"]:
                self._rules[p] = group
        self._handle = optimizer.register_step_pre_hook(self._pre_step)

    # -- the hook side ------------------------------------------------------------------------
    def start(self) -> None:
        """Called at the first compressed step, before any bucket of it."""
        if self.active:
            return
        if self.kind != "sgd":
            steps = [_step_of(self.optimizer.state.get(p, {})) for p in self._rules]
            if not steps or min(steps) == 0:
                raise RuntimeError(
                    f"momentum correction with {type(self.optimizer).__name__} freezes its variance at the "
                    "end of the warm-up, but the optimizer has not stepped yet: give CompressionState "
                    "warmup_steps >= 1 (about 5-20% of the training steps)"
                )
            self._t = max(steps)
        self.active = True

    def initial_velocity(self, params: Iterable[torch.Tensor]) -> Optional[torch.Tensor]:
        """A bucket's velocity at the start: the optimizer's momentum of its parameters, flat;
        None when the optimizer has none yet (SGD before its first step: the first velocity is
        then the gradient itself, as torch's SGD starts its momentum buffer)."""
        name = "momentum_buffer" if self.kind == "sgd" else "exp_avg"
        found = [self.optimizer.state.get(p, {}).get(name) for p in params]
        if all(m is None for m in found):
            return None
        return torch.cat(
            [
                torch.zeros(p.numel()) if m is None else m.detach().reshape(-1).float()
                for p, m in zip(params, found)
            ]
        )

    def preconditioner(self, params: Iterable[torch.Tensor]) -> Optional[torch.Tensor]:
        """A bucket's frozen Adam preconditioner d (flat), or None for SGD (d = 1)."""
        if self.kind == "sgd":
            return None
        parts = []
        for p in params:
            group, st = self._rules[p], self.optimizer.state.get(p, {})
            bc2 = 1.0 - group["betas"][1] ** _step_of(st)
            v = st["exp_avg_sq"].detach().reshape(-1).float() / bc2
            floor = self.variance_floor * v.mean()
            parts.append(torch.maximum(v, floor).sqrt_().add_(group["eps"]))
        return torch.cat(parts)

    def velocity_step(
        self,
        buf: torch.Tensor,
        params: Tuple[torch.Tensor, ...],
        u: Optional[torch.Tensor],
        d: Optional[torch.Tensor],
    ) -> torch.Tensor:
        """Step 3 of the module docstring on one bucket: u advances with this rank's gradient in
        `buf` (u None: starts as that gradient), and `buf` becomes x = u / d, the quantity to
        compress. Returns u."""
        off = 0
        for p in params:  # weight decay on the gradient (identical parameters on every rank)
            n = p.numel()
            wd = self._rules[p]["weight_decay"]
            if wd and self.kind != "adamw":
                buf[off : off + n].add_(p.detach().reshape(-1), alpha=wd)
            off += n
        if u is None:
            u = buf.to(torch.float32, copy=True)  # float32 velocity for 2-byte buckets too
        else:
            beta, damp = self._coefficients(params[0])
            u.mul_(beta).add_(buf, alpha=1.0 - damp)
        if d is None:
            buf.copy_(u)
        else:
            torch.div(u, d, out=buf)
        return u

    def mask_sent(self, u: torch.Tensor, residual: Any) -> None:
        """DGC's momentum factor masking: zero the velocity where the residual is zero (sent)."""
        if self.mask and residual is not None:
            u.masked_fill_(torch.from_numpy(residual).reshape(-1) == 0, 0.0)

    # -- the optimizer side -------------------------------------------------------------------
    @torch.no_grad()
    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.active:
            return
        self._t += 1
        for group in optimizer.param_groups:
            lr = group["lr"]
            scale = lr if self.kind == "sgd" else lr / (1.0 - group["betas"][0] ** self._t)
            for p in group["params"]:
                if p.grad is None:
                    continue
                if self.kind == "adamw" and group["weight_decay"]:
                    p.mul_(1.0 - lr * group["weight_decay"])
                p.add_(p.grad, alpha=-scale)
                p.grad = None

    def _coefficients(self, p: torch.Tensor) -> Tuple[float, float]:
        group = self._rules[p]
        if self.kind == "sgd":
            return group["momentum"], group["dampening"]
        beta1 = group["betas"][0]
        return beta1, beta1

    # -- checkpoints --------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        return {"active": self.active, "t": self._t}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.active, self._t = bool(state["active"]), int(state["t"])

    def remove(self) -> None:
        """Unregisters the optimizer pre-hook."""
        self._handle.remove()


def default_variance_floor(compressor: Any) -> float:
    """The measured default floor (docs/compression.md). Preconditioning makes a coordinate with
    almost no variance in the warm-up an outlier of x = u / d, as large as the floor allows:
    codecs whose error follows the block's largest value (int8, int4) and selection by magnitude
    (top-k) suffer from such outliers, so they get the tighter 1e-2 (d >= 0.1 x the parameter's
    RMS); sign, scaled by the block's mean |x|, suffers more from coordinates the floor shrinks
    below that mean, so it gets 1e-4."""
    return 1e-4 if getattr(compressor, "bits", None) == 1 else 1e-2


def _kind(optimizer: Any) -> str:
    if isinstance(optimizer, torch.optim.SGD):
        return "sgd"
    if isinstance(optimizer, torch.optim.AdamW) or (
        isinstance(optimizer, torch.optim.Adam) and optimizer.defaults.get("decoupled_weight_decay")
    ):
        return "adamw"
    if isinstance(optimizer, torch.optim.Adam):
        return "adam"
    raise TypeError(
        f"momentum correction knows the update rules of torch.optim.SGD, Adam and AdamW, got "
        f"{type(optimizer).__name__}; pass optimizer=None to compress gradients with error feedback only"
    )


def _check_group(kind: str, group: Dict[str, Any]) -> None:
    bad: List[str] = []
    if group.get("maximize"):
        bad.append("maximize=True")
    if kind == "sgd":
        if not group["momentum"] > 0:
            bad.append("momentum=0 (nothing to correct: pass optimizer=None)")
        if group["nesterov"]:
            bad.append("nesterov=True")
    elif group.get("amsgrad"):
        bad.append("amsgrad=True")
    if bad:
        raise ValueError(f"momentum correction does not support {', '.join(bad)}")


def _step_of(state: Dict[str, Any]) -> int:
    s = state.get("step", 0)
    return int(s.item()) if torch.is_tensor(s) else int(s)
