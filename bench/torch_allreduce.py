"""dist.all_reduce through the zcoll backend against gloo, both in one run.

    mpirun -n 2 python bench/torch_allreduce.py [-b 4K] [-e 64M] [-f 4] [-n 20] [-w 3]

The default group is gloo (MASTER_ADDR/PORT: localhost, a free port chosen by rank 0 and shared
through mpi4py); zcoll is a second group over the same ranks. For each size the backends take
turns in blocks (``--rounds`` blocks each; the machine is shared and noisy, so taking turns keeps
drift out of the ratio). A block starts with one untimed call: right after a gloo call, gloo's
threads are still busy for about 0.1 ms and would be charged to the next backend. Per call:

1. Every rank enters an MPI barrier, then times one in-place ``dist.all_reduce`` (SUM) on a
   buffer of zeros (values stay zero, so no inf/denormal slows anything down).
2. An iteration's time is the slowest rank's; the row shows the median over iterations.
3. One more call on values f(rank, i) is checked against the exact sum (#wrong: elements off).

Columns as nccl-tests: size, count, time (us), algbw and busbw (GB/s, busbw = algbw x 2(p-1)/p),
per backend, then ratio = gloo time / zcoll time. Progress goes to stderr. ``torch`` runs with one
intra-op thread (``--threads``): the ranks already fill the cores.
"""

import argparse
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def human(nbytes: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def options() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-b", "--min-bytes", default="4K", help="smallest buffer per rank (default 4K)")
    p.add_argument("-e", "--max-bytes", default="64M", help="largest buffer per rank (default 64M)")
    p.add_argument("-f", "--factor", type=int, default=4, help="size multiplier between rows (default 4)")
    p.add_argument("-n", "--iters", type=int, default=50, help="timed iterations per backend and size")
    p.add_argument("-w", "--warmup", type=int, default=3, help="untimed iterations first")
    p.add_argument("-r", "--rounds", type=int, default=5, help="blocks per backend and size (default 5)")
    p.add_argument(
        "--budget-mb",
        type=float,
        default=2048,
        help="cap on MB reduced per backend and size: fewer iterations for big sizes (min 5, default 2048)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--backends", default="zcoll,gloo", help="which to time (default zcoll,gloo)")
    return p.parse_args()


def setup():
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if world.size < 2:
        sys.exit("run under mpirun with at least 2 ranks: mpirun -n 2 python bench/torch_allreduce.py")
    import zcoll.torch  # registers the backend

    return world, zcoll.torch.init_gloo_beside_zcoll(world)


def timed(world, group, buf) -> float:
    world.Barrier()
    t0 = time.perf_counter()
    dist.all_reduce(buf, group=group)
    return time.perf_counter() - t0


def wrong_elements(group, count: int, rank: int, size: int) -> int:
    x = (torch.arange(count, dtype=torch.float32) % 1000) * (rank + 1)
    dist.all_reduce(x, group=group)
    want = (torch.arange(count, dtype=torch.float32) % 1000) * (size * (size + 1) / 2)
    return int((x != want).sum())


def main() -> None:
    args = options()
    torch.set_num_threads(args.threads)
    world, groups = setup()
    groups = {name: groups[name] for name in args.backends.split(",")}
    from mpi4py import MPI

    rank, p = world.rank, world.size
    factor = 2 * (p - 1) / p
    sizes, s = [], parse_size(args.min_bytes)
    while s <= parse_size(args.max_bytes):
        sizes.append(s)
        s *= args.factor
    if rank == 0:
        vs = " vs ".join(groups)
        print(f"# dist.all_reduce float32 sum, {p} ranks, {vs}, median of up to {args.iters} iterations")
        head = f"{'size':>6} {'count':>9} |"
        for name in groups:
            head += f" {name + ' us':>10} {'algbw':>6} {'busbw':>6} {'#wrong':>6} |"
        print(head + (f" {'ratio':>6}" if len(groups) == 2 else ""), flush=True)
    ratios = []
    for nbytes in sizes:
        count = nbytes // 4
        buf = torch.zeros(count)
        iters = max(args.rounds, min(args.iters, int(args.budget_mb * 2**20 / nbytes)))
        if rank == 0:
            print(
                f"# {human(nbytes)}: {args.warmup} + {iters} iterations per backend ...",
                file=sys.stderr,
                flush=True,
            )
        times = {name: [] for name in groups}
        for name, g in groups.items():
            for _ in range(args.warmup):
                timed(world, g, buf)
        for r in range(args.rounds):
            for name, g in groups.items():
                timed(world, g, buf)  # untimed: settles after the other backend
                block = iters // args.rounds + (r < iters % args.rounds)
                times[name] += [timed(world, g, buf) for _ in range(block)]
        row = f"{human(nbytes):>6} {count:>9} |"
        med = {}
        for name, g in groups.items():
            worst = np.array(times[name])
            world.Allreduce(MPI.IN_PLACE, worst, op=MPI.MAX)  # an iteration lasts as long as its slowest rank
            med[name] = statistics.median(worst.tolist())
            wrong = world.allreduce(wrong_elements(g, count, rank, p))
            algbw = nbytes / med[name] / 1e9
            row += f" {med[name] * 1e6:10.1f} {algbw:6.2f} {algbw * factor:6.2f} {wrong:6d} |"
        if len(med) == 2:
            ratios.append(med["gloo"] / med["zcoll"])
            row += f" {ratios[-1]:6.2f}x"
        if rank == 0:
            print(row, flush=True)
    if rank == 0 and ratios:
        print(f"# zcoll / gloo speed-up: min {min(ratios):.2f}x, max {max(ratios):.2f}x", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
