"""zcoll.observe.step_model on synthetic traces: DDP's bucket assignment, the traced step
replayed, and predictions for other bucket caps, compression and accumulation."""

import numpy as np
import pytest
import torch
import torch.distributed as dist
from synthetic_traces import INT8, MIB, MLP, analysis, measured, synthetic_docs
from zcoll.observe import step_model


def test_rebucket_is_ddps_assignment():
    rng = np.random.default_rng(0)
    for trial in range(20):
        numel = rng.integers(1, 300_000, size=int(rng.integers(1, 40))).tolist()
        first, cap = sorted(rng.integers(1000, 4 * MIB, size=2).tolist())
        tensors = [torch.empty(n) for n in numel]
        buckets, _ = dist._compute_bucket_assignment_by_size(
            tensors, [first, cap], [False] * len(numel), list(range(len(numel)))
        )
        want = [sum(4 * numel[i] for i in b) for b in buckets]
        sizes, _ = step_model.rebucket(tuple(4 * n for n in numel), first, cap)
        assert sizes.tolist() == want, (trial, numel, first, cap)


def test_model_reproduces_the_traced_step():
    docs = synthetic_docs(MLP)
    a = analysis(docs)
    assert a.link.beta == pytest.approx(1 / 100e6, rel=1e-3)  # least squares over the traced buckets
    assert a.verdict["model_s"] == pytest.approx(a.measured(), rel=1e-3)


@pytest.mark.parametrize("cap_mb", [0.25, 1, 4])
@pytest.mark.parametrize("eta_wake", [None, 2e-3])
def test_model_predicts_other_bucket_caps(cap_mb, eta_wake):
    """Also when waking the worker costs the training thread 2 ms (40x a hook for a busy one)."""
    a = analysis(synthetic_docs(MLP, eta_wake=eta_wake))
    cfg = step_model.Config(cap_mb * MIB, cap_mb * MIB)
    predicted = step_model.predict(a.shapes, a.link, cfg)
    want = measured(synthetic_docs(MLP, first_cap=cap_mb * MIB, cap=cap_mb * MIB, eta_wake=eta_wake))
    assert predicted == pytest.approx(want, rel=0.01)


def test_model_predicts_compression_and_accumulation():
    a = analysis(synthetic_docs(MLP, codecs=INT8))
    int8 = step_model.predict(a.shapes, a.link, step_model.Config(MIB, 25 * MIB, "int8"))
    assert int8 == pytest.approx(measured(synthetic_docs(MLP, codecs=INT8, method="int8")), rel=0.01)
    acc = step_model.predict(a.shapes, a.link, step_model.Config(MIB, 25 * MIB, accumulation=4))
    assert acc == pytest.approx(measured(synthetic_docs(MLP, accumulation=4, steps=26)), rel=0.01)
    # and back: from a compressed trace to the uncompressed step
    b = analysis(synthetic_docs(MLP, codecs=INT8, method="int8"))
    assert b.link.method == "int8"
    none = step_model.predict(b.shapes, b.link, step_model.Config(MIB, 25 * MIB, "none"))
    assert none == pytest.approx(measured(synthetic_docs(MLP)), rel=0.01)
