"""comm.allreduce(x, op="avg", compression="auto", key=k): zcoll.AutoCompression without DDP, each
key a bucket, a step ending where a key comes again. Any world size:
`PYTHONPATH=tests mpirun -n P python -m mpi4py tests/mpi/auto_calls.py [case ...]`.

Cases:
  averages   keys of 0, 1, 7, 257, 4099, 64 x 33 and 65537 elements, different on every rank and step,
             for 55 steps: every result bitwise identical on every rank; decided within 50
             steps, the same methods on every rank; error feedback loses nothing: the results
             plus the ranks' mean residual sum to the exact averages (numpy, float64) over the
             steps
  escalates  a corrupting codec (the test-only fault) escalates int8 -> bf16 within one check
             interval of the decision
  refusals   no key, op other than avg, float64, an algorithm, out of another shape or
             overlapping x, a string other than "auto": an exception naming the problem, before
             any communication (the next call works)
  resumes    state_dict() keeps the decisions and the step of the calls; a new AutoCompression
             loaded from it goes on without trials
Results are reported through tests/harness.py.
"""

import json
import math


from harness import Checks, run_cases

# isort: split
import numpy as np
import zcoll

comm = zcoll.Communicator()
rank, p = comm.rank, comm.size
SIZES = {"empty": 0, "one": 1, "seven": 7, "b257": 257, "p4099": 4099, "w64x33": 64 * 33, "p65537": 65537}
SHAPES = {"w64x33": (64, 33)}  # a layer's weight: its residual moves between methods as 1-D, as a bucket's


def gradient(key: str, n: int, step: int, r: int) -> np.ndarray:
    """Rank r's float32 input for `key` at `step`: different per rank, step and element."""
    g = np.random.default_rng([r, step, n]).standard_normal(n).astype(np.float32)
    return g * np.float32(1 + (step % 3)) + np.float32(0.01 * r)


def exact_average(key: str, n: int, step: int) -> np.ndarray:
    return np.mean([gradient(key, n, step, r).astype(np.float64) for r in range(p)], axis=0)


def steps(auto, count: int, keys=SIZES, first: int = 0, on_result=None) -> None:
    for step in range(first, first + count):
        for key, n in keys.items():
            g = gradient(key, n, step, rank).reshape(SHAPES.get(key, (n,)))
            comm.allreduce(g, op="avg", compression=auto, key=key, out=g)
            if on_result is not None:
                on_result(key, step, g)


def events(auto, kind):
    return [e for e in auto.events if e["event"] == kind]


def case_averages(ck: Checks):
    total = {k: np.zeros(n) for k, n in SIZES.items()}
    exact = {k: np.zeros(n) for k, n in SIZES.items()}

    def on_result(key, step, g):
        ck.same_on_all_ranks(f"{key} step {step}", g.tobytes())
        total[key] += g.reshape(-1)
        exact[key] += exact_average(key, SIZES[key], step)

    steps("auto", 55, on_result=on_result)
    auto = comm.auto_compression
    ck.check(isinstance(auto, zcoll.AutoCompression), "comm.auto_compression", f"{auto!r}")
    ck.check(
        auto.decided_step is not None and auto.decided_step <= 50,
        "decided within 50 steps",
        f"{auto.decided_step}",
    )
    ck.check(sorted(auto.guard.path) == sorted(SIZES), "every key decided", f"{auto.guard.path}")
    ck.check(
        set(auto.calls_by_method) == {"none", *auto.config.methods}, "every method tried", f"{auto.calls_by_method}"
    )
    ck.same_on_all_ranks("methods", json.dumps(auto.guard.path, sort_keys=True).encode())
    for key, n in SIZES.items():
        e = auto.residual(key)
        mine = np.zeros(n) if e is None else e.reshape(-1).astype(np.float64)
        owed = comm.allreduce(mine, op="sum") / p
        scale = max(1.0, float(np.abs(exact[key]).max(initial=0.0)))
        err = float(np.abs(total[key] + owed - exact[key]).max(initial=0.0))
        ck.check(
            err <= 1e-5 * scale, f"{key}: results + residuals = exact averages", f"{err} (scale {scale})"
        )


def case_escalates(ck: Checks):
    every = 3
    auto = zcoll.AutoCompression(
        methods=("int8",), trial_repeats=2, check_every=every, drift=math.inf, _test_corrupt_fraction=0.01
    )
    keys = {"w": 65537}
    steps(auto, 1 + 2 + every + 1, keys)  # one step more: a step's check runs at the next step's first call
    ck.check(auto.decided_step == 3, "decided after the trials", f"{auto.decided_step}")
    up = events(auto, "escalate")
    ck.check(len(up) == 1 and up[0]["bucket"] == "w", "the key escalated", f"{up}")
    for e in up:
        ck.check(
            e["step"] < auto.decided_step + every and e["previous"] == "int8" and e["method"] == "bf16",
            "int8 -> bf16 within one check interval",
            f"{e}",
        )
    ck.check(auto.guard.path == {"w": ["int8", "bf16"]}, "in use: bf16", f"{auto.guard.path}")


def case_refusals(ck: Checks):
    x = np.arange(10, dtype=np.float32)
    ar = comm.allreduce
    ck.raises(ValueError, lambda: ar(x, op="avg", compression="auto"), "key=")
    ck.raises(ValueError, lambda: ar(x, op="sum", compression="auto", key="x"), 'op="avg"', "'sum'")
    ck.raises(
        TypeError,
        lambda: ar(x.astype(np.float64), op="avg", compression="auto", key="x"),
        "float32",
        "float64",
    )
    ck.raises(ValueError, lambda: ar(x, op="avg", algorithm="ring", compression="auto", key="x"), "algorithm")
    ck.raises(
        ValueError,
        lambda: ar(x, op="avg", compression="auto", key="x", out=np.zeros(9, np.float32)),
        "out must match x",
    )
    ck.raises(ValueError, lambda: ar(x[:9], op="avg", compression="auto", key="x", out=x[1:]), "overlaps")
    ck.raises(TypeError, lambda: ar(x, op="avg", compression="fastest", key="x"), '"auto"', "'fastest'")
    ck.raises(TypeError, lambda: ar(x, op="avg", compression=3, key="x"), "AutoCompression")
    auto = zcoll.AutoCompression()
    y = ar(x, op="avg", compression=auto, key="x")  # nothing was sent before: the calls still match
    ck.check(np.array_equal(y, x + np.float32(0.0)), "an uncompressed first step: the average", f"{y}")


def case_resumes(ck: Checks):
    keys = {"a": 4099, "b": 65537}
    first = zcoll.AutoCompression(trial_repeats=2, check_every=5)
    steps(first, 1 + (first.trials.end - first.trials.first) + 2, keys)
    state = first.state_dict()
    ck.check(first.decided_step is not None, "decided", f"{first.decided_step}")
    second = zcoll.AutoCompression(trial_repeats=2, check_every=5)
    second.load_state_dict(state)
    ck.check(
        second._call_step == first._call_step + 1,
        "the step of the calls kept",
        f"{second._call_step} vs {first._call_step}",
    )
    steps(second, 3, keys, first=second._call_step)
    ck.check(second.guard.path == first.guard.path, "the decisions kept", f"{second.guard.path} vs {first.guard.path}")
    ck.check(not events(second, "screen"), "no trials again", f"{events(second, 'screen')}")
    ck.same_on_all_ranks("methods", json.dumps(second.guard.path, sort_keys=True).encode())


run_cases(globals())
