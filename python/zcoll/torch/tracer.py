"""What the step profiler records of a DDP model, per step and rank: its phases and buckets.

zcoll.torch.profiler turns it on, either around the training loop::

    with zcoll.torch.profile(ddp_model, "trace/") as prof:
        for x, y in loader:
            loss_fn(ddp_model(x), y).backward(); opt.step(); opt.zero_grad()
    print(prof.analysis["verdict"])            # on every rank; rank 0 also wrote trace/zcoll-report.txt

or for a whole program, without touching it: ``ZCOLL_TRACE=trace/ mpirun -n 2 python train.py``
(every DistributedDataParallel model is traced from its optimizer's first step on; the files are
written at exit). Then ``zcoll report trace/`` prints the summary and draws the timeline, and
trace/zcoll-trace.json opens in ui.perfetto.dev.

What is recorded, per step and rank (``zcoll.observe.trace`` holds the format):

1. Phases: ``data`` (from the end of the previous step to the forward: loading, and anything
   else the loop does there), ``forward`` (DDP module pre/post forward hooks), ``backward``
   (from the gradient hook of the forward's output, i.e. the start of the backward pass, to an
   autograd-engine callback queued there, which runs when every gradient is computed),
   ``sync`` (from there to a second callback queued from the first, which runs after DDP's own
   finalize: the exposed wait for the buckets plus DDP's copy of the results into ``.grad``),
   ``optimizer`` (the optimizer's step pre/post hooks).
2. Buckets: when the bucket became ready (DDP called the hook), when the hook returned, when its
   communication started and ended on the process group's worker, dense bytes, bytes this rank
   sent (``comm.stats()`` delta), the compressor, the bucket's parameter sizes (once per change).
   zcoll's hooks (``hooks.allreduce_hook`` / ``compression_hook``) report this themselves when a
   profiler is active. A model with no comm hook gets one: zcoll's ``allreduce_hook`` on a zcoll
   group, otherwise :func:`timed_hook` around DDP's default (sum, then divide), where the start
   is inferred (the previous bucket's end or this one's hand-over). Any other hook can be timed
   by registering ``timed_hook(hook)`` instead of ``hook``.
3. Once per model: a calibration of the process group's allreduce (a small and a large message,
   the per-call time and the time per byte), and the codec rates of zcoll's compressors on a
   sample (for the compression time of each bucket and for the predictions of ``zcoll report``).
4. With ``torch.profiler`` running, the same spans are also opened as ``record_function``
   ranges (``zcoll.forward``, ``zcoll.backward``, ``zcoll.sync``, ``zcoll.optimizer``,
   ``zcoll.bucket<i>``), so they appear in the user's own trace.

Off costs nothing: the hooks are removed when the profiler ends, and zcoll's comm hooks check one
module global (``active``). On, the per-step cost is a handful of Python calls (measured by
bench/profiler_overhead.py).
"""

from __future__ import annotations

import time
import weakref
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist
from torch.autograd import Variable
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from ..compression.methods import METHODS, make_compressor
from ..observe import trace as _trace
from .backend import ProcessGroupZcoll

# The tracer of the model whose step is in progress (set by its forward pre-hook); zcoll's comm
# hooks report their buckets to it. None when nothing is profiled.
active: Optional["ModelTracer"] = None

traced_models: "weakref.WeakSet[DDP]" = weakref.WeakSet()

# The compressors the report predicts for (zcoll.compression.methods).
CANDIDATE_CODECS = ("fp16", "int8", "int4", "sign", "top1%")


def compressor(method: str) -> Any:
    """The compressor a report's suggestion names ("int8", "top1%", ...), error feedback on
    (off for fp16, as HalfPrecision's default), ready for ``apply_gradient_compression``."""
    if method not in CANDIDATE_CODECS:
        raise ValueError(f"unknown compression method {method!r}; known: {', '.join(CANDIDATE_CODECS)}")
    return make_compressor(method)


CODEC_SAMPLE_ELEMENTS = 1 << 20
MAX_ENV_STEPS = 500  # steps ZCOLL_TRACE records per model


def _profiler_on() -> bool:
    return torch.autograd.profiler._is_profiler_enabled


def _first_grad_tensor(out: Any) -> Optional[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return out if out.requires_grad else None
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        for o in out:
            t = _first_grad_tensor(o)
            if t is not None:
                return t
    return None


class _Range:
    """A torch.profiler range opened now and closed later (record_function without a with)."""

    __slots__ = ("rf",)

    def __init__(self, name: str):
        self.rf = torch.autograd.profiler.record_function(name)
        self.rf.__enter__()

    def close(self) -> None:
        self.rf.__exit__(None, None, None)


class ModelTracer:
    """The hooks on one DDP model and its step records (see the module docstring)."""

    def __init__(self, recorder: _trace.Recorder, ddp: DDP, optimizer: Any = None, max_steps: int = 200):
        self.rec = recorder
        self.now = recorder.now
        self.ddp = ddp
        self.pg = ddp.process_group
        self.optimizer = getattr(optimizer, "optimizer", optimizer)  # GradientAccumulator: the real one
        self.max_steps = max_steps
        self.model = recorder.add_model(describe(ddp))
        self.steps: List[Dict[str, Any]] = self.model["steps"]
        self.cur: Optional[Dict[str, Any]] = None
        self._last_end: Optional[int] = None
        self._params = {id(p) for p in ddp.parameters()}
        self._opt_ok: Dict[int, bool] = {}
        self._handles: List[Any] = []
        self._ranges: Dict[str, _Range] = {}
        self._bucket_numel: Dict[int, int] = {}
        self._compressors: Dict[str, Any] = {}

    # -- attach / detach -----------------------------------------------------------------------
    def attach(self) -> None:
        self._last_end = None  # the first step after a pause has no data phase
        d = self.ddp
        self._handles += [
            d.register_forward_pre_hook(self._pre_forward),
            d.register_forward_hook(self._post_forward),
        ]
        if self.optimizer is not None:
            self._handles += [
                self.optimizer.register_step_pre_hook(self._pre_step),
                self.optimizer.register_step_post_hook(self._post_step),
            ]
        else:
            self._handles += [
                register_optimizer_step_pre_hook(self._pre_step),
                register_optimizer_step_post_hook(self._post_step),
            ]

    def detach(self) -> None:
        global active
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for r in self._ranges.values():
            r.close()
        self._ranges.clear()
        self.cur = None
        if active is self:
            active = None

    # -- phases ----------------------------------------------------------------------------------
    def _open(self, name: str) -> None:
        if _profiler_on():
            self._ranges[name] = _Range("zcoll." + name)

    def _close(self, name: str) -> None:
        r = self._ranges.pop(name, None)
        if r is not None:
            r.close()

    def _pre_forward(self, module: Any, args: Any) -> None:
        global active
        if not (module.training and torch.is_grad_enabled()):
            return  # an evaluation forward is no training step
        t = self.now()
        prev = self.cur
        if prev is not None:
            self._last_end = max(v[1] for v in prev["phases"].values() if v[1] is not None)
        if len(self.steps) >= self.max_steps:
            self.cur = None
            if active is self:
                active = None
            return
        phases: Dict[str, list] = {"forward": [t, None]}
        if self._last_end is not None:
            phases["data"] = [self._last_end, t]
        self.cur = {"step": len(self.steps), "phases": phases, "buckets": []}
        self.steps.append(self.cur)
        active = self
        self._open("forward")

    def _post_forward(self, module: Any, args: Any, out: Any) -> None:
        cur = self.cur
        if cur is None or cur["phases"]["forward"][1] is not None:
            return
        cur["phases"]["forward"][1] = self.now()
        self._close("forward")
        t = _first_grad_tensor(out)
        if t is not None:
            t.register_hook(self._backward_started)

    def _backward_started(self, grad: Any = None) -> None:
        cur = self.cur
        if cur is None or "backward" in cur["phases"]:
            return
        cur["phases"]["backward"] = [self.now(), None]
        self._open("backward")
        Variable._execution_engine.queue_callback(self._backward_done)

    def _backward_done(self) -> None:
        # Queued at the start of the backward pass, so it runs before DDP's finalize (queued
        # when the last bucket became ready); the callback it queues runs after that finalize.
        cur = self.cur
        if cur is None:
            return
        t = self.now()
        cur["phases"]["backward"][1] = t
        self._close("backward")
        self._open("sync")
        cur["phases"]["sync"] = [t, None]
        Variable._execution_engine.queue_callback(self._synced)

    def _synced(self) -> None:
        global active
        cur = self.cur
        if cur is not None and "sync" in cur["phases"]:
            cur["phases"]["sync"][1] = self.now()
        self._close("sync")
        if active is self:  # no bucket of this model until its next forward: others' are not ours
            active = None

    def _mine(self, opt: Any) -> bool:
        ok = self._opt_ok.get(id(opt))
        if ok is None:
            ok = any(id(p) in self._params for g in opt.param_groups for p in g["params"])
            self._opt_ok[id(opt)] = ok
        return ok

    def _pre_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        cur = self.cur
        if cur is not None and self._mine(opt):
            cur["phases"]["optimizer"] = [self.now(), None]
            self._open("optimizer")

    def _post_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        cur = self.cur
        if cur is not None and "optimizer" in cur["phases"] and self._mine(opt):
            cur["phases"]["optimizer"][1] = self.now()
            self._close("optimizer")

    # -- buckets ---------------------------------------------------------------------------------
    def _bucket_record(self, bucket: Any, buf: torch.Tensor, compressor: Any) -> Optional[Dict[str, Any]]:
        t = self.now()
        cur = self.cur
        if cur is None:
            return None
        if "backward" not in cur["phases"]:  # the output's gradient hook did not fire
            self._backward_started()
        index = bucket.index()
        rec: Dict[str, Any] = {
            "index": index,
            "bytes": buf.numel() * buf.element_size(),
            "ready": t,
            "issued": None,
            "start": None,
            "end": None,
            "wire": None,
            "method": "none",
        }
        if self._bucket_numel.get(index) != buf.numel():
            self._bucket_numel[index] = buf.numel()
            rec["params"] = [p.numel() * p.element_size() for p in bucket.parameters()]
        if compressor is not None:
            name = repr(compressor)
            self._compressors.setdefault(name, compressor)
            rec["method"] = name
        cur["buckets"].append(rec)
        return rec

    def bucket(
        self,
        bucket: Any,
        buf: torch.Tensor,
        pg: Any,
        run: Callable[[], Any],
        value: Any,
        compressor: Any = None,
    ) -> torch.futures.Future:
        """What zcoll's hooks call instead of ``pg.submit(run, value).get_future()`` while this
        tracer is active: the same, with the bucket timed (ready, hook return, start and end on
        the worker, bytes sent)."""
        rec = self._bucket_record(bucket, buf, compressor)
        if rec is None:
            return pg.submit(run, value).get_future()
        now, stats, name = self.now, pg.communicator.stats, f"zcoll.bucket{rec['index']}"

        def timed() -> Any:
            sent = stats()["bytes_sent"]
            rng = _Range(name) if _profiler_on() else None
            rec["start"] = now()
            try:
                return run()
            finally:
                rec["end"] = now()
                if rng is not None:
                    rng.close()
                rec["wire"] = stats()["bytes_sent"] - sent

        fut = pg.submit(timed, value).get_future()
        rec["issued"] = now()
        return fut

    def bucket_future(self, bucket: Any, launch: Callable[[], torch.futures.Future]) -> torch.futures.Future:
        """For hooks that return their own future (:func:`timed_hook`): ready and return times
        here, the end when the future completes; the start is inferred by the report."""
        rec = self._bucket_record(bucket, bucket.buffer(), None)
        fut = launch()
        if rec is None:
            return fut
        rec["issued"] = self.now()
        now = self.now

        def done(f: torch.futures.Future) -> Any:
            rec["end"] = now()
            return f.value()

        return fut.then(done)

    # -- once per model: the group's allreduce and the codecs ----------------------------------------
    def calibrate(self, large_bytes: int = 4 << 20, repeats: int = 5) -> None:
        """Collective over the model's process group: allreduces of 256 bytes, min(1 MiB, the
        gradients) and min(large_bytes, the gradients) through the group (asynchronous, as
        buckets go), the median of `repeats` after a warm-up, and the bytes each sent."""
        zc = zcoll_group(self.pg)
        grad = max(256, self.model["gradient_bytes"])
        sizes = sorted({256, min(1 << 20, grad), min(large_bytes, grad)})
        points = []
        for nbytes in sizes:
            t = torch.zeros(nbytes // 4)
            times, wires = [], []
            for i in range(repeats + 1):
                sent = zc.communicator.stats()["bytes_sent"] if zc is not None else 0
                t0 = time.perf_counter()
                dist.all_reduce(t, group=self.pg, async_op=True).wait()
                if i:  # the first call is a warm-up
                    times.append(time.perf_counter() - t0)
                    wires.append(zc.communicator.stats()["bytes_sent"] - sent if zc is not None else None)
            points.append({"bytes": nbytes, "wire": wires[0], "seconds": float(np.median(times))})
        self.model["calibration"] = {"points": points, "ranks": self.pg.size()}

    def time_codecs(self) -> None:
        """Local: encode and decode rates of zcoll's compressors (the candidates and any seen in
        a bucket) on a sample of float32 gradients, and their payload sizes."""
        x = torch.randn(CODEC_SAMPLE_ELEMENTS, generator=torch.Generator().manual_seed(0))
        out = torch.empty_like(x)
        codecs: Dict[str, Any] = {}
        for name in CANDIDATE_CODECS:
            codecs[name] = dict(
                _time_codec(make_compressor(name, False), x, out), constructor=METHODS[name].spelling
            )
        for name, c in self._compressors.items():  # the ones the model used
            codecs[name] = _time_codec(c, x, out, stateless_copy=True)
        self.model["codecs"] = codecs


def _time_codec(
    compressor: Any, x: torch.Tensor, out: torch.Tensor, stateless_copy: bool = False
) -> Dict[str, Any]:
    """Seconds per dense byte to encode and to decode, the payload bytes per dense byte, and
    whether the allreduce exchanges pairs (sparse: allgather) or payloads reduced along a ring."""
    import copy

    c = compressor
    if stateless_copy:  # key=None never touches residuals; a copy keeps the user's call counters
        c = copy.copy(compressor)
        c._calls = {}
    enc, dec, payload = [], [], None
    for _ in range(3):
        t0 = time.perf_counter()
        payload = c.compress(x)
        t1 = time.perf_counter()
        c.decompress(payload, out)
        t2 = time.perf_counter()
        enc.append(t1 - t0)
        dec.append(t2 - t1)
    dense = x.numel() * x.element_size()
    kind = type(compressor).__name__
    return {
        "encode_s_per_byte": min(enc) / dense,
        "decode_s_per_byte": min(dec) / dense,
        "payload_ratio": payload.nbytes / dense,
        "exchange": "allgather" if kind in ("TopK", "Threshold") else "ring",
        "name": repr(compressor),
    }


def zcoll_group(pg: Any) -> Any:
    return pg if isinstance(pg, ProcessGroupZcoll) else None


def describe(ddp: DDP) -> Dict[str, Any]:
    """What the report needs to know about a DDP model (JSON-able)."""
    pg = ddp.process_group
    params = [p for p in ddp.parameters() if p.requires_grad]
    cfg = getattr(ddp, "_bucket_config", None)
    hooks = getattr(ddp, "_comm_hooks", [])
    hook = getattr(hooks[0][0], "__name__", "?") if hooks else None
    state = hooks[0][1] if hooks else None
    compressor = getattr(state, "compressor", None)
    return {
        "name": type(ddp.module).__name__,
        "backend": pg.name() if hasattr(pg, "name") else type(pg).__name__,
        "ranks": pg.size(),
        "parameters": len(params),
        "gradient_bytes": sum(p.numel() * p.element_size() for p in params),
        "bucket_cap_bytes": int(getattr(ddp, "bucket_bytes_cap", 25 << 20)),
        "first_bucket_cap_bytes": int(getattr(cfg, "first_bucket_bytes_cap", 1 << 20)),
        "gradient_as_bucket_view": bool(getattr(ddp, "gradient_as_bucket_view", False)),
        "hook": hook,
        "compression": repr(compressor) if compressor is not None else None,
        "torch": torch.__version__,
    }


# -- comm hooks for models without one ------------------------------------------------------------
_HOOK_ANNOTATIONS = {"state": object, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}


def average_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's default: the sum over the group, then divided by its size."""
    buf, size = bucket.buffer(), state.size()
    fut = dist.all_reduce(buf, group=state, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].div_(size))


average_hook.__annotations__ = _HOOK_ANNOTATIONS


def timed_hook(hook: Callable) -> Callable:
    """A DDP comm hook that behaves as `hook` and, while a profiler is active, records the
    bucket (ready, hook return, end when its future completes). Register it in place of `hook`::

        ddp.register_comm_hook(state, zcoll.torch.tracer.timed_hook(fp16_compress_hook))
    """

    def timed(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        tracer = active
        if tracer is None:
            return hook(state, bucket)
        return tracer.bucket_future(bucket, lambda: hook(state, bucket))

    timed.__name__ = f"timed_{getattr(hook, '__name__', 'hook')}"
    timed.__qualname__ = timed.__name__
    timed.__annotations__ = _HOOK_ANNOTATIONS  # DDP checks them (this module's are strings)
    return timed
