"""The layer that calls the extension: the Communicator, its link telemetry and verdict, and the
checkpoint files every layer above may write."""

from .communicator import ALGORITHMS, OPS, Communicator, new_like, register_named_compression

__all__ = ["ALGORITHMS", "OPS", "Communicator", "new_like", "register_named_compression"]
