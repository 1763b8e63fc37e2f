"""A multi-node cluster emulated on one machine: network namespaces as nodes, MPI over TCP.

Topology (all of it inside namespaces; the machine's own network is never touched):

    <prefix>n0  eth0 10.77.0.1 --veth-- p0 -+
    <prefix>n1  eth0 10.77.0.2 --veth-- p1 -+- br0 (a bridge in <prefix>sw: the "switch")
    ...                                     |

Each namespace is a node; its ranks talk to each other over its loopback (unshaped) and to other
nodes through the switch. Every directed node link i->j has its own rate: an htb class on node
i's eth0 whose u32 filter matches node j's address (netem is not available, tbf has no per-
destination classes). A link without a rate is left unshaped (an htb class at 100 Gbit/s, far
above what a veth carries here). Rates change while jobs run (`tc class change`). The default MTU
is 9000 (jumbo frames), so a shaped rate is also what MPI's payload gets, within about 2%.

Ranks are placed with hydra's MPMD syntax, one segment per run of consecutive ranks on one node,
and hydra is told the nodes are separate hosts (fork launcher: every proxy runs here):

    mpirun -launcher fork -hosts node0,node1 -rankmap 0,0,1,1
           -genv MPIR_CVAR_CH4_NETMOD ofi -genv FI_PROVIDER tcp -genv FI_TCP_IFACE eth0
           -n 2 -env ZCOLL_NODE_ID node0 ip netns exec <prefix>n0 CMD :
           -n 2 -env ZCOLL_NODE_ID node1 ip netns exec <prefix>n1 CMD

So MPICH, like on a real cluster, uses shared memory between ranks of one node and TCP through
the node's eth0 (FI_TCP_IFACE) between nodes; MPI_Comm_split_type(SHARED) finds the nodes. With
intra="tcp" (MPIR_CVAR_NOLOCAL=1) even ranks of one node talk over TCP (their loopback); MPI then
sees every rank alone and shares no memory (so ZCOLL_SHM=0 too), and ZCOLL_NODE_ID=node<k> still
tells zcoll which ranks form a node.

Python:

    from zcoll.tools.testbed import Testbed
    with Testbed(nodes=[2, 2], inter="1gbit", links={(1, 0): "250mbit"}) as tb:
        out = tb.run(["python", "job.py"], timeout=120)   # Finished(returncode, output)
        tb.set_rate(0, 1, "250mbit")               # while jobs run, too
        tb.set_node_rate(1, "100mbit")             # every link from and to node 1
        argv = tb.mpirun_argv(["python", "job.py"], placement=[0, 1, 0, 1])

Command line (root, or CAP_NET_ADMIN + CAP_SYS_ADMIN; exit status 3 when namespaces are refused):

    python -m zcoll.tools.testbed --nodes 2,2 --inter 1gbit --slow 1:0:250mbit -- zcoll probe
    python -m zcoll.tools.testbed --nodes 3 --node 0 -- ip addr    # one command in node 0
    python -m zcoll.tools.testbed --cleanup                        # namespaces of dead runs

Namespaces are deleted on exit, on errors, Ctrl-C and SIGTERM; after a SIGKILL, the next
Testbed (or --cleanup) deletes those whose creating process is gone (their names carry its pid).
"""

from __future__ import annotations

import argparse
import atexit
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from .proc import Finished, kill_tree, run_tree

UNSHAPED = "100gbit"  # the rate of a link without one: above anything a veth carries here
SUBNET = "10.77.0"  # each test bed is its own layer-2 island, so they can all use it
IFACE = "eth0"  # the node's interface, in every node namespace
# Socket buffers of 4 MiB from the start (16-32 MiB at most) in every node, as on tuned cluster
# hosts: 30 ms at 1 Gbit/s, so a rank that loses its core for a while on a busy machine (all
# nodes share its cores) does not stall the link it is measuring.
TCP_BUFFERS = {"net.ipv4.tcp_wmem": "4096 4194304 16777216", "net.ipv4.tcp_rmem": "4096 4194304 33554432"}
MPI_TCP = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": IFACE}
_NAME = re.compile(r"^zctb(\d+)-(\d+)(sw|n\d+)$")
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)$")
_RATE_SCALE = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_serial = itertools.count()


class Refused(RuntimeError):
    """This machine does not let us create namespaces or shape traffic (not root, no tools)."""


def parse_rate(rate: Optional[str]) -> Optional[float]:
    """Bits per second of a tc rate such as '250mbit' or '1gbit'; None for None (unshaped)."""
    if rate is None:
        return None
    m = _RATE.match(str(rate).strip().lower())
    if not m:
        raise ValueError(f"bad rate {rate!r}: expected a number and one of bit, kbit, mbit, gbit, tbit")
    return float(m.group(1)) * _RATE_SCALE[m.group(2)]


def node_label(node: int) -> str:
    """The ZCOLL_NODE_ID of node k's ranks, and its host name in placement files."""
    return f"node{node}"


def _sh(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=False)


def _must(*cmd: str) -> None:
    r = _sh(*cmd)
    if r.returncode:
        raise RuntimeError(f"'{' '.join(cmd)}' failed ({r.returncode}): {r.stderr.strip()}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_stale() -> List[str]:
    """Deletes the namespaces of test beds whose creating process has exited (a SIGKILL leaves
    them behind); returns their names. Namespaces not named by a test bed are never touched."""
    r = _sh("ip", "netns", "list")
    gone = []
    for line in r.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NAME.match(name)
        if m and not _alive(int(m.group(1))):
            _sh("ip", "netns", "del", name)
            gone.append(name)
    return gone


def read_placement(path: Path) -> List[str]:
    """Host names in rank order from a placement file: one `host` or `host:count` per line (a
    SLURM_HOSTFILE or a hydra machinefile, as `zcoll probe` writes them); # starts a comment."""
    hosts: List[str] = []
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        host, _, count = line.partition(":")
        hosts += [host.strip()] * (int(count) if count else 1)
    return hosts


class Testbed:
    """An emulated cluster; see the module docstring. Use as a context manager (or call
    create() and close()).

    nodes: ranks per node (the default placement: node 0's ranks first). inter: the rate of every
    directed inter-node link (a tc rate, e.g. '1gbit'; None: unshaped). links: {(i, j): rate}
    overriding single directed links i->j. mtu: of every veth and the bridge. intra: how MPI
    moves messages within a node, "shm" (shared memory, as on a real node) or "tcp" (loopback).
    """

    def __init__(
        self,
        nodes: Sequence[int] = (2, 2),
        inter: Optional[str] = "1gbit",
        links: Optional[Mapping[Tuple[int, int], Optional[str]]] = None,
        mtu: int = 9000,
        intra: str = "shm",
    ):
        if intra not in ("shm", "tcp"):
            raise ValueError(f"intra must be 'shm' or 'tcp', got {intra!r}")
        self.intra = intra
        if not nodes or any(int(n) < 0 for n in nodes):
            raise ValueError(f"nodes must list a rank count (>= 0) per node, got {list(nodes)}")
        if len(nodes) > 250:
            raise ValueError("at most 250 nodes (one /24 subnet)")
        self.nodes = [int(n) for n in nodes]
        self.mtu = int(mtu)
        parse_rate(inter)
        self.rates: Dict[Tuple[int, int], Optional[str]] = {
            (i, j): inter for i in range(len(nodes)) for j in range(len(nodes)) if i != j
        }
        for (i, j), rate in (links or {}).items():
            self._check_link(i, j)
            parse_rate(rate)
            self.rates[(i, j)] = rate
        self.prefix = f"zctb{os.getpid()}-{next(_serial)}"
        self.created: List[str] = []

    # -- names ---------------------------------------------------------------------------------
    @property
    def node_count(self) -> int:
        return len(self.nodes)

    @property
    def ranks(self) -> int:
        return sum(self.nodes)

    def namespace(self, node: int) -> str:
        return f"{self.prefix}n{node}"

    @property
    def switch(self) -> str:
        return f"{self.prefix}sw"

    def ip(self, node: int) -> str:
        return f"{SUBNET}.{node + 1}"

    def default_placement(self) -> List[int]:
        """The node of each rank: node 0's ranks first, then node 1's, ..."""
        return [k for k, n in enumerate(self.nodes) for _ in range(n)]

    def _check_link(self, i: int, j: int) -> None:
        if not (0 <= i < self.node_count and 0 <= j < self.node_count) or i == j:
            raise ValueError(f"no link {i}->{j} between {self.node_count} nodes")

    # -- life cycle ----------------------------------------------------------------------------
    def __enter__(self) -> "Testbed":
        self.create()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def create(self) -> None:
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                raise Refused(f"the '{tool}' tool is missing (package iproute2)")
        reap_stale()
        atexit.register(self.close)
        try:
            self._add_namespace(self.switch)
            _must("ip", "-n", self.switch, "link", "add", "br0", "mtu", str(self.mtu), "type", "bridge")
            _must("ip", "-n", self.switch, "link", "set", "br0", "up")
            for k in range(self.node_count):
                self._add_node(k)
        except BaseException:
            self.close()
            raise

    def _add_namespace(self, name: str) -> None:
        r = _sh("ip", "netns", "add", name)
        if r.returncode:
            raise Refused(
                f"cannot create a network namespace ({r.stderr.strip()}): this needs root or "
                "CAP_SYS_ADMIN + CAP_NET_ADMIN (e.g. a container started with --cap-add SYS_ADMIN,NET_ADMIN)"
            )
        self.created.append(name)
        _must("ip", "-n", name, "link", "set", "lo", "up")

    def _add_node(self, k: int) -> None:
        ns, port = self.namespace(k), f"p{k}"
        self._add_namespace(ns)
        _must("ip", "-n", ns, "link", "add", IFACE, "mtu", str(self.mtu), "type", "veth",
              "peer", "name", port, "mtu", str(self.mtu), "netns", self.switch)
        _must("ip", "-n", self.switch, "link", "set", port, "master", "br0", "up")
        _must("ip", "-n", ns, "addr", "add", f"{self.ip(k)}/24", "dev", IFACE)
        _must("ip", "-n", ns, "link", "set", IFACE, "up")
        for key, value in TCP_BUFFERS.items():
            _must("ip", "netns", "exec", ns, "sysctl", "-q", "-w", f"{key}={value}")
        # htb: class 1:1 (unshaped) for what no filter matches (ARP), one class per destination.
        _must("tc", "-n", ns, "qdisc", "add", "dev", IFACE, "root", "handle", "1:", "htb", "default", "1")
        _must("tc", "-n", ns, "class", "add", "dev", IFACE, "parent", "1:", "classid", "1:1", "htb",
              *self._rate_args(None))
        for j in range(self.node_count):
            if j == k:
                continue
            classid = self._classid(j)
            _must("tc", "-n", ns, "class", "add", "dev", IFACE, "parent", "1:", "classid", classid, "htb",
                  *self._rate_args(self.rates[(k, j)]))
            _must("tc", "-n", ns, "filter", "add", "dev", IFACE, "parent", "1:", "protocol", "ip", "prio", "1",
                  "u32", "match", "ip", "dst", f"{self.ip(j)}/32", "flowid", classid)

    @staticmethod
    def _classid(dst: int) -> str:
        return f"1:{dst + 0x10:x}"

    @staticmethod
    def _rate_args(rate: Optional[str]) -> List[str]:
        r = rate or UNSHAPED
        # burst: 1 ms at the rate (at least 64 KiB), so a late qdisc timer on a busy machine is
        # made up for instead of lost (htb's default is about one packet); it biases a rate
        # measured over 50 ms by under 2%. quantum: explicit, or htb warns rate/r2q is too big.
        burst = max(64 << 10, int(parse_rate(r) / 8 * 0.001))
        return ["rate", r, "ceil", r, "burst", str(burst), "cburst", str(burst), "quantum", "60000"]

    def close(self) -> None:
        """Deletes every namespace this test bed made (their veths and the bridge go with them).
        Idempotent."""
        while self.created:
            _sh("ip", "netns", "del", self.created.pop())
        atexit.unregister(self.close)

    # -- links ---------------------------------------------------------------------------------
    def set_rate(self, src: int, dst: int, rate: Optional[str]) -> None:
        """Shapes the directed link src->dst to `rate` (None: unshaped), effective at once."""
        self._check_link(src, dst)
        parse_rate(rate)
        _must("tc", "-n", self.namespace(src), "class", "change", "dev", IFACE, "parent", "1:", "classid",
              self._classid(dst), "htb", *self._rate_args(rate))
        self.rates[(src, dst)] = rate

    def set_node_rate(self, node: int, rate: Optional[str]) -> None:
        """Every link from and to `node` at `rate` (a slow node: its NIC or its switch port)."""
        for other in range(self.node_count):
            if other != node:
                self.set_rate(node, other, rate)
                self.set_rate(other, node, rate)

    def rate_bytes(self, src: int, dst: int) -> Optional[float]:
        """The shaped rate of src->dst in bytes per second (None: unshaped)."""
        bits = parse_rate(self.rates[(src, dst)])
        return None if bits is None else bits / 8

    def link_bytes(self) -> Dict[Tuple[int, int], int]:
        """Bytes each directed link has carried so far (headers included), from tc's counters."""
        sent = {}
        for k in range(self.node_count):
            out = _sh("tc", "-n", self.namespace(k), "-s", "class", "show", "dev", IFACE).stdout
            for classid, count in re.findall(r"class htb (1:[0-9a-f]+) .*?\n\s*Sent (\d+) bytes", out):
                dst = int(classid[2:], 16) - 0x10
                if 0 <= dst < self.node_count and dst != k:
                    sent[(k, dst)] = int(count)
        return sent

    def describe(self) -> str:
        lines = [f"test bed {self.prefix}: {self.node_count} nodes, ranks {self.nodes}, MTU {self.mtu}, "
                 f"within a node: {self.intra}"]
        for k in range(self.node_count):
            lines.append(f"  node {k}: namespace {self.namespace(k)}, {self.ip(k)}, ZCOLL_NODE_ID={node_label(k)}")
        for (i, j), rate in sorted(self.rates.items()):
            lines.append(f"  link {i}->{j}: {rate or 'unshaped'}")
        return "\n".join(lines)

    # -- jobs ----------------------------------------------------------------------------------
    def exec_argv(self, node: int, argv: Sequence) -> List[str]:
        """argv run inside node's namespace (no MPI)."""
        return ["ip", "netns", "exec", self.namespace(node), *map(str, argv)]

    def mpirun_argv(
        self,
        argv: Sequence,
        placement: Optional[Sequence[int]] = None,
        env: Optional[Mapping[str, str]] = None,
        mpirun_flags: Iterable[str] = (),
    ) -> List[str]:
        """The hydra command that runs argv with rank r on node placement[r] (default: the
        nodes' rank counts in order). env: more variables for every rank (-genv)."""
        placement = list(self.default_placement() if placement is None else placement)
        if not placement:
            raise ValueError("no ranks to place")
        for node in placement:
            if not 0 <= node < self.node_count:
                raise ValueError(f"placement names node {node}; the test bed has {self.node_count}")
        used = sorted(set(placement))
        cmd = [_find_mpirun(), "-launcher", "fork", "-hosts", ",".join(node_label(k) for k in used),
               "-rankmap", ",".join(str(used.index(k)) for k in placement), *mpirun_flags]
        # intra="tcp": MPI shares no memory between ranks, so neither may zcoll (ZCOLL_SHM=0)
        tcp = {**MPI_TCP, "MPIR_CVAR_NOLOCAL": "1", "ZCOLL_SHM": "0"} if self.intra == "tcp" else MPI_TCP
        for key, value in {**tcp, **(env or {})}.items():
            cmd += ["-genv", key, str(value)]
        segments = [(node, len(list(run))) for node, run in itertools.groupby(placement)]
        for i, (node, count) in enumerate(segments):
            if i:
                cmd.append(":")
            cmd += ["-n", str(count), "-env", "ZCOLL_NODE_ID", node_label(node), *self.exec_argv(node, argv)]
        return cmd

    def placement_from_hosts(self, hosts: Sequence[str]) -> List[int]:
        """Node numbers from host names node<k> (a placement file written by `zcoll probe`)."""
        labels = {node_label(k): k for k in range(self.node_count)}
        unknown = sorted(set(hosts) - set(labels))
        if unknown:
            raise ValueError(f"hosts {unknown} are not nodes of this test bed ({', '.join(labels)})")
        return [labels[h] for h in hosts]

    def run(
        self,
        argv: Sequence,
        placement: Optional[Sequence[int]] = None,
        env: Optional[Mapping[str, str]] = None,
        timeout: float = 300,
        mpirun_flags: Iterable[str] = (),
    ) -> Finished:
        """Runs argv under mpirun in the test bed; returns Finished(returncode, output). On timeout
        kills every process of the job and raises TimeoutError with the output's tail."""
        cmd = self.mpirun_argv(argv, placement, env, mpirun_flags)
        finished, timed_out = run_tree(cmd, _job_env(), timeout)
        if timed_out:
            raise TimeoutError(f"timed out after {timeout} s (all processes killed): "
                               f"{' '.join(cmd)}\n{finished.output[-5000:]}")
        return finished


def _find_mpirun() -> str:
    """This Python's mpirun (the venv's MPICH), else the first on PATH."""
    beside = Path(sys.executable).parent / "mpirun"
    found = str(beside) if beside.exists() else shutil.which("mpirun")
    if not found:
        raise Refused(f"no mpirun beside {sys.executable} or on PATH; run with the venv's python")
    return found


def _job_env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


# -- command line ---------------------------------------------------------------------------------
def _link_arg(text: str) -> Tuple[int, int, str]:
    parts = text.split(":")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"expected SRC:DST:RATE (e.g. 1:0:250mbit), got {text!r}")
    try:
        parse_rate(parts[2])
        return int(parts[0]), int(parts[1]), parts[2]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _nodes_arg(text: str) -> List[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ranks per node, e.g. 2,2; got {text!r}") from None


def _terminate(signum, _frame):
    raise SystemExit(128 + signum)  # unwinds through close()


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m zcoll.tools.testbed", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=_nodes_arg, default=[2, 2], help="ranks per node (default 2,2)")
    ap.add_argument("--inter", default="1gbit", help="rate of every inter-node link; 'none': unshaped (default 1gbit)")
    ap.add_argument("--slow", type=_link_arg, action="append", default=[], metavar="SRC:DST:RATE",
                    help="one directed link at its own rate, e.g. 1:0:250mbit (repeatable)")
    ap.add_argument("--mtu", type=int, default=9000, help="MTU of the veths and the bridge (default 9000)")
    ap.add_argument("--intra", choices=("shm", "tcp"), default="shm",
                    help="MPI within a node: shared memory (default) or TCP over the loopback")
    ap.add_argument("--placement", type=Path, help="host file (node<k> per rank, or node<k>:count lines, as "
                    "`zcoll probe` writes): places ranks instead of --nodes' order")
    ap.add_argument("--node", type=int, help="run the command inside this node's namespace, without mpirun")
    ap.add_argument("--timeout", type=float, default=3600, help="kill the job after this many seconds (default 3600)")
    ap.add_argument("--print", action="store_true", help="print the topology and the mpirun command, then run it")
    ap.add_argument("--hold", action="store_true", help="without a command: keep the test bed until Ctrl-C")
    ap.add_argument("--cleanup", action="store_true", help="delete namespaces left by killed test beds, then exit")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command (under mpirun: one per rank)")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.cleanup:
        for name in reap_stale():
            print(f"deleted {name}")
        return 0
    if not command and not args.hold:
        ap.error("give a command after -- (or --hold)")
    inter = None if args.inter.lower() in ("none", "unshaped") else args.inter
    signal.signal(signal.SIGTERM, _terminate)
    try:
        with Testbed(args.nodes, inter, {(s, d): r for s, d, r in args.slow}, args.mtu, args.intra) as tb:
            if args.print or args.hold:
                print(tb.describe(), flush=True)
            if args.hold and not command:
                print("holding; Ctrl-C deletes it", flush=True)
                signal.pause()
            if args.node is not None:
                cmd = tb.exec_argv(args.node, command)
            else:
                placement = tb.placement_from_hosts(read_placement(args.placement)) if args.placement else None
                cmd = tb.mpirun_argv(command, placement)
            if args.print:
                print(" ".join(cmd), flush=True)
            return _run_streaming(cmd, args.timeout)
    except Refused as e:
        print(f"zcoll.tools.testbed: {e}", file=sys.stderr)
        return 3
    except ValueError as e:  # a bad placement file or link
        print(f"zcoll.tools.testbed: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except subprocess.TimeoutExpired:
        print(f"zcoll.tools.testbed: the command ran past --timeout {args.timeout} s; killed", file=sys.stderr)
        return 124


def _run_streaming(cmd: List[str], timeout: float) -> int:
    """cmd with its output on ours; its whole tree killed on timeout or Ctrl-C."""
    proc = subprocess.Popen(cmd, env=_job_env(), stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except BaseException:
        kill_tree(proc)
        proc.wait()
        raise


if __name__ == "__main__":
    sys.exit(main())
