"""The zcoll backend under torchrun (zcoll.core.store_launch serves MPI's start-up from torch's
store): tests/torch_mpi/launchers.py under mpirun and under torchrun at 2 and 4 processes, every
case passing under both and its results bitwise identical (the digests of every rank's results
equal); and the errors, within the timeout and naming what is missing, when a worker never
arrives, when one states another WORLD_SIZE, and when the store goes away (in the 2-worker
torchrun launch, before its cases: four launches in all)."""

import functools
import os
import re
import subprocess
import sys

import engines
import pytest
from mpi_util import script_job, tail

SCRIPT = "torch_mpi/launchers.py"
CASES = ("collectives", "torch_ops", "nodes")
# torchrun prefixes each worker's lines as mpirun -prepend-rank does, for the result protocol
PREFIXED = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[${rank}] "}
_DIGEST = re.compile(r"ZCOLL-DIGEST (\S+) ([0-9a-f]{64})")
_ERROR = re.compile(r"ZCOLL-ERROR (\w+) rank (\d+) after ([\d.]+) s: (.*)")


def torchrun_cmd(ranks: int, *args) -> list:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(ranks),
        *map(str, args),
    ]


@functools.cache  # one launcher object per size: script_job keys on it
def torchrun_launcher(ranks: int):
    return lambda argv: torchrun_cmd(ranks, "--tee", "3", *argv[3:])  # argv: python -m mpi4py script ...


ON_OPENMPI = engines.name() == "openmpi"
needs_pmi1 = pytest.mark.skipif(ON_OPENMPI, reason=engines.TORCHRUN_NEEDS_PMI1)

FAULTS = ("size", "missing", "store")
# The 2-worker torchrun launch goes through every fault first, then runs the cases: one launch
# instead of four, and the cases also show that a failed start leaves nothing behind.
TORCHRUN_ONLY = {2: ("--faults=" + ",".join(FAULTS),), 4: ()}


def jobs(ranks: int):
    return (
        script_job(SCRIPT, ranks, timeout=300),
        script_job(
            SCRIPT, ranks, *TORCHRUN_ONLY[ranks], env=PREFIXED, timeout=300, launcher=torchrun_launcher(ranks)
        ),
    )


def digest(job, case: str) -> str:
    found = {m.group(1): m.group(2) for m in _DIGEST.finditer(job.finished.output)}
    assert case in found, f"{job.describe()}: no digest for {case}:\n{tail(job.finished.output)}"
    return found[case]


@needs_pmi1
@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("case", CASES)
def test_torchrun_matches_mpirun(case, ranks):
    under_mpirun, under_torchrun = jobs(ranks)
    under_mpirun.check(case)
    under_torchrun.check(case)
    assert digest(under_torchrun, case) == digest(under_mpirun, case), (
        "torchrun's results differ from mpirun's"
    )


def fault_errors() -> tuple:
    """({(fault, rank): (seconds, message)} of each rank whose group creation failed, the output
    of the 2-worker torchrun launch, which went through every fault before its cases)."""
    job = jobs(2)[1]
    _, out = job.launch()
    assert "ZCOLL-NOERROR" not in out, f"a faulty start created the group:\n{tail(out)}"
    return {(m.group(1), int(m.group(2))): (float(m.group(3)), m.group(4)) for m in _ERROR.finditer(out)}, out


@needs_pmi1
def test_a_worker_that_never_arrives_is_named_within_the_timeout():
    errors, out = fault_errors()
    assert ("missing", 0) in errors, tail(out)
    seconds, message = errors[("missing", 0)]
    assert "[1]" in message and "did not arrive within 4 s" in message, message
    assert 4 <= seconds < 10, f"named after {seconds} s"


@needs_pmi1
def test_a_mismatched_world_size_fails_on_every_rank():
    errors, out = fault_errors()
    assert [r for f, r in sorted(errors) if f == "size"] == [0, 1], tail(out)
    for rank in (0, 1):
        seconds, message = errors[("size", rank)]
        assert "WORLD_SIZE=" in message and "same world size" in message, message
        assert seconds < 25, f"a mismatch should fail at once, took {seconds} s"


@needs_pmi1
def test_a_store_that_goes_away_is_named():
    errors, out = fault_errors()
    assert ("store", 1) in errors, tail(out)
    seconds, message = errors[("store", 1)]
    assert "store" in message and seconds < 30, message


@pytest.mark.skipif(not ON_OPENMPI, reason="Open MPI's refusal; MPICH joins torchrun (the tests above)")
@pytest.mark.timeout(180)
def test_torchrun_on_open_mpi_says_to_use_mpirun():
    code = "import torch.distributed as dist, zcoll.torch; dist.init_process_group('zcoll')"
    argv = torchrun_cmd(2, "--no-python", sys.executable, "-c", code)
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=150, env={**os.environ, **engines.OMPI_JOB_ENV}
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, tail(out)
    assert out.count("built against Open MPI") >= 2, tail(out)  # each worker, none waiting
    assert "mpirun -n N" in out and "MPICH" in out, tail(out)
