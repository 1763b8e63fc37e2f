"""The flight recorder (csrc/comm/flight_recorder.h, dump.h) and `zcoll report`
(python/zcoll/flight.py): the analysis on hand-made dumps, then real dumps of ranks made to
diverge on purpose (tests/mpi/flight.py) at 2 and 4 ranks, which torch's own analyzer
(torchfrtrace) reads too once `zcoll flight --to-torch` has converted them (the converter itself:
test_flight_torch.py)."""

from __future__ import annotations

import json
import sys
import tempfile

import pytest
from mpi_util import case_names, run, script_job
from zcoll.observe import flight

DUMP_DIR = tempfile.mkdtemp(prefix="zcoll-test-dumps-")


def call(seq, collective="allreduce", state="done", waiting_for=-1, nbytes=4096, **kw):
    c = {
        "seq": seq,
        "collective": collective,
        "algorithm": "ring",
        "dtype": "float32",
        "op": "sum",
        "count": nbytes // 4,
        "bytes": nbytes,
        "root": -1,
        "state": state,
        "waiting_for": waiting_for,
        "start": 1.0,
        "end": None,
        "peers": [],
    }
    c.update(kw)
    return c


def write_dump(directory, rank, calls, size=4, comm="c1", reason="zcoll.dump()"):
    d = {
        "format": flight.FORMAT,
        "version": 1,
        "comm": comm,
        "rank": rank,
        "size": size,
        "pid": 100 + rank,
        "host": "h",
        "reason": reason,
        "time": 2.0,
        "timeout": 3.0,
        "broken": False,
        "calls": calls,
    }
    path = directory / f"zcoll-flight-{comm}-rank{rank}.json"
    path.write_text(json.dumps(d))
    return path


def test_ranks_text_compresses_runs():
    assert flight.ranks_text([3]) == "rank 3"
    assert flight.ranks_text([2, 0, 1, 5, 7, 6]) == "ranks 0-2, 5-7"


def test_a_rank_behind_and_one_without_a_dump(tmp_path):
    """Ranks 0-1 wait in allreduce #12, rank 2 finished #11 and never entered #12, rank 3 left no
    dump: the report says each, and that the waits lead to rank 2."""
    for r in (0, 1):
        write_dump(tmp_path, r, [call(11), call(12, state="in_progress", waiting_for=2 if r == 1 else 1)])
    write_dump(tmp_path, 2, [call(10), call(11)])
    text = flight.report([str(tmp_path)])
    assert "dumps from ranks 0-2" in text
    assert "ranks 0-1 are in allreduce #12 (in_progress); rank 2 is in allreduce #11 (done)" in text
    assert "rank 2 never entered #12" in text
    assert "no dump from rank 3" in text
    assert "the waits lead to rank 2" in text
    assert "MISMATCH" not in text


def test_different_calls_at_one_sequence_number(tmp_path):
    for r in range(3):
        write_dump(tmp_path, r, [call(7), call(8, state="in_progress")], size=3)
    write_dump(tmp_path, 2, [call(7), call(8, collective="broadcast", root=0, state="in_progress")], size=3)
    text = flight.report([str(tmp_path)])
    assert "MISMATCH: the ranks made different calls at #8" in text
    assert "rank 2 called broadcast #8" in text and "ranks 0-1 called allreduce #8" in text


def test_sizes_that_differ_are_a_mismatch(tmp_path):
    write_dump(tmp_path, 0, [call(5, nbytes=4096)], size=2)
    write_dump(tmp_path, 1, [call(5, nbytes=8192)], size=2)
    assert "MISMATCH: the ranks made different calls at #5" in flight.report([str(tmp_path)])


def test_same_call_everywhere_is_no_divergence(tmp_path):
    for r in range(2):
        write_dump(tmp_path, r, [call(1), call(2)], size=2)
    assert "no divergence" in flight.report([str(tmp_path)])


def test_communicators_are_reported_apart_and_other_files_ignored(tmp_path):
    write_dump(tmp_path, 0, [call(1)], size=1, comm="a")
    write_dump(tmp_path, 0, [call(9)], size=1, comm="b")
    (tmp_path / "zcoll-flight-junk.json").write_text(json.dumps({"format": "something else"}))
    text = flight.report([str(tmp_path)])
    assert "communicator a:" in text and "communicator b:" in text and "#9" in text


def test_report_command(tmp_path):
    write_dump(tmp_path, 0, [call(1)], size=1)
    rc, out = run([sys.executable, "-m", "zcoll", "report", str(tmp_path)], timeout=60)
    assert rc == 0 and "communicator c1:" in out, out
    (tmp_path / "nothing").mkdir()
    rc, out = run([sys.executable, "-m", "zcoll", "report", str(tmp_path / "nothing")], timeout=60)
    assert rc == 2 and "no flight-recorder dumps" in out, out


@pytest.mark.parametrize("nprocs", [2, 4])
@pytest.mark.parametrize("case", case_names("mpi/flight.py"))
def test_dumps_of_diverging_ranks(case, nprocs):
    env = {"ZCOLL_DUMP_DIR": f"{DUMP_DIR}/{nprocs}"}
    script_job("mpi/flight.py", nprocs, env=env, timeout=180).check(case, min_checks=2)


def test_torch_analyzer_names_the_rank_that_never_came_and_the_mismatch(tmp_path):
    """The 4-rank job above, converted: torch's fr_trace finds rank 3 missing from allreduce #4
    (the rank that skipped a call) and rank 3's broadcast where the others allreduced (#3)."""
    job = script_job("mpi/flight.py", 4, env={"ZCOLL_DUMP_DIR": f"{DUMP_DIR}/4"}, timeout=180)
    job.launch()
    assert job.cases, job.finished.output[-3000:]
    rc, out = run([sys.executable, "-m", "zcoll", "flight", "--to-torch", f"{DUMP_DIR}/4", "--out", tmp_path / "fr"],
                  timeout=60)  # fmt: skip
    assert rc == 0 and "4 files for torch's analyzer" in out, out
    # torch's torchfrtrace script, through this Python (the Open MPI venv links torch, not its scripts)
    rc, text = run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", tmp_path / "fr"], timeout=120
    )
    assert rc == 0, text
    assert "Not all ranks joining collective, sequence number: 4" in text and "missing ranks: {3}" in text, (
        text
    )
    # torch matches from whichever rank's file it lists first: it blames rank 3, or names the broadcast
    assert "COLLECTIVE_TYPE_MISMATCH" in text, text
    assert "Culprit rank 3" in text or "Expected collective type: 'broadcast'" in text, text
