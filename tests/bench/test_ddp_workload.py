"""bench/ddp_workload.py run as a script: --optimizer adam-fused stands in for torch's default
Adam (the same training to float rounding), and an unknown optimizer is refused."""

import sys

import torch
from mpi_util import ROOT, run

WORKLOAD = ROOT / "bench" / "ddp_workload.py"


def test_fused_adam_steps_like_the_default(tmp_path):
    """--optimizer adam-fused trains the same model the same way as torch's default Adam (to float
    rounding: the fused kernel orders its arithmetic differently), and an unknown name is refused.
    Two steps: later ones amplify the rounding (Adam's early updates are nearly lr * sign(g), and a
    gradient near 0 flips sign with it: 5 steps differed by 1.3e-3 on an AVX-512 host, 2 by 1.4e-7)."""
    path = tmp_path / "steps.pt"
    argv = [sys.executable, WORKLOAD, "--optimizers", "adam,adam-fused", "--steps", "2", "--save", path]
    rc, out = run(argv, timeout=120)
    assert rc == 0, out
    saved = torch.load(path)
    plain, fused, start = saved["adam"]["parameters"], saved["adam-fused"]["parameters"], saved["start"]
    assert len(plain) == len(fused) == len(start) > 0
    for a, b in zip(plain, fused):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert saved["adam-fused"]["fused"] and not saved["adam"]["fused"]
    assert any(not torch.equal(p, q) for p, q in zip(plain, start))  # it trained
    argv = [sys.executable, WORKLOAD, "--optimizers", "sgd", "--save", tmp_path / "sgd.pt"]
    rc, out = run(argv, timeout=120)
    assert rc != 0 and "ValueError: unknown optimizer 'sgd'" in out, out
