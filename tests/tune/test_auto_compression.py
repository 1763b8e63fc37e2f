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
    in the trial steps every bucket comes back as the exact average (one rank: the input itself,
    bit for bit) while each candidate runs beside it on a copy; the trials end in a decision whose
    events carry every candidate's measured calls and errors against the exact average; a decided
    bucket still averages, and going dense sends what a compressed method still owed. The error
    bound is lifted so that int8 is chosen wherever it is fastest."""
    auto = zcoll.AutoCompression(check_every=2, error_bound=math.inf, hidden=0.0, min_gain=0.0)
    rng = np.random.default_rng(5)
    sizes = {"b0": 6007, "b1": 97}
    with zcoll.Communicator() as comm:
        step = 0
        while auto.decided_step is None:
            assert step < auto.trials.first + 100, "the trials never ended"
            for i, (key, n) in enumerate(sizes.items()):
                x = rng.standard_normal(n).astype(np.float32)
                out = np.asarray(auto.allreduce(comm, x.copy(), key, step, i == len(sizes) - 1, time.perf_counter()))
                np.testing.assert_array_equal(out, x)  # what the model gets in a trial: the exact average
            step += 1
        assert step == auto.config.start_step + auto.config.trial_repeats
        assert set(auto.calls_by_method) == set(auto.config.methods)  # each candidate ran, beside none
        for _ in range(4):  # decided, with the drift checks of check_every=2
            for i, key in enumerate(sizes):
                x = rng.standard_normal(sizes[key]).astype(np.float32)
                old, carried = auto.residuals.method_of.get(key, "none"), auto.residual(key)
                method = auto.method(key, step, x.nbytes)
                # going dense sends what the last compressed method still owed
                want = x + carried if method == "none" and old != "none" and carried is not None else x.copy()
                out = np.asarray(auto.allreduce(comm, x, key, step, i == len(sizes) - 1, time.perf_counter()))
                if method == "none":
                    np.testing.assert_array_equal(out, want)
                assert out.shape == want.shape and np.isfinite(out).all()
            step += 1
    assert set(auto.decisions) == set(sizes)
    decided = [e for e in auto.events if e["event"] == "decision"]
    for e in decided:
        assert set(e["measured_trial"]) == set(auto.config.methods) and all(t > 0 for t in e["measured_trial"].values())
        errors = e["trial_error"]
        assert set(errors) == {"bf16", "int8"}
        # against the exact average: bf16 keeps 8 bits of mantissa, int8 about 7 of each block's range
        assert 1e-4 < errors["bf16"]["relative"] < 1e-2 and errors["bf16"]["cosine"] > 0.9999, errors
        assert errors["bf16"]["relative"] < errors["int8"]["relative"] < 0.05 and errors["int8"]["cosine"] > 0.999
        assert e["predicted_error"] == (0.0 if e["method"] == "none" else errors[e["method"]]["relative"])
    # the drift check ran on the decided calls, whichever path they took (check_every=2)
    measured = [e for e in auto.events if e["event"] == "measured"]
    assert len(measured) == 2 and all(e["measured_s"] > 0 and e["predicted_s"] > 0 for e in measured)
    # resumed from a checkpoint: decided, but sizes and model unknown until each bucket's first
    # call (the uncompressed path once skipped that call's bookkeeping: KeyError at the check)
    resumed = zcoll.AutoCompression(check_every=2)
    resumed.load_state_dict(auto.state_dict())
    with zcoll.Communicator() as comm:
        for _ in range(4):
            for i, key in enumerate(sizes):
                x = rng.standard_normal(sizes[key]).astype(np.float32)
                resumed.allreduce(comm, x, key, step, i == len(sizes) - 1, time.perf_counter())
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
