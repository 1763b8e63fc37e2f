"""Step traces made to follow the step model's physics exactly (no DDP run): the input of the
tests of zcoll.observe's step model, report and trace format."""

from __future__ import annotations

from zcoll.observe import step_model, step_report, trace

MIB = 1 << 20
NS = 1e9


def synthetic_docs(
    params,
    *,
    first_cap=MIB,
    cap=25 * MIB,
    ranks=2,
    steps=12,
    compute=2e-9,
    eta=50e-6,
    eta_wake=None,
    alpha=300e-6,
    beta=1 / 100e6,
    h_idle=20e-6,
    gap=30e-6,
    data=1e-3,
    forward=3e-3,
    loss=0.2e-3,
    optimizer=2e-3,
    finalize=0.3e-3,
    method="none",
    codecs=None,
    accumulation=1,
    late=None,
):
    """Every rank's trace document of `steps` DDP steps that behave exactly as docs/profiler.md
    models them: gradients ready at `compute` seconds per byte in `params` order, buckets cut as
    DDP does, each hook `eta` (`eta_wake` when it wakes an idle worker), one worker per rank (`h_idle` wake-up, `gap` turnaround), one
    collective per bucket that starts when the last rank is ready and takes alpha + max(beta x,
    codec). late[r]: extra data-loading time of rank r every step (a straggler). codecs:
    step_model's codec table; method's entry gives the wire ratio and codec rates."""
    codecs, late = codecs or {}, late or [0.0] * ranks
    eta_wake = eta if eta_wake is None else eta_wake
    link = step_model.LinkModel(alpha, beta, 2.0 * (ranks - 1) / ranks, "none", codecs, ranks)
    sizes, ends = step_model.rebucket(tuple(params), first_cap, cap)
    t = [10.0] * ranks
    out = [[] for _ in range(ranks)]
    for i in range(steps):
        sync_step = (i + 1) % accumulation == 0
        ph, b0 = [], []
        for r in range(ranks):
            d = data + late[r] if i else 0.0
            p = {"data": [t[r], t[r] + d]} if i else {}
            p["forward"] = [t[r] + d, t[r] + d + forward]
            ph.append(p)
            b0.append(t[r] + d + forward + loss)
        buckets = [[] for _ in range(ranks)]
        end, hooks = -1.0, [0.0] * ranks
        for j, (n, c) in enumerate(zip(sizes.tolist(), ends.tolist()) if sync_step else []):
            ready = [b0[r] + c * compute + hooks[r] for r in range(ranks)]
            woke = [end + gap <= ready[r] for r in range(ranks)]  # the worker was idle, its turnaround done
            cost = [eta_wake if woke[r] else eta for r in range(ranks)]
            start = [max(ready[r] + cost[r] + (h_idle if woke[r] else 0.0), end + gap) for r in range(ranks)]
            hooks = [h + e for h, e in zip(hooks, cost)]
            end = max(start) + alpha + max(beta * link.wire(method, n), link.codec_time(method, n))
            for r in range(ranks):
                buckets[r].append(
                    {
                        "index": j,
                        "bytes": n,
                        "ready": ready[r],
                        "issued": ready[r] + cost[r],
                        "start": start[r],
                        "end": end,
                        "wire": link.wire(method, n),
                        "method": method,
                    }
                )
        for r in range(ranks):
            A = b0[r] + ends[-1] * compute + hooks[r]
            ph[r]["backward"] = [b0[r], A]
            t[r] = (max(A, end) + finalize) if buckets[r] else A
            ph[r]["sync"] = [A, t[r]]
            if sync_step:
                ph[r]["optimizer"] = [t[r], t[r] + optimizer]
                t[r] += optimizer
            out[r].append({"step": i, "phases": ph[r], "buckets": buckets[r]})
    as_ns = lambda v: int(round(v * NS))  # noqa: E731
    for steps_r in out:
        recorded = set()
        for st in steps_r:
            st["phases"] = {k: [as_ns(a), as_ns(b)] for k, (a, b) in st["phases"].items()}
            k = 0
            for b in st["buckets"]:
                for key in ("ready", "issued", "start", "end"):
                    b[key] = as_ns(b[key])
                b["wire"] = int(b["wire"])
                got = []
                while sum(got) < b["bytes"]:
                    got.append(params[k])
                    k += 1
                if b["index"] not in recorded:  # the parameter sizes, once, as the profiler records them
                    b["params"] = got
                    recorded.add(b["index"])
    calibration = {
        "points": [
            {"bytes": n, "wire": n * link.wire_per_byte, "seconds": alpha + beta * n * link.wire_per_byte}
            for n in (256, MIB, 4 * MIB)
        ],
        "ranks": ranks,
    }
    model = {
        "name": "Synthetic",
        "backend": "zcoll",
        "ranks": ranks,
        "parameters": len(params),
        "gradient_bytes": sum(params),
        "bucket_cap_bytes": cap,
        "first_bucket_cap_bytes": first_cap,
        "gradient_as_bucket_view": False,
        "hook": "allreduce_hook",
        "compression": None if method == "none" else method,
        "id": 0,
        "calibration": calibration,
        "codecs": codecs,
    }
    clock = {
        "start": {"offset_ns": 0, "rtt_ns": 2000, "local_ns": 0},
        "end": {"offset_ns": 0, "rtt_ns": 2000, "local_ns": as_ns(max(t))},
    }
    return [
        {
            "format": trace.FORMAT,
            "version": trace.VERSION,
            "rank": r,
            "size": ranks,
            "meta": {"host": "synthetic", "pid": r, "clock": clock, "link": {"bandwidth_Bps": 1 / beta}},
            "models": [dict(model, steps=out[r])],
            "spans": [],
            "instants": [],
        }
        for r in range(ranks)
    ]


INT8 = {
    "int8": {
        "encode_s_per_byte": 0.2e-9,
        "decode_s_per_byte": 0.15e-9,
        "payload_ratio": 0.2539,
        "exchange": "ring",
        "name": "GradientQuantizer(bits=8)",
        "constructor": "zcoll.GradientQuantizer(bits=8)",
    }
}


MLP = (4 * 10, 4 * 10 * 1024, 4 * 1024, 4 * 1024 * 1024, 4 * 1024, 4 * 1024 * 1024, 4 * 1024, 4 * 64 * 1024)


def analysis(docs):
    (a,) = step_report.analyze(docs, warmup=2)
    return a


def measured(docs):
    return analysis(docs).measured()
