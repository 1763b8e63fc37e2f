"""Accuracy of compressed DDP training on scikit-learn's digits: every method against gloo.

    python bench/accuracy.py [--ranks 2,4] [--seeds 0,1,2] [--epochs 15] [--models small,large]
                             [--methods gloo,zcoll,int8,int4,sign,top1%] [--optim adam] [--lr 1e-3]
                             [--csv results.csv]

Run without mpirun, it starts one ``mpirun -n N`` job per rank count (shared memory, the venv's
MPICH) and prints one table over all of them; run under ``mpirun -n N python -m mpi4py
bench/accuracy.py ...`` it trains that one rank count. Every (model, seed, method) trains from
the same initial weights on the same batches as gloo (the seed picks the weights, the
train/test split and the batch order), ``--batch`` rows per rank per step, for ``--epochs``.
After every step all ranks compare a digest of their parameters: a difference stops the job.

Models: ``small``, the MLP of examples/train_digits.py (64-128-64-10, 17K parameters, one DDP
bucket), and ``large``, 64-1024-1024-1024-10 (2.2M parameters; DDP rebuilds its single first-step
bucket into two after step 1). Data: bench/ddp_workload.py's digits split (the example's).

Methods (``--methods``): ``gloo`` (the reference), ``zcoll`` (uncompressed), and ``int8``,
``int4``, ``sign`` (``GradientQuantizer(bits=8|4|1)``) and ``top1%`` (``TopK(0.01)``) through
``zcoll.torch.apply_gradient_compression(model, compressor, warmup_steps=W, optimizer=opt)``:
``--warmup`` of the steps uncompressed, then momentum correction (zcoll.torch.momentum). A suffix
names the steps before that, for measuring each one's effect:

- ``-plain`` (``top1%-plain``): error feedback on the gradients alone (no warm-up, no optimizer);
- ``-warm``: the same after the warm-up;

and ``dense`` runs the momentum-corrected optimizer without compression (every bucket below
``dense_below``): what the optimizer change alone does.

Output: one line per finished run (progress), then the table: per (ranks, model, method) the
test accuracy per seed, their mean, and the mean's difference to gloo's mean in points.
``--csv`` writes every run as a row (ranks, model, method, seed, accuracy, final loss, seconds).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("MPIR_CVAR_DEVICE_COLLECTIVES", "none")  # MPICH's own collectives spin otherwise

RESULT_TAG = "ACCURACY-RESULT "
MODELS = ("small", "large")
BASE_METHODS = ("gloo", "zcoll", "int8", "int4", "sign", "top1%", "dense")
VARIANTS = ("", "plain", "warm")


def compressor(method: str):
    """The zcoll compressor behind a method name."""
    import zcoll

    return {
        "int8": lambda: zcoll.GradientQuantizer(bits=8),
        "int4": lambda: zcoll.GradientQuantizer(bits=4),
        "sign": lambda: zcoll.GradientQuantizer(bits=1),
        "top1%": lambda: zcoll.TopK(ratio=0.01),
        "dense": lambda: zcoll.GradientQuantizer(bits=8),  # never used: every bucket is below dense_below
    }[method]()


def split_method(name: str) -> tuple:
    base, _, variant = name.partition("-")
    if (
        base not in BASE_METHODS
        or variant not in VARIANTS
        or (variant and base in ("gloo", "zcoll", "dense"))
    ):
        raise SystemExit(
            f"unknown method {name!r}: choose from {', '.join(BASE_METHODS)} (compressed ones: -plain, -warm)"
        )
    return base, variant


def options() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="2,4", help="rank counts, one mpirun job each (default 2,4)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--models", default="small,large", help=f"comma-separated subset of {','.join(MODELS)}")
    p.add_argument(
        "--methods",
        default=",".join(BASE_METHODS),
        help="comma-separated methods, gloo first (default %(default)s)".replace("%", "%%").replace(
            "%%(", "%("
        ),
    )
    p.add_argument("--batch", type=int, default=32, help="rows per rank per step (default 32)")
    p.add_argument(
        "--warmup",
        type=float,
        default=0.1,
        help="fraction of the steps sent uncompressed first (default 0.1)",
    )
    p.add_argument("--optim", choices=("adam", "sgd"), default="adam", help="Adam, or SGD with momentum 0.9")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default 1e-3 Adam, 0.05 SGD)")
    p.add_argument(
        "--variance-floor",
        type=float,
        default=None,
        help="CompressionState's variance_floor (default: its own)",
    )
    p.add_argument(
        "--mask", choices=("auto", "on", "off"), default="auto", help="CompressionState's mask_momentum"
    )
    p.add_argument("--csv", default=None, help="write every run as a CSV row here")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per mpirun job (default 3600)")
    args = p.parse_args()
    if args.lr is None:
        args.lr = 1e-3 if args.optim == "adam" else 0.05
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.models = args.models.split(",")
    args.methods = args.methods.split(",")
    for m in args.models:
        if m not in MODELS:
            raise SystemExit(f"unknown model {m!r}: choose from {MODELS}")
    for m in args.methods:
        split_method(m)
    return args


# -- one rank count, under mpirun ---------------------------------------------------------------


def make_model(name: str, seed: int):
    import torch

    torch.manual_seed(seed)
    if name == "small":  # examples/train_digits.py's make_net
        return torch.nn.Sequential(
            torch.nn.Linear(64, 128),
            torch.nn.ReLU(),
            torch.nn.Linear(128, 64),
            torch.nn.ReLU(),
            torch.nn.Linear(64, 10),
        )
    layers, width = [], 64
    for out in (1024, 1024, 1024):
        layers += [torch.nn.Linear(width, out), torch.nn.ReLU()]
        width = out
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))


def train_one(args, world, groups, model_name: str, method: str, seed: int, data) -> dict:
    import torch
    import torch.nn.functional as F
    import zcoll.torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    xtr, ytr, xte, yte = data
    rank, size = world.rank, world.size
    base, variant = split_method(method)
    model = DDP(make_model(model_name, seed), process_group=groups["gloo" if base == "gloo" else "zcoll"])
    if args.optim == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    global_batch = args.batch * size
    steps = args.epochs * (len(xtr) // global_batch)
    if base not in ("gloo", "zcoll"):
        warmup = 0 if variant == "plain" else max(1, round(args.warmup * steps))
        extra = {"dense_below": 1 << 62} if base == "dense" else {}
        if not variant:
            extra.update(
                variance_floor=args.variance_floor, mask_momentum={"on": True, "off": False}.get(args.mask)
            )
        zcoll.torch.apply_gradient_compression(
            model, compressor(base), warmup, optimizer=None if variant else opt, plain=bool(variant), **extra
        )
    t0, loss = time.perf_counter(), None
    for epoch in range(args.epochs):
        order = torch.randperm(len(xtr), generator=torch.Generator().manual_seed(seed * 1000 + epoch))
        for start in range(0, len(order) - global_batch + 1, global_batch):
            idx = order[start + rank * args.batch : start + (rank + 1) * args.batch]
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            check_identical(world, model.module, f"{model_name} {method} seed {seed} epoch {epoch}")
    with torch.no_grad():
        acc = (model.module(xte).argmax(1) == yte).float().mean().item()
        final_loss = F.cross_entropy(model.module(xtr), ytr).item()
    return {
        "ranks": size,
        "model": model_name,
        "method": method,
        "seed": seed,
        "acc": acc,
        "train_loss": final_loss,
        "seconds": round(time.perf_counter() - t0, 2),
    }


def check_identical(world, module, where: str) -> None:
    import torch

    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    digests = world.allgather(hashlib.sha1(flat.numpy().tobytes()).digest())
    if len(set(digests)) != 1:
        raise SystemExit(f"rank {world.rank}: parameters differ across ranks after a step ({where})")


def worker(args) -> None:
    import torch
    import zcoll.torch
    from ddp_workload import load_digits
    from mpi4py import MPI

    torch.set_num_threads(1)
    world = MPI.COMM_WORLD
    groups = zcoll.torch.init_gloo_beside_zcoll(world)
    for model_name in args.models:
        for seed in args.seeds:
            d = load_digits(seed)
            data = (d.x_train, d.y_train, d.x_test, d.y_test)
            for method in args.methods:
                r = train_one(args, world, groups, model_name, method, seed, data)
                if world.rank == 0:
                    print(RESULT_TAG + json.dumps(r), flush=True)


# -- the launcher and the table -----------------------------------------------------------------


def launch(args, ranks: int) -> list:
    """One mpirun job of `ranks` ranks; its result lines, progress echoed as they come."""
    bin_dir = Path(sys.executable).parent
    argv = [a for a in sys.argv[1:]]
    cmd = [
        str(bin_dir / "mpirun"),
        "-n",
        str(ranks),
        sys.executable,
        "-m",
        "mpi4py",
        __file__,
        *argv,
        "--worker",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", MPIR_CVAR_DEVICE_COLLECTIVES="none")
    results = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as job:
        deadline = time.monotonic() + args.timeout
        for line in job.stdout:
            if line.startswith(RESULT_TAG):
                r = json.loads(line[len(RESULT_TAG) :])
                results.append(r)
                print(
                    f"[{time.strftime('%H:%M:%S')}] {ranks} ranks {r['model']:<5} seed {r['seed']} "
                    f"{r['method']:<12} acc {r['acc']:.2%} loss {r['train_loss']:.4f} ({r['seconds']:.0f} s)",
                    flush=True,
                )
            else:
                print(line, end="", flush=True)
            if time.monotonic() > deadline:
                job.kill()
                raise SystemExit(f"accuracy.py: the {ranks}-rank job ran past --timeout {args.timeout} s")
        if job.wait() != 0:
            raise SystemExit(f"accuracy.py: the {ranks}-rank job failed (exit status {job.returncode})")
    return results


def table(results: list, seeds: list) -> str:
    rows = {}
    for r in results:
        rows.setdefault((r["ranks"], r["model"], r["method"]), {})[r["seed"]] = r["acc"]
    lines = [
        f"{'ranks':>5} {'model':<6} {'method':<12} "
        + " ".join(f"{'seed ' + str(s):>7}" for s in seeds)
        + f" {'mean':>7} {'vs gloo':>8}"
    ]
    for (ranks, model, method), accs in rows.items():
        mean = sum(accs.values()) / len(accs)
        gloo = rows.get((ranks, model, "gloo"))
        diff = (
            f"{100 * (mean - sum(gloo.values()) / len(gloo)):+8.2f}"
            if gloo and method != "gloo"
            else f"{'':>8}"
        )
        per_seed = " ".join(f"{100 * accs[s]:7.2f}" if s in accs else f"{'-':>7}" for s in seeds)
        lines.append(f"{ranks:>5} {model:<6} {method:<12} {per_seed} {100 * mean:7.2f} {diff}")
    return "\n".join(lines)


def main() -> None:
    if "--worker" in sys.argv:
        sys.argv.remove("--worker")
        worker(options())
        return
    args = options()
    print(
        f"# digits, {args.epochs} epochs, {args.batch} rows/rank/step, {args.optim} lr {args.lr}, "
        f"warm-up {args.warmup:.0%} of the steps, seeds {args.seeds}, models {args.models}",
        flush=True,
    )
    results = []
    for ranks in [int(n) for n in args.ranks.split(",")]:
        results += launch(args, ranks)
    print("\n# test accuracy (%) per seed, mean over seeds, mean minus gloo's mean (points)")
    print(table(results, args.seeds))
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(results[0]))
            w.writeheader()
            w.writerows(results)


if __name__ == "__main__":
    main()
