"""zcoll.torch.checkpoint (on zcoll.core.checkpoint_files): save and load resume bit-exactly on one
rank (model, optimizer, accumulation, error-feedback residuals, RNGs, data position); what a save
refuses; checkpoints that a crash in the middle of a save cannot make look complete; per-rank state
for fewer ranks; and the same under mpirun (tests/torch_mpi/checkpoint.py) on 2 and 3 ranks.
Restarts through `zcoll run`: tests/tools/test_launcher.py."""

import sys

import pytest
import torch
import zcoll
import zcoll.torch
from mpi_util import case_names, run, script_job
from zcoll.core import checkpoint_files
from zcoll.torch import checkpoint


def _training_objects():
    """A net, an accumulating Adam (2 micro-batches per update) and an error-feedback compressor
    (the compression state: anything with state_dict(); e2e below it is a DDP CompressionState)."""
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    opt = zcoll.torch.optim.Adam(net.parameters(), lr=1e-2, gradient_accumulation_steps=2)
    return net, opt, zcoll.GradientQuantizer(bits=4, stochastic=True)


def _train_steps(net, opt, compressor, n, seed):
    """n micro-batches, each gradient through the compressor (residual and seed per key)."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x, y = torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g)
        torch.nn.functional.cross_entropy(net(x), y).backward()
        for i, p in enumerate(net.parameters()):
            p.grad.copy_(compressor.decompress(compressor.compress(p.grad, key=f"p{i}")))
        opt.step()
        opt.zero_grad()


def _flat(net):
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


@pytest.fixture
def self_comm():
    from mpi4py import MPI

    return MPI.COMM_SELF


def test_save_load_resumes_bit_exactly(tmp_path, self_comm):
    """Model, Adam state, accumulation counter, error-feedback residuals and call counts (the
    seeds of stochastic rounding), RNGs, data position: the continuation is bit-identical."""
    import random

    import numpy as np

    net, opt, state = _training_objects()
    _train_steps(net, opt, state, 6, seed=1)  # 3 updates of 2 micro-batches
    saved = dict(model=net, optimizer=opt, compression_state=state)
    path = checkpoint.save(
        tmp_path, 3, data_position={"row": 96}, extra={"losses": [1.5]}, comm=self_comm, **saved
    )
    assert path == tmp_path / "step-0000000003.json" and checkpoint.latest(tmp_path).step == 3
    saved_residual = state.residual("p0").copy()
    draws = (torch.rand(3), np.random.rand(3), random.random())
    _train_steps(net, opt, state, 6, seed=2)
    reference = _flat(net)

    net2, opt2, state2 = _training_objects()
    resumed = checkpoint.load(tmp_path, model=net2, optimizer=opt2, compression_state=state2, comm=self_comm)
    assert (resumed.step, resumed.data_position, resumed.extra) == (3, {"row": 96}, {"losses": [1.5]})
    assert not resumed.resized
    redraws = (torch.rand(3), np.random.rand(3), random.random())
    assert (
        torch.equal(draws[0], redraws[0]) and np.array_equal(draws[1], redraws[1]) and draws[2] == redraws[2]
    )
    assert np.any(state2.residual("p0")) and np.array_equal(state2.residual("p0"), saved_residual)
    _train_steps(net2, opt2, state2, 6, seed=2)
    assert torch.equal(_flat(net2), reference)


def test_save_refuses_the_middle_of_an_accumulation(tmp_path, self_comm):
    net, opt, state = _training_objects()
    _train_steps(net, opt, state, 1, seed=1)  # 1 of 2 micro-batches
    with pytest.raises(ValueError, match="1 of 2 micro-batches"):
        checkpoint.save(tmp_path, 1, model=net, optimizer=opt, comm=self_comm)
    assert checkpoint.latest(tmp_path) is None


def test_load_without_a_checkpoint_is_a_fresh_start(tmp_path, self_comm):
    net, opt, _ = _training_objects()
    assert checkpoint.load(tmp_path / "nothing", model=net, optimizer=opt, comm=self_comm) is None


def test_keeps_the_newest_and_replaces_a_step_saved_again(tmp_path, self_comm):
    net, opt, _ = _training_objects()
    for step in (1, 2, 3, 3):
        checkpoint.save(tmp_path, step, model=net, optimizer=opt, keep=2, comm=self_comm)
    assert [m.step for m in checkpoint_files.checkpoints(tmp_path)] == [2, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-0000000002",
        "step-0000000002.json",
        "step-0000000003",
        "step-0000000003.json",
    ]
    assert len(list((tmp_path / "step-0000000003").iterdir())) == 2  # the second save's files only


def test_a_crash_before_the_manifest_leaves_the_previous_checkpoint(tmp_path):
    """A process that dies after writing every part of step 2 but before its manifest."""
    program = f"""
import os, torch
from mpi4py import MPI
from zcoll.core import checkpoint_files
from zcoll.torch import checkpoint
net = torch.nn.Linear(4, 2)
checkpoint.save({str(tmp_path)!r}, 1, model=net, comm=MPI.COMM_SELF)
checkpoint_files.commit = lambda *a, **k: os._exit(9)   # dies where the manifest would be written
checkpoint.save({str(tmp_path)!r}, 2, model=net, comm=MPI.COMM_SELF)
"""
    rc, out = run([sys.executable, "-c", program], timeout=120)
    assert rc == 9, out
    assert len(list((tmp_path / "step-0000000002").glob("*.pt"))) == 2  # both parts were written
    assert checkpoint.latest(tmp_path).step == 1


def test_a_damaged_part_is_not_complete_and_not_loaded(tmp_path, self_comm):
    net, opt, _ = _training_objects()
    checkpoint.save(tmp_path, 1, model=net, optimizer=opt, comm=self_comm)
    checkpoint.save(tmp_path, 2, model=net, optimizer=opt, comm=self_comm)
    manifest = checkpoint.latest(tmp_path)
    part = manifest.directory / manifest.replicated["file"]
    data = part.read_bytes()
    part.write_bytes(data[:-10])  # truncated: latest() skips it
    assert checkpoint.latest(tmp_path).step == 1
    part.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, other bytes: load refuses it
    assert checkpoint.latest(tmp_path).step == 2
    with pytest.raises(ValueError, match="does not match its manifest"):
        checkpoint.load(tmp_path, model=net, comm=self_comm)


def test_per_rank_state_for_fewer_ranks_is_the_mean():
    """Residuals of 3 old ranks onto any new rank: the mean (a missing key counts as zero)."""
    old = [
        {"step": 5, "compressor": {"residuals": {"a": torch.tensor([1.0, 2.0])}, "calls": {"a": 5}}},
        {
            "step": 5,
            "compressor": {
                "residuals": {"a": torch.tensor([3.0, 4.0]), "b": torch.tensor([6.0])},
                "calls": {"a": 5},
            },
        },
        {"step": 5, "compressor": {"residuals": {"a": torch.tensor([5.0, 9.0])}, "calls": {"a": 5}}},
    ]
    merged = checkpoint._mean_over_ranks(old)
    assert merged["step"] == 5 and merged["compressor"]["calls"] == {"a": 5}
    assert torch.equal(merged["compressor"]["residuals"]["a"], torch.tensor([3.0, 5.0]))
    assert torch.equal(merged["compressor"]["residuals"]["b"], torch.tensor([2.0]))


@pytest.mark.parametrize("case", case_names("torch_mpi/checkpoint.py"))
def test_checkpoint_two_ranks(case):
    script_job("torch_mpi/checkpoint.py", 2).check(case, min_checks=2)


def test_checkpoint_resumes_bit_exactly_on_three_ranks():
    case = "ddp_with_compression_resumes_bit_exactly"
    script_job("torch_mpi/checkpoint.py", 3, case).check(case, min_checks=8)
