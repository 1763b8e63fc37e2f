"""The soak (bench/soak.py) in short: 2,500 mixed collectives on 2 ranks (every collective,
allreduce algorithm and compressor; zcoll communicators on the world and a subgroup, torch process
groups; inputs up to 256 KiB), every result checked, resident memory after call 1,000 and at the
end within 5 MiB. About a minute here. The long run, 100,000 collectives on 4 ranks with inputs up
to 4 MiB, is the command in bench/soak.py's docstring. Its checker: tests/tools/test_exact_inputs.py
and tests/compression/test_error_bounds.py.
"""

import ast

import zcoll
from mpi_util import ROOT, python_mpirun

SOAK = ROOT / "bench" / "soak.py"


def soak_compressors() -> list:
    """The names of bench/soak.py's COMPRESSORS, read from its source (bench/ is not imported)."""
    for node in ast.parse(SOAK.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == "COMPRESSORS":
            return [ast.literal_eval(k) for k in node.value.keys]
    raise AssertionError(f"no COMPRESSORS table in {SOAK}")


def test_soak_short():
    rc, out = python_mpirun(2, SOAK, "--collectives", "2500", "--max-bytes", "256K", timeout=900)
    assert rc == 0 and "soak: PASS (wrong 0;" in out, out[-6000:]
    for name in zcoll.ALGORITHMS:
        assert f" {name} " in out.split("allreduce by algorithm:")[1].splitlines()[0], f"no allreduce {name}"
    compressors = out.split("compressed by compressor:")[1].splitlines()[0]
    names = soak_compressors()
    assert names, "COMPRESSORS is empty"
    for name in names:
        assert f" {name} " in compressors + " ", f"no compressed allreduce with {name}"
    for target in ("world", "world-checked", "sub", "torch", "torch-sub"):
        assert f"  {target}: " in out, f"no calls on {target}"
