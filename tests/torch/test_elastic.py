"""zcoll.torch.elastic.ElasticLoop: a DDP training job that loses a rank to SIGKILL goes on in
place on Open MPI with ULFM (tests/torch_mpi/elastic.py, 3 ranks): every survivor recovers once,
within the timeout + 2 s of the kill, resumes at the failed step (at most that step lost), keeps
the global batch by accumulation, finishes every step with the same parameters as the other
survivor and a lower held-out loss. The fault-free comparison of final quality, many faults and
faults during a recovery: tests/chaos_shrink.py (docs/recovery.md)."""

from __future__ import annotations

import re

import engines
import pytest
from mpi_util import TESTS_DIR, run

OMPI = engines.openmpi()
RANKS, VICTIM, AFTER, STEPS, TIMEOUT = 3, 1, 6, 16, 5.0


@pytest.mark.skipif(OMPI is None, reason=engines.openmpi_missing())
def test_ddp_training_goes_on_after_a_rank_is_killed():
    if run([OMPI.python, "-c", "import torch"], timeout=120).returncode != 0:
        pytest.skip(f"{OMPI.python} has no torch (./dev.sh test --engine openmpi links the default venv's)")
    argv = engines.ft_mpirun_argv(OMPI, RANKS, OMPI.python, TESTS_DIR / "torch_mpi" / "elastic.py", "--victim",
                                  VICTIM, "--after", AFTER, "--steps", STEPS, "--timeout", TIMEOUT)  # fmt: skip
    out = run(argv, env=engines.ft_job_env(OMPI), timeout=300).output
    victim_t = float(re.search(r"ZCOLL-VICTIM rank=\d+ t=([\d.]+)", out)[1])
    recovered = {int(m[1]): m for m in re.finditer(
        r"ZCOLL-RECOVERED rank=(\d+) lost=(\S+) world=(\S+) resumed=(\d+) accumulation=(\d+) attempts=(\d+) "
        r"seconds=([\d.]+) t=([\d.]+)", out)}  # fmt: skip
    final = {int(m[1]): m for m in re.finditer(
        r"ZCOLL-FINAL rank=(\d+) steps=(\d+) world=(\d+) loss0=([\d.]+) loss=([\d.]+) digest=(\S+)", out)}  # fmt: skip
    survivors = [r for r in range(RANKS) if r != VICTIM]
    back = {r: round(float(m[8]) - victim_t, 3) for r, m in recovered.items()}
    print(f"\nseconds from the SIGKILL to training again: {back}; recovery seconds: "
          f"{ {r: float(m[7]) for r, m in recovered.items()} }")  # fmt: skip
    assert sorted(recovered) == survivors and sorted(final) == survivors, out
    for r in survivors:
        _, lost, world, resumed, accumulation, attempts, seconds, _ = recovered[r].groups()
        assert (lost, world, accumulation, attempts) == (str(VICTIM), f"{RANKS},{RANKS - 1}", "2", "1"), out
        assert int(resumed) in (AFTER, AFTER + 1), out
        assert back[r] <= TIMEOUT + 2, out
        _, steps, world, loss0, loss, _ = final[r].groups()
        assert (int(steps), int(world)) == (STEPS, RANKS - 1) and float(loss) < 0.8 * float(loss0), out
    assert len({final[r][6] for r in survivors}) == 1, out
