"""zcoll.compression in one process (a one-rank communicator): bad input, compress/decompress
round trips and their bounds, one-rank allreduce == decompress(compress(x)) bit for bit, error
feedback bookkeeping, stats, NaN/Inf, numpy and torch in and out."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import zcoll

COMPRESSORS = [
    lambda **kw: zcoll.GradientQuantizer(8, **kw),
    lambda **kw: zcoll.GradientQuantizer(4, **kw),
    lambda **kw: zcoll.GradientQuantizer(1, **kw),
    lambda **kw: zcoll.GradientQuantizer(8, stochastic=True, seed=11, **kw),
    lambda **kw: zcoll.GradientQuantizer(4, block=32, stochastic=True, **kw),
    lambda **kw: zcoll.TopK(0.05, **kw),
    lambda **kw: zcoll.TopK(0.05, exact=True, **kw),
    lambda **kw: zcoll.RandomK(0.1, seed=5, **kw),
    lambda **kw: zcoll.Threshold(1.0, **kw),
    lambda **kw: zcoll.HalfPrecision("fp16", **kw),
    lambda **kw: zcoll.HalfPrecision("bf16", **kw),
]
IDS = [
    "int8",
    "int4",
    "sign",
    "int8s",
    "int4s32",
    "topk",
    "topk_exact",
    "randomk",
    "threshold",
    "fp16",
    "bf16",
]


@pytest.fixture(scope="module")
def comm():
    with zcoll.Communicator() as c:
        yield c


def grad(n=5000, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * np.repeat(rng.uniform(0.01, 10, n // 128 + 1), 128)[:n]).astype(
        np.float32
    )


def same_bits(a, b):
    a = a.view(torch.int16).numpy() if isinstance(a, torch.Tensor) else a
    b = b.view(torch.int16).numpy() if isinstance(b, torch.Tensor) else b
    return a.tobytes() == b.tobytes()


# -- bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: zcoll.GradientQuantizer(bits=3), "bits must be 8, 4 or 1"),
        (lambda: zcoll.GradientQuantizer(bits=2), "bits must be 8, 4 or 1"),
        (lambda: zcoll.GradientQuantizer(bits=4, block=33), "even block"),
        (lambda: zcoll.GradientQuantizer(bits=1, block=12), "multiple of 8"),
        (lambda: zcoll.GradientQuantizer(bits=1, stochastic=True), "stochastic"),
        (lambda: zcoll.GradientQuantizer(block=0), "block must be a positive"),
        (lambda: zcoll.TopK(0.0), r"ratio must be in \(0, 1\]"),
        (lambda: zcoll.TopK(1.5), r"ratio must be in \(0, 1\]"),
        (lambda: zcoll.RandomK(-0.1), r"ratio must be in \(0, 1\]"),
        (lambda: zcoll.RandomK(float("nan")), r"ratio must be in \(0, 1\]"),
        (lambda: zcoll.Threshold(-1.0), "threshold value"),
        (lambda: zcoll.Threshold(float("nan")), "threshold value"),
        (lambda: zcoll.HalfPrecision("fp8"), "'fp16' or 'bf16'"),
    ],
)
def test_bad_parameters(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_key_required_with_error_feedback(comm):
    with pytest.raises(ValueError, match=r"pass key=.*error_feedback=False"):
        comm.allreduce(grad(), compression=zcoll.GradientQuantizer())
    with pytest.raises(ValueError, match="key="):
        comm.allreduce(grad(), compression=zcoll.TopK(0.01))
    comm.allreduce(grad(), compression=zcoll.GradientQuantizer(error_feedback=False))  # no key needed


def test_shape_change_under_one_key(comm):
    q = zcoll.GradientQuantizer()
    comm.allreduce(grad(1000), compression=q, key="w")
    with pytest.raises(ValueError, match=r"key 'w' holds a residual for shape \(1000,\).*reset\('w'\)"):
        comm.allreduce(grad(1001), compression=q, key="w")
    with pytest.raises(ValueError, match="shape"):
        comm.allreduce(grad(1000).reshape(10, 100), compression=q, key="w")
    q.reset("w")
    comm.allreduce(grad(1001), compression=q, key="w")
    assert q.residual("w").shape == (1001,)


@pytest.mark.parametrize("op", ["max", "min", "prod"])
def test_other_ops_rejected(comm, op):
    with pytest.raises(ValueError, match="supports op 'sum' and 'avg'"):
        comm.allreduce(grad(), op=op, compression=zcoll.HalfPrecision())


def test_bad_calls(comm):
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        comm.allreduce(np.arange(10, dtype=np.int32), compression=zcoll.HalfPrecision())
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        comm.allreduce(np.arange(10, dtype=np.float64), compression=zcoll.HalfPrecision())
    with pytest.raises(ValueError, match="leave algorithm='auto'"):
        comm.allreduce(grad(), algorithm="ring", compression=zcoll.HalfPrecision())
    with pytest.raises(TypeError, match="compression must be a zcoll compressor"):
        comm.allreduce(grad(), compression="int8")
    with pytest.raises(TypeError, match="key must be a str"):
        comm.allreduce(grad(), compression=zcoll.GradientQuantizer(), key=3)
    with pytest.raises(ValueError, match="not a payload"):
        zcoll.TopK().decompress(zcoll.GradientQuantizer().compress(grad()))
    payload = zcoll.GradientQuantizer().compress(grad(100))
    with pytest.raises(ValueError, match="expected 100 float32"):
        zcoll.GradientQuantizer().decompress(payload, out=np.empty(99, np.float32))


# -- round trips --------------------------------------------------------------------------------
def single_bound(c, x):
    """|x - D(Q(x))| allowed per element for one compression (kernels/quantize.h, sparsify.h)."""
    n = x.size
    ax = np.abs(x.astype(np.float64))
    if n == 0:
        return ax
    if isinstance(c, zcoll.GradientQuantizer):
        nb = -(-n // c.block)
        pad = np.zeros(nb * c.block)
        pad[:n] = ax
        absmax = np.repeat(pad.reshape(nb, c.block).max(axis=1), c.block)[:n]
        k = 1.0 if c.bits == 1 else (1.0 if c.stochastic else 0.5) / (127 if c.bits == 8 else 7)
        return absmax * (k + 2.0**-20)
    if isinstance(c, zcoll.HalfPrecision):
        return ax * (2.0**-11 if c.fmt == "fp16" else 2.0**-8) + 2.0**-25
    if isinstance(c, zcoll.TopK):  # per segment: its k_j-th largest |x|
        bound = np.empty(n)
        for b, e, k in c.segments(n):
            bound[b:e] = np.sort(ax[b:e])[::-1][k - 1]
        return bound
    if isinstance(c, zcoll.Threshold):
        return np.full(n, c.value)
    return ax  # random-k: an element not drawn is lost


@pytest.mark.parametrize("make", COMPRESSORS, ids=IDS)
@pytest.mark.parametrize("n", [0, 1, 7, 256, 257, 5000])
def test_round_trip(make, n):
    c = make(error_feedback=False)
    x = grad(n) if n else np.zeros(0, np.float32)
    payload = c.compress(x)
    y = c.decompress(payload)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == x.shape
    assert np.all(np.abs(y.astype(np.float64) - x) <= single_bound(c, x))
    if isinstance(c, zcoll.GradientQuantizer) and n:
        code_bytes = {8: n, 4: (n + 1) // 2, 1: (n + 7) // 8}[c.bits]
        assert payload.nbytes == code_bytes + 4 * -(-n // c.block)
    if isinstance(c, (zcoll.TopK, zcoll.RandomK)) and n:
        k = (
            sum(kj for _, _, kj in c.segments(n))
            if isinstance(c, zcoll.TopK)
            else zcoll._C.sparse_k(n, c.ratio)
        )
        assert payload.nbytes == 8 * k and np.count_nonzero(y) <= k
    out = np.full(n, 7.0, np.float32)
    assert c.decompress(payload, out=out) is out and same_bits(out, y)


@pytest.mark.parametrize("make", COMPRESSORS, ids=IDS)
@pytest.mark.parametrize("dtype", [np.float16, torch.bfloat16, torch.float32])
def test_dtypes_and_kinds(comm, make, dtype):
    x32 = grad(3000, seed=4)
    x = torch.from_numpy(x32).to(dtype) if isinstance(dtype, torch.dtype) else x32.astype(dtype)
    c = make(error_feedback=False)
    y = c.decompress(c.compress(x))
    assert type(y) is type(x) and y.dtype == x.dtype and tuple(y.shape) == tuple(x.shape)
    z = comm.allreduce(x, op="avg", compression=make(error_feedback=False))
    assert type(z) is type(x) and z.dtype == x.dtype
    assert same_bits(y, z), "one-rank allreduce == decompress(compress(x))"
    w = comm.allreduce(x, compression=make(error_feedback=False), out=x)  # in place
    assert w is x and same_bits(x, y)


@pytest.mark.parametrize("make", COMPRESSORS, ids=IDS)
def test_one_rank_allreduce_is_the_codec(comm, make):
    """With error feedback: allreduce on one rank == compress + decompress with the same key,
    step after step, residuals included (the same seeds, the same bits)."""
    a, b = make(error_feedback=True), make(error_feedback=True)
    for step in range(3):
        x = grad(2000, seed=step)
        y = comm.allreduce(x, compression=a, key="k")
        z = b.decompress(b.compress(x, key="k"))
        assert same_bits(y, z), f"step {step}"
        assert same_bits(a.residual("k"), b.residual("k"))
        assert a.last_stats.wire_bytes == 0 and a.last_stats.count == 2000 and a.last_stats.nonfinite == 0


# -- compress(out=): a payload overwritten in place ---------------------------------------------
FIXED_SIZE = [i for i in IDS if i not in ("randomk", "threshold")]


@pytest.mark.parametrize("make", COMPRESSORS, ids=IDS)
@pytest.mark.parametrize("n", [1, 5, 257, 5000])
def test_compress_into_a_payload(make, n):
    """compress(x, out=p) returns p, its arrays the same numpy objects over the same memory, with
    the bytes a fresh compress(x) makes (alignment padding zeroed: payloads are deterministic),
    step after step with error feedback (the same residuals and seeds)."""
    fixed = IDS[COMPRESSORS.index(make)] in FIXED_SIZE
    a, b = make(error_feedback=True), make(error_feedback=True)
    out = a.compress(grad(n, seed=1), key="k")
    b.compress(grad(n, seed=1), key="k")
    if not fixed:
        with pytest.raises(ValueError, match="fixed-size payloads"):
            a.compress(grad(n, seed=2), key="k", out=out)
        return
    arrays = dict(out.arrays)
    addresses = {name: v.ctypes.data for name, v in arrays.items()}
    for step in range(2, 4):
        x = grad(n, seed=step)
        got = a.compress(x, key="k", out=out)
        want = b.compress(x, key="k")
        assert got is out and out.shape == (n,)
        assert all(out.arrays[k] is v and v.ctypes.data == addresses[k] for k, v in arrays.items())
        assert bytes(out.wire) == bytes(want.wire), f"step {step}"
        assert same_bits(a.residual("k"), b.residual("k"))
        assert same_bits(a.decompress(out), b.decompress(want))
    fresh = [make(error_feedback=False).compress(grad(n)) for _ in range(2)]
    assert bytes(fresh[0].wire) == bytes(fresh[1].wire)


def test_compress_into_a_payload_refuses():
    q = zcoll.GradientQuantizer(error_feedback=False)
    p = q.compress(grad(1000))
    with pytest.raises(ValueError, match="expected a payload of int8.* from 999 float32"):
        q.compress(grad(999), out=p)
    with pytest.raises(ValueError, match="from 1000 float16"):
        q.compress(grad(1000).astype(np.float16), out=p)
    with pytest.raises(ValueError, match="not a payload"):
        zcoll.GradientQuantizer(bits=4, error_feedback=False).compress(grad(1000), out=p)
    with pytest.raises(ValueError, match="not a payload"):
        q.compress(grad(1000), out=np.empty(1016, np.uint8))
    t = zcoll.TopK(0.5, error_feedback=False)
    pt = t.compress(grad(64))  # 32 (index, value) pairs: 256 bytes, 64 floats
    with pytest.raises(ValueError, match="shares memory"):
        t.compress(np.frombuffer(pt.wire, np.float32), out=pt)


def test_payload_names_the_compressor_as_it_is_now(comm):
    """A payload carries repr(compressor), which is kept between calls: setting an attribute that
    repr shows renames the compressor, so older payloads are refused and stats name the new."""
    t = zcoll.TopK(0.5, error_feedback=False)
    p = t.compress(grad(64))
    assert p.method == repr(t) and t.compress(grad(64), out=p) is p
    t.error_feedback = True
    assert "error_feedback=True" in repr(t)
    with pytest.raises(ValueError, match="not a payload"):
        t.compress(grad(64), key="k", out=p)
    with pytest.raises(ValueError, match="not a payload"):
        t.decompress(p)
    q = t.compress(grad(64), key="k")
    assert q.method == repr(t) and t.decompress(q).shape == (64,)
    comm.allreduce(grad(64), compression=t, key="k")
    assert t.last_stats.method == repr(t)
    t.norm_sample = 16  # not in repr: payloads stay valid
    assert t.compress(grad(64), key="k", out=q) is q


# -- blockwise top-k ------------------------------------------------------------------------------
def np_blockwise_topk(x, ratio, exact=False):
    """numpy reference: per segment, the k_j = round(ratio * len_j) (at least 1) largest |x|, ties
    to the lower index; global indices in increasing order."""
    n = x.size
    s = zcoll._C.topk_segments(n, exact)
    picked = []
    for j in range(s):
        b, e = n * j // s, n * (j + 1) // s
        k = max(1, min(e - b, int(ratio * (e - b) + 0.5)))
        picked.append(b + np.sort(np.argsort(-np.abs(x[b:e]), kind="stable")[:k]))
    return np.concatenate(picked).astype(np.uint32)


@pytest.mark.parametrize(
    "n,want",
    [(0, 1), (1, 1), (32767, 1), (32768, 2), (65537, 4), (1 << 20, 8), (1 << 23, 8), ((1 << 24) + 9, 16)],
)
def test_topk_segment_rule(n, want):
    assert zcoll._C.topk_segments(n) == want and zcoll._C.topk_segments(n, True) == 1


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("n", [5000, 65537, (1 << 21) + 7])
def test_topk_is_blockwise(comm, n, exact):
    """Exactly k_j pairs per segment, equal to numpy's per-segment top-k (exact: the global
    top-k); the residual keeps exactly what was not sent; the one-rank allreduce is the codec."""
    x = grad(n, seed=n)
    c = zcoll.TopK(0.01, exact=exact)
    payload = c.compress(x, key="w")
    idx = payload.arrays["indices"]
    segs = c.segments(n)
    assert len(segs) == (1 if exact else zcoll._C.topk_segments(n))
    assert np.array_equal(idx, np_blockwise_topk(x, 0.01, exact))
    for b, e, k in segs:
        assert np.count_nonzero((idx >= b) & (idx < e)) == k
    assert np.array_equal(payload.arrays["values"], x[idx])
    e = c.residual("w")
    assert np.array_equal(e[idx], np.zeros(idx.size, np.float32))
    kept = np.ones(n, bool)
    kept[idx] = False
    assert np.array_equal(e[kept], x[kept])
    a = zcoll.TopK(0.01, exact=exact)
    y = comm.allreduce(x, compression=a, key="w")
    assert same_bits(y, c.decompress(payload)) and same_bits(a.residual("w"), e)
    assert a.last_stats.pairs == idx.size


def test_error_feedback_keeps_what_was_lost():
    q = zcoll.GradientQuantizer(bits=1)
    x = grad(1000)
    y = q.decompress(q.compress(x, key="g"))
    # r = x + 0; e = r - D(Q(r)): x == y + e up to one float32 rounding
    assert np.allclose(y.astype(np.float64) + q.residual("g"), x, rtol=0, atol=1e-6 * np.abs(x).max())
    t = zcoll.TopK(0.1)
    y = t.decompress(t.compress(x, key="g"))
    e = t.residual("g")
    assert np.array_equal(y + e, x) and np.count_nonzero(y * e) == 0  # sent xor kept
    y2 = t.decompress(t.compress(x, key="g"))  # second step picks from x + e
    assert np.array_equal(y + y2 + t.residual("g"), 2 * x)
    t.reset()
    assert t.residual("g") is None


def test_stats(comm):
    q = zcoll.GradientQuantizer(8, measure_error=True)
    x = grad(4096)
    comm.allreduce(x, compression=q, key="w")
    s = q.last_stats
    assert s.key == "w" and s.count == 4096 and s.method == repr(q)
    assert s.error_max_abs == np.abs(q.residual("w")).max() > 0
    assert s.error_l2 == pytest.approx(np.linalg.norm(q.residual("w").astype(np.float64)), rel=1e-6)
    q2 = zcoll.GradientQuantizer(8, error_feedback=False, measure_error=True)
    comm.allreduce(x, compression=q2)
    assert (
        q2.last_stats.error_max_abs == s.error_max_abs
    )  # the same first-step error, from a scratch residual
    q3 = zcoll.GradientQuantizer(8, error_feedback=False)
    comm.allreduce(x, compression=q3)
    assert q3.last_stats.error_max_abs is None


def runs_spread_over_every_sixteenth(a, sample):
    """The norm_sample elements of a flat array, written out independently: all up to sample,
    else 16 runs (fewer when sample < 16) of sample // runs, run j at j * (n // runs)."""
    n = a.size
    if n <= sample:
        return a
    runs = min(16, sample)
    length, stride = sample // runs, n // runs
    want = np.concatenate([a[j * stride : j * stride + length] for j in range(runs)])
    assert want.size == runs * length and (n - 1) // stride >= runs - 1  # the last sixteenth too
    return want


def squares(a):
    return float(np.sum(np.asarray(a, np.float64) ** 2))


@pytest.mark.parametrize(
    "n, sample", [(1, 4096), (4096, 4096), (4097, 4096), (1_000_003, 4096), (10, 4), (97, 16)]
)
def test_norm_sample_sums_the_input_before_and_the_residual_after(comm, n, sample):
    x = grad(n, seed=n)
    before = x.copy()
    q = zcoll.GradientQuantizer(1)
    q.norm_sample = sample
    comm.allreduce(x, compression=q, key="w", out=x)  # in place: the input is overwritten
    s = q.last_stats
    sampled = lambda a: squares(runs_spread_over_every_sixteenth(a, sample))
    assert s.input_squares == pytest.approx(sampled(before), rel=1e-9)
    assert s.residual_squares == pytest.approx(sampled(q.residual("w")), rel=1e-9)
    one_exact = n == 1  # sign of one value is exact
    assert s.residual_squares < s.input_squares and (s.residual_squares > 0 or one_exact)


def test_norm_sample_off_by_default_on_two_byte_inputs_and_without_a_residual(comm):
    x = grad(50_000)
    q = zcoll.GradientQuantizer(8)
    comm.allreduce(x, compression=q, key="w")
    assert q.last_stats.input_squares is None and q.last_stats.residual_squares is None
    for dtype in (torch.float16, torch.bfloat16):
        t = torch.from_numpy(x).to(dtype)
        q.norm_sample = 4096
        comm.allreduce(t, compression=q, key=str(dtype))
        want = squares(runs_spread_over_every_sixteenth(t.float().numpy(), 4096))
        assert q.last_stats.input_squares == pytest.approx(want, rel=1e-9), dtype
    h = zcoll.HalfPrecision("bf16")  # no error feedback: no residual
    h.norm_sample = 100
    comm.allreduce(x, compression=h)
    want = squares(runs_spread_over_every_sixteenth(x, 100))
    assert h.last_stats.input_squares == pytest.approx(want, rel=1e-9)
    assert h.last_stats.residual_squares == 0.0
    q.norm_sample = 4096
    comm.allreduce(np.zeros(0, np.float32), compression=q, key="empty")
    assert q.last_stats.input_squares == 0.0


@pytest.mark.parametrize("make", COMPRESSORS, ids=IDS)
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_nonfinite_raises(comm, make, value):
    c = make(error_feedback=True)
    x = grad(1000)
    comm.allreduce(x, compression=c, key="layer3.bias")
    x[:] = value  # every element, so that random-k draws one too
    with pytest.raises(FloatingPointError, match="'layer3.bias'"):
        comm.allreduce(x, compression=c, key="layer3.bias")
    assert not c.residual("layer3.bias").any()
    with pytest.raises(FloatingPointError, match="NaN or Inf"):
        c.compress(x)
    y = comm.allreduce(grad(1000), compression=c, key="layer3.bias")
    assert np.isfinite(y).all()


def test_fp16_overflow_raises(comm):
    x = grad(100)
    x[3] = 1e6  # beyond float16's range
    with pytest.raises(FloatingPointError, match="NaN or Inf"):
        comm.allreduce(x, compression=zcoll.HalfPrecision("fp16"))
    comm.allreduce(x, compression=zcoll.HalfPrecision("bf16"))  # bfloat16 has float32's range


def splitmix_chain(*words: int) -> int:
    """The per-call seed's definition in Python integers: splitmix64 chained over the words."""
    mask, z = (1 << 64) - 1, 0
    for w in words:
        z = ((z ^ w) + 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        z ^= z >> 31
    return z


def test_call_seed_is_the_splitmix_chain():
    """The per-call seeds that stochastic rounding and random-k draw from (so checkpoints and
    ranks agree) are splitmix64 chained over (seed, crc32(key), call), now computed in C++."""
    rng = np.random.default_rng(3)
    words = [(0, 0, 0), (11, 0, 1), ((1 << 64) - 1, (1 << 32) - 1, (1 << 64) - 1)]
    words += [tuple(int(v) for v in rng.integers(0, 1 << 63, 3, dtype=np.uint64)) for _ in range(50)]
    for w in words:
        assert zcoll._C.call_seed(*w) == splitmix_chain(*w), w
    a, b = zcoll.RandomK(0.1, seed=5), zcoll.RandomK(0.1, seed=5)
    x = grad(1000, seed=9)
    for _ in range(3):  # the same seed and call count: the same indices; the next call: others
        assert np.array_equal(a.compress(x).arrays["indices"], b.compress(x).arrays["indices"])
    assert not np.array_equal(
        a.compress(x).arrays["indices"], zcoll.RandomK(0.1, seed=5).compress(x).arrays["indices"]
    )
