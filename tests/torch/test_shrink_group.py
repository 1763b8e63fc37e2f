"""torch.distributed.shrink_group on the zcoll backend (zcoll.torch._shrink; docs/recovery.md):
torch's own validation messages for bad input, a rank left out alive (any engine), and the
survivors of a SIGKILLed rank going on within the timeout + 2 s on Open MPI with ULFM
(tests/torch_mpi/shrink_group.py)."""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import engines
import pytest
from mpi_util import TESTS_DIR, mpirun, run
from zcoll.tools.perf_table import split_ranks

SCRIPT = TESTS_DIR / "torch_mpi" / "shrink_group.py"
TIMEOUT = 5.0
OMPI = engines.openmpi()


def checks(out: str, reports: str = "") -> dict:
    """{(rank, name): (ok, what)} of the ZCOLL-CHECK lines, from the output and from the ranks'
    report files (the launcher may put one rank's line in the middle of another's)."""
    text = "\n".join(split_ranks(out).values())
    if reports:
        text += "\n" + "".join(Path(reports, f).read_text() for f in sorted(os.listdir(reports)))
    return {
        (int(m[1]), m[2]): (m[3] == "1", m[4])
        for m in re.finditer(r"ZCOLL-CHECK rank=(\d+) name=(\S+) ok=(\d) ?(.*)$", text, re.MULTILINE)
    }


def test_bad_input_raises_torchs_messages_and_a_live_rank_can_be_left_out():
    reports = tempfile.mkdtemp(prefix="zcoll-test-shrink-")
    env = {"ZCOLL_SHM": "0", "ZCOLL_TEST_REPORTS": reports}
    rc, out = mpirun(3, sys.executable, SCRIPT, "--mode", "checks", env=env, timeout=180)
    got = checks(out, reports)
    shutil.rmtree(reports, ignore_errors=True)
    bad = [
        "not_a_list",
        "empty",
        "out_of_range",
        "duplicate",
        "everyone",
        "excluded_caller",
        "bad_flags",
        "still_whole",
    ]
    for rank in range(3):
        for name in bad + (["left_out_alive", "is_zcoll"] if rank < 2 else []):
            assert (rank, name) in got, f"rank {rank} made no check {name}:\n{out}"
            assert got[rank, name][0], f"rank {rank} {name}: {got[rank, name][1]}\n{out}"
    assert rc == 0 and len(re.findall(r"ZCOLL-DONE rank=\d", out)) == 3, out


def has_torch(env) -> bool:
    return run([env.python, "-c", "import torch"], timeout=120).returncode == 0


@pytest.mark.skipif(OMPI is None, reason=engines.openmpi_missing())
def test_survivors_of_a_killed_rank_shrink_and_go_on():
    if not has_torch(OMPI):
        pytest.skip(f"{OMPI.python} has no torch (./dev.sh test --engine openmpi links the default venv's)")
    victim, ranks = 1, 4
    argv = engines.ft_mpirun_argv(
        OMPI, ranks, OMPI.python, SCRIPT, "--mode", "kill", "--victim", victim, "--timeout", TIMEOUT
    )
    out = run(argv, env=engines.ft_job_env(OMPI), timeout=180).output
    victim_t = float(re.search(rf"ZCOLL-VICTIM rank={victim} t=([\d.]+)", out)[1])
    shrunk = {
        int(m[1]): (int(m[2]), int(m[3]), float(m[4]))
        for m in re.finditer(r"ZCOLL-SHRUNK rank=(\d+) new_rank=(\d+) size=(\d+) t=([\d.]+)", out)
    }
    delays = {r: round(t - victim_t, 3) for r, (_, _, t) in shrunk.items()}
    print(f"\nseconds from SIGKILL to the shrunk group: {delays}")
    survivors = [r for r in range(ranks) if r != victim]
    assert sorted(shrunk) == survivors, out
    for new_rank, r in enumerate(survivors):
        assert shrunk[r][:2] == (new_rank, ranks - 1), out
        assert delays[r] <= TIMEOUT + 2, out
    got = checks(out)
    steps = [k for k in got if k[0] in survivors]
    assert len(steps) == 12 * len(survivors) and all(got[k][0] for k in steps), out
    assert sorted(int(r) for r in re.findall(r"ZCOLL-DONE rank=(\d+)", out)) == survivors, out
