"""zcoll's flight-recorder dumps in torch's format (python/zcoll/observe/flight_torch.py): the
conversion on hand-made dumps, torch's own analyzer (torch.distributed.flight_recorder) on them,
a mixed job's dumps merged, and the dumps of a real failed job (a stopped rank, from the
failure-path matrix's case script) in which torch's analyzer names the rank that left none. The
4-rank job whose ranks diverge on purpose, through torchfrtrace: test_flight.py."""

from __future__ import annotations

import json
import pickle

import fault_matrix as fm
import pytest
from mpi_util import OPEN_MPI
from torch.distributed.flight_recorder.fr_trace import main as fr_trace
from zcoll.observe import flight, flight_torch


def call(seq, collective="allreduce", state="done", count=1024, dtype="float32", start=None, end=None):
    start = 100.0 + seq if start is None else start
    return {"seq": seq, "collective": collective, "algorithm": "ring", "dtype": dtype, "op": "sum", "count": count,
            "bytes": count * 4, "root": -1, "state": state, "waiting_for": -1, "start": start,
            "end": (start + 0.001 if state == "done" else None) if end is None else end, "peers": []}  # fmt: skip


def dump(rank, calls, size=3, comm="c1"):
    return {"format": flight.FORMAT, "version": 1, "comm": comm, "rank": rank, "size": size, "pid": 100 + rank,
            "host": "h", "reason": "zcoll.dump()", "time": 200.0, "timeout": 3.0, "broken": False, "calls": calls}  # fmt: skip


def write(directory, dumps):
    directory.mkdir(parents=True, exist_ok=True)
    for d in dumps:
        (directory / f"zcoll-flight-{d['comm']}-rank{d['rank']}.json").write_text(json.dumps(d))
    return directory


def analyze(directory, caplog, *flags):
    """torch's fr_trace on directory, in this process; its log."""
    caplog.clear()
    with caplog.at_level("INFO", logger="Flight Recorder"):
        fr_trace([str(directory), *flags])
    return caplog.text


def test_entries_carry_torch_names_sizes_dtypes_and_states():
    dumps = [dump(r, [call(1), call(2, "allgather", count=10), call(3, "reduce_scatter", count=12, dtype="bfloat16"),
                      call(4, "reduce_scatter", count=10), call(5, "link_stats"), call(6, state="failed")])
             for r in range(3)]  # fmt: skip
    out = flight_torch.convert(dumps)
    assert sorted(out) == [0, 1, 2]
    d = out[1]
    assert d["version"] == "2.10" and d["pg_config"] == {
        "c1": {"name": "c1", "desc": "zcoll", "ranks": "[0, 1, 2]"}
    }
    names = [(e["profiling_name"], e["input_sizes"], e["output_sizes"], e["state"]) for e in d["entries"]]
    assert names == [
        ("gloo:all_reduce", [[1024]], [[1024]], "completed"),
        ("gloo:all_gather", [[10]], [[30]], "completed"),
        ("gloo:reduce_scatter", [[12]], [[4]], "completed"),
        ("gloo:reduce_scatter_v", [[10]], [[10]], "completed"),  # 10 over 3 ranks: uneven blocks
        ("gloo:all_reduce", [[1024]], [[1024]], "started"),  # failed: never completed
    ]  # link_stats (zcoll's own probe) has no torch name
    e = d["entries"][2]
    assert (
        e["input_dtypes"] == ["BFloat16"]
        and e["collective_seq_id"] == 3
        and e["process_group"] == ("c1", "zcoll")
    )
    assert [e["record_id"] for e in d["entries"]] == list(range(5))
    assert (
        d["entries"][0]["duration_ms"] == pytest.approx(1.0, abs=1e-3)
        and d["entries"][4]["time_discovered_completed_ns"] is None
    )
    assert d["pg_status"]["c1"] == {
        "last_enqueued_collective": 6,
        "last_started_collective": 6,
        "last_completed_collective": 4,
    }


def test_groups_rank_mapping_and_alignment():
    """A sub-communicator named and placed on global ranks 2 and 5; rank 1's ring buffer dropped
    call 1, so both start at call 2."""
    dumps = [
        dump(0, [call(1), call(2), call(3)], size=2, comm="sub"),
        dump(1, [call(2), call(3)], size=2, comm="sub"),
    ]
    comm, group = flight_torch.parse_group("sub=7:tp:2,5")
    out = flight_torch.convert(dumps, {comm: group})
    assert sorted(out) == [2, 5]
    assert out[5]["pg_config"] == {"7": {"name": "7", "desc": "tp", "ranks": "[2, 5]"}}
    assert [e["collective_seq_id"] for e in out[2]["entries"]] == [2, 3]
    with pytest.raises(ValueError, match="COMMUNICATOR_ID=NAME"):
        flight_torch.parse_group("no-equals-sign")
    with pytest.raises(ValueError, match="3 global ranks given for 2 ranks"):
        flight_torch.convert(dumps, {"sub": ("7", "tp", [0, 1, 2])})


def test_torch_analyzer_reads_them_and_names_what_went_wrong(tmp_path, caplog):
    """Rank 2 never entered allreduce #3 of one communicator; of another, rank 1 broadcast where the
    others allreduced; with every rank's dump, then without rank 2's."""
    dumps = [dump(r, [call(1), call(2)] + ([call(3, state="failed")] if r != 2 else [])) for r in range(3)]
    dumps += [dump(r, [call(1, start=90.0), call(2, "broadcast" if r == 1 else "allreduce", state="failed",
                                                start=91.0)], comm="c2") for r in range(3)]  # fmt: skip
    written = flight_torch.to_torch([str(write(tmp_path / "dumps", dumps))], str(tmp_path / "fr"))
    assert [p.rsplit("/", 1)[1] for p in written] == [f"zcoll_trace_rank_{r}" for r in range(3)]
    text = analyze(tmp_path / "fr", caplog)
    assert "Not all ranks joining collective, sequence number: 3" in text and "missing ranks: {2}" in text, (
        text
    )
    # torch matches from whichever rank's file it lists first: it blames rank 1, or names the broadcast
    assert "COLLECTIVE_TYPE_MISMATCH" in text, text
    assert "Culprit rank 1" in text or "Expected collective type: 'broadcast'" in text, text
    (tmp_path / "fr" / "zcoll_trace_rank_2").unlink()
    with pytest.raises(AssertionError, match=r"Missing dump files from ranks \{2\}"):
        analyze(tmp_path / "fr", caplog)
    assert "missed FR dumps from ranks ({2})" in analyze(tmp_path / "fr", caplog, "--allow-incomplete-ranks")


def test_a_mixed_job_lines_up_in_one_file_per_rank(tmp_path, caplog):
    """torch's own records of a gloo group (its dump format) merged with zcoll's: one file per rank
    holding both groups, entries in creation order, and torch's analyzer matches both."""
    zc = flight_torch.convert([dump(r, [call(1, start=10.0), call(2, start=30.0)], size=2) for r in range(2)])
    theirs = tmp_path / "torch"
    theirs.mkdir()
    for r in range(2):
        entry = dict(zc[r]["entries"][0], process_group=("0", "default_pg"), collective_seq_id=1, record_id=0,
                     time_created_ns=int(20e9), pg_id=0)  # fmt: skip
        body = {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
                "pg_status": {}, "entries": [entry]}  # fmt: skip
        (theirs / f"gloo_trace_rank_{r}").write_bytes(pickle.dumps(body))
    merged = flight_torch.merge(zc, flight_torch.read_torch_dumps(str(theirs)))
    assert [e["process_group"][0] for e in merged[0]["entries"]] == ["c1", "0", "c1"]
    assert set(merged[1]["pg_config"]) == {"c1", "0"}
    flight_torch.write(merged, str(tmp_path / "fr"))
    text = analyze(tmp_path / "fr", caplog)
    assert "Not all ranks" not in text and "has errors" not in text, text


def test_a_stopped_rank_leaves_no_dump_and_torch_names_it(tmp_path, caplog):
    """A real failed job: rank 1 of 3 stops (SIGSTOP) in a ring allreduce; the survivors time out
    and dump. Converted, torch's analyzer names rank 1 as the one without a dump."""
    case = fm.Case("ring", "stop", "middle", "4K", 3)
    verdict = fm.run_case(case, fm.Settings(timeout=1.0, linger=0.3), dumps=tmp_path / "dumps")
    assert verdict["passed"], verdict["problems"]
    by_rank = {json.loads(p.read_text())["rank"]: p for p in (tmp_path / "dumps").iterdir()}
    # When the survivors exit, each launcher ends the stopped rank its own way. hydra (MPICH)
    # kills it while it is stopped: it never dumps. prterun (Open MPI) sends SIGCONT before its
    # SIGTERM (a stopped process takes no SIGTERM); in between, rank 1 runs on in its allreduce,
    # hears a survivor's failure announcement and dumps as every raising rank does (9 of 36 runs
    # here; 0 of 20 on MPICH). That dump is right, and later than the survivors' ones: it is set
    # aside, leaving what was on disk when the survivors failed, as an operator collects it then.
    if OPEN_MPI and 1 in by_rank:
        late = json.loads(by_rank.pop(1).read_text())
        assert "failed: rank" in late["reason"] and "timed out in allreduce #4" in late["reason"], late
        assert late["time"] > max(json.loads(p.read_text())["time"] for p in by_rank.values()), late
    assert sorted(by_rank) == [0, 2], sorted(by_rank)
    survivors = tmp_path / "survivors"
    survivors.mkdir()
    for p in by_rank.values():
        p.rename(survivors / p.name)
    written = flight_torch.to_torch([str(survivors)], str(tmp_path / "fr"))
    assert sorted(p.rsplit("_", 1)[1] for p in written) == ["0", "2"]
    with pytest.raises(AssertionError, match=r"Missing dump files from ranks \{1\}"):
        analyze(tmp_path / "fr", caplog)
    assert "missed FR dumps from ranks ({1})" in analyze(tmp_path / "fr", caplog, "--allow-incomplete-ranks")
