"""Error feedback across methods: each bucket's residual lives in the compressor of the method it
last went with, or here when it last went uncompressed, and follows the bucket when its method
changes (a trial step, a decision, an escalation)."""

from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from ..compression.methods import make_compressor


class ResidualStore:
    """One compressor per method (made on first use) and which one holds each key's residual.
    norm_sample: elements each compressor sums for the residual-to-gradient ratio (0: none)."""

    def __init__(self, norm_sample: int):
        self.norm_sample = norm_sample
        self.compressors: Dict[str, Any] = {}
        self.method_of: Dict[str, str] = {}  # key -> the method whose compressor holds its residual
        self._uncompressed: Dict[str, np.ndarray] = {}  # residuals of keys last sent uncompressed

    def compressor(self, method: str) -> Any:
        if method not in self.compressors:
            c = self.compressors[method] = make_compressor(method)
            c.norm_sample = self.norm_sample
        return self.compressors[method]

    def residual(self, key: str) -> Optional[np.ndarray]:
        m = self.method_of.get(key, "none")
        return self._uncompressed.get(key) if m == "none" else self.compressors[m].residual(key)

    def residual_at(self, key: str, idx: np.ndarray) -> np.ndarray:
        e = self.residual(key)
        return np.zeros(len(idx), np.float32) if e is None else e.reshape(-1)[idx]

    def reset(self, key: Optional[str] = None) -> None:
        for c in self.compressors.values():
            c.reset(key)
        if key is None:
            self._uncompressed.clear()
        else:
            self._uncompressed.pop(key, None)

    def set_residual(self, key: str, values: Any) -> None:
        m = self.method_of.get(key, "none")
        if m == "none":
            self._uncompressed[key] = np.array(values, dtype=np.float32, copy=True).reshape(-1)
        else:
            self.compressors[m].set_residual(key, values)

    def switch(self, key: str, method: str, buf: np.ndarray) -> None:
        """Moves key's residual to `method`'s compressor; into the buffer when it goes dense."""
        old = self.method_of.get(key, "none")
        if old == method:
            return
        e = self.residual(key)
        e = None if e is None else e.reshape(-1)  # no copy: reset() below lets go of it
        self.reset(key)
        self.method_of[key] = method
        if e is not None and e.size == buf.size:
            if method == "none":
                buf += e
            else:
                self.compressor(method).set_residual(key, e)  # (its first call may come later)

    def state_dict(self) -> Dict[str, Any]:
        return {
            "compressors": {m: c.state_dict() for m, c in self.compressors.items()},
            "method_of": dict(self.method_of),
            "pending": {k: v.copy() for k, v in self._uncompressed.items()},
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        for m, s in state["compressors"].items():
            self.compressor(m).load_state_dict(s)
        self.method_of = dict(state["method_of"])
        self._uncompressed = {k: np.array(v, np.float32) for k, v in state["pending"].items()}
