"""Per-bucket state of a DDP communication hook that follows its parameters when DDP rebuilds
its buckets.

DDP puts every parameter in one bucket for the first step, then rebuilds the buckets in the
order the gradients became ready (by default a first bucket of 1 MiB, then 25 MiB). A hook that
keeps state per bucket (an error-feedback residual, a momentum buffer) must move it with the
parameters, or what one step did not send is silently dropped, or added to other parameters.

:class:`BucketLayouts` records which parameters each bucket key holds, at which offsets, and
moves every registered flat buffer when a key's parameters change:

1. ``place(key, params)`` before a bucket's state is used: when `key` is new or now holds other
   parameters, each buffer kind builds the key's new flat buffer from the slices its parameters
   had in their previous buckets (zeros for a parameter that had none);
2. a previous bucket's buffers are freed once none of its parameters remains in it.

A buffer kind is a pair of functions ``get(key) -> 1-D array or None`` and ``put(key, values or
None)`` (numpy arrays and torch tensors both work), so the compressor's residuals (numpy, inside
the compressor) and the hook's torch buffers move with the same code.

Example::

    layouts = BucketLayouts()
    layouts.register("residual", compressor.residual, put_residual)
    layouts.place("ddp/bucket0/1059850", tuple(bucket.parameters()))
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

Getter = Callable[[str], Any]
Putter = Callable[[str, Any], None]


class BucketLayouts:
    """Which parameters each bucket key holds; buffers that follow them (see module docstring)."""

    __slots__ = ("params", "_where", "_parked", "_kinds")

    def __init__(self) -> None:
        self.params: Dict[str, Tuple[torch.Tensor, ...]] = {}  # key -> its parameters, in bucket order
        self._where: Dict[torch.Tensor, Tuple[str, int]] = {}  # parameter -> (key, offset)
        self._parked: Dict[torch.Tensor, Dict[str, Any]] = {}  # parameter -> {kind: its slice}
        self._kinds: Dict[str, Tuple[Getter, Putter]] = {}

    def register(self, name: str, get: Getter, put: Putter) -> None:
        self._kinds[name] = (get, put)

    def place(self, key: str, params: Tuple[torch.Tensor, ...]) -> bool:
        """Moves every buffer kind's slices of `params` into `key` if its layout changed.
        Returns True when it did (a new key or a rebuilt bucket)."""
        old = self.params.get(key)
        if old is not None and len(old) == len(params) and all(a is b for a, b in zip(old, params)):
            return False
        offsets = _offsets(params)
        moved = {name: self._gather(name, get, params, offsets) for name, (get, _) in self._kinds.items()}
        previous = {self._where[p][0] for p in params if p in self._where}
        if old is not None:  # parameters `key` held and no longer holds wait for their next bucket
            kept = set(params)
            for p in old:
                if p not in kept and self._where.get(p, ("",))[0] == key:
                    self._park(p)
        for p, off in zip(params, offsets):
            self._where[p] = (key, off)
            self._parked.pop(p, None)
        self.params[key] = params
        for stale in previous - {key}:
            if not any(self._where.get(q, ("",))[0] == stale for q in self.params[stale]):
                self._drop(stale)
        for name, (_, put) in self._kinds.items():
            put(key, moved[name])
        return True

    def cover(self, params: Tuple[torch.Tensor, ...]) -> Optional[List[Tuple[str, Tuple[torch.Tensor, ...]]]]:
        """The known buckets whose parameters are exactly `params` together (in the order they
        were placed, the same on every rank), or None when they are not."""
        keys = []
        for p in params:
            where = self._where.get(p)
            if where is None:
                return None
            if where[0] not in keys:
                keys.append(where[0])
        if sum(len(self.params[k]) for k in keys) != len(params):
            return None
        return [(k, self.params[k]) for k in self.params if k in keys]

    def slice_of(self, param: torch.Tensor) -> Optional[Tuple[str, int, int]]:
        """(key, offset, numel) of a parameter's slice in its current bucket, or None."""
        where = self._where.get(param)
        return None if where is None else (where[0], where[1], param.numel())

    def state_dict(self, index: Dict[torch.Tensor, int]) -> Dict[str, List[int]]:
        """The layouts with parameters named by their position in `index` (model order)."""
        return {key: [index[p] for p in params] for key, params in self.params.items()}

    def load_state_dict(self, layouts: Dict[str, List[int]], params: List[torch.Tensor]) -> None:
        named = max((max(ps) for ps in layouts.values() if ps), default=-1) + 1
        if named > len(params):
            raise ValueError(
                f"the saved bucket layouts name {named} parameters, this CompressionState knows {len(params)}: "
                "create it with parameters= (or optimizer=) of the same model, as apply_gradient_compression does"
            )
        self.params, self._where, self._parked = {}, {}, {}
        for key, positions in layouts.items():
            ps = tuple(params[i] for i in positions)
            self.params[key] = ps
            for p, off in zip(ps, _offsets(ps)):
                self._where[p] = (key, off)

    # -- helpers ------------------------------------------------------------------------------
    def _slice(self, name: str, get: Getter, p: torch.Tensor) -> Any:
        """A parameter's current slice of one buffer kind, or None."""
        if p in self._parked:
            return self._parked[p].get(name)
        where = self._where.get(p)
        src = get(where[0]) if where else None
        return None if src is None else src[where[1] : where[1] + p.numel()]

    def _gather(
        self, name: str, get: Getter, params: Tuple[torch.Tensor, ...], offsets: List[int]
    ) -> Optional[torch.Tensor]:
        """The new flat buffer of a key holding `params`, from their previous slices; None when
        none of them had any (a new key keeps no buffer until its owner makes one)."""
        out = None
        for p, off in zip(params, offsets):
            piece = self._slice(name, get, p)
            if piece is None:
                continue
            if out is None:
                out = torch.zeros(offsets[-1] + params[-1].numel(), dtype=torch.float32)
            out[off : off + p.numel()] = torch.from_numpy(piece) if isinstance(piece, np.ndarray) else piece
        return out

    def _park(self, p: torch.Tensor) -> None:
        slices = {}
        for name, (get, _) in self._kinds.items():
            piece = self._slice(name, get, p)
            if piece is not None:
                slices[name] = torch.tensor(piece) if isinstance(piece, np.ndarray) else piece.clone()
        self._parked[p] = slices
        del self._where[p]

    def _drop(self, key: str) -> None:
        for _, put in self._kinds.values():
            put(key, None)
        del self.params[key]


def _offsets(params: Tuple[torch.Tensor, ...]) -> List[int]:
    offsets, off = [], 0
    for p in params:
        offsets.append(off)
        off += p.numel()
    return offsets
