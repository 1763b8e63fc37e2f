"""zcoll.tune.compression_model on synthetic costs (no MPI): the per-bucket decision (bf16 the
reference a lossier method has to beat) and the fit of calibration and trial measurements."""

from __future__ import annotations


import pytest
from cost_models import MIB, codecs, model
from zcoll.tune import compression_model as cm


def test_fast_link_stays_uncompressed():
    # shared memory, ~80 Gbit/s: the kernels cost more than the bytes they save
    d = cm.decide(model(80.0), [("b0", MIB, 0.0), ("b1", 25 * MIB, 0.0)])
    assert [x.method for x in d] == ["none", "none"], cm.render(d)


def test_slow_link_compresses_large_buckets_only():
    # 1 Gbit/s: a 25 MiB bucket takes ~0.2 s uncompressed; a 4 KiB one is all per-call cost
    d = cm.decide(model(1.0), [("small", 4096, 0.0), ("large", 25 * MIB, 0.0)])
    assert d[0].method == "none", cm.render(d)
    assert d[1].method not in ("none", "bf16"), cm.render(d)
    assert d[1].predicted_s < 0.5 * d[1].predicted_none_s
    # the least lossy within the margin of the fastest
    fastest = min(d[1].predicted.values())
    assert d[1].predicted_s <= fastest * 1.05
    for m in cm.LOSSINESS[: cm.LOSSINESS.index(d[1].method)]:
        assert d[1].predicted[m] > fastest * 1.05


def test_margin_prefers_less_lossy():
    d = cm.decide(model(1.0), [("large", 25 * MIB, 0.0)], methods=cm.LOSSINESS, margin=10.0)
    assert d[0].method == "bf16"  # int8 and beyond are faster, but within 10x bf16 is enough


def test_default_candidates_stop_at_int8():
    assert cm.CANDIDATES == ("none", "bf16", "int8") and cm.REFERENCE == "bf16"
    d = cm.decide(model(0.1), [("large", 25 * MIB, 0.0)])  # 100 Mbit/s: sign and top-k would be faster
    assert d[0].method == "int8" and set(d[0].predicted) == set(cm.CANDIDATES), cm.render(d)


def test_a_lossier_method_has_to_beat_bf16():
    bucket = [("large", 25 * MIB, 0.0)]
    cost = cm.decide(model(1.0), bucket)[0].predicted  # 1 Gbit/s: int8 about half of bf16's time
    saved = 1 - cost["int8"] / cost["bf16"]
    kept = cm.decide(model(1.0), bucket, min_gain=saved + 0.05)[0]
    assert kept.method == "bf16" and "reference" in kept.reason, kept.reason
    assert cm.decide(model(1.0), bucket, min_gain=saved - 0.05)[0].method == "int8"


def test_overlap_hides_a_bucket():
    # bucket 0 is handed over 1 s before the last: its uncompressed time (~0.2 s) is hidden
    buckets = [("early", 25 * MIB, 0.0), ("late", 25 * MIB, 1.0)]
    d = cm.decide(model(1.0), buckets)
    assert d[0].method == "none" and "overlap" in d[0].reason, cm.render(d)
    assert d[1].method not in ("none", "bf16")


def test_deterministic_and_methods_respected():
    b = [("a", 3 * MIB, 0.0), ("b", 25 * MIB, 0.01), ("c", 100, 0.02)]
    one = [x.as_dict() for x in cm.decide(model(1.0), b)]
    two = [x.as_dict() for x in cm.decide(model(1.0), b)]
    assert one == two
    only = cm.decide(model(80.0), b, methods=("int8",))
    assert {x.method for x in only} == {"int8"}  # none is not a candidate unless listed


def test_fit_per_method_and_bucket():
    cal = [
        (256.0, 256.0, 40e-6),
        (float(MIB), float(MIB), 40e-6 + MIB * 1e-9),
        (4.0 * MIB, 4.0 * MIB, 40e-6 + 4 * MIB * 1e-9),
    ]
    physics = cm.fit(cal, codecs(), 2)
    assert physics.link.beta == pytest.approx(1e-9, rel=1e-3)  # least squares over the three sizes
    assert physics.link.alpha == pytest.approx(40e-6 - 256e-9, rel=1e-3)
    assert physics.predict("none", MIB) == pytest.approx(physics.link.alpha + MIB * physics.link.beta)
    # trials: a per-call cost per method plus a per-bucket offset (exactly additive here)
    alpha = {"none": 1e-4, "int8": 3e-4, "top1%": 5e-4}
    offset = {"b0": 2e-3, "b1": 0.0, "b2": 5e-4}
    size = {"b0": MIB, "b1": 4 * MIB, "b2": 2 * MIB}
    trials = {
        m: [(k, size[k], a + offset[k] + physics.transfer(m, size[k])) for k in size]
        for m, a in alpha.items()
    }
    m = cm.fit(cal, codecs(), 2, trials)
    for method, pts in trials.items():
        for k, n, s in pts:
            assert m.predict(method, n, k) == pytest.approx(s, rel=1e-9), (method, k)
    # one wild measurement moves the additive terms little (medians); the model reproduces it as
    # that pair's own term
    before = (dict(m.alpha), dict(m.offset))
    trials["int8"][0] = ("b0", MIB, 1.0)
    m = cm.fit(cal, codecs(), 2, trials)
    for fitted, was in zip((m.alpha, m.offset), before):
        assert all(fitted[k] == pytest.approx(v, abs=2e-4) for k, v in was.items()), (fitted, was)
    assert m.predict("int8", MIB, "b0") == pytest.approx(1.0)
    # a pair not measured (here: a bucket the trials did not see): the additive terms alone
    assert m.predict("int8", MIB, "new") == pytest.approx(physics.transfer("int8", MIB) + m.alpha["int8"])
    # a pair measured faster than its transfer term (a token bucket's burst) is still reproduced;
    # an unmeasured one is never predicted below its kernels plus the smallest allreduce
    fast = {"int8": [("b0", MIB, 0.25 * physics.transfer("int8", MIB))], "none": [("b0", MIB, 1e-5)]}
    m = cm.fit(cal, codecs(), 2, fast)
    assert m.predict("int8", MIB, "b0") == pytest.approx(fast["int8"][0][2], rel=1e-9)
    assert m.predict("none", MIB, "b0") == pytest.approx(1e-5, rel=1e-9)
    floor = physics.link.codec_time("int8", 4 * MIB) + physics.link.alpha
    assert m.predict("int8", 4 * MIB, "new") >= floor
    assert m.predict("none", 4 * MIB, "new") >= physics.link.alpha > 0


def test_exposed():
    assert cm.exposed([1.0, 1.0], [0.0, 5.0]) == 1.0  # the first is hidden
    assert cm.exposed([3.0, 1.0], [0.0, 1.0]) == 3.0  # the second waits for the first
    assert cm.exposed([], []) == 0.0
