"""zcoll.torch.elastic.ElasticLoop: DDP training that goes on in place on Open MPI with ULFM
(tests/torch_mpi/elastic.py, 3 ranks, rank 1 signals itself at the start of step 6 of 16):

- SIGKILL, policy "accumulate": every survivor recovers once (MPI's shrink: how=failed), within
  the timeout + 2 s of the kill, resumes at the failed step (at most that step lost), takes the
  lost rank's micro-batches over and finishes every step with the same parameters as the other
  survivor and the fault-free run's held-out loss within TRAJECTORY_TOLERANCE (the same global
  batch each step: the trajectory differs only in the order of float sums);
- SIGSTOP: ULFM never holds a stopped rank failed, so the survivors time out on it and leave it
  out alive (how=excluded), with no grace for MPI since they see it stopped, within the timeout +
  1 s (the watchdog's wait for news) + STOPPED_MARGIN of the stop; they finish as above, and the
  stopped rank is then SIGKILLed (by the first survivor) or continued, when it must raise
  ExcludedError, not train on;
- SIGSTOP and SIGKILL at once (4 ranks, rank 1 stopped, rank 3 killed at the same step): the two
  survivors leave both out in one recovery (MPI_Comm_create_from_group: create_group refuses the
  communicator of the dead one, MPI's shrink would wait for the stopped one), finish with the
  same parameters, and the stopped rank, continued, raises ExcludedError;
- SIGKILL, policy "lr": the survivors keep their own data (the global batch shrinks to 2/3) and
  the learning rate follows LRScaling's linear rule; the quality is reported against the fault-
  free run's and must be below 0.8 x the initial loss.

Bad input for ElasticLoop (no MPI) is checked first. Many faults and faults during a recovery:
tests/chaos_shrink.py (docs/recovery.md)."""

from __future__ import annotations

import re

import engines
import pytest
import torch
from mpi_util import TESTS_DIR, run
from zcoll.torch.elastic import ElasticLoop, named_ranks, seen_alive, share

OMPI = engines.openmpi()
RANKS, VICTIM, AFTER, STEPS, TIMEOUT = 3, 1, 6, 16, 5.0
# Relative difference of the survivors' held-out loss from the fault-free run's with policy
# "accumulate" (float summation order only): 2.1e-7 in every case measured here, 0-2.75e-7 over
# 14 chaos jobs (docs/recovery.md); bound at 1e-6, as tests/chaos_shrink.py's --tolerance.
TRAJECTORY_TOLERANCE = 1e-6
# Seconds a recovery from a stopped rank may take beyond the detection (timeout + the watchdog's
# 1 s): 0.9 s measured at load 13, 1.6-2.8 s at load 14-22 (docs/recovery.md). The two graces it
# waited before added 6 s, which this bound still catches.
STOPPED_MARGIN = 4.0
_RECOVERED = re.compile(
    r"ZCOLL-RECOVERED rank=(\d+) lost=(\S+) world=(\S+) resumed=(\d+) accumulation=(\d+) attempts=(\d+) "
    r"seconds=([\d.]+) t=([\d.]+) how=(\S+)"
)
_FINAL = re.compile(
    r"ZCOLL-FINAL rank=(\d+) steps=(\d+) world=(\d+) loss0=([\d.]+) loss=([\d.]+) digest=(\S+)"
)


def test_bad_input_raises_clear_errors():
    net = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    cases = [
        ({"policy": "fastest"}, ValueError, "policy must be one of accumulate, lr, none, got 'fastest'"),
        ({"policy": "lr"}, ValueError, 'policy="lr" needs scaling='),
        ({"scaling": object()}, ValueError, 'scaling= is the learning-rate rule of policy="lr"'),
        ({"micro_batch": 0}, ValueError, "micro_batch must be an integer >= 1, got 0"),
        ({"accumulation": 1.5}, ValueError, "accumulation must be an integer >= 1, got 1.5"),
        ({"wrap": "ddp"}, TypeError, "wrap must be callable"),
        ({"on_phase": 3}, TypeError, "on_phase must be callable"),
        ({"grace": -1}, ValueError, "grace must be a number of seconds >= 0"),
        ({"group": object()}, ValueError, "group must be a zcoll process group"),
    ]
    for kwargs, kind, message in cases:
        with pytest.raises(kind, match=re.escape(message)):
            ElasticLoop(net, opt, **kwargs)
    with pytest.raises(TypeError, match="module must be a torch.nn.Module"):
        ElasticLoop(lambda x: x, opt)
    with pytest.raises(TypeError, match="optimizer must have state_dict"):
        ElasticLoop(net, None)
    loop = object.__new__(ElasticLoop)  # run() checks its arguments before touching the loop
    with pytest.raises(ValueError, match="steps must be an integer >= 0, got -1"):
        loop.run(lambda step, model: None, -1)
    with pytest.raises(TypeError, match="step_fn must be callable"):
        loop.run(None, 3)


def test_share_deals_every_micro_batch_once():
    """The global batch of 4 ranks x 3 micro-batches over the survivors [0, 2, 3], then [3]."""
    shares = [share([0, 2, 3], 4, 3, m) for m in range(3)]
    assert shares[0] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert shares[1] == [(2, 0), (2, 1), (2, 2), (1, 1)]
    assert shares[2] == [(3, 0), (3, 1), (3, 2), (1, 2)]
    assert sorted(sum(shares, [])) == [(q, k) for q in range(4) for k in range(3)]
    assert sorted(share([3], 4, 3, 0)) == [(q, k) for q in range(4) for k in range(3)]
    uneven = [len(share([1, 4], 5, 1, m)) for m in range(2)]  # 5 micro-batches on 2 ranks
    assert uneven == [3, 2]


def test_named_ranks_from_the_error_text_ddp_quotes():
    stopped = RuntimeError(
        "zcoll: allreduce #13 (2308 bytes) on rank 0 of 3 timed out after 5 s, the timeout of its communicator. "
        "Never arrived (not heard from within 1 s of the failure): rank 1 (its process, pid 7 on this machine, "
        "is stopped: SIGSTOP or a debugger). Rank 2 was also in allreduce #13."
    )
    assert named_ranks(stopped) == ([1], [])
    killed = RuntimeError(
        "zcoll: allreduce #9 (8 bytes) on rank 0 of 4 failed: rank 3 is lost. Never arrived (not heard from "
        "within 1 s of the failure): rank 1 (its process, pid 8 on this machine, is stopped: SIGSTOP or a "
        "debugger); rank 3 (lost: its process, pid 9 on this machine, has exited). Flight recorder dump: x."
    )
    assert named_ranks(killed) == ([1, 3], [3])
    assert named_ranks(RuntimeError("zcoll: ... aborted. Every rank was heard from.")) == ([], [])
    assert named_ranks(RuntimeError("MPI_ERR_PROC_FAILED")) == (None, None)
    hung = RuntimeError(
        "zcoll: allreduce #2 (8 bytes) on rank 0 of 4 timed out after 5 s. Never arrived (not heard from "
        "within 1 s of the failure): rank 2 (its process, pid 5 on this machine, is running but not in a zcoll "
        "call); rank 3 (on another machine)."
    )
    assert (seen_alive(stopped), seen_alive(killed), seen_alive(hung)) == ([1], [1], [2])


def _job(*extra, ranks: int = RANKS) -> str:
    if run([OMPI.python, "-c", "import torch"], timeout=120).returncode != 0:
        pytest.skip(f"{OMPI.python} has no torch (./dev.sh test --engine openmpi links the default venv's)")
    argv = engines.ft_mpirun_argv(OMPI, ranks, OMPI.python, TESTS_DIR / "torch_mpi" / "elastic.py", "--after",
                                  AFTER, "--steps", STEPS, "--timeout", TIMEOUT, *extra)  # fmt: skip
    return run(argv, env=engines.ft_job_env(OMPI), timeout=300).output


@pytest.fixture(scope="module")
def fault_free() -> float:
    """The held-out loss of the same training without a fault (every rank's, equal)."""
    if OMPI is None:
        pytest.skip(engines.openmpi_missing())
    out = _job()
    final = {int(m[1]): float(m[5]) for m in _FINAL.finditer(out)}
    assert sorted(final) == list(range(RANKS)) and len(set(final.values())) == 1, out
    return final[0]


def _survivors_finish(out: str, how: str, policy_accumulation: str) -> dict:
    """The checks common to every case; returns the survivors' final lines."""
    victim_t = float(re.search(r"ZCOLL-VICTIM rank=\d+ pid=\d+ signal=\w+ t=([\d.]+)", out)[1])
    recovered = {int(m[1]): m for m in _RECOVERED.finditer(out)}
    final = {int(m[1]): m for m in _FINAL.finditer(out)}
    survivors = [r for r in range(RANKS) if r != VICTIM]
    back = {r: round(float(m[8]) - victim_t, 3) for r, m in recovered.items()}
    print(f"\nseconds from the fault to training again: {back}; recovery seconds: "
          f"{ {r: float(m[7]) for r, m in recovered.items()} }")  # fmt: skip
    assert sorted(recovered) == survivors and sorted(final) == survivors, out
    bound = TIMEOUT + 2 if how == "failed" else TIMEOUT + 1 + STOPPED_MARGIN
    for r in survivors:
        _, lost, world, resumed, accumulation, attempts, seconds, _, way = recovered[r].groups()
        assert (lost, world, accumulation, attempts, way) == (
            str(VICTIM), f"{RANKS},{RANKS - 1}", policy_accumulation, "1", how), out  # fmt: skip
        assert int(resumed) in (AFTER, AFTER + 1), out
        assert back[r] <= bound, out
        _, steps, world, loss0, loss, _ = final[r].groups()
        assert (int(steps), int(world)) == (STEPS, RANKS - 1) and float(loss) < 0.8 * float(loss0), out
    assert len({final[r][6] for r in survivors}) == 1, out
    return final


def _same_trajectory(final: dict, reference: float, out: str) -> None:
    apart = max(abs(float(m[5]) / reference - 1) for m in final.values())
    print(f"held-out loss {[float(m[5]) for m in final.values()]}, fault-free {reference}: {apart:.2e} apart")
    assert apart <= TRAJECTORY_TOLERANCE, out


@pytest.mark.skipif(OMPI is None, reason=engines.openmpi_missing())
def test_ddp_training_goes_on_after_a_rank_is_killed(fault_free):
    out = _job("--victim", VICTIM, "--signal", "kill")
    _same_trajectory(_survivors_finish(out, "failed", "2"), fault_free, out)


@pytest.mark.skipif(OMPI is None, reason=engines.openmpi_missing())
def test_a_stopped_rank_is_left_out_and_then_killed(fault_free):
    out = _job("--victim", VICTIM, "--signal", "stop", "--stopped", "kill")
    _same_trajectory(_survivors_finish(out, "excluded", "2"), fault_free, out)
    assert f"ZCOLL-STOPPED-KILLED rank={VICTIM}" in out and "ZCOLL-EXCLUDED" not in out, out


@pytest.mark.skipif(OMPI is None, reason=engines.openmpi_missing())
def test_a_stopped_rank_that_continues_gets_a_clear_error(fault_free):
    out = _job("--victim", VICTIM, "--signal", "stop", "--stopped", "resume")
    _same_trajectory(_survivors_finish(out, "excluded", "2"), fault_free, out)
    assert f"ZCOLL-CONTINUED rank={VICTIM}" in out, out
    excluded = re.search(rf"ZCOLL-EXCLUDED rank={VICTIM} error=(.*)", out)
    assert (
        excluded and "was left out by the others" in excluded[1] and "first-group ranks [0, 2]" in excluded[1]
    ), out
    assert "ZCOLL-STOPPED-KILLED" not in out and not re.search(rf"ZCOLL-FINAL rank={VICTIM} ", out), out


@pytest.mark.skipif(OMPI is None, reason=engines.openmpi_missing())
def test_policy_lr_rescales_the_rate(fault_free):
    out = _job("--victim", VICTIM, "--signal", "kill", "--policy", "lr")
    final = _survivors_finish(out, "failed", "1")
    losses = [float(m[5]) for m in final.values()]
    print(f"policy lr: held-out loss {losses}, fault-free {fault_free}: {losses[0] / fault_free - 1:+.2%}")


@pytest.mark.skipif(OMPI is None, reason=engines.openmpi_missing())
def test_a_stopped_and_a_killed_rank_are_left_out_together():
    stopped, killed, ranks = 1, 3, 4
    out = _job(
        "--victim", stopped, "--signal", "stop", "--stopped", "resume", "--kill-too", killed, ranks=ranks
    )
    recovered = {int(m[1]): m.groups() for m in _RECOVERED.finditer(out)}
    final = {int(m[1]): m.groups() for m in _FINAL.finditer(out)}
    survivors = [0, 2]
    assert sorted(recovered) == survivors and sorted(final) == survivors, out
    for r in survivors:
        _, lost, world, resumed, accumulation, attempts, _, _, way = recovered[r]
        assert (lost, world, accumulation, attempts, way) == (
            f"{stopped},{killed}",
            "4,2",
            "2",
            "1",
            "excluded",
        ), out
        assert int(resumed) in (AFTER, AFTER + 1), out
        _, steps, world, loss0, loss, _ = final[r]
        assert (int(steps), int(world)) == (STEPS, 2) and float(loss) < 0.8 * float(loss0), out
    assert final[0][5] == final[2][5], out  # the same parameters on both survivors
    excluded = re.search(rf"ZCOLL-EXCLUDED rank={stopped} error=(.*)", out)
    assert excluded and "first-group ranks [0, 2]" in excluded[1], out
    assert not re.search(rf"ZCOLL-FINAL rank=({stopped}|{killed}) ", out), out
