"""compression="auto" in DDP (zcoll.tune.auto_compression): decisions identical on every rank and made
within the trial steps, escalation of a corrupting codec within one check interval (and none
without the fault), stepping back down, re-deciding on drift, the metrics log, recommend()
without applying anything.
Run: PYTHONPATH=tests mpirun -n 2 python -m mpi4py tests/torch_mpi/auto_compression.py [case ...]
"""

import json
import math
import os
import tempfile


from harness import Checks, run_cases

# isort: split
import torch
import torch.distributed as dist
import torch.nn.functional as F
import zcoll
import zcoll.torch
from torch.nn.parallel import DistributedDataParallel as DDP

zcoll.torch.init_process_group()
R, N = dist.get_rank(), dist.get_world_size()
B = 16


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 256),
        torch.nn.Tanh(),
        torch.nn.Linear(256, 256),
        torch.nn.Tanh(),
        torch.nn.Linear(256, 8),
    )


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def step(model, opt, i):
    g = torch.Generator().manual_seed(i)
    x, y = torch.randn(N * B, 32, generator=g), torch.randint(0, 8, (N * B,), generator=g)
    loss = F.cross_entropy(model(x[R * B : (R + 1) * B]), y[R * B : (R + 1) * B])
    opt.zero_grad()
    loss.backward()
    opt.step()


def train(auto, steps, model=None, warmup=0):
    """(model, state) after `steps` steps with the hook and `auto` (after `warmup` uncompressed
    steps); several buckets (small caps)."""
    model = model or DDP(net(), bucket_cap_mb=0.1)
    state = zcoll.torch.apply_gradient_compression(model, auto, warmup)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for i in range(steps):
        step(model, opt, i)
    return model, state


def events(auto, kind):
    return [e for e in auto.events if e["event"] == kind]


def shared_dir():
    d = [tempfile.mkdtemp(prefix="zcoll-auto-") if R == 0 else None]
    dist.broadcast_object_list(d, src=0)
    return d[0]


def case_decisions_identical_on_every_rank(ck: Checks):
    auto = zcoll.AutoCompression(trial_repeats=3, check_every=4)
    model, state = train(auto, 1 + 3 + 3)
    ck.check(auto.decided_step == 4, "decided after the 3 trial steps from step 1", f"{auto.decided_step}")
    report = auto.report()
    ck.check(len(report["decisions"]) >= 2, "one decision per bucket", f"{len(report['decisions'])}")
    ck.check(set(auto.guard.path) == {d["key"] for d in report["decisions"]}, "every bucket decided")
    for e in events(auto, "decision"):
        ck.check(set(e["measured_trial"]) == set(auto.config.methods), "every method measured", f"{e}")
        ck.check(set(e["predicted"]) == set(auto.config.methods) and e["reason"], "every method predicted, a reason")
        ck.check(set(e["trial_error"]) == {"bf16", "int8"}, "every candidate's error against the exact average")
    ck.same_on_all_ranks("decisions", json.dumps(report["decisions"], sort_keys=True).encode())
    ck.same_on_all_ranks("model", json.dumps(report["model"], sort_keys=True).encode())
    ck.same_on_all_ranks("parameters", flat(model).numpy().tobytes())


def case_trials_leave_the_model_exact(ck: Checks):
    """Through the trial steps the model trains exactly as with the uncompressed hook, bit for
    bit: the candidates only ever run on copies."""
    auto = zcoll.AutoCompression(methods=("none", "bf16", "int8", "int4", "sign", "top1%"), trial_repeats=4)
    model, _ = train(auto, 1 + 4)
    reference, _ = train(None, 1 + 4)
    ck.check(auto.decided_step == 5, "decided after the trials", f"{auto.decided_step}")
    ck.check(torch.equal(flat(model), flat(reference)), "parameters identical to uncompressed training")
    errors = events(auto, "decision")[0]["trial_error"]
    ck.check(
        errors["bf16"]["relative"] < errors["int8"]["relative"] < errors["int4"]["relative"] < errors["sign"]["relative"],
        "the errors measured on the side order the codecs by their loss",
        f"{errors}",
    )
    chosen = {e["method"] for e in events(auto, "decision")}
    ck.check(not chosen & {"int4", "sign", "top1%"}, "nothing beyond the error bound is chosen", f"{chosen}")


def case_corrupting_codec_escalates_within_one_interval(ck: Checks):
    every = 3
    auto = zcoll.AutoCompression(
        methods=("int8",), trial_repeats=2, check_every=every, drift=math.inf, _test_corrupt_fraction=0.01
    )
    model, _ = train(auto, 1 + 2 + every)
    ck.check(auto.decided_step == 3, "decided after the trials", f"{auto.decided_step}")
    up = events(auto, "escalate")
    ck.check(sorted(e["bucket"] for e in up) == sorted(auto.guard.path), "every bucket escalated", f"{up}")
    for e in up:
        ck.check(
            e["step"] < auto.decided_step + every and e["previous"] == "int8" and e["method"] == "bf16",
            "int8 -> bf16 within one check interval",
            f"{e}",
        )
    ck.check(all(p == ["int8", "bf16"] for p in auto.guard.path.values()), "in use: bf16", f"{auto.guard.path}")
    ck.same_on_all_ranks("parameters", flat(model).numpy().tobytes())


def case_honest_codecs_do_not_escalate(ck: Checks):
    for method in ("int8", "int4", "sign", "top1%", "bf16"):
        # (the residual bound, on by default, escalates sign and top-1% for their debt: not a fault)
        auto = zcoll.AutoCompression(methods=(method,), trial_repeats=2, check_every=2, drift=math.inf,
                                     error_bound=math.inf, residual_bound=None)  # fmt: skip
        train(auto, 1 + 2 + 8)
        checks = events(auto, "check")
        ck.check(len(checks) >= 4 * len(auto.guard.path), f"{method}: checked every 2 steps", f"{len(checks)}")
        ck.check(
            not events(auto, "escalate"),
            f"{method}: no escalation without a fault",
            f"{[(e['error'], e['bound']) for e in checks]}",
        )
        ck.check(all(e["error"] < 1e-5 for e in checks), f"{method}: only rounding is lost", f"{checks}")
        lossy = method != "bf16"  # what error feedback carries over shows against the gradient (bf16: ~3e-3)
        ck.check(all(e["step_error"] > 8e-3 for e in checks) == lossy, f"{method}: step error", f"{checks}")


def case_steps_back_down_when_calm(ck: Checks):
    auto = zcoll.AutoCompression(
        methods=("int8",),
        trial_repeats=2,
        check_every=2,
        calm_checks=2,
        drift=math.inf,
        _test_corrupt_fraction=0.01,
    )
    model, state = train(auto, 5)  # decided at 3, escalated at the check of step 4
    ck.check(all(p[-1] == "bf16" for p in auto.guard.path.values()), "escalated", f"{auto.guard.path}")
    auto.config.test_corrupt_fraction = 0.0  # the fault ends
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for i in range(5, 10):  # checks at 6 and 8: two calm ones
        step(model, opt, i)
    down = events(auto, "relax")
    ck.check(
        len(down) == len(auto.guard.path) and all(e["step"] == 8 and e["method"] == "int8" for e in down),
        "back to int8 after two calm checks",
        f"{down}",
    )


def case_residual_bound_escalates(ck: Checks):
    # sign's residual is about as large as the gradient (~1): a bound of 0.1 escalates it to int4
    auto = zcoll.AutoCompression(
        methods=("sign",), trial_repeats=2, check_every=2, drift=math.inf, residual_bound=0.1, error_bound=math.inf
    )
    train(auto, 5)  # decided at 3, checked at 4
    up = events(auto, "escalate")
    ck.check(
        len(up) == len(auto.guard.path) and all(e["method"] == "int4" and e["step"] == 4 for e in up),
        "sign -> int4 at the first check",
        f"{up} {events(auto, 'check')}",
    )


def case_trials_start_after_the_hooks_warmup(ck: Checks):
    # the hook's warm-up steps send uncompressed without calling auto; its trials were once
    # scheduled from step 1 only, so after a warm-up longer than them it never decided
    auto = zcoll.AutoCompression(methods=("int8", "sign"), trial_repeats=2, check_every=2, drift=math.inf)
    train(auto, 10, warmup=5)  # trials at steps 5-6; the decision runs from step 7
    ck.check(auto.decided_step == 7, "decided after the trial steps that follow the warm-up", str(auto.report()))
    buckets = len(auto.guard.path)
    ck.check(
        auto.calls_by_method == {"none": 2 * buckets, "sign": 2 * buckets, "int8": 2 * buckets + 3 * buckets},
        "two trial steps (exact, each candidate beside it), then int8 (sign is beyond the error bound)",
        str(auto.calls_by_method),
    )


def case_guard_times_itself(ck: Checks):
    auto = zcoll.AutoCompression(methods=("int8",), trial_repeats=2, check_every=2, drift=math.inf)
    train(auto, 9)  # decided at 3, checks at 4, 6, 8
    cost = events(auto, "guard_cost")
    ck.check(
        [e["step"] for e in cost] == [4, 6, 8] and all(e["per_step_s"] > 0 for e in cost),
        "a guard_cost event at every check, with the guard's own seconds per step",
        str(cost),
    )
    ck.check(
        auto.guard.seconds == sum(e["seconds"] for e in cost) and sum(e["steps"] for e in cost) == 8,
        "guard_seconds sums them; the steps since the first call are covered once",
        f"{auto.guard.seconds} {cost}",
    )
    ck.check(
        all(0 < e["cpu_seconds"] <= e["seconds"] + 1e-4 for e in cost)
        and auto.guard.cpu_seconds == sum(e["cpu_seconds"] for e in cost),
        "its CPU time too (the worker thread's: never more than the wall time it was measured in)",
        str(cost),
    )


def case_redecides_when_the_link_verdict_changes(ck: Checks):
    model = DDP(net(), bucket_cap_mb=0.1)
    comm = model.process_group.communicator
    labels = iter(["healthy"] * 3 + ["slow link"] * 100)
    calls = []

    def diagnose():  # the telemetry's verdict, scripted: healthy, then a slow link (same on every rank)
        calls.append(1)
        return type("Verdict", (), {"label": next(labels)})()

    comm.diagnose = diagnose
    auto = zcoll.AutoCompression(
        methods=("none", "int8"), trial_repeats=2, drift=math.inf, diagnose_every=2
    )
    train(auto, 14, model)  # decided at the end of step 2; verdicts at 2, 4, 6, 8 (changed): trials from 9
    again = events(auto, "redecide")
    ck.check(
        len(again) == 1 and again[0]["step"] == 8 and "slow link" in again[0]["reason"],
        "re-decided when the verdict changed",
        f"{again} after {len(calls)} diagnoses",
    )
    ck.check(9 in auto.trials and 10 in auto.trials and auto.decided_step == 11, "trials again, decided again")


def case_redecides_on_drift(ck: Checks):
    auto = zcoll.AutoCompression(
        methods=("none", "int8"), trial_repeats=2, check_every=2, drift=0.0
    )
    auto.drift.another_would_win = lambda *what: True  # judged in tests/tune/test_drift.py
    train(auto, 15)  # decided at 3; drift checks at 4 and 6 -> re-decide; trials 7-8, decided at 9
    again = events(auto, "redecide")
    ck.check(len(again) >= 1 and again[0]["step"] == 6, "re-decided after two drifting checks", f"{again}")
    ck.check(len({e["step"] for e in events(auto, "decision")}) >= 2, "decided twice")


def case_metrics_log(ck: Checks):
    path = os.path.join(shared_dir(), "metrics.jsonl")
    auto = zcoll.AutoCompression(
        methods=("int8", "top1%"), trial_repeats=2, check_every=2, metrics_path=path
    )
    train(auto, 1 + 4 + 4)
    auto.close()
    dist.barrier()
    if R != 0:
        ck.check(auto.metrics.path is None, "only rank 0 writes the log")
        return
    rows = [json.loads(line) for line in open(path)]
    kinds = {r["event"] for r in rows}
    ck.check({"bucket", "decision", "check", "measured"} <= kinds, "events", f"{kinds}")
    for r in rows:
        if r["event"] == "bucket":
            ck.check(
                {"step", "bucket", "method", "ratio", "residual_ratio", "nonfinite", "seconds"} <= set(r),
                "bucket fields",
                f"{r}",
            )
            ck.check(
                r["ratio"] > 1.0 and r["residual_ratio"] >= 0.0 and r["nonfinite"] == 0,
                "bucket values",
                f"{r}",
            )
        if r["event"] == "decision":
            ck.check(
                r["reason"] and r["predicted_s"] > 0 and set(r["measured_trial"]) == {"none", "int8", "top1%"},
                "decision fields",
                f"{r}",
            )
        if r["event"] == "check":
            ck.check(0.0 <= r["error"] < r["bound"], "check fields", f"{r}")
        if r["event"] == "measured":
            ck.check(r["measured_s"] > 0 and r["predicted_s"] > 0, "measured vs predicted", f"{r}")
            per = r["per_bucket"]
            ck.check(len(per) >= 2 and all(m > 0 and p > 0 for m, p in per.values()), "per bucket", f"{r}")


def case_recommend_does_not_apply(ck: Checks):
    model = DDP(net(), bucket_cap_mb=0.1)
    report = zcoll.torch.recommend(model)
    ck.check(len(report["decisions"]) >= 1 and report["text"], "a decision per bucket", f"{report['text']}")
    ck.same_on_all_ranks("recommendation", json.dumps(report["decisions"], sort_keys=True).encode())
    ck.check(not hasattr(model, "_zcoll_compression_state"), "no hook state")
    reference = DDP(net(), bucket_cap_mb=0.1)
    for m in (model, reference):
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        for i in range(2):
            step(m, opt, i)
    ck.check(torch.equal(flat(model), flat(reference)), "the model trains as without recommend()")
    # with an auto hook that has decided: its own decision
    auto = zcoll.AutoCompression(methods=("none", "int8"), trial_repeats=2)
    model, state = train(auto, 7)
    again = zcoll.torch.recommend(model)
    ck.check(again["decisions"] == auto.report()["decisions"], "the hook's decision", again["source"])


def case_with_momentum_correction_profiler_and_checkpoint(ck: Checks):
    """Adam with momentum correction, the step profiler on, and a checkpoint taken after the
    decision that resumes to the same parameters."""
    model = DDP(net(), bucket_cap_mb=0.1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    auto = zcoll.AutoCompression(
        methods=("none", "int8", "top1%"), trial_repeats=2, check_every=2, drift=math.inf
    )
    state = zcoll.torch.apply_gradient_compression(model, auto, 1, optimizer=opt)  # Adam: warm-up >= 1
    with zcoll.torch.profile(model, shared_dir(), optimizer=opt):
        for i in range(9):
            step(model, opt, i)
    ck.check(auto.decided_step == 3 and len(events(auto, "decision")) >= 2, "decided", f"{auto.decided_step}")
    saved = {
        "state": state.state_dict(),
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "opt": opt.state_dict(),
    }
    for i in range(9, 12):
        step(model, opt, i)
    want = flat(model)
    ck.same_on_all_ranks("parameters", want.numpy().tobytes())
    # resume into fresh objects: the same three steps give the same bits
    model2 = DDP(net(), bucket_cap_mb=0.1)
    model2.load_state_dict(saved["model"])
    opt2 = torch.optim.Adam(model2.parameters(), lr=1e-3)
    auto2 = zcoll.AutoCompression(
        methods=("none", "int8", "top1%"), trial_repeats=2, check_every=2, drift=math.inf
    )
    state2 = zcoll.torch.apply_gradient_compression(model2, auto2, 1, optimizer=opt2)
    state2.load_state_dict(saved["state"])
    opt2.load_state_dict(saved["opt"])
    for i in range(9, 12):
        step(model2, opt2, i)
    ck.check(
        auto2.guard.path == auto.guard.path, "the resumed hook uses the saved decisions", f"{auto2.guard.path} vs {auto.guard.path}"
    )
    ck.check(torch.equal(flat(model2), want), "resumed bit-exactly")


if __name__ == "__main__":
    run_cases(globals())
