"""The emulated multi-node test bed (zcoll.tools.testbed) and `zcoll probe` on it.

Needs network namespaces (root, or CAP_SYS_ADMIN + CAP_NET_ADMIN); every test that creates one
is skipped, with the reason, only where the machine refuses `ip netns add`.

1. The probe's accuracy on 2 nodes x 2 ranks, 1 Gbit/s between them and node 1 -> node 0 shaped
   to 250 Mbit/s: every inter-node bandwidth within 15% of its shaped rate, the nodes found, and
   that link (and no other between nodes) named as the hotspot.
2. Rates changed while the test bed runs (tc class change), seen by a probe on 2 nodes.
3. Node identity in the namespaces: MPI and zcoll find the emulated nodes (tests/mpi/nodes.py),
   also with ranks interleaved over the nodes (hydra -rankmap), and over TCP within a node.
4. Clean-up: namespaces are gone after the context, after an error inside it, after the command
   line ends, and those of a killed test bed are reaped; the command line's --help and refusal.
"""

import itertools
import os
import subprocess
import sys
from pathlib import Path

import engines
import pytest
from mpi_util import case_names, run, script_job
from zcoll.observe import probe
from zcoll.tools import testbed

TESTBED = [sys.executable, "-m", "zcoll.tools.testbed"]  # its command line
PYTHON = [sys.executable, "-m", "mpi4py"]
PROBE_TIMEOUT = 240


def namespaces() -> set:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.split()}


# the tests that start MPI inside the namespaces (the others only shape links)
needs_hydra = pytest.mark.skipif(engines.name() == "openmpi", reason=engines.TESTBED_NEEDS_HYDRA)


@pytest.fixture(scope="module")
def allowed():
    """Skips where this machine refuses network namespaces (the reason says what is missing)."""
    tb = testbed.Testbed([1, 1])
    try:
        tb.create()
    except testbed.Refused as e:
        pytest.skip(f"no network namespaces here: {e}")
    finally:
        tb.close()


def run_probe(tb, out: Path, *flags, placement=None):
    argv = [sys.executable, "-m", "zcoll", "probe", "--out", out, "--quiet", "--no-html", *flags]
    rc, text = run(tb.mpirun_argv(argv, placement), timeout=PROBE_TIMEOUT)
    assert rc == 0, text
    return probe.load(out / "probe.json"), text


@needs_hydra
def test_probe_finds_nodes_rates_and_the_slow_link(allowed, tmp_path):
    with testbed.Testbed([2, 2], inter="1gbit", links={(1, 0): "250mbit"}) as tb:
        r, text = run_probe(tb, tmp_path / "probe", "--budget", "0.6")
        sent = tb.link_bytes()
    assert r.nodes == [[0, 1], [2, 3]] and r.hosts == ["node0", "node0", "node1", "node1"], text
    for i, j in itertools.permutations(range(4), 2):
        a, b = r.node_of[i], r.node_of[j]
        if a == b:
            continue
        want = tb.rate_bytes(a, b)
        got = r.bandwidth[i, j]
        assert abs(got / want - 1) <= 0.15, f"{i}->{j}: {got / 1e6:.1f} MB/s, shaped {want / 1e6:.1f}\n{text}"
    # between nodes: that link and nothing else (shared-memory links within a node are CPU-bound
    # and noisy on a busy machine; they are not what this topology shapes)
    bandwidth_hot = [h for h in r.hotspots if h.what == "bandwidth" and h.link.startswith("node ")]
    assert [h.link for h in bandwidth_hot] == ["node 1 -> node 0"], text
    assert not [h for h in r.hotspots if "(in node" in h.link], text  # no rank pair within a node link
    assert sorted(bandwidth_hot[0].pairs) == [(2, 0), (2, 1), (3, 0), (3, 1)]
    # one inter-node tier (the shaped links); shared-memory links may form one intra tier or two
    # (CI measured 1.2 to 4.6 GB/s within a node once: a 2x gap is a tier by the probe's rule)
    kinds = [t.kind for t in r.tiers]
    assert kinds.count("inter") == 1 and kinds[-1] == "inter" and "intra" in kinds, text
    assert "node 1 -> node 0: " in text and "inter-node" in text
    # what the probe sent went through the shaped classes
    assert sent[(0, 1)] > 4 * (1 << 20) and sent[(1, 0)] > 4 * (1 << 20), sent


@needs_hydra
def test_rates_change_while_running(allowed, tmp_path):
    with testbed.Testbed([1, 1], inter="1gbit") as tb:
        tb.set_rate(0, 1, "100mbit")
        assert tb.rates == {(0, 1): "100mbit", (1, 0): "1gbit"}
        r, text = run_probe(tb, tmp_path / "a", "--budget", "0.2")
        tb.set_node_rate(1, "200mbit")  # both directions of node 1
        s, text2 = run_probe(tb, tmp_path / "b", "--budget", "0.2")
    assert abs(r.bandwidth[0, 1] / 12.5e6 - 1) <= 0.15, text
    assert abs(r.bandwidth[1, 0] / 125e6 - 1) <= 0.15, text
    # The change took effect: both directions near 200 Mbit/s, 1 -> 0 far below its old 1 Gbit/s.
    # A short probe right after a change can measure low on a busy machine (CI measured 0.53x
    # once), so this judges within -50%/+15%; the probe's accuracy is held to 15% by
    # test_probe_finds_nodes_rates_and_the_slow_link on rates set before the job starts.
    for i, j in ((0, 1), (1, 0)):
        assert 0.5 <= s.bandwidth[i, j] / 25e6 <= 1.15, text2


def launcher_for(tb, placement=None):
    def launch(argv):
        return tb.mpirun_argv(argv, placement, mpirun_flags=["-prepend-rank"])

    return launch


@pytest.fixture(scope="module")
def bed(allowed):
    with testbed.Testbed([2, 1, 1], inter="1gbit") as tb:
        yield tb


@pytest.fixture(scope="module")
def launchers(bed):
    """One launcher per placement, made once: a job is launched once for all its cases."""
    return {"blocked": launcher_for(bed), "interleaved": launcher_for(bed, placement=[0, 1, 2, 0])}


@pytest.fixture(scope="module")
def tcp_launcher(allowed):
    # MPIR_CVAR_NOLOCAL: MPI sees every rank alone; ZCOLL_NODE_ID still groups them
    with testbed.Testbed([2, 1], inter=None, intra="tcp") as tb:
        yield launcher_for(tb)


@needs_hydra
@pytest.mark.parametrize("case", case_names("mpi/nodes.py"))
def test_nodes_in_namespaces(launchers, case):
    script_job("mpi/nodes.py", 4, "--nodes=0,0,1,2", launcher=launchers["blocked"]).check(case)


@needs_hydra
@pytest.mark.parametrize("case", case_names("mpi/nodes.py"))
def test_nodes_interleaved(launchers, case):
    # ranks 0 and 3 on node 0: hydra's -rankmap places them, ZCOLL_NODE_ID names them
    script_job("mpi/nodes.py", 4, "--nodes=0,1,2,0", launcher=launchers["interleaved"]).check(case)


@needs_hydra
@pytest.mark.parametrize("case", case_names("mpi/nodes.py"))
def test_nodes_with_tcp_within_a_node(tcp_launcher, case):
    script_job("mpi/nodes.py", 3, "--nodes=0,0,1", launcher=tcp_launcher).check(case)


def test_mpirun_argv_places_ranks(bed):
    argv = bed.mpirun_argv(["prog", "x"], placement=[2, 2, 0, 1])
    assert argv[argv.index("-hosts") + 1] == "node0,node1,node2"
    assert argv[argv.index("-rankmap") + 1] == "2,2,0,1"
    segments = " ".join(argv).split(" : ")
    assert len(segments) == 3
    assert f"-n 2 -env ZCOLL_NODE_ID node2 ip netns exec {bed.namespace(2)} prog x" in segments[0]
    with pytest.raises(ValueError, match="node 3"):
        bed.mpirun_argv(["prog"], placement=[0, 3])


def test_placement_files_are_read(tmp_path, bed):
    (tmp_path / "hosts").write_text("node1\nnode0  # a comment\n\nnode2:2\n")
    assert testbed.read_placement(tmp_path / "hosts") == ["node1", "node0", "node2", "node2"]
    assert bed.placement_from_hosts(["node1", "node0"]) == [1, 0]
    with pytest.raises(ValueError, match="node7"):
        bed.placement_from_hosts(["node7"])


def test_rates_are_checked():
    assert testbed.parse_rate("250mbit") == 250e6 and testbed.parse_rate("1.5gbit") == 1.5e9
    assert testbed.parse_rate(None) is None
    for bad in ("fast", "10mbps", "1 gbit"):
        with pytest.raises(ValueError, match="bad rate"):
            testbed.parse_rate(bad)
    with pytest.raises(ValueError, match="no link 0->0"):
        testbed.Testbed([1, 1], links={(0, 0): "1gbit"})


def test_cleanup_after_context_and_error(allowed):
    tb = testbed.Testbed([1, 1, 1])
    with pytest.raises(RuntimeError, match="inside"):
        with tb:
            made = {tb.namespace(k) for k in range(3)} | {tb.switch}
            assert made <= namespaces()
            raise RuntimeError("inside")
    assert not made & namespaces()


def test_reap_namespaces_of_dead_runs(allowed):
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = f"zctb{dead.pid}-0n0"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert name in testbed.reap_stale()
        assert name not in namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    mine = f"zctb{os.getpid()}-999n0"  # a live owner: left alone
    subprocess.run(["ip", "netns", "add", mine], check=True)
    try:
        assert mine not in testbed.reap_stale() and mine in namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", mine], check=True)


def test_command_line_runs_in_a_node_and_cleans_up(allowed):
    rc, out = run([*TESTBED, "--nodes", "1,1", "--print", "--node", "1", "--", "ip", "-o", "-4",
                   "addr", "show", "eth0"], timeout=60)
    assert rc == 0, out
    assert "10.77.0.2/24" in out, out
    prefix = out.split("test bed ", 1)[1].split(":", 1)[0]
    assert not any(n.startswith(prefix) for n in namespaces()), out


@needs_hydra
def test_command_line_runs_mpi_across_nodes(allowed):
    code = ("from mpi4py import MPI; import os, sys; "  # one write per line: ranks' output interleaves
            "sys.stdout.write(f\"rank {MPI.COMM_WORLD.rank} {os.environ['ZCOLL_NODE_ID']}\\n\")")
    rc, out = run([*TESTBED, "--nodes", "1,2", "--slow", "1:0:100mbit", "--", sys.executable, "-c",
                   code], timeout=120)
    assert rc == 0, out
    assert sorted(l for l in out.splitlines() if l.startswith("rank")) == [
        "rank 0 node0", "rank 1 node1", "rank 2 node1"], out


def test_help():
    rc, out = run([*TESTBED, "--help"], timeout=60)
    assert rc == 0 and "--slow SRC:DST:RATE" in out and "ZCOLL_NODE_ID" in out, out


def test_refused_without_privileges(allowed):
    """As an unprivileged user: exit status 3 and a message saying what is missing."""
    if not os.path.exists("/usr/bin/setpriv") or os.geteuid() != 0:
        pytest.skip("needs root and setpriv to drop privileges")
    rc, out = run(["/usr/bin/setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", *TESTBED,
                   "--nodes", "1,1", "--", "true"], timeout=60, cwd="/")
    assert rc == 3 and "cannot create a network namespace" in out and "CAP_SYS_ADMIN" in out, out

