"""The kernel tables the kernel tests run (csrc/kernels/kernel_table.h): every instruction set
zcoll builds a table for, plus "dispatch" (what ZCOLL_SIMD and the CPU select). Tests take one
as a parameter and call `require(impl)` first: a table this CPU cannot run is skipped with a
reason that names it, so a report from a machine without AVX-512 shows what went untested."""

from __future__ import annotations

import pytest
from zcoll import _C

ISAS = ["scalar", "avx2", "avx512"]  # "scalar" is the reference the others are compared with
IMPLS = [*ISAS, "dispatch"]
SIMD_IMPLS = [i for i in IMPLS if i != "scalar"]


def require(impl: str) -> None:
    """Skips the calling test when this CPU lacks the instruction set of `impl`."""
    if impl != "dispatch" and impl not in _C.kernel_impls():
        level = _C.detected_simd_level()
        pytest.skip(f"this CPU lacks {impl} (detected {level}): the {impl} kernel table is not tested")
