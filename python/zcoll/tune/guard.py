"""The accuracy guard of ``compression="auto"``: per-step metrics of every compressed bucket, an
exact check every ``check_every`` steps, and the method each bucket is escalated to or relaxed
back from.

The exact check: at ``sample`` indices (the same on every rank, from the key and the step) what
each rank meant to send (its gradient plus the residual it carried minus the one it keeps) is
averaged uncompressed and compared with the compressed result (``error``: lost beyond error
feedback; ``step_error``, against the average gradient, is logged only: error feedback sends that
part later). ``error`` above ``bound`` escalates the bucket one step (compression_model.ESCALATION:
sign/top-k -> int4 -> int8 -> bf16 -> none); ``calm_checks`` checks in a row under a quarter of it
step back down one (hysteresis). Optional ``residual_bound``: a mean residual-to-gradient ratio
above it escalates too (error feedback's debt growing; under half of it counts as calm).
"""

from __future__ import annotations

import math
import time
import zlib
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import compression_model as cm


class Spent:
    """Wall seconds and this thread's CPU seconds spent inside ``with`` blocks, until taken."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def __enter__(self) -> "Spent":
        self._wall0, self._cpu0 = time.perf_counter(), time.thread_time()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.wall += time.perf_counter() - self._wall0
        self.cpu += time.thread_time() - self._cpu0

    def take(self) -> Tuple[float, float]:
        spent, (self.wall, self.cpu) = (self.wall, self.cpu), (0.0, 0.0)
        return spent


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """||got - want|| / ||want|| (||got|| when want is 0; inf when not finite)."""
    norm = float(np.linalg.norm(want))
    err = float(np.linalg.norm(got - want)) / norm if norm > 0 else float(np.linalg.norm(got))
    return err if math.isfinite(err) else math.inf


class Guard:
    """The guard's state: each bucket's method path (the decision, then its escalations; the
    last is in use), the checks waiting for the next exact check, and the guard's own time."""

    def __init__(self, config: Any, log: Callable[..., None]):
        self.config, self._log = config, log
        self.path: Dict[str, List[str]] = {}  # key -> [decided method, escalations...]; last = in use
        self._calm: Dict[str, int] = {}
        self._residual_ratio: Dict[str, float] = {}
        self.pending: List[Tuple[str, str, np.ndarray, np.ndarray]] = []  # key, method, meant+grad, got
        # the guard's own wall time and this thread's CPU time in it, summed at each check
        # (guard_cost events); the wall time includes waiting for the GIL and the cores
        self.seconds = self.cpu_seconds = 0.0
        self.spent = Spent()  # since the last check
        self._since: Optional[int] = None  # the step of the first call, then of the last check

    def set_path(self, key: str, path: List[str]) -> None:
        self.path[key] = path
        self._calm[key] = 0

    def started(self, step: int) -> None:
        if self._since is None:
            self._since = step

    def sample_indices(self, key: str, step: int, n: int) -> np.ndarray:
        """An exact check's `sample` indices of a bucket of n elements: every stride-th element
        from an offset drawn from (seed, key, step), so the same on every rank, different at
        every check, spread over every layer, sorted and without repeats (a random draw,
        sorted and deduplicated, cost 0.35 ms of the hook's worker at each check under load)."""
        k = min(n, self.config.sample)
        if k == 0:
            return np.zeros(0, np.int64)
        stride = n // k
        offset = zlib.crc32(f"{self.config.seed}/{key}/{step}".encode()) % stride
        return offset + stride * np.arange(k, dtype=np.int64)

    def bucket_metrics(
        self, metrics: Any, key: str, method: str, step: int, stats: Any, seconds: float
    ) -> None:
        """The step's metrics of one bucket; the residual-to-gradient norm ratio estimated on
        the same `sample` elements of both, summed by the collective (full norms would cost ~1%
        of a small step; the same sums as numpy calls here cost ~30 us each)."""
        grad, kept = stats.input_squares, stats.residual_squares
        r = math.sqrt(kept / grad) if grad else 0.0
        self._residual_ratio[key] = r
        if metrics is None:
            return
        if metrics.server is not None:  # the gauges are for Prometheus only
            metrics.set("zcoll_compression_ratio", stats.ratio, bucket=key, method=method)
            metrics.set("zcoll_compression_residual_ratio", r, bucket=key, method=method)
            metrics.set("zcoll_compression_comm_seconds", seconds, bucket=key, method=method)
        metrics.write_bucket(step, key, method, stats.ratio, r, stats.nonfinite, seconds)

    def keep_check(self, key: str, method: str, meant: np.ndarray, grad: np.ndarray, got: np.ndarray) -> None:
        """A sampled bucket's halves for the next exact check (meant: gradient + carried - kept)."""
        both = np.concatenate([meant, grad, [self._residual_ratio.get(key, 0.0)]]).astype(np.float32)
        self.pending.append((key, method, both, got))

    def check(self, comm: Any, step: int, metrics: Any) -> None:
        """Collective (one allreduce when anything was sampled, on every rank alike): the
        sampled checks' verdicts."""
        checks, self.pending = self.pending, []
        if not checks:
            return
        total = comm.allreduce(np.concatenate([both for _, _, both, _ in checks]), op="sum") / comm.size
        off = 0
        for key, method, _, got in checks:
            n = got.size
            meant, grad = total[off : off + n], total[off + n : off + 2 * n]
            residual = float(total[off + 2 * n])
            off += 2 * n + 1
            self.judge(
                key, method, relative_error(got, meant), relative_error(got, grad), residual, step, metrics
            )

    def judge(self, key: str, method: str, err: float, step_err: float, residual: float, step: int,
              metrics: Any = None) -> None:  # fmt: skip
        """err: what the result lost beyond what error feedback carries over; step_err: against
        the average gradient; residual: the ranks' mean residual-to-gradient norm ratio."""
        bound, residual_bound = self.config.bound, self.config.residual_bound
        if metrics is not None:
            metrics.set("zcoll_compression_check_error", min(err, 1e300), bucket=key, method=method)
            metrics.set("zcoll_compression_step_error", min(step_err, 1e300), bucket=key, method=method)
        self._log("check", step=step, bucket=key, method=method, error=err, bound=bound, step_error=step_err,
                  residual_ratio=residual)  # fmt: skip
        path = self.path.get(key)
        if path is None or path[-1] != method:
            return
        owed = residual_bound is not None and residual > residual_bound
        calm = err < bound / 4 and (residual_bound is None or residual < residual_bound / 2)
        if (err > bound or owed) and method in cm.ESCALATION:
            up = cm.ESCALATION[method]
            path.append(up)
            self._calm[key] = 0
            if metrics is not None:
                metrics.add("zcoll_compression_escalations_total", 1, bucket=key)
            self._log("escalate", step=step, bucket=key, method=up, previous=method, error=err, bound=bound)
        elif len(path) > 1 and calm:
            self._calm[key] += 1
            if self._calm[key] >= self.config.calm_checks:
                path.pop()
                self._calm[key] = 0
                self._log("relax", step=step, bucket=key, method=path[-1], previous=method, error=err)
        else:
            self._calm[key] = 0

    def log_cost(self, step: int) -> None:
        """The guard's own time (sampling, metrics, the exact check) per step since the last
        check: its overhead, measured where it is spent rather than as a difference of two
        noisy step times."""
        wall, cpu = self.spent.take()
        steps = step - (self._since or 0)
        if steps > 0:
            self._log("guard_cost", step=step, steps=steps, seconds=wall, per_step_s=wall / steps, cpu_seconds=cpu,
                      cpu_per_step_s=cpu / steps)  # fmt: skip
        self.seconds += wall
        self.cpu_seconds += cpu
        self._since = step

    def state_dict(self) -> Dict[str, Any]:
        return {"path": {k: list(p) for k, p in self.path.items()}}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.path = {k: list(p) for k, p in state["path"].items()}
        self._calm = {k: 0 for k in self.path}
