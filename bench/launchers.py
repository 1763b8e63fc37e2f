"""zcoll's torch backend under torchrun, beyond what CI runs (docs/launching.md quotes its output).

  startup    seconds to a first allreduce under torchrun, zcoll against gloo, 2 and 4 workers,
             interleaved and repeated (median and range), holding /tmp/zcoll-bench.lock
  elastic    torchrun --max-restarts 1: a worker SIGKILLed mid-training, the group formed again,
             training resumed from its checkpoint; the weights compared with an uninterrupted run
  dist-suite PyTorch's own distributed_test.py (tests/torch_mpi/dist_suite.py) under torchrun,
             3 workers, through tests/torch_mpi/under_torchrun.py, and under mpirun -n 3 as
             tests/torch/test_dist_suite.py runs it: every test's outcome compared
  two-node   two torchrun agents in two network namespaces (zcoll.tools.testbed, root), c10d
             rendezvous at node 0: MPI and zcoll must see 2 nodes, every collective and algorithm
             must pass, and the results must equal those of mpirun on the same test bed

Run: python bench/launchers.py startup --repeats 5
     python bench/launchers.py elastic
     python bench/launchers.py dist-suite
     sudo python bench/launchers.py two-node
"""

from __future__ import annotations

import argparse
import fcntl
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from zcoll.tools.proc import run_tree
from zcoll.tools.testbed import MPI_TCP, Testbed

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
BIN = Path(sys.executable).parent


def env(**extra: str) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith("ZCOLL_")}
    e.update(PATH=f"{BIN}{os.pathsep}{e.get('PATH', '')}", OMP_NUM_THREADS="1")
    e["PYTHONPATH"] = os.pathsep.join([str(TESTS), *filter(None, [e.get("PYTHONPATH")])])
    e.update(extra)
    return e


def torchrun(n: int, *args) -> list:
    return [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(n), *map(str, args)]


def run(cmd: list, timeout: float = 300, **extra: str) -> str:
    finished, timed_out = run_tree(cmd, env(**extra), timeout)
    if timed_out or finished.returncode != 0:
        with tempfile.NamedTemporaryFile("w", prefix="zcoll-launchers-", suffix=".log", delete=False) as f:
            f.write(finished.output)
        raise SystemExit(
            f"failed ({'timed out' if timed_out else finished.returncode}): {' '.join(cmd)}\n"
            f"{finished.output[-4000:]}\n(the whole output: {f.name})"
        )
    return finished.output


def say(text: str) -> None:
    print(text, flush=True)


# -- startup -------------------------------------------------------------------------------------
_STARTUP = re.compile(r"ZCOLL-STARTUP backend=(\S+) rank=(\d+) import=([\d.]+) init=([\d.]+) first=([\d.]+)")


def startup(args: argparse.Namespace) -> None:
    rows = {}  # (n, backend) -> lists of wall, init, first
    loads = []  # the 1-minute load average after each run
    with open("/tmp/zcoll-bench.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for rep in range(args.repeats):
            for n in args.workers:
                for backend in ("zcoll", "gloo") if rep % 2 == 0 else ("gloo", "zcoll"):
                    start = time.monotonic()
                    out = run(torchrun(n, TESTS / "torch_mpi/first_allreduce.py", f"--backend={backend}"))
                    wall = time.monotonic() - start
                    found = [m.groups() for m in _STARTUP.finditer(out)]
                    if len(found) != n:
                        raise SystemExit(f"{n} workers, {len(found)} lines:\n{out[-3000:]}")
                    init = max(float(f[3]) - float(f[2]) for f in found)
                    first = max(float(f[4]) for f in found)
                    rows.setdefault((n, backend), []).append((wall, init, first))
                    loads.append(os.getloadavg()[0])
                    say(
                        f"[{rep + 1}/{args.repeats}] {n} workers {backend}: torchrun {wall:.2f} s, "
                        f"init_process_group {init:.3f} s, script start to first allreduce {first:.2f} s "
                        f"(load {loads[-1]:.1f})"
                    )
    say(f"\nload average (1 min) after the runs: {min(loads):.1f}-{max(loads):.1f}")
    say(
        "| workers | backend | torchrun command, s | init_process_group, s | script start to first allreduce, s |"
    )
    say("|---|---|---|---|---|")
    for (n, backend), vals in sorted(rows.items()):
        cells = []
        for i in range(3):
            xs = [v[i] for v in vals]
            cells.append(f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})")
        say(f"| {n} | {backend} | " + " | ".join(cells) + " |")
    for n in args.workers:
        z, g = (statistics.median(v[1] for v in rows[(n, b)]) for b in ("zcoll", "gloo"))
        say(f"{n} workers: zcoll's init_process_group / gloo's = {z / g:.2f}x (medians, {args.repeats} runs)")


# -- elastic -------------------------------------------------------------------------------------
_ELASTIC = re.compile(r"ZCOLL-ELASTIC attempt=(\d+) start=(\d+) steps=(\d+) digest=(\w+)")


def elastic(args: argparse.Namespace) -> None:
    results = {}
    for name, extra in (("uninterrupted", []), ("killed", [f"--kill-at={args.kill_at}"])):
        with tempfile.TemporaryDirectory(prefix="zcoll-elastic-") as ckpt:
            say(f"{name}: torchrun --max-restarts 1, {args.workers} workers, {args.steps} steps ...")
            start = time.monotonic()
            cmd = torchrun(
                args.workers,
                "--max-restarts",
                "1",
                TESTS / "torch_mpi/elastic_train.py",
                f"--ckpt={ckpt}",
                f"--steps={args.steps}",
                *extra,
            )
            out = run(cmd, timeout=600)
            lines = _ELASTIC.findall(out)
            if not lines:
                raise SystemExit(f"{name}: no result line\n{out[-4000:]}")
            attempt, begun, _, digest = lines[-1]
            results[name] = digest
            say(
                f"  finished in {time.monotonic() - start:.1f} s: attempt {attempt} (restarts), resumed at step "
                f"{begun}, weights sha256 {digest[:16]}"
            )
            if name == "killed":
                for line in out.splitlines():
                    if (
                        "SIGKILL" in line
                        or "Restarting" in line
                        or "restart" in line.lower()
                        and "worker" in line
                    ):
                        say("  torchrun: " + line.strip()[:160])
    same = results["uninterrupted"] == results["killed"]
    say(f"weights after the restart {'equal' if same else 'DIFFER FROM'} the uninterrupted run's")
    if not same:
        raise SystemExit(1)


# -- two nodes -----------------------------------------------------------------------------------
_DIGEST = re.compile(r"ZCOLL-DIGEST (\S+) ([0-9a-f]{64})")
_CASE = re.compile(r"ZCOLL-CASE (\S+) (PASS|FAIL)")


def two_node(args: argparse.Namespace) -> None:
    script = TESTS / "torch_mpi/launchers.py"
    cases = ["collectives", "torch_ops", "nodes", "--nodes=2"]
    with Testbed(nodes=[2, 2], inter=args.inter) as tb:
        say(tb.describe())
        extra = {**MPI_TCP, "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[${rank}] "}
        endpoint = f"{tb.ip(0)}:29511"
        agents = []
        for node in (0, 1):
            cmd = tb.exec_argv(
                node,
                [
                    "env",
                    *(f"{k}={v}" for k, v in extra.items()),
                    str(BIN / "torchrun"),
                    "--nnodes",
                    "2",
                    "--node-rank",
                    str(node),
                    "--nproc-per-node",
                    "2",
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                    endpoint,
                    "--rdzv-id",
                    "zcoll-two-node",
                    "--rdzv-conf",
                    f"is_host={int(node == 0)}",
                    # the address the other node's workers reach this agent's store at (else the
                    # host name's, which resolves to localhost in a namespace)
                    "--local-addr",
                    tb.ip(node),
                    "--tee",
                    "3",
                    str(script),
                    *cases,
                ],
            )
            agents.append(" ".join(f"'{c}'" for c in cmd))
        say("torchrun on both nodes (c10d rendezvous at " + endpoint + ") ...")
        start = time.monotonic()
        both = f"{agents[0]} & a=$!; {agents[1]} & b=$!; wait $a; ra=$?; wait $b; rb=$?; exit $((ra | rb))"
        out_torchrun = run(["bash", "-c", both], timeout=args.timeout)
        say(f"  {time.monotonic() - start:.1f} s")
        say("mpirun on the same test bed ...")
        mpirun = tb.run(
            [sys.executable, "-m", "mpi4py", str(script), *cases],
            placement=[0, 0, 1, 1],
            env={k: env()[k] for k in ("PYTHONPATH", "OMP_NUM_THREADS")},
            timeout=args.timeout,
            mpirun_flags=["-prepend-rank"],
        )
        if mpirun.returncode != 0:
            raise SystemExit(f"mpirun on the test bed failed ({mpirun.returncode}):\n{mpirun.output[-4000:]}")
        report = {}
        for name, out in (("torchrun", out_torchrun), ("mpirun", mpirun.output)):
            report[name] = (dict(_CASE.findall(out)), dict(_DIGEST.findall(out)))
            nodes = re.search(r"ZCOLL-NODES .*", out)
            say(f"{name}: cases {report[name][0]}; {nodes.group(0) if nodes else 'no ZCOLL-NODES line'}")
        ok = True
        for case in ("collectives", "torch_ops", "nodes"):
            a, b = report["torchrun"][1].get(case), report["mpirun"][1].get(case)
            passed = all(report[n][0].get(case) == "PASS" for n in report)
            say(
                f"  {case}: {'PASS' if passed else 'FAIL'} under both; digests {'equal' if a and a == b else 'DIFFER'}"
            )
            ok &= passed and a is not None and a == b
        if not ok:
            raise SystemExit(f"two-node check failed\n--- torchrun ---\n{out_torchrun[-4000:]}")
        say("two-node check passed: torchrun across 2 namespaces equals mpirun there, bit for bit")


_SKIP = re.compile(r"ZCOLL-TORCH-SKIP (\S+) rank")


def suite_outcomes(name: str, cmd: list, timeout: float, **extra: str) -> dict:
    """{test: PASS | FAIL | SKIP} of one launch of tests/torch_mpi/dist_suite.py; prints its counts."""
    say(f"{name}: torch's distributed_test.py ...")
    start = time.monotonic()
    finished, timed_out = run_tree(cmd, env(**extra), timeout)
    out = finished.output
    outcome = dict(_CASE.findall(out))
    for test in set(_SKIP.findall(out)):
        outcome[test] = "SKIP"
    counts = {k: sum(v == k for v in outcome.values()) for k in ("PASS", "SKIP", "FAIL")}
    say(
        f"  {time.monotonic() - start:.0f} s{' (timed out)' if timed_out else ''}, exit {finished.returncode}: "
        f"{len(outcome)} tests reported, {counts['PASS']} passed, {counts['SKIP']} skipped by torch, "
        f"{counts['FAIL']} failed: {', '.join(sorted(t for t, v in outcome.items() if v == 'FAIL'))}"
    )
    return outcome


def dist_suite(args: argparse.Namespace) -> None:
    """The suite under torchrun and under mpirun (as tests/torch/test_dist_suite.py runs it), each
    test's outcome compared."""
    script = TESTS / "torch_mpi/dist_suite.py"
    prefixed = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[${rank}] "}
    launcher = torchrun(args.workers, "--tee", "3", TESTS / "torch_mpi/under_torchrun.py", script)
    got = suite_outcomes(f"torchrun, {args.workers} workers", launcher, args.timeout, **prefixed)
    mpirun = [str(BIN / "mpirun"), "-n", str(args.workers), "-prepend-rank", sys.executable, "-m", "mpi4py"]
    want = suite_outcomes(f"mpirun -n {args.workers}", [*mpirun, str(script)], args.timeout)
    differ = sorted(t for t in set(got) | set(want) if got.get(t) != want.get(t))
    for test in differ:
        say(f"  {test}: torchrun {got.get(test, 'not reported')}, mpirun {want.get(test, 'not reported')}")
    say(
        f"{len(set(got) | set(want)) - len(differ)} tests with the same outcome under both, {len(differ)} differ"
    )
    if differ or not got:
        raise SystemExit(1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("startup", help="seconds to a first allreduce, zcoll vs gloo")
    s.add_argument("--repeats", type=int, default=5)
    s.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    e = sub.add_parser("elastic", help="a killed worker, torchrun's restart, resume from checkpoint")
    e.add_argument("--workers", type=int, default=2)
    e.add_argument("--steps", type=int, default=40)
    e.add_argument("--kill-at", type=int, default=23)
    d = sub.add_parser("dist-suite", help="torch's distributed_test.py under torchrun")
    d.add_argument("--workers", type=int, default=3)
    d.add_argument("--timeout", type=float, default=1500)
    t = sub.add_parser("two-node", help="two torchrun agents in two network namespaces (root)")
    t.add_argument("--inter", default="1gbit", help="rate of the links between the nodes")
    t.add_argument("--timeout", type=float, default=400)
    args = p.parse_args()
    {"startup": startup, "elastic": elastic, "dist-suite": dist_suite, "two-node": two_node}[args.what](args)


if __name__ == "__main__":
    main()
