#!/usr/bin/env python3
"""The step profiler on three constructed cases, and its suggestions followed.

    mpirun -n 2 python -m mpi4py bench/profiler_cases.py --case overhead --follow bucket
    # over a slow link (a zcoll.tools.netns namespace; tests/bench/test_profiler_cases.py sets one up):
    mpirun -n 2 python -m mpi4py bench/profiler_cases.py --case link --follow compression,accumulation

Cases (DDP on zcoll, Adam, one thread per rank):
  link      a 4-layer MLP of --hidden units, batch 32, DDP's default buckets: over a slow link
            the transfer of its gradients dominates the step;
  compute   a 2-layer MLP, batch 16384: the step is matrix products, the gradients are small;
  overhead  24 layers of 32x32, batch 16, bucket_cap_mb=0.0001: one bucket per tensor (50),
            each costing its hook and its call while it carries a few KB.

Steps: 1. warm up, profile --steps steps, print the verdict and the suggestions; 2. for each
kind in --follow (bucket, compression, accumulation): take that suggestion, build a second model
with it (same initial weights and data) and run both in alternating blocks of --block steps, each
under its own profiler (--rounds rounds), so both see the same machine; the prediction is made
again from the first model's interleaved steps (Analysis.predict of the suggested setting; the
first steps after each switch are run unrecorded) and
compared with the second model's measured step time (the median; per micro-batch for
accumulation, whose steps alternate). --result FILE: the figures as JSON (for the tests).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

os.environ.setdefault("MPIR_CVAR_DEVICE_COLLECTIVES", "none")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import zcoll.torch  # noqa: E402
from mpi4py import MPI  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

CASES = {
    # name: (layer widths, batch per rank, bucket_cap_mb or None for DDP's default)
    "link": (None, 32, None),
    "compute": ([64, 256, 10], 16384, None),
    "overhead": ([64] + [32] * 24 + [10], 16, 0.0001),
}


def options(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=list(CASES), required=True)
    p.add_argument(
        "--hidden", type=int, default=512, help="hidden width of the link case's MLP (default 512)"
    )
    p.add_argument("--steps", type=int, default=30, help="steps profiled in the first run (default 30)")
    p.add_argument("--rounds", type=int, default=6, help="rounds of the interleaved runs (default 6)")
    p.add_argument("--block", type=int, default=6, help="steps per block in the interleaved runs (default 6)")
    p.add_argument("--warmup", type=int, default=3, help="steps run before profiling (default 3)")
    p.add_argument(
        "--follow",
        default="",
        help="comma-separated suggestion kinds to follow: bucket,compression,accumulation",
    )
    p.add_argument("--out", default=None, help="trace directory (default: a temporary one)")
    p.add_argument(
        "--result", default=None, help="write the verdict, suggestions and comparisons here (JSON)"
    )
    return p.parse_args(argv)


def widths(args):
    w, _, _ = CASES[args.case]
    return w if w is not None else [64, args.hidden, args.hidden, args.hidden, 10]


def make_net(ws, seed=0):
    torch.manual_seed(seed)
    layers = []
    for a, b in zip(ws, ws[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def batches(n, rows, seed=1):
    g = torch.Generator().manual_seed(seed + dist.get_rank())
    return [
        (torch.randn(rows, 64, generator=g), torch.randint(0, 10, (rows,), generator=g)) for _ in range(n)
    ]


class Trainer:
    """One DDP model with a setting, its optimizer and its data."""

    def __init__(self, args, cap_mb, method=None, accumulation=1):
        kwargs = {} if cap_mb is None else {"bucket_cap_mb": cap_mb}
        self.ddp = DDP(make_net(widths(args)), **kwargs)
        if method not in (None, "none"):
            zcoll.torch.apply_gradient_compression(self.ddp, zcoll.torch.tracer.compressor(method), plain=True)
        self.opt = torch.optim.Adam(self.ddp.parameters(), lr=1e-3)
        if accumulation > 1:
            self.opt = zcoll.torch.GradientAccumulator(self.opt, accumulation, model=self.ddp)
        self.data, self.i = batches(4, CASES[args.case][1]), 0

    def steps(self, n):
        for _ in range(n):
            x, y = self.data[self.i % len(self.data)]
            self.i += 1
            F.cross_entropy(self.ddp(x), y).backward()
            self.opt.step()
            self.opt.zero_grad()


def profile_alone(args, directory, trainer):
    trainer.steps(args.warmup)
    steps = args.steps + 3  # the analysis leaves out 3 (DDP rebuilds its buckets after the first)
    with zcoll.torch.profile(trainer.ddp, directory, steps=steps) as prof:
        trainer.steps(steps)
    return prof.analysis


def interleaved(args, root, kind, base, follow, accumulation):
    """Blocks of the base and the follow model in turn, each under its own profiler; the first
    steps after a switch are not recorded (caches, TCP's window after an idle link). Returns the
    base's trace directory and the follow's analysis."""
    block = max(args.block, 2 * accumulation)
    block += -block % accumulation  # whole updates
    settle = 2 * accumulation
    follow.steps(args.warmup * accumulation)
    a_dir, b_dir = os.path.join(root, kind + "-base"), os.path.join(root, kind)
    limit = args.rounds * block + 10
    with (
        zcoll.torch.profile(base.ddp, a_dir, steps=limit) as pa,
        zcoll.torch.profile(follow.ddp, b_dir, steps=limit) as pb,
    ):
        for _ in range(args.rounds):
            for trainer, mine, other in ((base, pa, pb), (follow, pb, pa)):
                with other.paused():
                    with mine.paused():
                        trainer.steps(settle)
                    trainer.steps(block)
    return a_dir, pb.analysis


def interleaved_base(a_dir, s):
    """The base model's step time in the interleaved blocks, and the suggested setting's step
    time predicted from those same steps."""
    from zcoll.observe import step_report, trace

    (a,) = step_report.analyze(trace.load(a_dir), warmup=1)
    predicted = a.predict(bucket_cap_mb=s["bucket_cap_mb"], method=s.get("method"), accumulation=s.get("steps"))
    return a.measured(), predicted


def say(msg):
    if dist.get_rank() == 0:
        sys.stdout.write(msg + "\n")  # one write: hydra marks every chunk with the rank
        sys.stdout.flush()


def follow_one(args, root, kind: str, a: dict, base, cap) -> dict:
    """Follows the profile's `kind` suggestion in blocks interleaved with the profiled setting;
    what it measured against what the model predicted (rank 0; {} on the others)."""
    s = next((s for s in a["suggestions"] if s["kind"] == kind), None)
    if s is None:
        say(f"  no {kind} suggestion to follow")
        return {"kind": kind, "suggestion": None}
    k = s.get("steps", 1)
    new_cap = s["bucket_cap_mb"] if s["bucket_cap_mb"] is not None else cap  # None: keep the caps
    follow = Trainer(args, new_cap, method=s.get("method"), accumulation=k)
    a_dir, b = interleaved(args, root, kind, base, follow, k)
    if "error" in b:
        raise RuntimeError(f"the {kind} run could not be analysed: {b['error']}")
    measured = b.get("micro_batch_s", b["step_s"]) if kind == "accumulation" else b["step_s"]
    if dist.get_rank() != 0:
        return {}
    base_s, predicted = interleaved_base(a_dir, s)
    err = measured / predicted - 1
    say(
        f"  followed {kind} ({s['text'][:80]}): measured {measured * 1e3:.2f} ms, predicted "
        f"{predicted * 1e3:.2f} ms from the interleaved base steps ({err:+.1%}), which took "
        f"{base_s * 1e3:.2f} ms ({base_s / measured:.2f}x); first prediction {s['predicted_s'] * 1e3:.2f} ms"
    )
    return {
        "kind": kind,
        "suggestion": s,
        "measured_s": measured,
        "predicted_s": predicted,
        "base_s": base_s,
        "error": err,
        "verdict": b["verdict"],
    }


def main(argv=None):
    args = options(argv)
    zcoll.torch.init_process_group()
    torch.set_num_threads(1)
    root = args.out or (tempfile.mkdtemp(prefix="zcoll-prof-") if dist.get_rank() == 0 else None)
    root = MPI.COMM_WORLD.bcast(root)
    cap = CASES[args.case][2]
    base = Trainer(args, cap)
    a = profile_alone(args, os.path.join(root, "base"), base)
    if "error" in a:
        raise RuntimeError(f"the run could not be analysed: {a['error']}")
    say(
        f"{args.case}: {a['verdict']} ({a['reason']}); step {a['step_s'] * 1e3:.2f} ms, model "
        f"{a['model_step_s'] * 1e3:.2f} ms"
    )
    for s in a["suggestions"]:
        say(f"  suggestion: {s['text'][:100]}: {s['predicted_s'] * 1e3:.2f} ms ({s['speedup']:.2f}x)")
    result = {
        "case": args.case,
        "verdict": a["verdict"],
        "step_s": a["step_s"],
        "model_step_s": a["model_step_s"],
        "suggestions": a["suggestions"],
        "follow": [],
    }
    for kind in [k for k in args.follow.split(",") if k]:
        followed = follow_one(args, root, kind, a, base, cap)
        if followed:
            result["follow"].append(followed)
    if args.result and dist.get_rank() == 0:
        with open(args.result, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
