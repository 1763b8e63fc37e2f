"""DDP communication hooks over zcoll, in the shape of torch's ``default_hooks``:
``hook(state, bucket) -> Future[Tensor]``, the future holding the averaged bucket.

- :func:`allreduce_hook` (state: a zcoll process group, or None for the default group):
  uncompressed average, in place on ``bucket.buffer()``.
- :func:`compression_hook` (state: :class:`CompressionState`): the average through a zcoll
  compressor, ``comm.allreduce(buffer, op="avg", compression=compressor, key=...)``, with the
  compressor's error-feedback memory keyed per bucket; uncompressed during a warm-up.
- :func:`apply_gradient_compression` checks the model and group and registers one of them.

Both run the zcoll call on the group's ordered executor, so they overlap with the rest of the
backward pass and stay in the same order on every rank.

Example::

    model = DistributedDataParallel(net)                    # on a "zcoll" process group
    state = zcoll.torch.apply_gradient_compression(model, zcoll.TopK(ratio=0.01), warmup_steps=100)
    # or, by hand:
    model.register_comm_hook(CompressionState(compressor=zcoll.GradientQuantizer(bits=8)), compression_hook)
"""

from typing import Any, Dict, Optional

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from . import profiler as _profiler
from .backend import ProcessGroupZcoll


def _zcoll_group(process_group: Optional[Any], what: str) -> ProcessGroupZcoll:
    pg = c10d._get_default_group() if process_group is None else process_group
    if not isinstance(pg, ProcessGroupZcoll):
        name = pg.name() if hasattr(pg, "name") else type(pg).__name__
        raise ValueError(
            f"{what} needs a process group of the zcoll backend, got '{name}'; start with "
            "zcoll.torch.init_process_group() or dist.init_process_group('zcoll')"
        )
    return pg


class CompressionState:
    """State of :func:`compression_hook`.

    1. ``compressor``: any zcoll compressor (``zcoll.GradientQuantizer``, ``TopK``, ``RandomK``,
       ``Threshold``, ``HalfPrecision``); None sends uncompressed.
    2. ``warmup_steps``: the first N optimizer steps go uncompressed (Deep Gradient Compression's
       warm-up); a step ends with DDP's last bucket.
    3. ``key(bucket)``: the error-feedback key of a bucket, ``"<prefix>/bucket<index>/<numel>"``.
       The size is part of the key because DDP rebuilds its buckets after the first step, after
       which an index may hold other parameters.

    Example::

        state = CompressionState(compressor=zcoll.GradientQuantizer(bits=4), warmup_steps=50)
        ddp_model.register_comm_hook(state, compression_hook)
    """

    __slots__ = ("process_group", "compressor", "warmup_steps", "step", "key_prefix", "keys")

    def __init__(
        self,
        process_group: Optional[Any] = None,
        compressor: Any = None,
        warmup_steps: int = 0,
        key_prefix: str = "ddp",
    ):
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.process_group = _zcoll_group(process_group, "CompressionState")
        self.compressor = compressor
        self.warmup_steps = int(warmup_steps)
        self.step = 0  # completed DDP steps (backward passes that reached the last bucket)
        self.key_prefix = key_prefix
        self.keys: Dict[int, str] = {}  # bucket index -> error-feedback key in use

    @property
    def compressing(self) -> bool:
        """Whether the next bucket goes through the compressor."""
        return self.compressor is not None and self.step >= self.warmup_steps

    def key(self, bucket: dist.GradBucket) -> str:
        key = f"{self.key_prefix}/bucket{bucket.index()}/{bucket.buffer().numel()}"
        self.keys[bucket.index()] = key
        return key

    def state_dict(self) -> Dict[str, Any]:
        """This rank's state, for checkpoints: the step counter (warm-up) and the compressor's
        error-feedback residuals (``Compressor.state_dict()``; None without a compressor)."""
        return {"step": self.step, "compressor": self.compressor.state_dict() if self.compressor else None}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if (self.compressor is None) != (state["compressor"] is None):
            raise ValueError(
                f"{self!r}: the saved state was made {'without' if state['compressor'] is None else 'with'} "
                "a compressor; load it into a CompressionState of the same kind"
            )
        self.step = int(state["step"])
        if self.compressor is not None:
            self.compressor.load_state_dict(state["compressor"])

    def __repr__(self) -> str:
        return (
            f"CompressionState(compressor={self.compressor!r}, step={self.step}, "
            f"warmup_steps={self.warmup_steps})"
        )


def allreduce_hook(
    process_group: Optional[Any], bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket over the group with zcoll, uncompressed, in place.

    1. Queue ``comm.allreduce(buffer, op="avg", out=buffer)`` on the group's executor.
    2. Return its future; its value is ``bucket.buffer()`` (what DDP expects).

    Example::

        ddp_model.register_comm_hook(None, allreduce_hook)      # None: the default group
    """
    pg = _zcoll_group(process_group, "allreduce_hook")
    buf, comm = bucket.buffer(), pg.communicator
    run = lambda: comm.allreduce(buf, op="avg", out=buf)  # noqa: E731
    if _profiler.active is not None:  # the step profiler times the bucket
        return _profiler.active.bucket(bucket, buf, pg, run, buf)
    return pg.submit(run, buf).get_future()


def compression_hook(state: CompressionState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket over the group through ``state.compressor``.

    1. Warm-up (or no compressor): the uncompressed path of :func:`allreduce_hook`.
    2. Otherwise queue ``comm.allreduce(buffer, op="avg", compression=compressor, key=state.key(bucket))``;
       the compressor adds this bucket's carried-over error (error feedback) and keeps the new one.
    3. After DDP's last bucket, ``state.step`` advances.

    The future holds the averaged gradient (``bucket.buffer()`` or the tensor zcoll returned).

    Example::

        state = CompressionState(compressor=zcoll.TopK(ratio=0.01), warmup_steps=100)
        ddp_model.register_comm_hook(state, compression_hook)
    """
    pg, buf = state.process_group, bucket.buffer()
    comm = pg.communicator
    if state.compressing:
        compressor, key = state.compressor, state.key(bucket)
        run, value = (lambda: comm.allreduce(buf, op="avg", compression=compressor, key=key)), None
    else:
        compressor, run, value = None, (lambda: comm.allreduce(buf, op="avg", out=buf)), buf
    if _profiler.active is not None:  # the step profiler times the bucket
        fut = _profiler.active.bucket(bucket, buf, pg, run, value, compressor)
    else:
        fut = pg.submit(run, value).get_future()
    if bucket.is_last():
        state.step += 1
    return fut


def apply_gradient_compression(
    ddp_model: Any, compressor: Any = None, warmup_steps: int = 0, key_prefix: str = "ddp"
) -> CompressionState:
    """Registers :func:`compression_hook` on a DDP model whose process group is zcoll's and
    returns the hook's state (compressor None: uncompressed, as :func:`allreduce_hook`).

    Example::

        model = torch.nn.parallel.DistributedDataParallel(net)
        state = zcoll.torch.apply_gradient_compression(model, zcoll.GradientQuantizer(bits=8))
    """
    if not isinstance(ddp_model, torch.nn.parallel.DistributedDataParallel):
        raise TypeError(
            "apply_gradient_compression: expected a model wrapped in "
            f"torch.nn.parallel.DistributedDataParallel, got {type(ddp_model).__name__}"
        )
    pg = _zcoll_group(ddp_model.process_group, "apply_gradient_compression")
    state = CompressionState(pg, compressor, warmup_steps, key_prefix)
    ddp_model.register_comm_hook(state, compression_hook)
    return state
