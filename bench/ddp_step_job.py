"""One job of bench/ddp_step.py: every configuration of one model, trained side by side on one set of
ranks, timed in turns (``--phase timing``) or trained to a final accuracy (``--phase accuracy``).

    mpirun -n P python -m mpi4py bench/ddp_step_job.py --model mlp --result r.json [options]

bench/ddp_step.py starts this (on shared memory or inside the emulated network) and reads the
JSON that rank 0 writes. Timing, in order:

1. Groups: gloo as the default group beside a zcoll group on the same ranks
   (``zcoll.torch.init_gloo_beside_zcoll``). Buckets: ``default`` (DDP's bucket_cap_mb=25), a
   number of MB, or ``suggested`` (per configuration, :func:`suggest_bucket_mb`).
2. Entries: one *step* entry per (configuration, bucket setting), each its own model from the same
   initial weights, its own optimizer (Adam) and the same data order; ``compute`` is the model
   without DDP (each rank alone: no communication). After the warm-up, one *comm* entry per DDP
   entry: the same gradients, cut into that model's own DDP buckets, through the configuration's
   collective alone, bucket after bucket (:func:`comm_only`).
3. Warm-up: ``--warmup`` untimed steps per entry, comm entries included (covers DDP's bucket
   rebuild after step 1, the PowerSGD hook's first compressed step, the compressors' first calls);
   with PowerSGD or compression="auto" among the configurations, every model warms up as long
   as they need (auto: its trial steps), so that every model has trained as many steps.
4. ``--rounds`` rounds; each visits every entry once, in a seeded order that changes per round and
   is the same on every rank, for one untimed settling step (``--settle``) and then its share of
   ``--steps`` timed steps. A timed step: MPI barrier, then forward, backward (DDP communicates),
   optimizer step. Its time is the slowest rank's; the entry's result is the median over steps.
5. Bytes per step: what zcoll's communicator counted this rank sending during the timed steps.

Accuracy: every (configuration, bucket setting) trains ``--accuracy-epochs`` epochs from the same
initial weights and data order, then the test accuracy and whether every rank holds the same
parameters bits.

A configuration that crashes or hangs takes the job down: each rank writes the entry it is in to
``--progress DIR/rank<r>`` (once per block) and a watchdog (faulthandler) ends a process whose step
makes no progress (``--hang-after``, or 20x the slowest step so far, at least 10 s), so the caller
can name the configuration, drop it, and run the job again.
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist

import ddp_workload as wl

HANG_FLOOR_S = 10.0  # the watchdog never fires earlier than this
HANG_FACTOR = 20.0  # ... nor before 20x the slowest step seen so far


def options(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phase", choices=("timing", "accuracy"), default="timing")
    p.add_argument("--model", choices=wl.MODELS, default="mlp")
    p.add_argument("--configs", default=",".join(wl.CONFIGS), help="comma-separated configurations")
    p.add_argument("--buckets", default="default", help="comma-separated: default, suggested or MB")
    p.add_argument(
        "--suggested-fallback-mb",
        type=float,
        default=1.0,
        help="the cap 'suggested' uses while no profiler suggests one (default 1)",
    )
    p.add_argument("--steps", type=int, default=20, help="timed steps per entry (default 20)")
    p.add_argument("--rounds", type=int, default=4, help="rounds the timed steps are split into (default 4)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per entry first (default 3)")
    p.add_argument(
        "--settle", type=int, default=1, help="untimed steps at the start of each block (default 1)"
    )
    p.add_argument(
        "--accuracy-epochs", type=int, default=15, help="epochs of the accuracy phase (default 15)"
    )
    p.add_argument("--batch", type=int, default=32, help="rows per rank per step (default 32)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 1e-3)")
    p.add_argument("--optimizer", choices=wl.OPTIMIZERS, default="adam", help="(default adam)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--hang-after",
        type=float,
        default=120.0,
        help="seconds a step may take before the watchdog ends the job (default 120)",
    )
    p.add_argument("--result", type=Path, required=True, help="JSON written by rank 0")
    p.add_argument("--progress", type=Path, help="directory for the per-rank progress files")
    p.add_argument("--metrics-dir", help="where the compression='auto' configurations write their logs")
    a = p.parse_args(argv)
    wl.AUTO_METRICS_DIR = a.metrics_dir
    a.configs = [c for c in a.configs.split(",") if c]
    unknown = [c for c in a.configs if c not in wl.CONFIGS]
    if unknown:
        p.error(f"unknown configurations {unknown}; choose from {', '.join(wl.CONFIGS)}")
    try:
        a.buckets = wl.parse_buckets(a.buckets)
    except ValueError as e:
        p.error(f"--buckets: {e}")
    if a.steps < 1 or a.rounds < 1 or a.rounds > a.steps:
        p.error(f"need 1 <= --rounds ({a.rounds}) <= --steps ({a.steps})")
    if a.warmup < 2:
        p.error(f"--warmup must be >= 2 (DDP rebuilds its buckets in the second step), got {a.warmup}")
    return a


# -- the run's shared state -----------------------------------------------------------------------
class Job:
    def __init__(self, args: argparse.Namespace):
        import zcoll.torch
        from mpi4py import MPI

        torch.set_num_threads(1)  # the ranks already fill the cores
        self.args = args
        self.MPI = MPI
        self.world = MPI.COMM_WORLD
        self.rank, self.size = self.world.rank, self.world.size
        self.groups = zcoll.torch.init_gloo_beside_zcoll(self.world)
        self.zcomm = self.groups["zcoll"].communicator
        self.data = wl.load_digits(args.seed)
        model = wl.make_model(args.model, args.seed)
        self.model_info = dict(
            parameters=sum(p.numel() for p in model.parameters()), gradient_bytes=wl.gradient_bytes(model)
        )
        self.slowest = 0.0  # slowest step so far, for the watchdog
        self.notes: Dict[str, str] = {}  # configuration -> what its bucket settings came from
        self._progress = args.progress / f"rank{self.rank}" if args.progress else None

    def say(self, msg: str) -> None:
        if self.rank == 0:
            print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def at(self, phase: str, what: str) -> None:
        """Records where this rank is, for the caller to read after a crash or a hang."""
        if self._progress is not None:
            self._progress.write_text(f"{phase} {what}\n")

    def arm(self) -> None:
        limit = self.args.hang_after
        if self.slowest > 0:
            limit = min(limit, max(HANG_FLOOR_S, HANG_FACTOR * self.slowest))
        faulthandler.dump_traceback_later(limit, exit=True)

    def disarm(self, seconds: float) -> None:
        faulthandler.cancel_dump_traceback_later()
        self.slowest = max(self.slowest, seconds)

    def write(self, result: Dict[str, Any]) -> None:
        """Rank 0 writes `result` and the run's description to --result (atomically)."""
        if self.rank != 0:
            return
        a = self.args
        result = dict(
            result,
            phase=a.phase,
            model=a.model,
            ranks=self.size,
            torch=torch.__version__,
            batch=a.batch,
            lr=a.lr,
            optimizer=a.optimizer,
            seed=a.seed,
            notes=self.notes,
            **self.model_info,
        )
        tmp = a.result.with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        tmp.replace(a.result)

    def slowest_rank(self, times: List[float]) -> List[float]:
        """Per step, the slowest rank's time (every rank timed the same steps)."""
        arr = np.array(times, dtype=np.float64)
        self.world.Allreduce(self.MPI.IN_PLACE, arr, op=self.MPI.MAX)
        return arr.tolist()


# -- bucket settings ------------------------------------------------------------------------------
DDP_DEFAULT_MB = 25.0  # DDP's bucket_cap_mb
PROFILE_STEPS, PROFILE_WARMUP = 8, 3  # the profiled run behind a suggestion


def suggest_bucket_mb(job: Job, config: wl.Config) -> Tuple[Optional[float], str]:
    """The bucket cap (MB) zcoll's step profiler suggests for `config` on this model, from a short
    profiled run at DDP's default buckets (``zcoll.torch.profile``; its analysis names the cap
    with the fastest predicted step, or none when the current one is best: then DDP's default),
    and where it came from. (None, why) when this build has no profiler or it gave no suggestion."""
    import zcoll.torch

    if not hasattr(zcoll.torch, "profile"):
        return None, "no profiler in this build (zcoll.torch.profile)"
    # torch's own hooks are timed by the profiler when registered through its timed_hook
    timed_hook = getattr(getattr(zcoll.torch, "profiler", None), "timed_hook", lambda hook: hook)
    probe = StepEntry(job, config, "default", None, "", hook_wrapper=timed_hook)
    with tempfile.TemporaryDirectory(prefix="ddp_step_profile.") as tmp:
        with zcoll.torch.profile(
            probe.model, tmp, optimizer=probe.opt, steps=PROFILE_STEPS, warmup=PROFILE_WARMUP
        ) as prof:
            for _ in range(PROFILE_STEPS):
                probe.timed(record=False)
    analysis = prof.analysis or {}
    if "error" in analysis:
        return None, f"the profiler gave no suggestion ({analysis['error']})"
    mb = analysis.get("suggested_bucket_cap_mb")
    verdict = analysis.get("verdict", "?")
    if mb is None:
        return DDP_DEFAULT_MB, f"profiler ({verdict}): DDP's default buckets are best"
    return float(mb), f"profiler ({verdict}): bucket_cap_mb={mb:g}"


def bucket_settings(job: Job, config: wl.Config) -> List[Tuple[str, Optional[float], str]]:
    """[(label, cap in MB or None for DDP's default, note)] of a DDP configuration. A suggestion
    equal to DDP's default is not run twice when ``default`` is measured; the note says so
    (``job.notes``)."""
    out: List[Tuple[str, Optional[float], str]] = []
    wanted = job.args.buckets
    for b in wanted:
        if b == "default":
            out.append(("default", None, ""))
        elif b == "suggested":
            job.at("suggest", config.name)
            mb, why = suggest_bucket_mb(job, config)
            if mb is None:
                out.append(("suggested", job.args.suggested_fallback_mb, f"fallback: {why}"))
            elif mb == DDP_DEFAULT_MB and "default" in wanted:
                job.notes[config.name] = f"suggested = DDP's default; {why}"
            else:
                out.append(("suggested", mb, why))
        else:
            out.append((f"{float(b):g}MB", float(b), ""))
    return out


# -- entries --------------------------------------------------------------------------------------
class StepEntry:
    """A model trained by one configuration at one bucket setting."""

    kind = "step"

    def __init__(
        self,
        job: Job,
        config: wl.Config,
        label: str,
        bucket_mb: Optional[float],
        note: str,
        hook_wrapper: Callable[[Callable], Callable] = lambda hook: hook,
    ):
        self.job, self.config, self.label, self.bucket_mb, self.note = job, config, label, bucket_mb, note
        module = wl.make_model(job.args.model, job.args.seed)
        self.model = wl.wrap(config, module, job.groups, bucket_mb, hook_wrapper)
        self.opt = wl.make_optimizer(job.args.optimizer, self.model, job.args.lr)
        self.batches = wl.Batches(job.data, job.args.batch, job.rank, job.size, job.args.seed)
        self.times: List[float] = []
        self.optimizer_times: List[float] = []  # the optimizer's part of each timed step
        self.bytes_sent = 0

    @property
    def name(self) -> str:
        return self.config.name if not self.config.ddp else f"{self.config.name} @{self.label}"

    def step(self) -> float:
        """One training step; returns the optimizer's seconds in it."""
        x, y, _ = self.batches.next()
        wl.loss_of(self.model, x, y).backward()
        t0 = time.perf_counter()
        self.opt.step()
        self.opt.zero_grad()
        return time.perf_counter() - t0

    def timed(self, record: bool) -> None:
        job = self.job
        sent0 = job.zcomm.stats()["bytes_sent"]
        job.arm()
        job.world.Barrier()
        t0 = time.perf_counter()
        optimizer = self.step()
        t = time.perf_counter() - t0
        job.disarm(t)
        if record:
            self.times.append(t)
            self.optimizer_times.append(optimizer)
            self.bytes_sent += job.zcomm.stats()["bytes_sent"] - sent0

    def second_moments_at_zero(self) -> Optional[float]:
        """The fraction of Adam's second-moment entries exactly 0 (parameters whose gradient has
        been exactly 0 at every step: ReLUs that never fire, never-selected top-k entries). torch's CPU sqrt
        takes ~5x longer per element on zeros than numpy's (measured here), so it sets the
        optimizer's time: the same model trained differently steps at different speeds."""
        moments = [s["exp_avg_sq"] for s in self.opt.state.values() if "exp_avg_sq" in s]
        total = sum(m.numel() for m in moments)
        return sum(int((m == 0).sum()) for m in moments) / total if total else None

    def buckets(self) -> List[List[torch.Tensor]]:
        """The parameters of each DDP bucket, in DDP's order (the reducer's current buckets: after
        the rebuild of the second step)."""
        return [list(b.parameters()) for b in self.model.reducer._get_zeros_like_grad_buckets()]

    def bucket_sizes(self) -> List[int]:
        return [sum(p.numel() for p in params) for params in self.buckets()]

    def gradients_in_bucket_order(self) -> List[torch.Tensor]:
        """One more backward's averaged gradients (no optimizer step), one flat tensor per bucket."""
        x, y, _ = self.batches.next()
        wl.loss_of(self.model, x, y).backward()
        flat = [torch.cat([p.grad.reshape(-1) for p in params]) for params in self.buckets()]
        total = sum(p.numel() for p in wl.parameters_of(self.model))
        if sum(f.numel() for f in flat) != total:
            raise RuntimeError(
                f"{self.name}: DDP's buckets hold {sum(f.numel() for f in flat)} of {total} elements"
            )
        self.opt.zero_grad()
        return flat


class CommEntry:
    """The communication of a step entry alone: its gradients, cut into its DDP buckets, through
    its configuration's collective, one bucket after the other (see :func:`comm_only`)."""

    kind = "comm"

    def __init__(self, job: Job, of: StepEntry):
        self.job, self.config, self.label, self.bucket_mb, self.note = (
            job,
            of.config,
            of.label,
            of.bucket_mb,
            "",
        )
        self.source = of.gradients_in_bucket_order()
        self.buffers = [s.clone() for s in self.source]
        self.reduce = comm_only(job, of.config)
        self.times: List[float] = []
        self.bytes_sent = 0

    @property
    def name(self) -> str:
        return f"{self.config.name} @{self.label} (comm only)"

    def timed(self, record: bool) -> None:
        job = self.job
        for buf, src in zip(self.buffers, self.source):  # the same values every time, untimed
            buf.copy_(src)
        sent0 = job.zcomm.stats()["bytes_sent"]
        job.arm()
        job.world.Barrier()
        t0 = time.perf_counter()
        self.reduce(self.buffers)
        t = time.perf_counter() - t0
        job.disarm(t)
        if record:
            self.times.append(t)
            self.bytes_sent += job.zcomm.stats()["bytes_sent"] - sent0


def comm_only(job: Job, config: wl.Config) -> Callable[[List[torch.Tensor]], None]:
    """The collective a configuration's DDP runs per bucket, as a function of the bucket buffers:
    gloo: ``dist.all_reduce`` then / p (DDP's default); gloo-fp16: the fp16 hook's cast, / p,
    ``dist.all_reduce`` and cast back; zcoll: ``comm.allreduce(op="avg")`` in place, or with a
    compressor of its own (its own error-feedback state) keyed per bucket."""
    p, comm = job.size, job.zcomm
    if config.group == "gloo" and config.gloo_hook is None:
        group = job.groups["gloo"]

        def gloo(bufs: List[torch.Tensor]) -> None:
            for b in bufs:
                dist.all_reduce(b, group=group)
                b.div_(p)

        return gloo
    if config.gloo_hook == "fp16":
        group = job.groups["gloo"]

        def gloo_fp16(bufs: List[torch.Tensor]) -> None:
            for b in bufs:
                h = b.to(torch.float16).div_(p)
                dist.all_reduce(h, group=group)
                b.copy_(h)

        return gloo_fp16
    if config.group == "zcoll" and config.compressor is None:

        def zcoll_plain(bufs: List[torch.Tensor]) -> None:
            for b in bufs:
                comm.allreduce(b, op="avg", out=b)

        return zcoll_plain
    if config.compressor is not None:
        compressor = config.compressor()

        def zcoll_compressed(bufs: List[torch.Tensor]) -> None:
            for i, b in enumerate(bufs):
                comm.allreduce(b, op="avg", compression=compressor, key=f"comm-only/{i}")

        return zcoll_compressed
    raise ValueError(f"{config.name}: no communication-only equivalent")


def has_comm_only(config: wl.Config) -> bool:
    # PowerSGD's communication is interleaved with its own factorisations: no separate collective.
    # AutoCompression decides across steps and refuses single calls.
    return config.ddp and config.gloo_hook != "powersgd" and not config.auto


def round_order(entries: list, r: int, seed: int) -> list:
    order = list(entries)
    random.Random(seed * 7919 + r).shuffle(order)  # the same on every rank
    return order


def powersgd_first(configs: List[wl.Config]) -> List[wl.Config]:
    """PowerSGD first: where it hangs, the watchdog ends the job before the others spent time."""
    return sorted(configs, key=lambda c: c.gloo_hook != "powersgd")


def warmup_steps(job: Job, config: wl.Config) -> int:
    # PowerSGD's first compressed step (start_powerSGD_iter) belongs to its warm-up, not its timing.
    if config.auto:  # its trial steps are not the method it decides for
        return max(job.args.warmup, wl.auto_decided() + 1)
    return max(job.args.warmup, wl.POWERSGD_START + 1) if config.gloo_hook == "powersgd" else job.args.warmup


def timing(job: Job) -> None:
    a = job.args
    steps: List[StepEntry] = []
    for c in powersgd_first([wl.CONFIGS[c] for c in a.configs]):
        for label, mb, note in bucket_settings(job, c) if c.ddp else [("-", None, "")]:
            job.at("build", c.name)
            steps.append(StepEntry(job, c, label, mb, note))
    # every model as far into training as the one that needs the longest warm-up, so that the
    # models compared have trained as many steps (auto's trials are 46)
    warm = max(warmup_steps(job, e.config) for e in steps)
    job.say(f"{len(steps)} models built; warm-up: {warm} steps each")
    for e in steps:
        job.at("warmup", e.name)
        for _ in range(warm):
            e.timed(record=False)
    comms = []
    for e in steps:
        if has_comm_only(e.config):
            job.at("warmup", e.name)
            comms.append(CommEntry(job, e))
            for _ in range(a.warmup):  # the compressor's first call allocates its residuals
                comms[-1].timed(record=False)
    entries: List[Any] = steps + comms
    t_start = time.perf_counter()
    for r in range(a.rounds):
        block = a.steps // a.rounds + (r < a.steps % a.rounds)
        for e in round_order(entries, r, a.seed):
            job.at(f"round{r}", e.name)
            for _ in range(a.settle):
                e.timed(record=False)
            for _ in range(block):
                e.timed(record=True)
        job.say(
            f"round {r + 1}/{a.rounds}: {len(entries)} entries x {block} steps "
            f"({time.perf_counter() - t_start:.0f} s)"
        )
    results = []
    for e in entries:
        times = job.slowest_rank(e.times)
        sent = job.world.allreduce(e.bytes_sent) / job.size  # mean over ranks
        results.append(
            dict(
                config=e.config.name,
                bucket=e.label,
                bucket_mb=e.bucket_mb,
                note=e.note,
                kind=e.kind,
                times=times,
                median=statistics.median(times),
                optimizer_median=statistics.median(job.slowest_rank(e.optimizer_times))
                if isinstance(e, StepEntry)
                else None,
                second_moments_at_zero=e.second_moments_at_zero() if isinstance(e, StepEntry) else None,
                bytes_per_step=sent / len(times),
                bucket_sizes=e.bucket_sizes() if isinstance(e, StepEntry) and e.config.ddp else None,
            )
        )
    job.write(dict(entries=results))


def parameters_digest(model: torch.nn.Module) -> bytes:
    flat = torch.cat([p.detach().reshape(-1) for p in wl.parameters_of(model)])
    return hashlib.sha1(flat.numpy().tobytes()).digest()


def accuracy(job: Job) -> None:
    """Trains every (configuration, bucket setting) in turn; the result file is rewritten after each
    configuration (``partial``), so a job that dies later keeps what it finished."""
    a = job.args
    rows: List[Dict[str, Any]] = []
    for c in powersgd_first([wl.CONFIGS[n] for n in a.configs]):
        for label, mb, note in bucket_settings(job, c) if c.ddp else [("-", None, "")]:
            job.at("accuracy", c.name)
            e = StepEntry(job, c, label, mb, note)
            t0 = time.perf_counter()
            for _ in range(a.accuracy_epochs * e.batches.per_epoch):
                job.arm()
                ts = time.perf_counter()
                e.step()
                job.disarm(time.perf_counter() - ts)
            acc = wl.accuracy_on_test_set(e.model, job.data)
            identical = len(set(job.world.allgather(parameters_digest(e.model)))) == 1
            rows.append(
                dict(
                    config=c.name,
                    bucket=label,
                    bucket_mb=mb,
                    accuracy=acc,
                    identical=identical,
                    epochs=a.accuracy_epochs,
                    steps=e.batches.step,
                )
            )
            job.say(
                f"accuracy {e.name}: {acc:.2%} after {a.accuracy_epochs} epochs "
                f"({time.perf_counter() - t0:.0f} s)"
            )
        job.write(dict(accuracy=rows, partial=True))
    job.write(dict(accuracy=rows, partial=False))


def main(argv=None) -> None:
    args = options(argv)
    job = Job(args)
    job.say(f"{args.phase}: {args.model}, {job.size} ranks, configurations {','.join(args.configs)}")
    timing(job) if args.phase == "timing" else accuracy(job)
    job.at("done", "-")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
