"""Compression kernels through zcoll._C, single process (csrc/kernels/quantize.h, sparsify.h).

Every kernel table (avx2, avx512, dispatch; those this CPU lacks are skipped with a reason, see
kernel_tables.py) is compared bit for bit with the scalar reference, kernel by kernel; the
scalar reference is checked against the documented payload layout (decoded here in numpy), the
error bounds, stochastic rounding's bias, the error-feedback invariant, numpy's float16 /
bfloat16 conversions, and numpy's top-k / add.at.
"""

import numpy as np
import pytest
from kernel_tables import IMPLS, SIMD_IMPLS, require
from numerics import bf16_from_f32, random_bits
from zcoll import _C as C

F32, F16, BF16 = 0, 2, 3
# Around every vector width (8, 16) and block size (256), a prime (1009), and a large one.
SIZES = [0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 255, 256, 257, 1000, 1009, 4097, 1 << 20]
MODES = [(8, "nearest"), (8, "stochastic"), (4, "nearest"), (4, "stochastic"), (1, "nearest")]
QMAX = {8: 127, 4: 7}


def addr(a):
    return a.ctypes.data


def bits_equal(a, b):
    """Bitwise equality, every NaN counted equal (NaN payloads are not part of the contract)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "f":
        nan_a, nan_b = np.isnan(a), np.isnan(b)
        return np.array_equal(nan_a, nan_b) and np.array_equal(
            np.where(nan_a, 0, a).view(np.uint8), np.where(nan_b, 0, b).view(np.uint8)
        )
    return np.array_equal(a, b)


def widen_bf16(h):
    return (h.astype(np.uint32) << 16).view(np.float32)


def as_input(x32, dtype):
    """(array to pass, its exact float32 value) for a dtype code."""
    if dtype == F32:
        return x32, x32
    if dtype == F16:
        with np.errstate(over="ignore"):
            h = x32.astype(np.float16)
        return h, h.astype(np.float32)
    h = bf16_from_f32(x32)
    return h, widen_bf16(h)


def quantize(x, dtype, bits=8, block=256, rounding="nearest", seed=0, offset=0, impl="dispatch"):
    n = x.size
    codes = np.full(C.code_bytes(n, bits), 0xAA, np.uint8)
    scales = np.full(C.num_blocks(n, block), -1.0, np.float32)
    st = C.quantize(
        addr(x),
        dtype,
        n,
        addr(codes),
        addr(scales),
        bits=bits,
        block=block,
        rounding=rounding,
        seed=seed,
        offset=offset,
        impl=impl,
    )
    return codes, scales, st


def np_decode(codes, scales, n, bits, block):
    """The documented payload layout, decoded independently of the C++ code."""
    s = np.repeat(scales, block)[:n]
    if bits == 8:
        q = codes.view(np.int8)[:n].astype(np.float32)
        return q * s
    if bits == 4:
        nib = np.empty(2 * codes.size, np.int16)
        nib[0::2], nib[1::2] = codes & 0xF, codes >> 4
        q = ((nib[:n] ^ 8) - 8).astype(np.float32)
        return q * s
    neg = np.unpackbits(codes, bitorder="little")[:n].astype(bool)
    return np.where(neg, -s, s)


def dequantize(codes, scales, n, bits, block=256, y=None, impl="dispatch"):
    acc = y is not None
    y = np.zeros(n, np.float32) if y is None else y.copy()
    C.dequantize(addr(codes), addr(scales), n, addr(y), bits=bits, block=block, accumulate=acc, impl=impl)
    return y


def block_absmax(x, block):
    n = x.size
    pad = np.zeros(C.num_blocks(n, block) * block, np.float32)
    pad[:n] = np.abs(x)
    return np.repeat(pad.reshape(-1, block).max(axis=1), block)[:n]


def gradient(n, seed=1):
    rng = np.random.default_rng(seed)
    # blocks of very different scale, like the layers of a model
    return (rng.standard_normal(n) * np.repeat(10.0 ** rng.uniform(-6, 3, n // 256 + 1), 256)[:n]).astype(
        np.float32
    )


def edge_values(n=4096):
    x = gradient(n, seed=7)
    x[0:256] = 0.0  # an all-zero block
    x[256:512] = -0.0  # negative zeros
    x[512:768] = np.float32(1.5e-42) * np.arange(-128, 128)  # denormals
    x[768:1024] = 3.0e38  # huge, all equal
    x[1024:1280] = np.where(np.arange(256) % 2, 3.4e38, -3.4e38)  # near FLT_MAX, alternating
    x[1280:1536] = -2.5  # all equal, negative
    x[1536:1544] = [1e-45, -1e-45, 0, 1e-44, 0, 0, -0.0, 1e-45]  # smallest denormals
    x[1792:2048] = np.float32(1e-38) * np.arange(256)  # normal / denormal boundary
    return x.astype(np.float32)


# ---- bit-identical SIMD vs scalar -------------------------------------------------------------


@pytest.mark.parametrize("impl", SIMD_IMPLS)
@pytest.mark.parametrize("bits,rounding", MODES)
@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_quantize_simd_matches_scalar(bits, rounding, dtype, impl):
    require(impl)
    for n in SIZES:
        x, _ = as_input(gradient(n), dtype)
        ref = quantize(x, dtype, bits, rounding=rounding, seed=5, impl="scalar")
        assert ref[2] == (0, -1)
        got = quantize(x, dtype, bits, rounding=rounding, seed=5, impl=impl)
        assert bits_equal(got[0], ref[0]) and bits_equal(got[1], ref[1]) and got[2] == ref[2], n
        assert bits_equal(
            dequantize(got[0], got[1], n, bits, impl=impl), dequantize(*ref[:2], n, bits, impl="scalar")
        ), n


@pytest.mark.parametrize("impl", SIMD_IMPLS)
@pytest.mark.parametrize(
    "block,bits,rounding",
    [(b, bits, r) for b in (8, 16, 24, 40, 1000, 4096) for bits, r in MODES if bits != 1 or b % 8 == 0],
)
def test_block_sizes_simd_matches_scalar(block, bits, rounding, impl):
    require(impl)
    for n in (block - 1, block * 3 + 5, 4097):
        x = gradient(n)
        ref = quantize(x, F32, bits, block, rounding, seed=3, impl="scalar")
        y = np.linspace(-1, 1, n).astype(np.float32)
        yref = dequantize(ref[0], ref[1], n, bits, block, y=y, impl="scalar")
        assert bits_equal(yref, y + np_decode(ref[0], ref[1], n, bits, block))
        got = quantize(x, F32, bits, block, rounding, seed=3, impl=impl)
        assert bits_equal(got[0], ref[0]) and bits_equal(got[1], ref[1]), n
        assert bits_equal(dequantize(got[0], got[1], n, bits, block, y=y, impl=impl), yref), n


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bits,rounding", MODES)
@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_edge_values(bits, rounding, dtype, impl):
    require(impl)
    x, x32 = as_input(edge_values(), dtype)
    n = x.size
    ref = quantize(x, dtype, bits, rounding=rounding, impl="scalar")
    if impl != "scalar":
        got = quantize(x, dtype, bits, rounding=rounding, impl=impl)
        assert bits_equal(got[0], ref[0]) and bits_equal(got[1], ref[1]), impl
        return
    if dtype != F32:
        return  # 3e38 overflows float16 (flagged, see test_nonfinite_flagged)
    assert ref[2] == (0, -1)  # 3.4e38 is finite
    codes, scales, _ = ref
    assert np.all(np.isfinite(scales))
    d = np_decode(codes, scales, n, bits, 256)
    assert np.all(np.isfinite(d))
    assert np.all(d[0:512] == 0)  # zero blocks (+0 and -0): scale 0
    if bits != 1:
        # all-equal blocks code to +-Q exactly and decode to the value up to the scale's rounding
        np.testing.assert_allclose(d[768:1024], x32[768:1024], rtol=2**-22)
        np.testing.assert_allclose(d[1280:1536], x32[1280:1536], rtol=2**-22)


# ---- error bounds ----------------------------------------------------------------------------


@pytest.mark.parametrize("bits,rounding", MODES)
@pytest.mark.parametrize("data", ["gradient", "edge", "uniform", "denormal"])
def test_error_bound(bits, rounding, data):
    rng = np.random.default_rng(2)
    x = {
        "gradient": gradient(1 << 16),
        "edge": edge_values(),
        "uniform": rng.uniform(-1, 1, 10000).astype(np.float32),
        "denormal": (rng.uniform(-1, 1, 1 << 14) * 2.0 ** np.repeat(rng.uniform(-149, -110, 64), 256)).astype(
            np.float32
        ),
    }[data]
    n = x.size
    codes, scales, _ = quantize(x, F32, bits, rounding=rounding, seed=11)
    d = np_decode(codes, scales, n, bits, 256)
    assert bits_equal(d, dequantize(codes, scales, n, bits))
    amax = block_absmax(x, 256).astype(np.float64)
    err = np.abs(x.astype(np.float64) - d.astype(np.float64))
    tiny = 2.0**-149
    if bits == 1:
        assert np.all(err <= amax * (1 + 2**-20) + tiny)
        return
    q = QMAX[bits]
    step = amax / q
    bound = step / 2 if rounding == "nearest" else step
    denormal_scale = amax < q * 2.0**-126
    assert np.all(err <= bound + amax * 2**-22 + np.where(denormal_scale, q * tiny, 0)), (err - bound).max()
    if data == "uniform" and rounding == "nearest":
        assert err.max() > 0.9 * (amax / (2 * q)).max()  # the bound is tight


def test_sign_keeps_block_l1_norm():
    x = gradient(4096)
    codes, scales, _ = quantize(x, F32, 1)
    d = np_decode(codes, scales, x.size, 1, 256)
    l1 = np.abs(x.astype(np.float64)).reshape(-1, 256).sum(axis=1)
    np.testing.assert_allclose(np.abs(d.astype(np.float64)).reshape(-1, 256).sum(axis=1), l1, rtol=1e-5)
    assert np.all(np.sign(d[x != 0]) == np.sign(x[x != 0]))


# ---- stochastic rounding -------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [8, 4])
def test_stochastic_rounding_unbiased(bits):
    x = np.random.default_rng(4).uniform(-1, 1, 2048).astype(np.float32)
    x[::256] = 1.0  # absmax 1 in every block: step = 1/q
    step = 1.0 / QMAX[bits]
    worst = []
    for trials in (16, 256):
        acc = np.zeros(x.size, np.float64)
        for seed in range(trials):
            codes, scales, _ = quantize(x, F32, bits, rounding="stochastic", seed=seed)
            acc += np_decode(codes, scales, x.size, bits, 256)
        mean_err = acc / trials - x
        # per element the error of one draw has std <= step/2: the mean of T draws <= step/(2 sqrt T)
        assert np.abs(mean_err).max() < 6 * step / (2 * np.sqrt(trials))
        worst.append(np.abs(mean_err).mean())
        assert abs(mean_err.mean()) < 4 * step / (2 * np.sqrt(trials * x.size))
    assert worst[1] < worst[0] / 2  # shrinks like 1/sqrt(trials)


@pytest.mark.parametrize("impl", IMPLS)
def test_stochastic_rounding_reproducible_and_chunkable(impl):
    require(impl)
    x = gradient(10000)
    a = quantize(x, F32, 8, rounding="stochastic", seed=42)
    b = quantize(x, F32, 8, rounding="stochastic", seed=42)
    c = quantize(x, F32, 8, rounding="stochastic", seed=43)
    assert bits_equal(a[0], b[0]) and not bits_equal(a[0], c[0])
    nearest = quantize(x, F32, 8)
    assert not bits_equal(a[0], nearest[0])
    # A slice starting on a block boundary, with offset = its start, is coded like the whole.
    s = quantize(x[2560:7000].copy(), F32, 8, rounding="stochastic", seed=42, offset=2560, impl=impl)
    assert bits_equal(s[0], a[0][2560:7000]) and bits_equal(s[1], a[1][10:28])
    s4 = quantize(x[2560:7001].copy(), F32, 4, rounding="stochastic", seed=42, offset=2560, impl=impl)
    w4 = quantize(x, F32, 4, rounding="stochastic", seed=42, impl=impl)
    assert bits_equal(s4[0][:-1], w4[0][1280:3500])


@pytest.mark.parametrize("impl", SIMD_IMPLS)
@pytest.mark.parametrize("offset", [2**32 - 100, 2**32 - 3, 2**32 - 17, 2**63 + 12345, 2**64 - 4097])
def test_stochastic_rounding_counter_wraps(offset, impl):
    # the 64-bit counter offset + i crosses 2^32 inside a vector: every table carries the same way
    require(impl)
    x = gradient(4097)
    ref = quantize(x, F32, 8, rounding="stochastic", seed=1, offset=offset, impl="scalar")
    got = quantize(x, F32, 8, rounding="stochastic", seed=1, offset=offset, impl=impl)
    assert bits_equal(got[0], ref[0]), impl
    assert not bits_equal(ref[0], quantize(x, F32, 8, rounding="stochastic", seed=1, offset=offset + 1)[0])


# ---- fused kernels ----------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bits,rounding", MODES)
def test_dequantize_add(bits, rounding, impl):
    """Against the documented decode (numpy); that is the scalar reference's result too."""
    require(impl)
    for n in SIZES:
        x = gradient(n)
        codes, scales, _ = quantize(x, F32, bits, rounding=rounding, impl="scalar")
        y = np.random.default_rng(3).standard_normal(n).astype(np.float32)
        expect = y + np_decode(codes, scales, n, bits, 256)  # float32 multiply, then add: same IEEE ops
        assert bits_equal(dequantize(codes, scales, n, bits, y=y, impl=impl), expect), n
        assert bits_equal(dequantize(codes, scales, n, bits, y=y, impl="scalar"), expect), n


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bits,rounding", MODES)
@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_dequantize_add_quantize(bits, rounding, dtype, impl):
    """One ring hop equals decode (numpy) + add, then quantize with the scalar reference."""
    require(impl)
    for n in SIZES:
        cin, sin, _ = quantize(gradient(n, seed=3), F32, bits, impl="scalar")
        x, x32 = as_input(gradient(n, seed=4), dtype)
        s_expect = np_decode(cin, sin, n, bits, 256) + x32
        ref = quantize(s_expect, F32, bits, rounding=rounding, seed=9, offset=77, impl="scalar")
        cout = np.zeros_like(ref[0])
        sout = np.zeros_like(ref[1])
        total = np.zeros(n, np.float32)
        st = C.dequantize_add_quantize(
            addr(cin),
            addr(sin),
            addr(x),
            dtype,
            n,
            addr(cout),
            addr(sout),
            addr(total),
            bits=bits,
            rounding=rounding,
            seed=9,
            offset=77,
            impl=impl,
        )
        assert st == (0, -1)
        assert bits_equal(total, s_expect) and bits_equal(cout, ref[0]) and bits_equal(sout, ref[1]), impl
        c2, s2 = np.zeros_like(cout), np.zeros_like(sout)  # sum_out is optional
        C.dequantize_add_quantize(
            addr(cin),
            addr(sin),
            addr(x),
            dtype,
            n,
            addr(c2),
            addr(s2),
            0,
            bits=bits,
            rounding=rounding,
            seed=9,
            offset=77,
            impl=impl,
        )
        assert bits_equal(c2, cout) and bits_equal(s2, sout)


def quantize_ef(g, e, dtype, bits, rounding="nearest", seed=0, impl="dispatch"):
    n = g.size
    codes = np.zeros(C.code_bytes(n, bits), np.uint8)
    scales = np.zeros(C.num_blocks(n, 256), np.float32)
    st = C.quantize_ef(
        addr(g),
        dtype,
        addr(e),
        n,
        addr(codes),
        addr(scales),
        bits=bits,
        rounding=rounding,
        seed=seed,
        impl=impl,
    )
    return codes, scales, st


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bits,rounding", MODES)
def test_error_feedback_invariant(bits, rounding, impl):
    """Five steps of error feedback: codes Q(g + e), residuals bit-identical to the scalar
    reference's, and sent + owed == the sum of the gradients."""
    require(impl)
    for n in [s for s in SIZES if 0 < s < 1 << 20] + [1 << 18]:
        e, e_ref = np.zeros(n, np.float32), np.zeros(n, np.float32)
        sum_g = np.zeros(n, np.float64)
        sum_d = np.zeros(n, np.float64)
        for step in range(5):
            g = gradient(n, seed=100 + step)
            sum_g += g
            r = g + e  # what the kernel codes
            codes, scales, st = quantize_ef(g, e, F32, bits, rounding, seed=step, impl=impl)
            assert st == (0, -1)
            ref = quantize_ef(g, e_ref, F32, bits, rounding, seed=step, impl="scalar")
            assert bits_equal(codes, ref[0]) and bits_equal(scales, ref[1]) and bits_equal(e, e_ref), (
                n,
                step,
            )
            q = quantize(r, F32, bits, rounding=rounding, seed=step, impl="scalar")
            assert bits_equal(codes, q[0]) and bits_equal(scales, q[1])  # codes Q(g + e)
            sum_d += np_decode(codes, scales, n, bits, 256)
        # sum of what was sent + what is still owed == sum of the gradients (float rounding only)
        scale = np.abs(sum_g).max()
        np.testing.assert_allclose(sum_d + e, sum_g, rtol=0, atol=scale * 5 * 2**-21)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_error_feedback_half_gradients(dtype, impl):
    require(impl)
    for n in SIZES:
        g, g32 = as_input(gradient(n), dtype)
        e0 = gradient(n, seed=9) * np.float32(0.01)
        e, e_ref = e0.copy(), e0.copy()
        codes, scales, _ = quantize_ef(g, e, dtype, 8, impl=impl)
        ref = quantize_ef(g, e_ref, dtype, 8, impl="scalar")
        assert bits_equal(codes, ref[0]) and bits_equal(scales, ref[1]) and bits_equal(e, e_ref), n
        assert bits_equal(e, (g32 + e0) - np_decode(codes, scales, n, 8, 256)), n


# ---- casts ---------------------------------------------------------------------------------------------


def cast_inputs(n):
    """float32 values for the narrowing casts: gradients, the edges of float16's range (overflow,
    ties, subnormal results), and every third block of 8 random bit patterns (NaN payloads,
    infinities, subnormals)."""
    x = gradient(n) * np.float32(1e-3)
    bits = random_bits(np.random.default_rng(n), n, "float32")
    mask = (np.arange(n) // 8) % 3 == 2
    x[mask] = bits[mask]
    edges = np.array(
        [
            np.inf,
            -np.inf,
            np.nan,
            65520.0,
            65519.0,
            1e-8,
            -0.0,
            3e38,
            2.0**-25,
            2.0**-24 * 1.5,
            1.0 + 2.0**-11,
        ],
        np.float32,
    )
    k = min(n, edges.size)
    x[:k] = edges[:k]
    return x


def cast(x, from_code, to_code, out_dtype, impl):
    y = np.zeros(x.size, out_dtype)
    C.cast(addr(x), from_code, addr(y), to_code, x.size, impl=impl)
    return y


@pytest.mark.parametrize("impl", IMPLS)
def test_casts(impl):
    """float32 -> float16 / bfloat16 against numpy's rounding (float16) and the bfloat16 spec,
    and back (exact); every table against the scalar reference, bit for bit."""
    require(impl)
    for n in SIZES:
        x = cast_inputs(n)
        h = cast(x, F32, F16, np.float16, impl)
        with np.errstate(over="ignore"):
            ref = x.astype(np.float16)
        assert bits_equal(h, ref), n
        b = cast(x, F32, BF16, np.uint16, impl)
        assert np.array_equal(b, bf16_from_f32(x)), n
        for src, code, expect in ((h, F16, ref.astype(np.float32)), (b, BF16, widen_bf16(b))):
            y = cast(src, code, F32, np.float32, impl)
            assert bits_equal(y, expect), n
            assert np.array_equal(
                y.view(np.uint32), cast(src, code, F32, np.float32, "scalar").view(np.uint32)
            )
        # NaN payloads included, every table rounds like the scalar reference
        assert np.array_equal(h.view(np.uint16), cast(x, F32, F16, np.float16, "scalar").view(np.uint16)), n
        assert np.array_equal(b, cast(x, F32, BF16, np.uint16, "scalar")), n


# ---- NaN / Inf ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bits", [8, 4, 1])
def test_nonfinite_flagged(bits, impl):
    require(impl)
    n = 2048
    x = gradient(n)
    x[3 * 256 + 17] = np.nan
    x[5 * 256] = -np.inf
    x[7 * 256 + 255] = np.inf
    codes, scales, st = quantize(x, F32, bits, impl=impl)
    assert st == (3, 3), impl
    bad = [3, 5, 7]
    assert np.all(np.isnan(scales[bad])) and np.all(np.isfinite(np.delete(scales, bad)))
    d = np_decode(codes, scales, n, bits, 256)
    assert np.all(np.isnan(d.reshape(-1, 256)[bad])) and np.all(
        np.isfinite(np.delete(d.reshape(-1, 256), bad, 0))
    )
    per_block = C.code_bytes(256, bits)
    assert not codes.reshape(-1, per_block)[bad].any()  # codes 0
    # error feedback and the ring hop report the same
    e = np.zeros(n, np.float32)
    assert quantize_ef(x, e, F32, bits, impl=impl)[2] == (3, 3)
    assert np.all(np.isnan(e.reshape(-1, 256)[bad])) and np.all(
        np.isfinite(np.delete(e.reshape(-1, 256), bad, 0))
    )
    good, gs, _ = quantize(gradient(n), F32, bits)
    c2, s2 = np.zeros_like(codes), np.zeros_like(scales)
    st = C.dequantize_add_quantize(
        addr(good), addr(gs), addr(x), F32, n, addr(c2), addr(s2), bits=bits, impl=impl
    )
    assert st == (3, 3)
    gs[1] = np.nan  # a poisoned incoming payload is caught too
    fine = gradient(n)
    st = C.dequantize_add_quantize(
        addr(good), addr(gs), addr(fine), F32, n, addr(c2), addr(s2), bits=bits, impl=impl
    )
    assert st == (1, 1)


def test_overflowing_sum_flagged():
    g = np.full(512, 3e38, np.float32)
    e = np.full(512, 3e38, np.float32)
    assert quantize_ef(g, e, F32, 8)[2] == (2, 0)


# ---- bad arguments -------------------------------------------------------------------------------------------


def test_bad_arguments_raise_value_error():
    x = np.zeros(64, np.float32)
    buf = np.zeros(64, np.uint8)
    s = np.zeros(8, np.float32)
    for kwargs in (
        {"bits": 2},
        {"bits": 0},
        {"bits": 16},
        {"block": 0},
        {"bits": 4, "block": 7},
        {"bits": 1, "block": 12},
        {"bits": 1, "rounding": "stochastic"},
        {"rounding": "up"},
        {"impl": "neon"},
    ):
        with pytest.raises(ValueError):
            C.quantize(addr(x), F32, 64, addr(buf), addr(s), **kwargs)
    with pytest.raises(ValueError):
        C.quantize(addr(x), 6, 64, addr(buf), addr(s))  # int32 input
    with pytest.raises(ValueError):
        C.dequantize(addr(buf), addr(s), 64, addr(x), bits=3)
    with pytest.raises(ValueError):
        C.quantize_ef(addr(x), F32, addr(x), 64, addr(buf), addr(s), block=0)
    with pytest.raises(ValueError):
        C.dequantize_add_quantize(addr(buf), addr(s), addr(x), F32, 64, addr(buf), addr(s), bits=5)
    with pytest.raises(ValueError):
        C.cast(addr(x), F32, addr(buf), 6, 4)
    with pytest.raises(ValueError):
        C.num_blocks(10, 0)
    with pytest.raises(ValueError):
        C.code_bytes(10, 3)
    idx = np.zeros(64, np.uint32)
    with pytest.raises(ValueError):
        C.topk(addr(x), 64, 65, addr(idx), addr(x))
    with pytest.raises(ValueError):
        C.topk(addr(x), 64, 6, addr(idx), addr(x), method="approx")
    with pytest.raises(ValueError):
        C.threshold(addr(x), 64, -1.0, addr(idx), addr(x), 64)
    with pytest.raises(ValueError):
        C.threshold(addr(x), 64, float("nan"), addr(idx), addr(x), 64)
    with pytest.raises(ValueError):
        C.randomk(addr(x), 64, 65, 0, addr(idx), addr(x))
    idx[3] = 64
    with pytest.raises(ValueError):
        C.scatter_add(addr(x), 64, addr(idx), addr(x), 4)
    assert not x.any()  # untouched


def test_layout_helpers():
    assert C.num_blocks(0, 256) == 0 and C.num_blocks(257, 256) == 2
    assert [C.code_bytes(9, b) for b in (8, 4, 1)] == [9, 5, 2]
    assert C.quant_layout(1000, 8, 256) == (4, 1000, 1000, 1016)
    assert C.quant_layout(1001, 4, 256) == (4, 501, 504, 520)


# ---- sparsifiers ------------------------------------------------------------------------------------------


def topk(x, k, method="sampled", seed=0, impl="dispatch", sample=0):
    idx = np.full(k, 0xFFFFFFFF, np.uint32)
    val = np.full(k, np.nan, np.float32)
    C.topk(addr(x), x.size, k, addr(idx), addr(val), method=method, seed=seed, impl=impl, sample=sample)
    return idx, val


def np_topk(x, k):
    """Reference: largest |x| bit pattern first, ties by lower index; returned in index order."""
    keys = (x.view(np.uint32) & 0x7FFFFFFF).astype(np.int64)
    order = np.lexsort((np.arange(x.size), -keys))[:k]
    return np.sort(order)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "n,k",
    [
        (0, 0),
        (1, 1),
        (7, 3),
        (8, 8),
        (9, 2),
        (15, 1),
        (16, 5),
        (17, 17),
        (31, 4),
        (33, 10),
        (1000, 10),
        (1009, 100),
        (4097, 41),
        (100000, 1000),
        (1 << 20, 10486),
        (1 << 20, 1),
        (1 << 20, 200000),
        (50000, 50000),
    ],
)
def test_topk_matches_numpy(n, k, impl):
    """Every table, both methods, against numpy's top-k and the scalar reference."""
    require(impl)
    x = gradient(n, seed=n)
    want = np.sort(np.argpartition(-np.abs(x), k - 1)[:k]) if 0 < k < n else np.arange(k)
    assert np.array_equal(np_topk(x, k), want)  # no ties in this data: same as argpartition
    for method in ("exact", "sampled"):
        idx, val = topk(x, k, method, impl=impl)
        assert np.array_equal(idx, want), method
        assert bits_equal(val, x[idx])
        ref = topk(x, k, method, impl="scalar")
        assert np.array_equal(idx, ref[0]) and bits_equal(val, ref[1]), method


@pytest.mark.parametrize("impl", IMPLS)
def test_topk_ties_and_specials(impl):
    require(impl)
    n = 1 << 18
    rng = np.random.default_rng(5)
    x = rng.integers(-20, 21, n).astype(np.float32)  # massive ties: magnitudes 0..20
    x[rng.integers(0, n, 50)] = -0.0
    for k in (1, 100, 2621, 30000, 65536):
        want = np_topk(x, k)
        for method in ("exact", "sampled"):
            idx, val = topk(x, k, method, seed=k, impl=impl)
            assert np.array_equal(idx, want), (k, method)
    x[[5, 77, 1000]] = [np.nan, -np.inf, np.inf]
    idx, val = topk(x, 3, impl=impl)
    assert list(idx) == [5, 77, 1000]  # NaN and Inf sort first (and are visible in val)
    assert np.isnan(val[0]) and np.isinf(val[1:]).all()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("k", [2621, 10486, 40000])
def test_topk_mostly_zeros(k, impl):
    # 0.5% non-zeros (an embedding gradient): k beyond them must take the lowest-index zeros
    require(impl)
    n = 1 << 20
    rng = np.random.default_rng(k)
    x = np.zeros(n, np.float32)
    nz = rng.choice(n, n // 200, replace=False)
    x[nz] = rng.standard_normal(nz.size)
    x[rng.choice(n, 100, replace=False)] = -0.0
    want = np_topk(x, k)
    for method in ("sampled", "exact"):
        idx, val = topk(x, k, method, impl=impl)
        assert np.array_equal(idx, want), method
        assert bits_equal(val, x[idx])
    g, e = x.copy(), np.zeros(n, np.float32)
    idx2, val2 = np.zeros(k, np.uint32), np.zeros(k, np.float32)
    C.topk_ef(addr(g), addr(e), n, k, addr(idx2), addr(val2), impl=impl)
    assert np.array_equal(idx2, want)


def test_topk_sampled_seed_independent():
    x = gradient(1 << 20, seed=3)
    a = topk(x, 10486, seed=1)
    for seed in (2, 3, 12345):
        assert np.array_equal(topk(x, 10486, seed=seed)[0], a[0])


@pytest.mark.parametrize("n,k", [(32768, 328), (16384, 4096)])
def test_topk_sampled_retry_same_pairs(n, k):
    """Many seeds on a segment-sized input: the first threshold (2 sigma) misses in about 1 call
    of 100 and the pass runs again at 4 sigma; every seed must give the exact pairs (and, with
    error feedback, the exact residual: the retry must not add g to e twice)."""
    x = gradient(n, seed=n + k)
    want, _ = topk(x, k, "exact")
    e0 = gradient(n, seed=7) * np.float32(0.5)
    want_ef = np_topk(x + e0, k)
    for seed in range(300):
        assert np.array_equal(topk(x, k, "sampled", seed=seed)[0], want), seed
    for seed in range(0, 300, 3):
        e = e0.copy()
        idx, val = np.zeros(k, np.uint32), np.zeros(k, np.float32)
        C.topk_ef(addr(x), addr(e), n, k, addr(idx), addr(val), method="sampled", seed=seed)
        r = x + e0
        assert np.array_equal(idx, want_ef) and bits_equal(val, r[idx]), seed
        r[idx] = 0
        assert bits_equal(e, r), seed


def candidate_shapes(n, seed):
    """Inputs that steer the candidates' histogram (phase 4) into each of its cases: layered
    scales, a smooth tail, ties at the k-th magnitude, and outliers far beyond its 8-octave window."""
    rng = np.random.default_rng(seed)
    kind = seed % 4
    if kind == 0:
        return gradient(n, seed=seed)
    if kind == 1:
        return rng.standard_normal(n).astype(np.float32)
    if kind == 2:  # few distinct magnitudes: the k-th key is shared by many candidates
        return (rng.integers(-40, 41, n) * np.float32(0.25)).astype(np.float32)
    x = rng.standard_normal(n).astype(np.float32)
    x[rng.integers(0, n, 40)] = rng.choice([1e30, -1e30, np.inf, np.nan], 40)
    return x


@pytest.mark.parametrize("n,k", [(32768, 328), (32769, 1), (65536, 655), (131072, 4096)])
def test_topk_sampled_exact_pairs_many_inputs(n, k):
    """320 different inputs per shape, segment-sized and layered, ties and outliers included: the
    sampled method returns exactly the pairs of the exact one (the order of |x| bit patterns, ties
    by lower index), whatever the candidates' histogram and compaction took as a shortcut."""
    # The public path's segments sample their share of the tensor's sample (256 positions for a
    # 32 K segment of 1 MiB): fewer positions, a deeper threshold, more retries; the same pairs.
    share = C.topk_sample_share(8 * n, n)
    whole = min(65536, max(512, 8 * n // 128))  # topk_sample_size of the whole tensor
    assert share == min(max(256, whole // 8), max(512, n // 128))
    for seed in range(320):
        x = candidate_shapes(n, seed)
        want = np_topk(x, k)
        for sample in (0, share):
            idx, val = topk(x, k, "sampled", seed=seed, sample=sample)
            assert np.array_equal(idx, want), (seed, sample)
            assert bits_equal(val, x[idx]), (seed, sample)


def test_topk_threshold_estimate():
    x = gradient(1 << 20, seed=3)
    for k in (1000, 10486, 100000):
        t = C.topk_threshold(addr(x), x.size, k, 0)
        got = int((np.abs(x) > t).sum())
        assert 0.8 * k < got < 1.2 * k, (k, got)


def topk_ef(g, e0, k, method, impl):
    """(idx, val, e) of topk_ef on a copy of the residual e0."""
    e = e0.copy()
    idx = np.zeros(k, np.uint32)
    val = np.zeros(k, np.float32)
    C.topk_ef(addr(g), addr(e), g.size, k, addr(idx), addr(val), method=method, impl=impl)
    return idx, val, e


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("method", ["exact", "sampled"])
@pytest.mark.parametrize(
    "n,k", [(0, 0), (1, 1), (8, 3), (9, 9), (17, 5), (33, 4), (1000, 10), (1009, 7), (1 << 20, 10486)]
)
def test_topk_error_feedback(method, n, k, impl):
    require(impl)
    g = gradient(n, seed=1)
    e0 = gradient(n, seed=2) * np.float32(0.5)
    r = g + e0
    idx, val, e = topk_ef(g, e0, k, method, impl)
    assert np.array_equal(idx, np_topk(r, k))
    assert bits_equal(val, r[idx])
    expect = r.copy()
    expect[idx] = 0
    assert bits_equal(e, expect)
    ref = topk_ef(g, e0, k, method, "scalar")
    assert np.array_equal(idx, ref[0]) and bits_equal(val, ref[1]) and bits_equal(e, ref[2])
    # invariant: sent + residual == g + e_old
    full = np.zeros(n, np.float32)
    full[idx] = val
    assert bits_equal(full + e, r)


def threshold(x, t, cap, impl):
    idx = np.zeros(cap, np.uint32)
    val = np.zeros(cap, np.float32)
    c = C.threshold(addr(x), x.size, t, addr(idx), addr(val), cap, impl=impl)
    return c, idx[: min(c, cap)], val[: min(c, cap)]


@pytest.mark.parametrize("impl", IMPLS)
def test_threshold(impl):
    require(impl)
    for n in SIZES:
        x = gradient(n)
        x[n // 2 : n // 2 + 3] = 1.0  # keys equal to a threshold: not selected (|x| > t only)
        for t in (0.0, 1e-3, 1.0, 100.0, np.inf):
            want = np.nonzero(np.abs(x) > t)[0]
            c, idx, val = threshold(x, t, want.size + 3, impl)
            assert c == want.size and np.array_equal(idx, want) and bits_equal(val, x[want]), (n, t)
            ref = threshold(x, t, want.size + 3, "scalar")
            assert c == ref[0] and np.array_equal(idx, ref[1]) and bits_equal(val, ref[2]), (n, t)
            if c >= 2:  # capacity: writes the first ones, still counts all
                c1, idx1, _ = threshold(x, t, 1, impl)
                assert c1 == c and idx1[0] == want[0]


def test_randomk():
    n = 1000
    x = gradient(n)
    counts = np.zeros(n)
    for seed in range(2000):
        idx = np.zeros(50, np.uint32)
        val = np.zeros(50, np.float32)
        C.randomk(addr(x), n, 50, seed, addr(idx), addr(val))
        assert np.all(np.diff(idx.astype(np.int64)) > 0) and idx[-1] < n  # distinct, sorted
        assert bits_equal(val, x[idx])
        counts[idx] += 1
    # each index is chosen with probability k/n = 5%: 100 of 2000 draws, std ~9.7
    assert np.abs(counts - 100).max() < 50 and abs(counts.mean() - 100) < 1e-9
    a, b = np.zeros(50, np.uint32), np.zeros(50, np.uint32)
    v = np.zeros(50, np.float32)
    C.randomk(addr(x), n, 50, 7, addr(a), addr(v))
    C.randomk(addr(x), n, 50, 7, addr(b), addr(v))
    assert np.array_equal(a, b)
    for k in (0, n):
        idx = np.zeros(max(k, 1), np.uint32)
        val = np.zeros(max(k, 1), np.float32)
        C.randomk(addr(x), n, k, 1, addr(idx), addr(val))
        if k == n:
            assert np.array_equal(idx, np.arange(n)) and bits_equal(val, x)


@pytest.mark.parametrize("impl", IMPLS)
def test_scatter_add(impl):
    """In order, duplicates included: numpy's add.at in float32, and the scalar reference."""
    require(impl)
    n = 5000
    for m in [0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 1000, 1009, 100000]:
        rng = np.random.default_rng(m)
        idx = rng.integers(0, n, m).astype(np.uint32)  # with duplicates
        val = rng.standard_normal(m).astype(np.float32)
        y0 = rng.standard_normal(n).astype(np.float32)
        want = y0.copy()
        np.add.at(want, idx, val)  # in order, float32
        y, y_ref = y0.copy(), y0.copy()
        C.scatter_add(addr(y), n, addr(idx), addr(val), m, impl=impl)
        C.scatter_add(addr(y_ref), n, addr(idx), addr(val), m, impl="scalar")
        assert bits_equal(y, want) and bits_equal(y, y_ref), m


def test_sparse_roundtrip_through_scatter_add():
    x = gradient(1 << 16)
    idx, val = topk(x, 655)
    y = np.zeros_like(x)
    C.scatter_add(addr(y), y.size, addr(idx), addr(val), idx.size)
    assert bits_equal(y[idx], x[idx]) and np.count_nonzero(y) == 655


# ---- the benchmark binary ----------------------------------------------------------------------------------


def _perf_binary():
    import os
    import shutil
    import sys

    here = os.path.join(os.path.dirname(sys.executable), "zcoll_kernels_perf")
    return here if os.path.exists(here) else shutil.which("zcoll_kernels_perf")


@pytest.mark.parametrize("impl", IMPLS)
def test_kernels_perf_binary_runs(impl):
    """Every row (every kernel) runs with --impl, bit-identical to the scalar reference."""
    import subprocess

    require(impl)
    exe = _perf_binary()
    assert exe, "zcoll_kernels_perf is not installed next to the Python executable or on PATH"
    out = subprocess.run(
        [exe, "-s", "64K,12", "-r", "2", "-d", "0.05", "-i", impl],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    kernels = impl if impl != "dispatch" else C.simd_level()
    assert f"kernels {kernels} (detected {C.detected_simd_level()})" in out.stdout.splitlines()[0]
    rows = [line for line in out.stdout.splitlines() if line and not line.startswith("#")][1:]
    names = {r[10:54].strip() for r in rows}
    for kernel in (
        "reduce",
        "divide",
        "quantize",
        "dequantize",
        "error feedback",
        "cast",
        "top-k",
        "threshold",
        "scatter-add",
    ):
        assert any(kernel in name for name in names), kernel
    assert len(rows) == 2 * 23, out.stdout
    assert all(r.split()[-1] == "0" for r in rows), out.stdout  # #wrong: bit-identical to the reference


def test_kernels_perf_binary_arguments():
    import subprocess

    exe = _perf_binary()
    assert exe, "zcoll_kernels_perf is not installed next to the Python executable or on PATH"
    out = subprocess.run([exe, "--help"], check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--sizes" in out.stdout
    for args, message in (
        (["--no-such-flag"], "unknown flag"),
        (["-i", "avx1024"], "unknown kernel implementation"),
    ):
        bad = subprocess.run([exe, *args], check=False, capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr
