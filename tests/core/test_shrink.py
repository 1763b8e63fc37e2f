"""In-place recovery, zcoll.Communicator.shrink (docs/recovery.md).

On Open MPI with ULFM (`mpirun --with-ft ulfm`; the Open MPI environment of tests/engines.py):
a rank is SIGKILLed in a loop of steps on 4 ranks and every survivor shrinks, rolls back to the
last step all survivors completed and goes on within the timeout + 2 s, losing at most the step in
flight, with the final state of its closed form; allreduce on the shrunk communicator gives, per
algorithm and count, the bits a fresh job of the survivors gives (tests/mpi/shrink_recovery.py).
Where fault tolerance is missing, shrink() raises zcoll.ZcollError saying which engine to install
or how to launch.
"""

from __future__ import annotations

import functools
import re

import engines
import pytest
from mpi_util import TESTS_DIR, mpirun, run

SCRIPT = TESTS_DIR / "mpi" / "shrink_recovery.py"
RANKS = 4
AFTER = 10  # steps completed before the victim dies
TIMEOUT = 5.0  # the communicators' deadline, seconds
OMPI = engines.openmpi()
needs_openmpi = pytest.mark.skipif(OMPI is None, reason=engines.openmpi_missing())


def lines(out: str, kind: str) -> dict:
    """{rank: {field: value}} of the ZCOLL-<kind> lines (one per rank)."""
    found = {}
    for m in re.finditer(rf"^ZCOLL-{kind} (.*)$", out, re.MULTILINE):
        fields = dict(f.split("=", 1) for f in m.group(1).split())
        found[int(fields["rank"])] = fields
    return found


def shas(out: str) -> dict:
    """{(algorithm, count): {rank: sha}}."""
    found: dict = {}
    for m in re.finditer(
        r"^ZCOLL-DIGEST rank=(\d+) algorithm=(\S+) count=(\d+) sha=(\S+)$", out, re.MULTILINE
    ):
        found.setdefault((m[2], int(m[3])), {})[int(m[1])] = m[4]
    return found


def recovery_job(*args: str) -> str:
    argv = engines.ft_mpirun_argv(
        OMPI, RANKS, OMPI.python, SCRIPT, "--after", AFTER, "--timeout", TIMEOUT, *args
    )
    return run(argv, env=engines.ft_job_env(OMPI), timeout=120).output


@functools.cache
def fresh_digests() -> dict:
    """The digests of a fresh 3-rank job (no victim)."""
    argv = [OMPI.bin_dir / "mpirun", "--oversubscribe", "-n", RANKS - 1, OMPI.python, SCRIPT, "--fresh"]
    rc, out = run(argv, env=engines.ft_job_env(OMPI), timeout=120)
    assert rc == 0, out
    return shas(out)


def check_recovered(out: str, victim: int, in_flight: int = 0) -> None:
    """Every survivor shrinks and resumes at the step the victim died in (or before), or, when
    it may have died inside a collective the survivors completed without it, up to `in_flight`
    steps later."""
    survivors = [r for r in range(RANKS) if r != victim]
    killed = lines(out, "VICTIM")[victim]
    victim_t, died_in = float(killed["t"]), int(killed["step"])
    resumed = range(died_in, died_in + 1 + in_flight)
    # killed before its step: exactly at AFTER; inside one: that call can end before the timer
    assert died_in == AFTER or (in_flight and died_in > AFTER), out
    shrunk, resumed_at, state = lines(out, "SHRUNK"), lines(out, "RESUMED"), lines(out, "STATE")
    delays = {r: round(float(resumed_at[r]["t"]) - victim_t, 3) for r in resumed_at}
    shrink_ms = {r: round(1e3 * float(shrunk[r]["shrink_s"]), 2) for r in shrunk}
    print(
        f"\nvictim {victim} (died in step {died_in}): seconds from SIGKILL to going on: {delays}; shrink ms: {shrink_ms}"
    )
    for new_rank, r in enumerate(survivors):
        assert r in shrunk and r in resumed_at and r in state, f"rank {r} did not recover:\n{out}"
        assert shrunk[r]["lost"] == str(victim) and shrunk[r]["kept"] == ",".join(map(str, survivors)), out
        assert int(shrunk[r]["new_rank"]) == new_rank and int(shrunk[r]["size"]) == RANKS - 1, out
        assert int(resumed_at[r]["step"]) in resumed, f"rank {r} resumed at {resumed_at[r]['step']}:\n{out}"
        assert delays[r] <= TIMEOUT + 2, f"rank {r} went on {delays[r]} s after the SIGKILL:\n{out}"
        assert state[r]["ok"] == "1", f"rank {r}: state {state[r]}:\n{out}"
    assert set(lines(out, "DONE")) == set(survivors), out
    got, want = shas(out), fresh_digests()
    assert set(got) == set(want) and len(want) >= 28, (sorted(got), sorted(want))
    for key, per_rank in got.items():
        assert set(per_rank) == set(survivors), (key, per_rank)
        assert set(per_rank.values()) == set(want[key].values()) and len(set(want[key].values())) == 1, (
            f"{key}: after the shrink {per_rank}, a fresh job of the survivors {want[key]}"
        )


@needs_openmpi
@pytest.mark.parametrize("victim", [0, 2])
def test_survivors_shrink_and_go_on(victim):
    check_recovered(recovery_job("--victim", str(victim)), victim)


@needs_openmpi
def test_kill_inside_a_collective_loses_at_most_that_step():
    """The victim dies half a call's mean time into a 4 MiB ring allreduce: survivors that
    completed it roll back."""
    out = recovery_job("--victim", "3", "--count", str(1 << 20), "--mid-call", "0.5", "--steps", "16")
    check_recovered(out, 3, in_flight=1)


REFUSE = (
    "import sys, zcoll\n"
    "c = zcoll.Communicator()\n"
    "try:\n    c.shrink()\n"
    "except zcoll.ZcollError as e:\n"
    "    open(f'{sys.argv[1]}/refused-{c.rank}.txt', 'w').write(' '.join(str(e).split()))\n"
    "c.free()\n"
)


def test_shrink_refused_on_this_engine_without_fault_tolerance(tmp_path):
    """Under plain mpirun (no --with-ft) of whichever engine this is, shrink() says what to do.
    Each rank writes its message to a file: hydra may cut one rank's long line into another's."""
    rc, out = (
        mpirun(2, "python", "-c", REFUSE, tmp_path)
        if engines.name() == "mpich"
        else run(
            [OMPI.bin_dir / "mpirun", "--oversubscribe", "-n", 2, OMPI.python, "-c", REFUSE, tmp_path],
            env=engines.ft_job_env(OMPI),
        )
    )
    files = sorted(tmp_path.glob("refused-*.txt"))
    assert rc == 0 and [f.name for f in files] == ["refused-0.txt", "refused-1.txt"], out
    refused = [f.read_text() for f in files]
    words = (
        ("MPICH", "openmpi", "--with-ft ulfm", "zcoll run")
        if engines.name() == "mpich"
        else ("--with-ft ulfm",)
    )
    for word in words:
        assert word in refused[0], refused[0]
