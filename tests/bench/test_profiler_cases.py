"""bench/profiler_cases.py: the three constructed cases on real DDP (compute-, overhead- and
link-bound, the last over a loopback shaped to 1 Gbit/s), and the suggestions followed."""

import contextlib
import json
import os
import sys

import pytest
from mpi_util import OPEN_MPI, ROOT, mpirun_argv, run
from zcoll.tools import netns


# How close a followed suggestion lands to its prediction is a measurement, not a test: the
# target is 15%, bench/profiler_cases.py prints the error, and CI's runners measured
# -16% to -32% (faster than predicted) where this machine measured 4-17%. The test holds what
# must not depend on the machine: a suggestion is made, followed, measured, and makes the step
# faster (judged when the machine is not overloaded).
BUSY_LOAD = 2.0  # timing checks need a machine whose load average is below this many per core


# MPI's TCP path, so the shaped loopback carries every byte: MPICH's ofi netmod over tcp with no
# shared memory between ranks; Open MPI's ob1 over its tcp transport alone, told to use the
# loopback (its tcp transport leaves 127.0.0.1/8 out by default, and in the namespace that is the
# only interface: MPI_Init then fails with "Unreachable").
if OPEN_MPI:
    MPI_TCP = {
        "OMPI_MCA_pml": "ob1",
        "OMPI_MCA_btl": "tcp,self",
        "OMPI_MCA_btl_tcp_if_include": "lo",
        "ZCOLL_SHM": "0",
    }
else:
    MPI_TCP = {
        "MPIR_CVAR_NOLOCAL": "1",
        "MPIR_CVAR_CH4_NETMOD": "ofi",
        "FI_PROVIDER": "tcp",
        "ZCOLL_SHM": "0",
    }


CASES = {"compute": "", "overhead": "bucket", "link": "compression,accumulation"}


_results: dict = {}


def profiler_case(tmp_path_factory, case):
    """bench/profiler_cases.py on 2 ranks, once per session and case (the link case inside a
    namespace whose loopback is shaped to 1 Gbit/s, over MPI's TCP path); its result and the
    load average per core while it ran."""
    if case not in _results:
        result = tmp_path_factory.mktemp(case) / "result.json"
        argv = mpirun_argv(
            2, sys.executable, "-m", "mpi4py", ROOT / "bench" / "profiler_cases.py", "--case", case,
            "--follow", CASES[case], "--result", result,
        )  # fmt: skip
        before = os.getloadavg()[0]
        if case == "link":
            with slow_link() as ns:
                rc, out = run(["ip", "netns", "exec", ns, *argv], env=MPI_TCP, timeout=900)
        else:
            rc, out = run(argv, timeout=900)
        assert rc == 0 and result.exists(), out
        load = max(before, os.getloadavg()[0]) / os.cpu_count()
        _results[case] = (json.loads(result.read_text()), load)
    return _results[case]


@contextlib.contextmanager
def slow_link(rate="1gbit"):
    """A namespace whose loopback is shaped to `rate` (zcoll.tools.netns, as
    bench/emulated_network.py uses it); skipped where namespaces or traffic control are refused."""
    try:
        ns = netns.RateLimitedLoopback(rate)
    except netns.Unavailable as e:
        pytest.skip(
            f"cannot create a network namespace with a shaped loopback here (needs root, ip and tc): {e}"
        )
    try:
        yield ns.name
    finally:
        ns.close()


@pytest.mark.parametrize(
    "case,verdict", [("compute", "compute-bound"), ("overhead", "overhead-bound"), ("link", "link-bound")]
)
def test_constructed_case_verdict(tmp_path_factory, case, verdict):
    """compute-bound: a small model on a big batch; overhead-bound: 50 buckets of a few KB; link-
    bound: a 2.2 MB model over an emulated 1 Gbit/s link."""
    r, _ = profiler_case(tmp_path_factory, case)
    assert r["verdict"] == verdict, r
    if case == "compute":
        assert all(s["speedup"] < 1.25 for s in r["suggestions"]), r["suggestions"]


@pytest.mark.parametrize(
    "case,kind", [("overhead", "bucket"), ("link", "compression"), ("link", "accumulation")]
)
def test_suggestion_followed_makes_the_step_faster(tmp_path_factory, case, kind):
    """The suggested setting, run in alternating blocks with the profiled one, is measured and is
    faster than the profiled setting in those same blocks (not than the first, separate profile:
    CI's runner once ran the interleaved blocks 40% slower than that); its error against the
    model's prediction is printed."""
    r, load = profiler_case(tmp_path_factory, case)
    f = next(f for f in r["follow"] if f["kind"] == kind)
    assert f["suggestion"], f"no {kind} suggestion: {r['suggestions']}"
    text = (
        f"followed {f['suggestion']['text']}: measured {f['measured_s'] * 1e3:.2f} ms, predicted "
        f"{f['predicted_s'] * 1e3:.2f} ms ({f['error']:+.1%}); the profiled setting in the same blocks "
        f"{f['base_s'] * 1e3:.2f} ms (profiled alone first: {r['step_s'] * 1e3:.2f} ms)"
    )
    print("\n" + text)
    assert f["measured_s"] > 0 and f["predicted_s"] > 0, text
    if load > BUSY_LOAD and f["measured_s"] >= f["base_s"]:
        pytest.skip(f"{text}; not judged: load average {load:.1f} per core while it ran (other jobs)")
    assert f["measured_s"] < f["base_s"], text
