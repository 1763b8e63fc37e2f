"""DDP training on scikit-learn's bundled digits (no download), gloo against zcoll configurations.

    mpirun -n 4 python examples/train_digits.py [--configs all] [--epochs 30] [--png digits_loss.png]

Each configuration trains the same MLP from the same initial weights on the same batches, then
the script prints one table row per configuration and saves the loss curves:

- ``gloo``          DDP on gloo (MASTER_ADDR/PORT: localhost, a free port from rank 0 via mpi4py)
- ``zcoll``         DDP on zcoll, uncompressed (its built-in allreduce path)
- ``int8``, ``int4``, ``sign``, ``top1%``: zcoll with a compression hook, error feedback on
                    (``zcoll.GradientQuantizer(bits=8|4|1)``, ``zcoll.TopK(0.01)``), the first
                    10% of the updates (at least 12) uncompressed, then momentum correction
                    (docs/compression.md)
- ``guarded-sign``, ``guarded-top1%``: the same method under ``zcoll.AutoCompression``'s guard
                    (sampled exact checks every --check-every updates, escalation to int4 and on
                    while error feedback owes more than --residual-bound gradients, back down
                    after calm checks); bytes leave out its one-time calibration
- ``accum4``        zcoll, ``zcoll.torch.optim.Adam(gradient_accumulation_steps=4, model=ddp)``:
                    4 micro-batches of a quarter of the batch per update, one allreduce per update
- ``accum4-every``  the same without ``model=``: the same updates, but every backward communicates

Columns: final test accuracy, updates, bytes sent per update and per backward (this rank's
``comm.stats()["bytes_sent"]``; n/a for gloo, which counts nothing), ms per update (training
only), the largest difference of the final parameters from gloo's (same seed, same data
order), and a digest of the final parameters. After every update the script checks that all
ranks hold bit-identical parameters.

Checkpoints and restarts (``zcoll run``, ``zcoll.torch.checkpoint``)::

    zcoll run -n 2 --max-restarts 2 --checkpoint-dir ckpt -- \
        python examples/train_digits.py --checkpoint-every 20 --kill-rank 1 --kill-at-step 50

Every ``--checkpoint-every`` updates each configuration saves a checkpoint in
``<dir>/<config>/`` (and one at its end); on start it resumes from the newest one. The
fault injection kills the given rank with SIGKILL after the given update, on the first launch
only (ZCOLL_RESTART=0), so ``zcoll run`` restarts the job and the run ends with the same final
parameters (same digest) as an uninterrupted one.
"""

import argparse
import hashlib
import os
import signal
import time
from pathlib import Path

STARTED = time.monotonic()  # before torch's import: the start-up time reported includes it
os.environ.setdefault("MPIR_CVAR_DEVICE_COLLECTIVES", "none")  # MPICH's own collectives spin otherwise
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import zcoll  # noqa: E402
import zcoll.torch  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

COMPRESSORS = {
    "int8": lambda: zcoll.GradientQuantizer(bits=8, error_feedback=True),
    "int4": lambda: zcoll.GradientQuantizer(bits=4, error_feedback=True),
    "sign": lambda: zcoll.GradientQuantizer(bits=1, error_feedback=True),
    "top1%": lambda: zcoll.TopK(ratio=0.01, error_feedback=True),
}
GUARDED = {"guarded-sign": "sign", "guarded-top1%": "top1%"}  # zcoll.AutoCompression, one method
CONFIGS = ["gloo", "zcoll", *COMPRESSORS, *GUARDED, "accum4", "accum4-every"]


def options():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--configs",
        default="all",
        help=f"comma-separated subset of {','.join(CONFIGS)} (default all)".replace("%", "%%"),
    )
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch", type=int, default=32, help="rows per rank per update (default 32)")
    p.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--png", default="digits_loss.png", help="where to save the loss curves")
    p.add_argument(
        "--checkpoint-dir",
        default=zcoll._C.env_get("ZCOLL_CHECKPOINT_DIR") or None,
        help="save and resume checkpoints here (default: ZCOLL_CHECKPOINT_DIR, set by `zcoll run`)",
    )
    p.add_argument("--checkpoint-every", type=int, default=20, help="updates between checkpoints")
    p.add_argument(
        "--residual-bound",
        type=float,
        default=zcoll.tune.RESIDUAL_BOUND,
        help="the guarded configurations' residual-to-gradient bound (default %(default)s; 0: off)",
    )
    p.add_argument("--check-every", type=int, default=10, help="updates between the guard's checks")
    p.add_argument(
        "--guard-log", default=None, help="directory for the guarded configurations' JSON-lines logs"
    )
    p.add_argument("--kill-rank", type=int, default=None, help="fault injection: the rank to kill")
    p.add_argument("--kill-at-step", type=int, default=0, help="fault injection: after this update")
    return p.parse_args()


def load_digits(seed):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x / 16.0, y, test_size=0.2, random_state=seed, stratify=y)
    as_t = lambda a, dt: torch.tensor(a, dtype=dt)  # noqa: E731
    return as_t(xtr, torch.float32), as_t(ytr, torch.long), as_t(xte, torch.float32), as_t(yte, torch.long)


def make_net(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )


def identical_everywhere(world, model):
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    digests = world.allgather(hashlib.sha1(flat.numpy().tobytes()).digest())
    if len(set(digests)) != 1:
        raise SystemExit(f"rank {world.rank}: parameters differ across ranks")


def kill_if_asked(args, rank, updates):
    """Fault injection: SIGKILL this rank after update --kill-at-step, on the first launch only."""
    if rank == args.kill_rank and updates == args.kill_at_step and zcoll._C.env_get("ZCOLL_RESTART") == 0:
        print(f"# rank {rank}: killed after update {updates} (--kill-rank, --kill-at-step)", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


class Progress:
    """Where a configuration's training stands, besides the model and optimizer: what a
    checkpoint saves as its data position (epoch, first row of the next batch) and extra."""

    def __init__(self, ranks):
        self.started_ranks = ranks  # the job's first world size, which fixes the warm-up's length
        self.epoch, self.row = 0, 0
        self.updates, self.backwards, self.losses = 0, 0, []
        self.epoch_loss, self.n, self.busy, self.sent = 0.0, 0.0, 0.0, 0  # this rank's (sent: before)

    def save(self, directory, world, sent, **state):
        mine = (self.epoch_loss, self.n, self.busy, sent)
        extra = {"updates": self.updates, "backwards": self.backwards, "losses": self.losses}
        extra["started_ranks"] = self.started_ranks
        extra["per_rank"] = world.allgather(mine)
        position = {"epoch": self.epoch, "row": self.row}  # in rows: right for any rank count
        zcoll.torch.checkpoint.save(directory, self.updates, data_position=position, extra=extra, **state)

    def load(self, directory, world, name, rebuild_buckets, **state):
        resumed = zcoll.torch.checkpoint.load(directory, rebuild_buckets=rebuild_buckets, **state)
        if resumed is None:
            return
        self.epoch, self.row = resumed.data_position["epoch"], resumed.data_position["row"]
        extra = resumed.extra
        self.updates, self.backwards, self.losses = extra["updates"], extra["backwards"], extra["losses"]
        self.started_ranks = extra.get("started_ranks", self.started_ranks)  # older checkpoints: now
        per_rank = extra["per_rank"]
        if resumed.resized:  # another rank's share: start from the mean of the saved ones
            per_rank = [tuple(sum(col) / len(per_rank) for col in zip(*per_rank))] * world.size
        self.epoch_loss, self.n, self.busy, self.sent = per_rank[world.rank]
        if world.rank == 0:
            where = f"update {resumed.step} (epoch {self.epoch}, row {self.row}"
            if resumed.resized:
                where += f", saved by {resumed.saved_world_size} ranks, now {world.size}"
            print(f"# {name}: resumed from {where})", flush=True)


def guarded(args, name):
    """The method under the guard: escalated (sign/top-k -> int4 -> int8 ...) when its sampled
    error, or its residual-to-gradient ratio, passes the bound; stepped back after calm checks."""
    log = os.path.join(args.guard_log, f"{name}.jsonl") if args.guard_log else None
    return zcoll.AutoCompression(
        methods=[GUARDED[name]],
        check_every=args.check_every,
        residual_bound=args.residual_bound or None,
        metrics_path=log,
    )


# Uncompressed updates at least: with momentum correction Adam's variance freezes at the end of
# the warm-up, and from 2-4 gradients it is noise. On 2 epochs (int8; 2 and 3 ranks, seeds 0-2)
# 2-4 updates let the largest weight run away (max |w| 2.7-7.2, gloo's 0.21) and a resumed run's
# accuracy swing 63.6-85.0% under 1e-7 perturbations of its checkpoint; 12 updates: max |w|
# 0.6-2.4, the same accuracy for every perturbation.
WARMUP_FLOOR = 12


def warmup_updates(args, rows, ranks):
    """The dense warm-up: a tenth of the updates of the job as it started with `ranks` ranks
    (a resize keeps it), at least WARMUP_FLOOR."""
    return max(WARMUP_FLOOR, args.epochs * (rows // (args.batch * ranks)) // 10)


def train(name, args, world, groups, data):
    xtr, ytr, xte, yte = data
    rank, size = world.rank, world.size
    group = groups["gloo" if name == "gloo" else "zcoll"]
    model = DDP(make_net(args.seed), process_group=group)
    micro = 4 if name.startswith("accum4") else 1
    opt = zcoll.torch.optim.Adam(
        model.parameters(),
        lr=args.lr,
        gradient_accumulation_steps=micro,
        model=model if name == "accum4" else None,
    )
    compression = None
    if (
        name in COMPRESSORS or name in GUARDED
    ):  # the first updates uncompressed (warmup_updates), then momentum correction
        compressor = COMPRESSORS[name]() if name in COMPRESSORS else guarded(args, name)
        warmup = warmup_updates(args, len(xtr), size)
        compression = zcoll.torch.apply_gradient_compression(model, compressor, warmup, optimizer=opt)
    ckpt = Path(args.checkpoint_dir, name) if args.checkpoint_dir else None
    state = {"model": model, "optimizer": opt, "compression_state": compression}
    run = Progress(size)
    if ckpt:  # any batch: DDP's first backward only decides its bucket layout (see checkpoint.load)
        first_backward = lambda: F.cross_entropy(model(xtr[:8]), ytr[:8]).backward()  # noqa: E731
        run.load(ckpt, world, name, first_backward, **state)
    if compression is not None:  # resized: the warm-up of the size the job started with
        compression.warmup_steps = warmup_updates(args, len(xtr), run.started_ranks)
    comm = group.communicator if name != "gloo" else None
    if comm:
        comm.reset_stats()
    global_batch = args.batch * size
    rows = args.batch // micro
    auto = compression.compressor if name in GUARDED else None  # a zcoll.AutoCompression
    # bytes the gradients took: less AutoCompression's one-time calibration (its uncompressed
    # allreduces of 256 B, 1 MiB and 4 MiB), which a longer run spreads over more updates
    calibration = lambda: auto.trials.calibration_bytes if auto is not None else 0  # noqa: E731
    sent = lambda: run.sent + (comm.stats()["bytes_sent"] - calibration() if comm else 0)  # noqa: E731
    for epoch in range(run.epoch, args.epochs):
        run.epoch = epoch
        order = torch.randperm(len(xtr), generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        for start_row in range(run.row, len(order) - global_batch + 1, global_batch):
            batch = order[start_row : start_row + global_batch]
            t0 = time.perf_counter()
            for k in range(micro):  # micro-batch k of this rank's share
                idx = batch[(k * size + rank) * rows : (k * size + rank + 1) * rows]
                loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
                loss.backward()
                opt.step()
                opt.zero_grad()
                run.epoch_loss, run.n = run.epoch_loss + loss.item() / micro, run.n + 1 / micro
                run.backwards += 1
            run.busy += time.perf_counter() - t0
            run.updates += 1
            run.row = start_row + global_batch
            identical_everywhere(world, model.module)
            kill_if_asked(args, rank, run.updates)
            if ckpt and run.updates % args.checkpoint_every == 0:
                run.save(ckpt, world, sent(), **state)
        run.losses.append(world.allreduce(run.epoch_loss / run.n) / size)
        run.row, run.epoch_loss, run.n = 0, 0.0, 0.0
    run.epoch = args.epochs
    if ckpt:
        run.save(ckpt, world, sent(), **state)  # the end: a later launch only reports
    with torch.no_grad():
        acc = (model.module(xte).argmax(1) == yte).float().mean().item()
    params = torch.cat([q.detach().reshape(-1) for q in model.module.parameters()])
    return {
        "name": name,
        "acc": acc,
        "updates": run.updates,
        "per_update": sent() / run.updates if comm else None,
        "per_backward": sent() / run.backwards if comm else None,
        "ms": world.allreduce(run.busy, op=_max()) / run.updates * 1e3,
        "losses": run.losses,
        "params": params,
        "digest": hashlib.sha1(params.numpy().tobytes()).hexdigest()[:12],
        "methods": dict(auto.calls_by_method) if auto is not None else None,
        "guard_ms": world.allreduce(auto.guard.seconds, op=_max()) / run.updates * 1e3
        if auto is not None
        else None,
        "guard_cpu_ms": (
            world.allreduce(auto.guard.cpu_seconds, op=_max()) / run.updates * 1e3
            if auto is not None
            else None
        ),
    }


def _max():
    from mpi4py import MPI

    return MPI.MAX


def fmt_bytes(b):
    return "n/a" if b is None else f"{b / 1024:.1f} KiB"


def plot(results, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, r in enumerate(results):  # identical curves overlap: vary the line style
        style = ("-", "--", ":", "-.")[i % 4]
        label = f"{r['name']} ({r['acc']:.1%})"
        ax.plot(range(1, len(r["losses"]) + 1), r["losses"], linestyle=style, marker=".", label=label)
    ax.set(xlabel="epoch", ylabel="training loss (mean over ranks)", yscale="log", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    args = options()
    torch.set_num_threads(1)
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    wanted = CONFIGS if args.configs == "all" else args.configs.split(",")
    unknown = sorted(set(wanted) - set(CONFIGS))
    if unknown:
        raise SystemExit(f"unknown configurations {unknown}; choose from {CONFIGS}")
    groups = zcoll.torch.init_gloo_beside_zcoll(world)  # gloo (the reference) and zcoll
    data = load_digits(args.seed)
    say = print if world.rank == 0 else (lambda *a, **k: None)
    say(
        f"# digits: {len(data[0])} train / {len(data[2])} test rows, {world.size} ranks, "
        f"{args.epochs} epochs, batch {args.batch}/rank, Adam lr {args.lr}, seed {args.seed}",
        flush=True,
    )
    ready = world.allreduce(time.monotonic() - STARTED, op=_max())
    say(f"# ready after {ready:.1f} s (imports, MPI, process groups, data)", flush=True)
    results = []
    for name in wanted:
        say(f"# training {name} ...", flush=True)
        results.append(train(name, args, world, groups, data))
    gloo = next((r["params"] for r in results if r["name"] == "gloo"), None)
    head = ("config", "test acc", "updates", "bytes/update", "bytes/backward", "ms/update", "max|w-w_gloo|")
    head += ("params sha1",)
    say("\n{:<13} {:>8} {:>7} {:>13} {:>15} {:>9} {:>14} {:>12}".format(*head))
    for r in results:
        dist_to_gloo = "n/a" if gloo is None else f"{(r['params'] - gloo).abs().max().item():.2e}"
        say(
            f"{r['name']:<13} {r['acc']:>8.2%} {r['updates']:>7} {fmt_bytes(r['per_update']):>13} "
            f"{fmt_bytes(r['per_backward']):>15} {r['ms']:>9.2f} {dist_to_gloo:>14} {r['digest']:>12}"
        )
    for r in results:
        if r["methods"]:  # the guard: how many bucket calls each method carried (after the warm-up)
            calls = ", ".join(f"{m} {n}" for m, n in sorted(r["methods"].items(), key=lambda kv: -kv[1]))
            say(
                f"{r['name']}: bucket calls by method: {calls}; the guard's own time {r['guard_ms']:.3f} ms "
                f"per update ({r['guard_ms'] / r['ms']:.1%} of it), its CPU time {r['guard_cpu_ms']:.3f} ms "
                f"({r['guard_cpu_ms'] / r['ms']:.1%}); bytes exclude the one-time calibration"
            )
    if world.rank == 0 and results:
        plot(results, args.png, f"digits, DDP on {world.size} ranks")
        say(f"\nloss curves: {args.png}; every rank held identical parameters after every update")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
