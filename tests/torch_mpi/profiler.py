"""The step profiler (zcoll.torch.profile, zcoll.trace) on real DDP steps: the files, the phases
and buckets on every rank, a valid Chrome trace, clocks aligned (also with a skewed and drifting
clock), torch.profiler ranges, gloo models, pausing, the step limit.
Run: PYTHONPATH=tests mpirun -n 2 python -m mpi4py tests/torch_mpi/profiler.py [case ...]
"""

import json
import os
import tempfile
import time


from chrome_trace import validate
from harness import WORLD, Checks, run_cases

# isort: split
import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
import zcoll.torch
from torch.nn.parallel import DistributedDataParallel as DDP
from zcoll.observe import trace

GROUPS = zcoll.torch.init_gloo_beside_zcoll()  # gloo is the default group, zcoll a second one
R, N = dist.get_rank(), dist.get_world_size()
PHASES = ("data", "forward", "backward", "sync", "optimizer")


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 4),
    )


def shared_dir() -> str:
    """A fresh directory, rank 0's, on every rank."""
    return WORLD.bcast(tempfile.mkdtemp(prefix="zcoll-prof-test-") if WORLD.rank == 0 else None)


def train(ddp, steps, opt=None):
    opt = opt or torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(R)
    for _ in range(steps):
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
        opt.zero_grad()
    return opt


def zcoll_ddp(**kw):
    return DDP(net(), process_group=GROUPS["zcoll"], bucket_cap_mb=kw.pop("bucket_cap_mb", 0.01), **kw)


def check_steps(ck: Checks, doc: dict, steps: int, counts_bytes: bool = True):
    model = doc["models"][0]
    ck.check(
        len(model["steps"]) == steps, "step count", f"rank {doc['rank']}: {len(model['steps'])} != {steps}"
    )
    for s in model["steps"][1:]:
        ph = s["phases"]
        missing = [p for p in PHASES if p not in ph or ph[p][1] is None]
        ck.check(not missing, "phases", f"rank {doc['rank']} step {s['step']} lacks {missing}")
        if missing:
            continue
        order = [
            ph["data"][0] <= ph["data"][1] <= ph["forward"][0] < ph["forward"][1] <= ph["backward"][0],
            ph["backward"][0] < ph["backward"][1] <= ph["sync"][0] <= ph["sync"][1] <= ph["optimizer"][0],
            ph["optimizer"][0] < ph["optimizer"][1],
        ]
        ck.check(all(order), "phase order", f"rank {doc['rank']} step {s['step']}: {ph}")
        ck.check(
            len(s["buckets"]) >= 2, "buckets", f"rank {doc['rank']} step {s['step']}: {len(s['buckets'])}"
        )
        for b in s["buckets"]:
            ok = ph["backward"][0] <= b["ready"] <= b["issued"] and b["end"] <= ph["sync"][1]
            ok = ok and (b["start"] is None or b["ready"] <= b["start"] <= b["end"])
            ok = ok and (b["wire"] > 0 if counts_bytes else b["wire"] is None)  # gloo counts no bytes
            ck.check(ok, "bucket times", f"rank {doc['rank']} step {s['step']}: {b} within {ph}")


def case_trace_files_phases_buckets_and_chrome_json(ck: Checks):
    d = shared_dir()
    ddp = zcoll_ddp()
    train(ddp, 2)
    with zcoll.torch.profile(ddp, d, steps=8, warmup=2) as prof:
        train(ddp, 8)
    a = prof.analysis
    ck.check(
        isinstance(a, dict) and a.get("verdict") in ("compute-bound", "link-bound", "overhead-bound"),
        "analysis on every rank",
        f"{a}",
    )
    ck.same_on_all_ranks("verdict", str(a.get("verdict")).encode())
    if R != 0:
        ck.check(prof.paths == [], "only rank 0 writes")
        return
    names = sorted(os.listdir(d))
    want = [f"zcoll-trace-rank{r}.json" for r in range(N)] + ["zcoll-trace.json", "zcoll-report.txt"]
    ck.check(all(w in names for w in want), "files", f"{names}")
    docs = trace.load(d)
    for doc in docs:
        check_steps(ck, doc, 8)
        ck.check(
            doc["models"][0]["backend"] == "zcoll" and "calibration" in doc["models"][0], "model description"
        )
        ck.check(
            {"int8", "top1%"} <= set(doc["models"][0]["codecs"]),
            "codec rates",
            f"{doc['models'][0]['codecs']}",
        )
    with open(os.path.join(d, "zcoll-trace.json")) as f:
        chrome = json.load(f)
    problems = validate(chrome)
    ck.check(not problems, "Chrome trace format", "; ".join(problems[:5]))
    for r in range(N):
        names_r = {e["name"] for e in chrome["traceEvents"] if e["pid"] == r and e["ph"] == "X"}
        ck.check(
            set(PHASES) | {"bucket 0", "bucket 1"} <= names_r,
            "spans per rank",
            f"rank {r}: {sorted(names_r)}",
        )
    with open(os.path.join(d, "zcoll-report.txt")) as f:
        report = f.read()
    ck.check("VERDICT" in report and "buckets, rank 0" in report, "report text", report[:300])


def case_clock_offsets_within_half_the_round_trip(ck: Checks):
    d = shared_dir()
    session = trace.Session(d, WORLD, probe_bytes=1 << 20)
    start = session.recorder.meta["clock"]["start"]
    link = session.recorder.meta["link"]
    session.finish()
    end = session.recorder.meta["clock"]["end"]
    for c in (start, end):  # one host, one CLOCK_MONOTONIC: the true offset is 0
        ck.check(abs(c["offset_ns"]) <= c["rtt_ns"] // 2 + 1000, "offset within rtt/2", f"{c}")
    ck.check(link is not None and link["bandwidth_Bps"] > 1e6, "link capacity", f"{link}")


def case_skewed_and_drifting_clocks_are_aligned(ck: Checks):
    """Rank r's clock runs r x 7 s ahead and 5% fast. Mapped to rank 0's clock, messages still
    arrive after they were sent, both ways, to within the measured round trip; the raw times
    (7 s) or the start offset alone (5% of the session, tens of ms) would break that."""
    d = shared_dir()
    base = time.perf_counter_ns()
    skew = R * 7_000_000_000

    def clock():
        return base + skew + int((time.perf_counter_ns() - base) * (1 + 0.05 * R))

    session = trace.Session(d, WORLD, clock=clock, probe_bytes=0)
    pairs, buf = [], np.zeros(1, dtype=np.int64)
    for i in range(12):  # ping-pong between rank 0 and the others, with each side's times
        time.sleep(0.05)
        for r in range(1, N):
            if R == r:
                sent = clock()
                WORLD.Send(buf, dest=0, tag=5)
                WORLD.Recv(buf, source=0, tag=6)
                pairs.append((sent, clock(), int(buf[0])))  # mine sent, mine received, rank 0's sent
            elif R == 0:
                WORLD.Recv(buf, source=r, tag=5)
                received = clock()
                buf[0] = clock()
                WORLD.Send(buf, dest=r, tag=6)
                pairs.append((r, received))
    session.finish()
    c = session.recorder.meta["clock"]
    for at in ("start", "end"):  # the true offset at local time L: T - L, where L = clock() at T
        L = c[at]["local_ns"]
        true = base + (L - base - skew) / (1 + 0.05 * R) - L
        ck.check(
            abs(c[at]["offset_ns"] - true) <= c[at]["rtt_ns"] // 2 + 1000,
            "offset recovers skew and drift",
            f"{at}: measured {c[at]['offset_ns']}, true {true:.0f}",
        )
    every = WORLD.gather((c, pairs), root=0)
    if R == 0:
        received_at = {}
        for r_, t in every[0][1]:
            received_at.setdefault(r_, []).append(t)
        for r in range(1, N):
            clock_r, pairs_r = every[r]
            m = trace.ClockMap(clock_r)
            tol = max(clock_r["start"]["rtt_ns"], clock_r["end"]["rtt_ns"])
            for (sent, got, root_sent), root_got in zip(pairs_r, received_at[r]):
                ck.check(
                    m(sent) <= root_got + tol and m(got) >= root_sent - tol,
                    "causal after mapping",
                    f"rank {r}: sent {m(sent) - root_got:.0f} ns after rank 0 received; received "
                    f"{root_sent - m(got):.0f} ns before rank 0 sent (tolerance {tol} ns)",
                )
            drift = trace.ClockMap({"start": clock_r["start"]})  # the start offset alone
            late = max(drift(sent) - root_got for (sent, _, _), root_got in zip(pairs_r, received_at[r]))
            ck.check(late > tol, "the drift matters here", f"{late} <= {tol}")


def case_torch_profiler_sees_the_spans(ck: Checks):
    """The phases on the training thread always; the buckets, which run on the group's worker
    thread, when the user's profiler records every thread (profile_all_threads)."""
    ddp = zcoll_ddp()
    train(ddp, 2)
    every_thread = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    for config, want in (
        (None, {"zcoll.forward", "zcoll.backward", "zcoll.sync", "zcoll.optimizer"}),
        (every_thread, {"zcoll.bucket0", "zcoll.bucket1"}),
    ):
        cpu = [torch.profiler.ProfilerActivity.CPU]
        with (
            zcoll.torch.profile(ddp, shared_dir(), steps=5, calibrate=False, probe_bytes=0),
            torch.profiler.profile(activities=cpu, experimental_config=config) as tp,
        ):
            train(ddp, 3)
        names = {e.key for e in tp.key_averages()}
        ck.check(want <= names, "record_function ranges", f"missing {sorted(want - names)}")


def case_gloo_model_gets_a_timed_hook(ck: Checks):
    d = shared_dir()
    ddp = DDP(net(), bucket_cap_mb=0.01)  # the default group: gloo
    train(ddp, 2)
    with zcoll.torch.profile(ddp, d, steps=6, warmup=2) as prof:
        train(ddp, 6)
    ck.check(
        ddp._comm_hooks and ddp._comm_hooks[0][0].__name__ == "timed_average_hook", "hook", f"{ddp._comm_hooks}"
    )
    ck.check(prof.analysis.get("backend") == "gloo", "analysed", f"{prof.analysis}")
    if R == 0:
        for doc in trace.load(d):
            check_steps(ck, doc, 6, counts_bytes=False)
    ck.same_on_all_ranks(
        "parameters", torch.cat([p.detach().reshape(-1) for p in ddp.parameters()]).numpy().tobytes()
    )


def case_profiled_training_matches_unprofiled(ck: Checks):
    """zcoll's allreduce_hook (registered by the profiler on a model without a hook) averages
    as DDP's built-in path does."""
    plain, traced = zcoll_ddp(), zcoll_ddp()
    train(plain, 5)
    with zcoll.torch.profile(traced, shared_dir(), steps=5):
        train(traced, 5)
    for p, q in zip(plain.parameters(), traced.parameters()):
        ck.check(torch.allclose(p, q, rtol=1e-5, atol=1e-6), "parameters", f"{(p - q).abs().max()}")


def case_steps_limit_pause_and_eval_forward(ck: Checks):
    d = shared_dir()
    ddp = zcoll_ddp()
    with zcoll.torch.profile(ddp, d, steps=6, warmup=1) as prof:
        opt = train(ddp, 2)
        with prof.paused():
            train(ddp, 3, opt)
        ddp.eval()
        with torch.no_grad():
            ddp(torch.randn(4, 16))
        ddp.train()
        train(ddp, 6, opt)  # 4 recorded, then the limit
    if R == 0:
        doc = trace.load(d)[R]
        steps = doc["models"][0]["steps"]
        ck.check(len(steps) == 6, "limit", f"{len(steps)}")
        ck.check(all("backward" in s["phases"] for s in steps), "paused and eval steps not recorded")
        gaps = [s["phases"]["data"][1] - s["phases"]["data"][0] for s in steps[1:] if "data" in s["phases"]]
        ck.check(len(gaps) == 4, "data phase after a pause starts afresh", f"{len(gaps)}")
    ck.check(zcoll.torch.tracer.active is None, "inactive after the block")


def case_compressed_buckets_report_the_method_and_fewer_bytes(ck: Checks):
    d = shared_dir()
    ddp = zcoll_ddp(bucket_cap_mb=0.02)
    zcoll.torch.apply_gradient_compression(ddp, zcoll.GradientQuantizer(bits=8))
    train(ddp, 2)
    with zcoll.torch.profile(ddp, d, steps=6, warmup=2) as prof:
        train(ddp, 6)
    if R == 0:
        doc = trace.load(d)[0]
        bs = [b for s in doc["models"][0]["steps"] for b in s["buckets"]]
        ck.check(all(b["method"].startswith("GradientQuantizer(bits=8") for b in bs), "method", f"{bs[0]}")
        ck.check(
            all(b["wire"] < b["bytes"] / 2 for b in bs),
            "fewer bytes",
            f"{[(b['wire'], b['bytes']) for b in bs]}",
        )
        ck.check(bs[0]["method"] in doc["models"][0]["codecs"], "its codec timed")
    ck.check(
        "int8" not in [s.get("method") for s in prof.analysis["suggestions"]], "no suggestion of what runs"
    )


if __name__ == "__main__":
    run_cases(globals(), teardown=dist.destroy_process_group)
