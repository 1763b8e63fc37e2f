"""Choosing for the job: the per-bucket cost model (compression_model) and ``compression="auto"``
(auto_compression), registered here as the named compression "auto"."""

from ..core import register_named_compression
from .auto_compression import AutoCompression
from .auto_config import DEFAULT_BOUND, RESIDUAL_BOUND, AutoConfig

register_named_compression("auto", AutoCompression)

__all__ = ["DEFAULT_BOUND", "RESIDUAL_BOUND", "AutoCompression", "AutoConfig"]
