"""zcoll.torch.elastic.ElasticLoop: a DDP training job that loses a rank to SIGKILL goes on in
place on Open MPI with ULFM (tests/torch_mpi/elastic.py): every survivor recovers once, resumes at
the failed step (at most that step lost), keeps the global batch by accumulation, finishes every
step with the same parameters as the other survivors and a lower loss."""

from __future__ import annotations

import re

import engines
import pytest
from mpi_util import TESTS_DIR, run

OMPI = engines.openmpi()


@pytest.mark.skipif(OMPI is None, reason=engines.openmpi_missing())
def test_ddp_training_goes_on_after_a_rank_is_killed():
    if run([OMPI.python, "-c", "import torch"], timeout=120).returncode != 0:
        pytest.skip(f"{OMPI.python} has no torch (./dev.sh test --engine openmpi links the default venv's)")
    victim, after, steps, timeout = 2, 6, 20, 5.0
    argv = engines.ft_mpirun_argv(OMPI, 4, OMPI.python, TESTS_DIR / "torch_mpi" / "elastic.py", "--victim", victim,
                                  "--after", after, "--steps", steps, "--timeout", timeout)  # fmt: skip
    out = run(argv, env=engines.ft_job_env(OMPI), timeout=240).output
    victim_t = float(re.search(r"ZCOLL-VICTIM rank=\d+ t=([\d.]+)", out)[1])
    recovered = {int(m[1]): m for m in re.finditer(
        r"ZCOLL-RECOVERED rank=(\d+) lost=(\S+) world=(\S+) resumed=(\d+) accumulation=(\d+) seconds=([\d.]+)", out)}  # fmt: skip
    final = {int(m[1]): m for m in re.finditer(
        r"ZCOLL-FINAL rank=(\d+) steps=(\d+) loss0=([\d.]+) loss=([\d.]+) digest=(\S+)", out)}  # fmt: skip
    survivors = [0, 1, 3]
    print(f"\nrecovery seconds: { {r: float(m[6]) for r, m in recovered.items()} }; victim at {victim_t:.3f}")
    assert sorted(recovered) == survivors and sorted(final) == survivors, out
    for r in survivors:
        _, lost, world, resumed, accumulation, _ = recovered[r].groups()
        assert (lost, world, accumulation) == (str(victim), "4,3", "2"), out
        assert int(resumed) in (after, after + 1), out
        assert int(final[r][2]) == steps and float(final[r][4]) < float(final[r][3]) / 4, out
    assert len({final[r][5] for r in survivors}) == 1, out
