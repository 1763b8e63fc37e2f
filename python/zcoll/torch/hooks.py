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
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    state = zcoll.torch.apply_gradient_compression(model, zcoll.TopK(0.01), optimizer=opt)  # DGC's recipe
    # or, by hand:
    model.register_comm_hook(CompressionState(compressor=zcoll.GradientQuantizer(bits=8)), compression_hook)
"""

import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from ..tune.auto_compression import AutoCompression, resolve
from . import tracer as step_tracer
from .backend import ProcessGroupZcoll
from .bucket_state import BucketLayouts
from .momentum import SPARSIFIERS, MomentumCorrection, default_variance_floor


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
       ``Threshold``, ``HalfPrecision``); None sends uncompressed; ``"auto"`` or a
       ``zcoll.AutoCompression``: each bucket's method measured and chosen, then guarded
       (zcoll.auto_compression).
    2. ``warmup_steps``: the first N optimizer steps go uncompressed (Deep Gradient Compression's
       warm-up); a step ends with DDP's last bucket.
    3. ``key(bucket)``: the error-feedback key of a bucket, ``"<prefix>/bucket<index>/<numel>"``.
       Per-bucket state (the compressor's residual, the velocity) follows its parameters when DDP
       rebuilds its buckets after the first step (``zcoll.torch.bucket_state``): what a bucket
       did not send is sent later by whichever bucket then holds those parameters.
    4. ``optimizer`` (torch's SGD with momentum, Adam or AdamW): momentum correction
       (``zcoll.torch.momentum``): from the first compressed step on, each rank keeps its own
       velocity, the hook compresses the step the optimizer would take, and the optimizer only
       applies the average (Adam's variance frozen at the end of the warm-up, as 1-bit Adam does).
       Needed for top-k and sign with momentum or Adam (docs/compression.md); None: the
       compressor sees the gradients (error feedback only).
    5. ``variance_floor`` (Adam) and ``mask_momentum``: None picks the measured defaults per
       compressor (docs/compression.md): floor 1e-4 for sign, 1e-2 otherwise; DGC's momentum
       factor masking for sparsifiers.
    6. ``dense_below``: buckets of fewer elements go uncompressed (their latency, not their bytes,
       is what they cost), with whatever residual they carry (not with AutoCompression: its model
       decides small buckets too).

    Example::

        state = CompressionState(compressor=zcoll.TopK(0.01), warmup_steps=50, optimizer=opt)
        ddp_model.register_comm_hook(state, compression_hook)
    """

    __slots__ = (
        "process_group",
        "compressor",
        "warmup_steps",
        "step",
        "key_prefix",
        "keys",
        "momentum",
        "dense_below",
        "layouts",
        "velocity",
        "preconditioner",
        "parameters",
        "resuming",
    )

    def __init__(
        self,
        process_group: Optional[Any] = None,
        compressor: Any = None,
        warmup_steps: int = 0,
        key_prefix: str = "ddp",
        *,
        optimizer: Any = None,
        variance_floor: Optional[float] = None,
        mask_momentum: Optional[bool] = None,
        dense_below: int = 1024,
        parameters: Optional[List[torch.Tensor]] = None,
    ):
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if dense_below < 0:
            raise ValueError(f"dense_below must be >= 0, got {dense_below}")
        self.process_group = _zcoll_group(process_group, "CompressionState")
        compressor = resolve(compressor)
        self.compressor = compressor
        self.warmup_steps = int(warmup_steps)
        self.step = 0  # completed DDP steps (backward passes that reached the last bucket)
        self.key_prefix = key_prefix
        self.keys: Dict[int, str] = {}  # bucket index -> error-feedback key in use
        self.dense_below = int(dense_below)
        sparse = type(compressor).__name__ in SPARSIFIERS or isinstance(compressor, AutoCompression)
        self.momentum = None
        if optimizer is not None:
            floor = default_variance_floor(compressor) if variance_floor is None else variance_floor
            mask = sparse if mask_momentum is None else mask_momentum
            self.momentum = MomentumCorrection(optimizer, variance_floor=floor, mask=mask)
        if parameters is None and optimizer is not None:
            parameters = [p for g in optimizer.param_groups for p in g["params"]]
        self.parameters = list(parameters) if parameters is not None else None  # checkpoint order
        self.velocity: Dict[str, torch.Tensor] = {}  # key -> this rank's velocity (momentum correction)
        self.preconditioner: Dict[str, torch.Tensor] = {}  # key -> frozen Adam preconditioner
        self.layouts = BucketLayouts()
        self.resuming = False  # after load_state_dict, until DDP has rebuilt its buckets
        if compressor is not None:
            self.layouts.register("residual", lambda key: self.compressor.residual(key), self._put_residual)
        self.layouts.register("velocity", self.velocity.get, _putter(self.velocity))
        self.layouts.register("preconditioner", self.preconditioner.get, _putter(self.preconditioner))

    @property
    def compressing(self) -> bool:
        """Whether the next bucket goes through the compressor."""
        return self.compressor is not None and self.step >= self.warmup_steps

    def key(self, bucket: dist.GradBucket) -> str:
        key = f"{self.key_prefix}/bucket{bucket.index()}/{bucket.buffer().numel()}"
        self.keys[bucket.index()] = key
        return key

    def residual(self, param: torch.Tensor) -> Optional[torch.Tensor]:
        """This rank's error-feedback residual of one parameter (what it has not sent yet, in
        the space the hook compresses), a copy; None when it has none."""
        where = self.layouts.slice_of(param)
        e = None if where is None or self.compressor is None else self.compressor.residual(where[0])
        return (
            None if e is None else torch.from_numpy(e[where[1] : where[1] + where[2]].copy()).view_as(param)
        )

    def compressed_allreduce(
        self,
        buf: torch.Tensor,
        key: str,
        params: Tuple[torch.Tensor, ...],
        when: Tuple[int, bool, float] = (0, False, 0.0),
    ) -> torch.Tensor:
        """One bucket, compressed (runs on the group's executor, in bucket order): move the
        bucket's state if DDP rebuilt it, momentum correction, the compressed average.

        After load_state_dict, DDP starts again with its first-step bucket (every parameter, in
        model order) until it rebuilds; such a bucket is compressed as the saved buckets it is
        made of, so a resumed run computes exactly what the uninterrupted one did.
        when: (step, last bucket of the step, hand-over time), for AutoCompression."""
        if self.resuming:
            saved = self.layouts.cover(params)
            if saved is not None and not (len(saved) == 1 and saved[0][0] == key and saved[0][1] == params):
                return self._through_saved_layouts(buf, params, saved, when)
            self.resuming = False
        return self._compressed_bucket(buf, key, params, when)

    def _compressed_bucket(
        self, buf: torch.Tensor, key: str, params: Tuple[torch.Tensor, ...], when: Tuple[int, bool, float]
    ) -> torch.Tensor:
        comm, compressor, mc = self.process_group.communicator, self.compressor, self.momentum
        self.layouts.place(key, params)
        u = None
        if mc is not None:
            mc.start()
            u = self.velocity.get(key)
            if u is None:
                u = mc.initial_velocity(params)
            d = self.preconditioner.get(key)
            if d is None and mc.kind != "sgd":
                d = self.preconditioner[key] = mc.preconditioner(params)
            u = self.velocity[key] = mc.velocity_step(buf, params, u, d)
        if buf.numel() < self.dense_below and not isinstance(compressor, AutoCompression):  # auto decides
            e = compressor.residual(key)
            if e is not None:  # a bucket that shrank below the limit sends what it owes
                buf.add_(torch.from_numpy(e).reshape(-1))
                compressor.reset(key)
            return comm.allreduce(buf, op="avg", out=buf)
        masked = True  # mask_sent masks only where the correction was built to (sparsifiers)
        if isinstance(compressor, AutoCompression):
            out = compressor.allreduce(comm, buf, key, *when)  # in place too
            masked = compressor.residuals.method_of.get(key, "none").startswith("top")
        else:
            out = comm.allreduce(buf, op="avg", compression=compressor, key=key, out=buf)  # in place
        if u is not None and masked:
            mc.mask_sent(u, compressor.residual(key))
        return out

    def _through_saved_layouts(
        self, buf: torch.Tensor, params: Tuple[torch.Tensor, ...], saved: list, when: Tuple[int, bool, float]
    ) -> torch.Tensor:
        """Each saved bucket's slices gathered from `buf` in its own order, compressed under its
        own key, scattered back."""
        offset, off = {}, 0
        for p in params:
            offset[p] = off
            off += p.numel()
        out = torch.empty_like(buf)
        for i, (key, ps) in enumerate(saved):
            part = torch.cat([buf[offset[p] : offset[p] + p.numel()] for p in ps])
            last = when[1] and i == len(saved) - 1
            result = self._compressed_bucket(part, key, ps, (when[0], last, when[2]))
            pos = 0
            for p in ps:
                out[offset[p] : offset[p] + p.numel()] = result[pos : pos + p.numel()]
                pos += p.numel()
        return out

    def _put_residual(self, key: str, values: Optional[torch.Tensor]) -> None:
        if values is None:
            self.compressor.reset(key)
        elif self.compressor.error_feedback:
            self.compressor.set_residual(key, values.numpy())

    # -- checkpoints --------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """This rank's state, for checkpoints: the step counter (warm-up), the compressor's
        residuals (``Compressor.state_dict()``), and the per-bucket layouts, velocities and
        preconditioners with the momentum correction's progress. Parameters are named by their
        position in ``parameters`` (the optimizer's, or the model's through
        apply_gradient_compression)."""
        index = {p: i for i, p in enumerate(self.parameters or [])}
        if self.layouts.params and not index:
            raise ValueError(
                "CompressionState.state_dict needs parameters= (or optimizer=) to name the buckets' tensors"
            )
        return {
            "step": self.step,
            "compressor": self.compressor.state_dict() if self.compressor is not None else None,
            "layouts": self.layouts.state_dict(index),
            "velocity": {k: v.clone() for k, v in self.velocity.items()},
            "preconditioner": {k: v.clone() for k, v in self.preconditioner.items()},
            "momentum": self.momentum.state_dict() if self.momentum is not None else None,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if (self.compressor is None) != (state["compressor"] is None):
            raise ValueError(
                f"{self!r}: the saved state was made {'without' if state['compressor'] is None else 'with'} "
                "a compressor; load it into a CompressionState of the same kind"
            )
        if (self.momentum is None) != (state["momentum"] is None):
            raise ValueError(
                f"{self!r}: the saved state and this one differ in momentum correction (optimizer=)"
            )
        self.step = int(state["step"])
        if self.compressor is not None:
            self.compressor.load_state_dict(state["compressor"])
        self.layouts.load_state_dict(state["layouts"], self.parameters or [])
        self.velocity.clear()
        self.velocity.update({k: v.clone() for k, v in state["velocity"].items()})
        self.preconditioner.clear()
        self.preconditioner.update({k: v.clone() for k, v in state["preconditioner"].items()})
        if self.momentum is not None:
            self.momentum.load_state_dict(state["momentum"])
        self.resuming = bool(self.layouts.params)

    def __repr__(self) -> str:
        return (
            f"CompressionState(compressor={self.compressor!r}, step={self.step}, "
            f"warmup_steps={self.warmup_steps}, momentum_correction={self.momentum is not None})"
        )


def _putter(store: Dict[str, torch.Tensor]) -> Callable[[str, Optional[torch.Tensor]], None]:
    def put(key: str, values: Optional[torch.Tensor]) -> None:
        if values is None:
            store.pop(key, None)
        else:
            store[key] = values

    return put


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
    if step_tracer.active is not None:  # the step profiler times the bucket
        return step_tracer.active.bucket(bucket, buf, pg, run, buf)
    return pg.submit(run, buf).get_future()


def compression_hook(state: CompressionState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket over the group through ``state.compressor``.

    1. Warm-up (or no compressor): the uncompressed path of :func:`allreduce_hook`.
    2. Otherwise queue :meth:`CompressionState.compressed_allreduce` on the group's executor:
       the bucket's state follows its parameters if DDP rebuilt the bucket; with momentum
       correction the buffer becomes this rank's velocity step; then ``comm.allreduce(buffer,
       op="avg", compression=compressor, key=state.key(bucket))``, where the compressor adds the
       bucket's carried-over error (error feedback) and keeps the new one (uncompressed below
       ``dense_below`` elements).
    3. After DDP's last bucket, ``state.step`` advances.

    The future holds the averaged gradient (with momentum correction: the averaged step, which
    the optimizer's pre-hook applies) as ``bucket.buffer()`` or the tensor zcoll returned.

    Example::

        state = CompressionState(compressor=zcoll.TopK(ratio=0.01), warmup_steps=100)
        ddp_model.register_comm_hook(state, compression_hook)
    """
    pg, buf = state.process_group, bucket.buffer()
    if state.compressing:
        key, params = state.key(bucket), tuple(bucket.parameters())
        compressor, value = state.compressor, None
        when = (state.step, bucket.is_last(), time.perf_counter())
        run = lambda: state.compressed_allreduce(buf, key, params, when)  # noqa: E731
        if isinstance(compressor, AutoCompression):  # the profiler records the method in use
            m = compressor.method(key, state.step, buf.numel() * buf.element_size())
            compressor = compressor.compressor(m) if m != "none" else None
    else:
        comm = pg.communicator
        compressor, run, value = None, (lambda: comm.allreduce(buf, op="avg", out=buf)), buf
    if step_tracer.active is not None:  # the step profiler times the bucket
        fut = step_tracer.active.bucket(bucket, buf, pg, run, value, compressor)
    else:
        fut = pg.submit(run, value).get_future()
    if bucket.is_last():
        state.step += 1
    return fut


# The published recipes that keep a model's quality under the lossiest codecs (docs/compression.md):
# Deep Gradient Compression for sparsifiers (momentum correction with factor masking after a dense
# warm-up) and 1-bit Adam for sign (a full-precision warm-up, then the momentum compressed with
# the variance frozen). Through apply_gradient_compression they are what these codecs do by
# default; plain=True is error feedback alone.
RECIPE_WARMUP_STEPS = 100  # when not given: about a tenth of a short run (the docs' measured setting)


def needs_recipe(compressor: Any) -> bool:
    """Whether `compressor` keeps a model's quality only with its recipe (top-k, random-k,
    threshold, 1-bit sign)."""
    return type(compressor).__name__ in SPARSIFIERS or getattr(compressor, "bits", None) == 1


def apply_gradient_compression(
    ddp_model: Any,
    compressor: Any = None,
    warmup_steps: Optional[int] = None,
    key_prefix: str = "ddp",
    *,
    optimizer: Any = None,
    plain: bool = False,
    **options: Any,
) -> CompressionState:
    """Registers :func:`compression_hook` on a DDP model whose process group is zcoll's and
    returns the hook's state (compressor None: uncompressed, as :func:`allreduce_hook`).

    Top-k, random-k, threshold and 1-bit sign get their published recipe by default (DGC;
    1-bit Adam): momentum correction through ``optimizer`` (the model's torch SGD with momentum,
    Adam or AdamW; required) after a dense warm-up of ``warmup_steps`` (default
    RECIPE_WARMUP_STEPS; about a tenth of the run's steps did as well as more in
    docs/compression.md). ``plain=True``: error feedback alone (no optimizer needed, warm-up 0
    unless given). Other codecs: error feedback, with momentum correction when an optimizer is
    given. options: CompressionState's variance_floor, mask_momentum, dense_below.

    compressor "auto" (or a zcoll.AutoCompression): each bucket's method chosen from trial steps
    that leave the model exact, then guarded (zcoll.tune.auto_compression);
    ``zcoll.torch.recommend(model)`` reports the decision.

    Example::

        model = torch.nn.parallel.DistributedDataParallel(net)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        state = zcoll.torch.apply_gradient_compression(model, zcoll.TopK(0.01), optimizer=opt)
        state = zcoll.torch.apply_gradient_compression(model, "auto")
    """
    if not isinstance(ddp_model, torch.nn.parallel.DistributedDataParallel):
        raise TypeError(
            "apply_gradient_compression: expected a model wrapped in "
            f"torch.nn.parallel.DistributedDataParallel, got {type(ddp_model).__name__}"
        )
    pg = _zcoll_group(ddp_model.process_group, "apply_gradient_compression")
    recipe = needs_recipe(compressor) and not plain
    if recipe and optimizer is None:
        raise ValueError(
            f"apply_gradient_compression: {compressor!r} keeps a model's quality only with its recipe "
            "(momentum correction after a dense warm-up, docs/compression.md): pass optimizer=<the model's "
            "optimizer>, or plain=True for error feedback alone"
        )
    if warmup_steps is None:
        warmup_steps = RECIPE_WARMUP_STEPS if recipe else 0
    state = CompressionState(
        pg,
        compressor,
        warmup_steps,
        key_prefix,
        optimizer=None if plain else optimizer,
        parameters=list(ddp_model.parameters()),
        **options,
    )
    ddp_model.register_comm_hook(state, compression_hook)
    ddp_model._zcoll_compression_state = state  # for zcoll.torch.recommend
    return state
