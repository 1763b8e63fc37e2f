"""The compression methods by name ("int8", "top1%", ...): how the docs spell each one and how to
make it. ``compression="auto"``, the step profiler's suggestions and the benchmarks all read
this one table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict

from .codecs import Compressor, GradientQuantizer, HalfPrecision, TopK


@dataclass(frozen=True)
class Method:
    spelling: str  # as a user writes it
    make: Callable[[bool], Compressor]  # error_feedback -> a new compressor
    error_feedback: bool = True  # the spelling's


METHODS: Dict[str, Method] = {
    "bf16": Method("zcoll.HalfPrecision('bf16', error_feedback=True)", lambda ef: HalfPrecision("bf16", error_feedback=ef)),
    "fp16": Method("zcoll.HalfPrecision('fp16')", lambda ef: HalfPrecision("fp16", error_feedback=ef), False),
    "int8": Method("zcoll.GradientQuantizer(bits=8)", lambda ef: GradientQuantizer(bits=8, error_feedback=ef)),
    "int4": Method("zcoll.GradientQuantizer(bits=4)", lambda ef: GradientQuantizer(bits=4, error_feedback=ef)),
    "sign": Method("zcoll.GradientQuantizer(bits=1)", lambda ef: GradientQuantizer(bits=1, error_feedback=ef)),
    "top10%": Method("zcoll.TopK(ratio=0.1)", lambda ef: TopK(ratio=0.1, error_feedback=ef)),
    "top1%": Method("zcoll.TopK(ratio=0.01)", lambda ef: TopK(ratio=0.01, error_feedback=ef)),
}


def make_compressor(method: str, error_feedback: bool = None) -> Compressor:
    """A new compressor for `method` (error feedback as its spelling says unless given)."""
    if method not in METHODS:
        raise ValueError(f"unknown compression method {method!r}; known: none, {', '.join(METHODS)}")
    m = METHODS[method]
    return m.make(m.error_feedback if error_feedback is None else error_feedback)
