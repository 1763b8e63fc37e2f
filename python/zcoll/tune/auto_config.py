"""What ``compression="auto"`` may do and how it judges: one dataclass, checked when made."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ..compression.methods import METHODS
from . import compression_model as cm

# The guard's bound on the relative L2 error of a compressed average against the exact average
# of what the ranks meant to send (gradient + carried residual - kept residual): zcoll's codecs
# keep every rounding, hops included, in the residuals, so an honest codec measures float
# rounding (0 to ~1e-7 on 2 and 4 ranks, every method); anything near 1e-3 is lost mass.
DEFAULT_BOUND = 1e-3

# A residual-to-gradient norm ratio above this means error feedback owes more than a whole
# gradient: updates arrive more than a step late on average. Measured on the digits MLP (2 ranks,
# the guard's checks every 10 steps): int8 0.02 (max 0.03), int4 0.3 (max 0.6), sign 3-16,
# top-1% 6-10: the bound separates the methods that keep up from those that carry a debt. On by
# default (residual_bound=None turns it off): a method that falls behind is escalated.
RESIDUAL_BOUND = 1.0

# The most a candidate's compressed average may differ from the exact average in the trials
# (relative L2 norm, error feedback included) for auto to choose it. Measured on the trial calls
# of bench/tta.py's three workloads at 2 ranks, every method a candidate (docs/results.md): bf16
# 0.22-0.30%, int8 1.3-1.8%, int4 21-28%, sign 94-109%, top-1% 61-83% (cosine 1.0, 0.9999,
# 0.96-0.98, 0.36-0.46, 0.60-0.79): the bound admits the methods that change a step by rounding,
# not the ones that change its direction.
TRIAL_ERROR_BOUND = 0.05

# Uncompressed communication predicted to leave at most this fraction of a step exposed is hidden
# behind the backward pass: no lossy method is chosen, whatever it would save on the wire.
HIDDEN = 0.05


@dataclass
class AutoConfig:
    """methods: candidates, least lossy first (compression_model.LOSSINESS; default none, bf16,
    int8); trial_repeats: trial steps (the first warms the candidates up and is not counted), in
    which the model gets the exact average and each candidate runs on a copy of every bucket beside
    it; error_bound: the most a candidate's average may differ from the exact one (relative L2
    norm, median over the trial calls, error feedback included) for it to be chosen (not applied
    to a single method given alone: a guarded fixed method); hidden: when
    uncompressed communication is predicted to leave at most this fraction of a typical step
    exposed (the rest hidden behind the backward pass), nothing lossy is chosen; start_step: the
    first trial step (DDP rebuilds its buckets after step 0); margin / min_gain: see
    compression_model.decide;
    guard: the per-step metrics and exact checks; check_every: steps between exact checks (and
    drift checks); sample: elements per bucket in a check; bound: relative error lost beyond
    error feedback that escalates (DEFAULT_BOUND); residual_bound: a residual-to-gradient norm
    ratio (the ranks' mean at a check) that escalates too (None: off; RESIDUAL_BOUND, 1.0, the
    default, is the calibrated one); calm_checks: quiet checks before stepping back down;
    drift: relative drift of measured from predicted communication time (each bucket's median
    call times its calls) that re-decides (at two checks in a row; 0.5: the noise of a shared
    machine stays below it); diagnose_every: steps between link diagnoses (0: never; a changed
    verdict re-decides); metrics_path: JSON-lines log (rank 0 writes it); metrics_port:
    Prometheus (None: ZCOLL_METRICS_PORT; each rank on port + rank).
    test_corrupt_fraction (tests only): overwrites that fraction of a compressed result's values
    (the same ones on every rank) with 1e3 times the bucket's largest value."""

    methods: Sequence[str] = cm.CANDIDATES
    trial_repeats: int = 5
    error_bound: float = TRIAL_ERROR_BOUND
    hidden: float = HIDDEN
    start_step: int = 1
    margin: float = 0.05
    min_gain: float = 0.05
    guard: bool = True
    check_every: int = 50
    sample: int = 4096
    bound: float = DEFAULT_BOUND
    residual_bound: Optional[float] = RESIDUAL_BOUND
    calm_checks: int = 3
    drift: float = 0.5
    diagnose_every: int = 0
    metrics_path: Optional[str] = None
    metrics_port: Optional[int] = None
    seed: int = 0
    test_corrupt_fraction: float = 0.0

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m != "none" and m not in METHODS]
        if unknown or not self.methods:
            raise ValueError(f"unknown methods {unknown}; known: none, {', '.join(METHODS)}")
        counts = (self.trial_repeats, self.start_step, self.check_every, self.sample, self.calm_checks)
        if (
            min(a - b for a, b in zip(counts, (1, 0, 1, 1, 1))) < 0
            or not self.error_bound > 0
            or self.hidden < 0
        ):
            raise ValueError(
                "need trial_repeats >= 2, start_step >= 0, check_every >= 1, sample >= 1, calm_checks >= 1, "
                f"error_bound > 0, hidden >= 0; got {', '.join(map(str, counts))}, {self.error_bound}, {self.hidden}"
            )
        if not 0.0 <= self.test_corrupt_fraction <= 1.0:
            raise ValueError(f"_test_corrupt_fraction must be in [0, 1], got {self.test_corrupt_fraction}")
        self.methods = tuple(dict.fromkeys(self.methods))  # the trials' order
        for name in ("trial_repeats", "start_step", "check_every", "sample", "calm_checks", "diagnose_every"):
            setattr(self, name, int(getattr(self, name)))
        self.guard, self.bound, self.drift = bool(self.guard), float(self.bound), float(self.drift)
        self.residual_bound = None if self.residual_bound is None else float(self.residual_bound)
        self.test_corrupt_fraction = float(self.test_corrupt_fraction)
