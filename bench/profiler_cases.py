#!/usr/bin/env python3
"""The step profiler on three constructed cases, and its suggestions followed.

    mpirun -n 2 python -m mpi4py bench/profiler_cases.py --case link --follow compression,accumulation
    mpirun -n 2 python -m mpi4py bench/profiler_cases.py --case overhead --follow bucket

Cases (DDP on zcoll, Adam, one thread per rank):
  link      a 4-layer MLP of --hidden units, batch 32, DDP's default buckets: run it over a slow
            link (bench/emulated_network.py's namespace; tests/test_profiler.py does) and the
            gradients' transfer dominates the step;
  compute   a 2-layer MLP, batch 8192: the step is matrix products, the gradients are small;
  overhead  24 layers of 32x32, batch 16, bucket_cap_mb=0.0001: one bucket per tensor (48),
            each costing its hook and its call while it carries a few KB.

Steps: 1. warm up, profile --steps steps (zcoll.torch.profile), print the verdict and the
suggestions; 2. for each kind in --follow (bucket, compression, accumulation), take the best
suggestion of that kind, rebuild the model with it (same initial weights and data), profile
again, and compare the measured step time (the median; the mean for accumulation, whose steps
alternate) with the prediction. One JSON line per case at the end (RESULT {...}) for the tests.
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
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

CASES = {
    # name: (layer widths, batch per rank, bucket_cap_mb or None for DDP's default)
    "link": (None, 32, None),
    "compute": ([64, 256, 10], 8192, None),
    "overhead": ([64] + [32] * 24 + [10], 16, 0.0001),
}


def options(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=list(CASES), required=True)
    p.add_argument("--hidden", type=int, default=512, help="hidden width of the link case's MLP (default 512)")
    p.add_argument("--steps", type=int, default=30, help="steps profiled per run (default 30)")
    p.add_argument("--warmup", type=int, default=3, help="steps run before profiling (default 3)")
    p.add_argument("--follow", default="", help="comma-separated suggestion kinds to follow: bucket,compression,accumulation")
    p.add_argument("--out", default=None, help="trace directory (default: a temporary one)")
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
    return [(torch.randn(rows, 64, generator=g), torch.randint(0, 10, (rows,), generator=g)) for _ in range(n)]


def run(args, directory, cap_mb, method=None, accumulation=1):
    """Trains a fresh model with the setting under the profiler; returns its analysis."""
    ws, batch = widths(args), CASES[args.case][1]
    kwargs = {} if cap_mb is None else {"bucket_cap_mb": cap_mb}
    ddp = DDP(make_net(ws), **kwargs)
    if method not in (None, "none"):
        zcoll.torch.apply_gradient_compression(ddp, zcoll.torch.profiler.compressor(method))
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    if accumulation > 1:
        opt = zcoll.torch.GradientAccumulator(opt, accumulation, model=ddp)
    data = batches(4, batch)

    def step(i):
        x, y = data[i % len(data)]
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
        opt.zero_grad()

    for i in range(args.warmup):
        step(i)
    steps = args.steps + 3  # the profiler's own warm-up (DDP rebuilds its buckets after step 0)
    if accumulation > 1:  # enough updates for a median of the communicating steps
        steps = max(steps, 3 + 8 * accumulation)
    with zcoll.torch.profile(ddp, directory, steps=steps) as prof:
        for i in range(steps):
            step(i)
    return prof.analysis


def say(msg):
    if dist.get_rank() == 0:
        print(msg, flush=True)


def main(argv=None):
    args = options(argv)
    zcoll.torch.init_process_group()
    torch.set_num_threads(1)
    root = args.out or tempfile.mkdtemp(prefix="zcoll-prof-")
    cap = CASES[args.case][2]
    a = run(args, os.path.join(root, "base"), cap)
    say(f"{args.case}: {a['verdict']} ({a['reason']}); step {a['step_s'] * 1e3:.2f} ms, model "
        f"{a['model_step_s'] * 1e3:.2f} ms")
    for s in a["suggestions"]:
        say(f"  suggestion: {s['text'][:100]}: {s['predicted_s'] * 1e3:.2f} ms ({s['speedup']:.2f}x)")
    result = {"case": args.case, "verdict": a["verdict"], "step_s": a["step_s"], "model_step_s": a["model_step_s"],
              "suggestions": a["suggestions"], "follow": []}
    for kind in [k for k in args.follow.split(",") if k]:
        s = next((s for s in a["suggestions"] if s["kind"] == kind), None)
        if s is None:
            say(f"  no {kind} suggestion to follow")
            result["follow"].append({"kind": kind, "suggestion": None})
            continue
        new_cap = s["bucket_cap_mb"] if s["bucket_cap_mb"] is not None else cap  # None: keep the caps
        b = run(args, os.path.join(root, kind), new_cap, method=s.get("method"), accumulation=s.get("steps", 1))
        if "error" in b:
            raise RuntimeError(f"the {kind} run could not be analysed: {b['error']}")
        measured = b.get("micro_batch_s", b["step_s"]) if kind == "accumulation" else b["step_s"]
        err = measured / s["predicted_s"] - 1
        say(f"  followed {kind} ({s['text'][:80]}): measured {measured * 1e3:.2f} ms, predicted "
            f"{s['predicted_s'] * 1e3:.2f} ms ({err:+.1%})")
        result["follow"].append({"kind": kind, "suggestion": s, "measured_s": measured, "error": err,
                                 "verdict": b["verdict"]})
    say("RESULT " + json.dumps(result))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
