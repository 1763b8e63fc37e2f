"""Argument checks and small helpers of the zcoll process group.

Every check raises before anything is sent, identically on every rank, so a rejected call
leaves the group usable: ValueError (or TypeError for a non-tensor) with the reason, and
NotImplementedError naming what the backend does not do.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist

RED = dist.ReduceOp.RedOpType
OPS = {
    RED.SUM: "sum",
    RED.AVG: "avg",
    RED.PRODUCT: "prod",
    RED.MIN: "min",
    RED.MAX: "max",
    RED.BAND: "band",
    RED.BOR: "bor",
    RED.BXOR: "bxor",
}
# By the enum's integer value: hashing a RedOpType costs ~0.7 us, reading .value ~0.1 us.
_OP_BY_VALUE = {kind.value: name for kind, name in OPS.items()}
_TORCH_NAME = {name: kind.name for kind, name in OPS.items()}  # "prod" -> "PRODUCT"
# The dtypes gloo takes (measured with torch 2.13; tests/torch_mpi/dtype_walk.py holds the two
# backends side by side), and the ops each kind takes; gloo refuses every other dtype too.
FLOAT = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTEGRAL = (torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool)
COMPLEX = (torch.complex32, torch.complex64, torch.complex128)
DTYPES = FLOAT + INTEGRAL + COMPLEX
_FLOAT_SET = frozenset(FLOAT)
_COMPLEX_SET = frozenset(COMPLEX)
_DTYPE_SET = frozenset(DTYPES)
_FLOAT_OPS = ("sum", "avg", "prod", "min", "max")
_INTEGRAL_OPS = ("sum", "prod", "min", "max", "band", "bor", "bxor")
_COMPLEX_OPS = ("sum", "avg")


class SparseTensorError(NotImplementedError):
    """A sparse tensor where the call takes dense ones (all_reduce catches it: it sums sparse
    COO tensors, see ``_sparse``)."""


def check(call: str, t: Any, what: str = "tensor") -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"zcoll {call}: {what} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_cpu:
        raise ValueError(
            f"zcoll {call}: {what} is on {t.device}, but the zcoll backend works on CPU tensors only; "
            "move it with .cpu() (zcoll has no CUDA path yet; use NCCL for GPU tensors)"
        )
    if t.dtype not in _DTYPE_SET:
        raise ValueError(
            f"zcoll {call}: {what} has dtype {t.dtype}; supported: {', '.join(map(str, DTYPES))}"
        )
    if not t.is_contiguous():
        if t.layout != torch.strided:  # checked here: a dense tensor never pays for it
            raise SparseTensorError(
                f"zcoll {call}: {what} is a sparse tensor ({t.layout}); sparse tensors are not supported "
                "by the zcoll backend here (only all_reduce with SUM of sparse COO tensors): "
                "pass t.to_dense()"
            )
        raise ValueError(f"zcoll {call}: {what} is not contiguous; call .contiguous() first")
    return t


def one(call: str, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    if len(tensors) != 1:
        raise ValueError(
            f"zcoll {call}: expected a list of exactly one tensor (one per process), got {len(tensors)}"
        )
    return check(call, tensors[0])


def same(
    call: str, ref: torch.Tensor, ts: Sequence[torch.Tensor], what: str, numel: Optional[int] = None
) -> None:
    for i, t in enumerate(ts):
        check(call, t, f"{what}[{i}]")
        if t.dtype != ref.dtype:
            raise ValueError(
                f"zcoll {call}: mixed dtypes in one call: {what}[{i}] is {t.dtype}, input is {ref.dtype}"
            )
        if numel is not None and t.numel() != numel:
            raise ValueError(f"zcoll {call}: {what}[{i}] has {t.numel()} elements, expected {numel}")


def like(call: str, a: torch.Tensor, b: torch.Tensor, a_per_b: float) -> None:
    """a and b: same dtype, a.numel() == b.numel() * a_per_b."""
    if a.dtype != b.dtype:
        raise ValueError(f"zcoll {call}: mixed dtypes in one call: output is {a.dtype}, input is {b.dtype}")
    if a.numel() != b.numel() * a_per_b:
        raise ValueError(
            f"zcoll {call}: output has {a.numel()} elements, input {b.numel()}; "
            f"expected output = input x {a_per_b:g}"
        )


def op_name(call: str, opts: Any, t: torch.Tensor) -> str:
    """zcoll's name of ``opts.reduceOp`` (SUM when opts is None), checked against t's dtype as
    gloo checks it: floating types take SUM AVG PRODUCT MIN MAX, integers and bool SUM PRODUCT
    MIN MAX BAND BOR BXOR, complex types SUM and AVG (ValueError naming both otherwise)."""
    if opts is None:
        return "sum"
    op = opts.reduceOp
    kind = getattr(op, "op", op)
    name = _OP_BY_VALUE.get(getattr(kind, "value", None))
    if name is None:
        raise NotImplementedError(
            f"zcoll {call}: ReduceOp.{getattr(kind, 'name', kind)} is not supported "
            f"(supported: {', '.join(k.name for k in OPS)})"
        )
    dtype = t.dtype
    if dtype in _FLOAT_SET:
        allowed, kind_name = _FLOAT_OPS, "floating-point"
    elif dtype in _COMPLEX_SET:
        allowed, kind_name = _COMPLEX_OPS, "complex"
    else:
        allowed, kind_name = _INTEGRAL_OPS, "integer and bool"
    if name == "avg" and dtype == torch.complex32:  # dist.all_reduce passes torch.view_as_real(t)
        raise ValueError(
            f"zcoll {call}: ReduceOp.AVG is not defined for dtype torch.complex32 (gloo refuses it too: "
            "torch cannot divide complex32); use SUM and divide the real view, or all_reduce"
        )
    if name not in allowed:
        hint = "; use SUM and divide" if name == "avg" else ""
        raise ValueError(
            f"zcoll {call}: ReduceOp.{_TORCH_NAME[name]} is not defined for dtype {dtype} (gloo refuses it "
            f"too); {kind_name} tensors take {', '.join(_TORCH_NAME[n] for n in allowed)}{hint}"
        )
    return name


def tiled(ts: Sequence[torch.Tensor]) -> Optional[torch.Tensor]:
    """One flat view when the tensors lie back to back in one storage (e.g. ``out.chunk(n)``)."""
    t0 = ts[0].detach()
    n, base = t0.numel(), t0.storage_offset()
    ptr = t0.untyped_storage().data_ptr()
    for i, t in enumerate(ts):
        if t.numel() != n or t.storage_offset() != base + i * n or t.untyped_storage().data_ptr() != ptr:
            return None
    return torch.as_strided(t0, (n * len(ts),), (1,), base)


def is_async(opts: Any) -> bool:
    return True if opts is None else opts.asyncOp


def unsupported(call: str) -> Callable[..., Any]:
    def method(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"the zcoll backend does not implement {call}")

    method.__name__ = call
    return method
