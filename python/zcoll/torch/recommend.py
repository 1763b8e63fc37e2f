"""``zcoll.torch.recommend(ddp)``: the per-bucket compression ``compression="auto"`` chooses, as a
report, without applying it.

1. When the model's hook is an AutoCompression that has decided (``apply_gradient_compression(ddp,
   "auto")``, or ``state=`` given): its decisions, from this job's trial steps (the same object).
2. Otherwise (collective over the model's process group): the same calibration and kernel rates
   ``auto`` starts with (zcoll.tune.trials.calibrate), DDP's current bucket sizes, and the
   same decision (zcoll.compression_model.decide) from the model without trial steps; with no
   step measured, no overlap is assumed (every bucket's time counts), so it can recommend
   compressing a bucket that ``auto`` would find hidden behind the backward pass.

Example::

    report = zcoll.torch.recommend(ddp)
    print(report["text"])            # bucket, MiB, method, predicted ms, uncompressed ms, reason
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from ..observe.step_model import rebucket
from ..tune import compression_model as cm
from ..tune.auto_compression import AutoCompression
from ..tune.trials import calibrate
from .hooks import _zcoll_group


def bucket_bytes(ddp: Any) -> List[int]:
    """DDP's buckets (bytes, in the order their gradients become ready): the reducer's own once it
    has them, else DDP's assignment of the parameters in reverse order at its caps."""
    data = ddp._get_ddp_logging_data() if hasattr(ddp, "_get_ddp_logging_data") else {}
    sizes = data.get("bucket_sizes")
    if isinstance(sizes, str):
        sizes = [int(s) for s in sizes.split(",") if s.strip()]
    if sizes:
        return [int(s) for s in sizes]
    params = tuple(p.numel() * p.element_size() for p in reversed(list(ddp.parameters())) if p.requires_grad)
    first = getattr(ddp, "bucket_bytes_cap", 25 << 20)
    return [int(b) for b in rebucket(params, min(first, 1 << 20), first)[0]]


def recommend(
    ddp: Any,
    state: Any = None,
    methods: Sequence[str] = cm.CANDIDATES,
    margin: float = 0.05,
    min_gain: float = 0.05,
) -> Dict[str, Any]:
    """The per-bucket decision as a report (see the module docstring): ``decisions`` (one dict per
    bucket: key, nbytes, method, reason, predicted_s, predicted_none_s, predicted per method),
    ``model`` (its constants), ``text`` (a table), ``source``. Changes nothing."""
    state = state if state is not None else getattr(ddp, "_zcoll_compression_state", None)
    auto: Optional[AutoCompression] = getattr(state, "compressor", None)
    if isinstance(auto, AutoCompression) and auto.decided_step is not None:
        return dict(auto.report(), source="the hook's trial steps (compression='auto')")
    comm = _zcoll_group(ddp.process_group, "recommend").communicator
    calibration, codecs = calibrate(comm, methods, sizes=(256, 1 << 20, 4 << 20))
    model = cm.fit(calibration, codecs, comm.size)
    buckets = [(f"bucket{i}", n, 0.0) for i, n in enumerate(bucket_bytes(ddp))]
    decisions = cm.decide(model, buckets, methods, margin, min_gain)
    return {
        "decided": True,
        "decisions": [d.as_dict() for d in decisions],
        "model": model.describe(),
        "text": cm.render(decisions),
        "source": "calibration and kernel rates only (no trial steps; no overlap assumed)",
    }
