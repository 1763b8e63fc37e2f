"""The dtype walk: zcoll beside gloo on the same ranks, every torch dtype x every collective.

    PYTHONPATH=tests mpirun -n 2|3 python -m mpi4py tests/torch_mpi/dtype_walk.py [case ...]

gloo is the default group and zcoll a second group on the same ranks
(zcoll.torch.init_gloo_beside_zcoll). Every dtype torch defines (``dir(torch)``, deduplicated:
46 in torch 2.13) goes through broadcast, all_gather, all_gather_into_tensor, and, with every
ReduceOp, reduce_scatter_tensor, all_reduce and reduce (every root), on both groups, from the
same inputs. Where gloo succeeds, zcoll must succeed with the same bytes (``torch.equal`` on a
uint8 view); where gloo raises, zcoll must raise too (a clear exception, on every rank, leaving
the group usable: no crash, no hang). Two comparisons are not byte for byte with gloo, on purpose:

1. Floating and complex SUM, AVG and PRODUCT on more than 2 ranks: gloo and zcoll add in
   different orders, so their bits may differ on rounding. Those inputs are exact (small integers
   times a power of two; +-2^k for PRODUCT), and zcoll's result is compared with the exact
   reference instead: the float64 sum or product rounded to the dtype, AVG's division in the
   dtype's compute type (float32 for the 16-bit types) rounded once. (gloo's AVG of a complex
   tensor in reduce / reduce_scatter divides with complex division, which rounds differently
   from dividing each part; zcoll divides each part, as gloo does in all_reduce, where torch
   hands the backend the real view.) On 2 ranks every result is compared with gloo's bytes.
2. bool SUM: gloo adds the bytes as uint8 (True + True leaves the byte 2 in a bool tensor); zcoll
   returns a logical or (byte 1), as torch's own ``+`` on bool tensors and NCCL do. There the
   truth values must agree and zcoll's bytes must be 0 or 1.

Case ddp_bool_buffer: a tiny transformer language model with a causal-mask bool buffer trains
under DDP on zcoll and on gloo from the same seed and data; the buffer is broadcast from rank 0
(it starts wrong on the other ranks), and the parameters match gloo's bit for bit on 2 ranks,
to float32 rounding on 3 (the gradient sums' order), and are identical on every rank.
"""

from __future__ import annotations

from harness import Checks, run_cases, say

# isort: split
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
import zcoll.torch
from torch import nn

warnings.filterwarnings("ignore")  # ComplexHalf is experimental; quantized creation deprecated
GROUPS = zcoll.torch.init_gloo_beside_zcoll(timeout=timedelta(seconds=60))
GLOO, ZC = GROUPS["gloo"], GROUPS["zcoll"]
R, N = dist.get_rank(), dist.get_world_size()
DTYPES = []
for _name in dir(torch):
    if isinstance(getattr(torch, _name), torch.dtype) and getattr(torch, _name) not in DTYPES:
        DTYPES.append(getattr(torch, _name))
OPS = [getattr(dist.ReduceOp, n) for n in dist.ReduceOp.RedOpType.__members__]
ORDERED = {dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.PRODUCT}  # order-dependent on floats
PER_RANK = 6 * N  # divisible by N (reduce_scatter_tensor)
SIZES = [PER_RANK, 171 * PER_RANK]  # one element per rank's block .. several segments' worth
TALLY: dict = {}  # (collective, dtype) -> outcome, printed by case_summary


def make(dtype: torch.dtype, n: int, rank: int, op=None) -> torch.Tensor:
    """Rank `rank`'s input: random values (no NaN, distinct per rank: no ties in MIN/MAX); on more
    than 2 ranks, for SUM/AVG small integers times a power of two (exact in every summation
    order) and +-2^k for PRODUCT; a tensor of any kind for the dtypes that cannot hold numbers."""
    g = torch.Generator().manual_seed(1000 * rank + n + 7 * DTYPES.index(dtype))
    i = torch.arange(n, dtype=torch.float64)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool() | (i % 5 == 0)
    if dtype.is_floating_point or dtype.is_complex:
        v = torch.randn(n, generator=g, dtype=torch.float64) * 8 + (rank + 1) * 0.001
        w = torch.randn(n, generator=g, dtype=torch.float64) * 8
        if N > 2 and op == dist.ReduceOp.PRODUCT:
            v = torch.where((i + rank) % 3 == 0, -1.0, 1.0) * torch.exp2((i * 5 + rank * 3) % 5 - 2)
        elif N > 2 and op in ORDERED:
            v = (((i * 13 + rank * 7 + 3) % 17) - 8) * torch.exp2(i % 11 - 5)
            w = (((i * 5 + rank * 11 + 1) % 15) - 7) * torch.exp2(i % 7 - 3)
        if dtype.is_complex:
            v = torch.complex(v, w)
        try:
            return v.to(dtype)
        except (RuntimeError, TypeError):
            pass
    elif not dtype.is_complex:
        try:
            info = torch.iinfo(dtype)
            return torch.randint(
                max(info.min, -(2**62)), min(info.max, 2**62), (n,), generator=g, dtype=dtype
            )
        except (RuntimeError, TypeError):
            pass
    try:
        return torch.quantize_per_tensor(torch.arange(n, dtype=torch.float32), 0.5, 0, dtype)
    except (RuntimeError, TypeError):
        return torch.zeros(n, dtype=dtype)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (flat uint8); a quantized tensor's integer representation."""
    if t.is_quantized:
        t = t.int_repr()
    t = t.reshape(-1)
    return t.view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


def attempt(fn):
    """(result, None) or (None, the exception)."""
    try:
        return fn(), None
    except Exception as e:  # noqa: BLE001 - any clear exception is an answer
        return None, e


# -- the collectives, each on one group; the tensors to compare on this rank (None: none) --------
def broadcast(group, dtype, n, op, root):
    t = make(dtype, n, R)
    dist.broadcast(t, src=root, group=group)
    return [t]


def all_gather(group, dtype, n, op, root):
    t = make(dtype, n, R)
    outs = [torch.zeros_like(t) for _ in range(N)]
    dist.all_gather(outs, t, group=group)
    return outs


def all_gather_into_tensor(group, dtype, n, op, root):
    t = make(dtype, n, R)
    out = t.new_zeros(N * n)
    dist.all_gather_into_tensor(out, t, group=group)
    return [out]


def reduce_scatter_tensor(group, dtype, n, op, root):
    t = make(dtype, n, R, op)
    out = t.new_zeros(n // N)
    dist.reduce_scatter_tensor(out, t, op=op, group=group)
    return [out]


def all_reduce(group, dtype, n, op, root):
    t = make(dtype, n, R, op)
    dist.all_reduce(t, op=op, group=group)
    return [t]


def reduce(group, dtype, n, op, root):
    t = make(dtype, n, R, op)
    dist.reduce(t, dst=root, op=op, group=group)
    return [t] if R == root else None


def exact(dtype, n, op, part) -> torch.Tensor:
    """The exact result of a floating / complex SUM, AVG or PRODUCT (inputs exact in any order):
    computed in float64 / complex128, AVG divided in the dtype's compute type, rounded once;
    `part`: the slice of it this rank holds."""
    wide = torch.complex128 if dtype.is_complex else torch.float64
    xs = torch.stack([make(dtype, n, r, op).to(wide) for r in range(N)])
    v = xs.prod(0) if op == dist.ReduceOp.PRODUCT else xs.sum(0)
    if op == dist.ReduceOp.AVG:
        compute = torch.float32 if dtype in (torch.float16, torch.bfloat16, torch.complex32) else None
        parts = torch.view_as_real(v) if dtype.is_complex else v
        compute = compute or (torch.float32 if dtype in (torch.float32, torch.complex64) else torch.float64)
        parts = (parts.to(compute) / N).to(torch.float64)
        v = torch.view_as_complex(parts.contiguous()) if dtype.is_complex else parts
        if dtype == torch.complex32:  # round each part to float16 (complex128 -> complex32 does too)
            v = torch.complex(v.real.half().double(), v.imag.half().double())
    return v.to(dtype)[part]


def compare(ck: Checks, coll: str, dtype, op, n: int, root: int) -> str:
    """Runs coll on gloo, then on zcoll; checks as the module docstring says. Returns the
    outcome: "ok" (both succeeded), "refused" (both raised) or "MISMATCH"."""
    fn = globals()[coll]
    what = f"{coll} {dtype} op={getattr(op, 'name', op)} n={n} root={root}"
    want, gloo_error = attempt(lambda: fn(GLOO, dtype, n, op, root))
    got, zcoll_error = attempt(lambda: fn(ZC, dtype, n, op, root))
    if gloo_error is not None:
        ok = ck.check(zcoll_error is not None, what, f"gloo raised {gloo_error!r:.200}, zcoll succeeded")
        if ok:
            ck.check(
                str(zcoll_error).strip(), what, f"zcoll raised {type(zcoll_error).__name__} with no message"
            )
        return "refused" if ok else "MISMATCH"
    if not ck.check(zcoll_error is None, what, f"gloo succeeded, zcoll raised {zcoll_error!r:.300}"):
        return "MISMATCH"
    if want is None:  # reduce off the root
        return "ok"
    ordered = (dtype.is_floating_point or dtype.is_complex) and op in ORDERED and coll in REDUCING and N > 2
    for k, (g, z) in enumerate(zip(want, got)):
        if ordered:  # 1. of the module docstring
            part = slice(R * (n // N), (R + 1) * (n // N)) if coll == "reduce_scatter_tensor" else slice(None)
            g = exact(dtype, n, op, part)
        if dtype == torch.bool and op == dist.ReduceOp.SUM and coll in REDUCING:  # 2.
            ck.check(
                bool((as_bytes(z) <= 1).all()), what, f"zcoll's bool bytes are not 0/1: {as_bytes(z)[:12]}"
            )
            g, z = as_bytes(g) != 0, as_bytes(z) != 0
        same = torch.equal(as_bytes(g), as_bytes(z))
        against = "exact" if ordered else "gloo"
        if not ck.check(same, f"{what} [{k}]", f"zcoll {z.reshape(-1)[:8]} vs {against} {g.reshape(-1)[:8]}"):
            return "MISMATCH"
    return "ok"


REDUCING = ("reduce_scatter_tensor", "all_reduce", "reduce")


def walk(ck: Checks, coll: str) -> None:
    """Every dtype x op (reducing collectives) x root (broadcast, reduce) x size."""
    ops = OPS if coll in REDUCING else [None]
    roots = range(N) if coll in ("broadcast", "reduce") else [0]
    for dtype in DTYPES:
        for op in ops:
            outcomes = set()
            for root in roots:
                for n in SIZES:
                    outcome = compare(ck, coll, dtype, op, n, root)
                    outcomes.add(outcome)
                    if outcome == "refused":
                        break  # refused whatever the size
            label = coll if op is None else f"{coll}:{op.name}"
            TALLY[(label, str(dtype)[6:])] = "MISMATCH" if "MISMATCH" in outcomes else outcomes.pop()
    dist.barrier(group=GLOO)
    dist.barrier(group=ZC)  # both groups still work after every refusal


def case_broadcast(ck: Checks) -> None:
    walk(ck, "broadcast")


def case_all_gather(ck: Checks) -> None:
    walk(ck, "all_gather")


def case_all_gather_into_tensor(ck: Checks) -> None:
    walk(ck, "all_gather_into_tensor")


def case_reduce_scatter_tensor(ck: Checks) -> None:
    walk(ck, "reduce_scatter_tensor")


def case_all_reduce(ck: Checks) -> None:
    walk(ck, "all_reduce")


def case_reduce(ck: Checks) -> None:
    walk(ck, "reduce")


# -- DDP with a bool buffer ------------------------------------------------------------------
class TinyLM(nn.Module):
    """A one-block causal transformer language model; its causal mask is a bool buffer."""

    def __init__(self, vocab: int = 32, d: int = 16, context: int = 8):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.randn(context, d) * 0.02)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.head = nn.Linear(d, vocab)
        self.register_buffer("causal_mask", torch.triu(torch.ones(context, context, dtype=torch.bool), 1))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        x = self.emb(idx) + self.pos[:T]
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=self.causal_mask[:T, :T], need_weights=False)[0]
        return self.head(x + self.ff(self.ln2(x)))


def train(group, steps: int = 4):
    torch.manual_seed(0)
    model = TinyLM()
    if R != 0:
        model.causal_mask.zero_()  # wrong off rank 0: DDP's buffer broadcast must fix it
    ddp = nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.01)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + R)
        idx = torch.randint(0, 32, (4, 9), generator=g)
        loss = nn.functional.cross_entropy(ddp(idx[:, :-1]).reshape(-1, 32), idx[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def case_ddp_bool_buffer(ck: Checks) -> None:
    on_gloo, on_zcoll = train(GLOO), train(ZC)
    mask = torch.triu(torch.ones(8, 8, dtype=torch.bool), 1)
    ck.check(torch.equal(on_zcoll.causal_mask, mask), "zcoll: the mask broadcast from rank 0")
    ck.check(torch.equal(on_gloo.causal_mask, mask), "gloo: the mask broadcast from rank 0")
    flat = torch.cat([p.detach().reshape(-1) for p in on_zcoll.parameters()])
    reference = torch.cat([p.detach().reshape(-1) for p in on_gloo.parameters()])
    ck.check(not torch.equal(flat, torch.cat([p.reshape(-1) for p in TinyLM().parameters()])), "it trained")
    if N <= 2:
        ck.check(torch.equal(flat.view(torch.uint8), reference.view(torch.uint8)), "parameters: gloo's bits")
    else:
        err = (flat - reference).abs().max().item()
        ck.check(
            torch.allclose(flat, reference, rtol=1e-5, atol=1e-6), "parameters: gloo's", f"max diff {err}"
        )
    ck.same_on_all_ranks("parameters", flat.numpy().tobytes())


# -- the matrix -------------------------------------------------------------------------------
def case_summary(ck: Checks) -> None:
    """The dtypes both backends take for each collective (printed on rank 0), checked against
    what gloo took when this was written: a walk that silently took less fails."""
    walked = {label for label, _ in TALLY}
    ck.check(len(walked) == 6 + 3 * len(OPS) - 3, "every collective and op walked", f"{sorted(walked)}")
    ck.check(
        "MISMATCH" not in TALLY.values(), "no mismatch", str([k for k, v in TALLY.items() if v == "MISMATCH"])
    )
    taken = {
        label: sorted(d for (lab, d), v in TALLY.items() if lab == label and v == "ok") for label in walked
    }
    if R == 0:
        for label in sorted(taken):
            say(f"DTYPE-WALK {label}: {' '.join(taken[label]) or '-'}")
    every = {"bool", "uint8", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64",
             "complex32", "complex64", "complex128"}  # fmt: skip
    for label in ("broadcast", "all_gather", "all_gather_into_tensor", "all_reduce:SUM", "reduce:SUM"):
        ck.check(set(taken.get(label, [])) == every, label, f"took {taken.get(label)}")
    ck.check(set(taken.get("all_reduce:BXOR", [])) == {"bool", "uint8", "int8", "int32", "int64"}, "BXOR")


if __name__ == "__main__":
    run_cases(globals(), teardown=dist.destroy_process_group)
