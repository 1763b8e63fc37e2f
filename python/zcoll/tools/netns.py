"""The emulated network of the benchmarks: a network namespace whose loopback is rate-limited.

Every process started inside the namespace talks to the others through the one loopback device,
shaped by a token bucket (tc tbf), so all ranks share one emulated link:

  1. ``ip netns add NS``, ``ip netns exec NS ip link set lo up``;
  2. ``ip netns exec NS tc qdisc add dev lo root tbf rate RATE burst 256kb latency 50ms``;
  3. commands run as ``ip netns exec NS ...`` (``command(argv)``); MPICH must then go over TCP
     (``MPI_TCP``: no shared-memory shortcut, the ofi netmod, libfabric's tcp provider);
  4. ``close()`` deletes the namespace (a ``with`` block does it on errors and Ctrl-C too).

Needs root (or CAP_SYS_ADMIN + CAP_NET_ADMIN) and the ``ip`` and ``tc`` tools (iproute2); when the
machine refuses, the constructor raises :class:`Unavailable` saying why. ``netem`` (delay, loss) is
missing on the machines this was written on; ``tbf`` and ``htb`` work.

Example::

    with RateLimitedLoopback("1gbit") as ns:
        subprocess.run(ns.command(["mpirun", "-n", "2", "prog"]), env=ns.env(os.environ))
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Callable, Dict, List, Mapping

# MPICH over TCP inside the namespace: without these, ranks of one host use shared memory and the
# shaped loopback carries nothing.
MPI_TCP = {"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}


class Unavailable(RuntimeError):
    """The machine cannot emulate the network (no root, no iproute2, tc refused); says why."""


def _sh(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=False)


class RateLimitedLoopback:
    """A network namespace whose loopback is limited to `rate` (tc tbf syntax: 1gbit, 250mbit)."""

    def __init__(
        self,
        rate: str = "1gbit",
        burst: str = "256kb",
        latency: str = "50ms",
        log: Callable[[str], None] = lambda msg: None,
    ):
        self.name = f"zcoll-net-{os.getpid()}"
        self.rate = rate
        self._log = log
        self._created = False
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                raise Unavailable(
                    f"the '{tool}' tool is missing (package iproute2); cannot emulate a network here"
                )
        r = _sh("ip", "netns", "add", self.name)
        if r.returncode:
            raise Unavailable(
                f"cannot create a network namespace ({r.stderr.strip()}); this needs root or "
                "CAP_SYS_ADMIN (e.g. sudo, or a container started with --cap-add SYS_ADMIN,NET_ADMIN)"
            )
        self._created = True
        shaping = [
            "tc",
            "qdisc",
            "add",
            "dev",
            "lo",
            "root",
            "tbf",
            "rate",
            rate,
            "burst",
            burst,
            "latency",
            latency,
        ]
        for step in (["ip", "link", "set", "lo", "up"], shaping):
            r = _sh(*self.command(step))
            if r.returncode:
                self.close()
                raise Unavailable(
                    f"'{' '.join(step)}' failed in the namespace ({r.stderr.strip()}); traffic control "
                    "(tc tbf) is not permitted or not available here"
                )
        log(f"namespace {self.name}: loopback limited to {rate} (tbf, burst {burst}, latency {latency})")

    def command(self, argv: List[str]) -> List[str]:
        """argv run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *map(str, argv)]

    @staticmethod
    def env(base: Mapping[str, str]) -> Dict[str, str]:
        """`base` plus the settings that send MPICH's traffic over TCP (through the shaped loopback)."""
        return {**base, **MPI_TCP}

    def close(self) -> None:
        """Deletes the namespace. Idempotent."""
        if self._created:
            _sh("ip", "netns", "del", self.name)
            self._created = False
            self._log(f"namespace {self.name} deleted")

    def __enter__(self) -> "RateLimitedLoopback":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
