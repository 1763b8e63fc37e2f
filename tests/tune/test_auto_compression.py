"""compression="auto" (zcoll.tune.auto_compression): the refusals and a run driven without the
hook, in one process; the multi-rank behaviour (identical decisions, escalation on a corrupting
codec, the metrics a run writes, recommend) in tests/torch_mpi/auto_compression.py, and without
DDP (comm.allreduce) in tests/mpi/auto_calls.py. The cost model and decision:
test_compression_model.py; drift: test_drift.py; the metrics log: tests/observe/test_guard_metrics.py."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import zcoll
from mpi_util import case_names, script_job
from zcoll.tune import compression_model as cm
from zcoll.tune.auto_compression import resolve


def test_resolve_and_refusals():
    assert isinstance(resolve("auto"), zcoll.AutoCompression)
    with pytest.raises(ValueError, match="'auto'"):
        resolve("int8")
    with pytest.raises(ValueError, match="unknown methods"):
        zcoll.AutoCompression(methods=("int3",))
    with pytest.raises(ValueError, match="_test_corrupt_fraction"):
        zcoll.AutoCompression(_test_corrupt_fraction=2.0)
    c = zcoll.Communicator()
    with pytest.raises(TypeError, match="'int8'"):
        c.allreduce(np.ones(4, np.float32), op="avg", compression="int8", key="k")
    for what in ("auto", zcoll.AutoCompression()):  # without DDP: its own cases in tests/mpi/auto_calls.py
        with pytest.raises(ValueError, match="key="):
            c.allreduce(np.ones(4, np.float32), op="avg", compression=what)
    assert isinstance(c.auto_compression, zcoll.AutoCompression)


def test_driven_without_the_hook_through_every_method():
    """AutoCompression.allreduce called directly (the hook is one caller, not a precondition):
    every method's compressor exists by the time a bucket's residual moves to it (a switch from
    one compressed method to the next, bf16 -> int8 in the screen, once failed with a KeyError
    when nothing else had asked for the next compressor), the trials end in a decision, and a
    decided bucket still averages (one rank: the average is the input). Every method enters the
    final (screen_band): on one rank the screen's windows are tens of microseconds apart, and
    which come within the default band of the fastest is noise."""
    auto = zcoll.AutoCompression(check_every=2, screen_band=math.inf)
    rng = np.random.default_rng(5)
    bufs = {
        "b0": rng.standard_normal(6007).astype(np.float32),
        "b1": rng.standard_normal(97).astype(np.float32),
    }
    with zcoll.Communicator() as comm:
        step = 0
        while auto.decided_step is None:
            assert step < auto.trials.first + 100, "the trials never ended"
            for i, (key, b) in enumerate(bufs.items()):
                auto.allreduce(comm, b, key, step, i == len(bufs) - 1, time.perf_counter())
            step += 1
        assert set(auto.calls_by_method) >= set(auto.config.methods)  # every method ran in the screen
        for _ in range(4):  # decided, with the drift checks of check_every=2
            for i, key in enumerate(bufs):
                x = rng.standard_normal(bufs[key].size).astype(np.float32)
                old, carried = auto.residuals.method_of.get(key, "none"), auto.residual(key)
                method = auto.method(key, step, x.nbytes)
                # going dense sends what the last compressed method still owed
                want = x + carried if method == "none" and old != "none" and carried is not None else x.copy()
                out = np.asarray(auto.allreduce(comm, x, key, step, i == len(bufs) - 1, time.perf_counter()))
                if method == "none":
                    np.testing.assert_array_equal(out, want)
                assert out.shape == want.shape and np.isfinite(out).all()
            step += 1
    assert set(auto.decisions) == set(bufs)
    # the final's evidence is logged: its windows round by round, and per candidate the sum over
    # buckets of each bucket's typical trial call (what decides where the windows do not resolve)
    decided = [e for e in auto.events if e["event"] == "decision"]
    rounds, calls = decided[0]["final_rounds_s"], decided[0]["final_calls_s"]
    assert set(rounds) == set(calls) and len(calls) >= 2
    assert all(len(w) == auto.config.final_rounds for w in rounds.values())
    for name in set(calls) - {cm.PLAN}:
        assert calls[name] == pytest.approx(sum(e["measured_trial"][name] for e in decided))
    # the drift check ran on the decided calls, whichever path they took (check_every=2)
    measured = [e for e in auto.events if e["event"] == "measured"]
    assert len(measured) == 2 and all(e["measured_s"] > 0 and e["predicted_s"] > 0 for e in measured)
    # resumed from a checkpoint: decided, but sizes and model unknown until each bucket's first
    # call (the uncompressed path once skipped that call's bookkeeping: KeyError at the check)
    resumed = zcoll.AutoCompression(check_every=2)
    resumed.load_state_dict(auto.state_dict())
    with zcoll.Communicator() as comm:
        for _ in range(4):
            for i, key in enumerate(bufs):
                x = rng.standard_normal(bufs[key].size).astype(np.float32)
                resumed.allreduce(comm, x, key, step, i == len(bufs) - 1, time.perf_counter())
            step += 1
    assert len([e for e in resumed.events if e["event"] == "measured"]) == 2


@pytest.mark.parametrize("case", case_names("torch_mpi/auto_compression.py"))
def test_auto_compression_two_ranks(case):
    script_job("torch_mpi/auto_compression.py", 2).check(case)


@pytest.mark.parametrize("case", case_names("mpi/auto_calls.py"))
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_auto_compression_without_ddp(nprocs, case):
    """comm.allreduce(x, op="avg", compression="auto", key=k) in a loop of steps (tests/mpi/auto_calls.py)."""
    script_job("mpi/auto_calls.py", nprocs, timeout=300).check(case)


ON_FOUR = ["decisions_identical_on_every_rank", "corrupting_codec_escalates_within_one_interval"]


@pytest.mark.parametrize("case", ON_FOUR)
def test_auto_compression_four_ranks(case):
    script_job("torch_mpi/auto_compression.py", 4, *ON_FOUR, timeout=400).check(case)
