"""Gradient codecs for ``Communicator.allreduce(x, op, compression=..., key=...)``
(zcoll.compression.codecs), and their documented error bounds (zcoll.compression.error_bounds)."""

from .codecs import (
    CompressionStats,
    Compressor,
    GradientQuantizer,
    HalfPrecision,
    Payload,
    RandomK,
    Threshold,
    TopK,
)

__all__ = [
    "CompressionStats",
    "Compressor",
    "GradientQuantizer",
    "HalfPrecision",
    "Payload",
    "RandomK",
    "Threshold",
    "TopK",
]
