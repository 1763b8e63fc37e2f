"""A PMI-1 server inside the process: MPICH joins a job that a launcher other than MPI's started.

MPICH learns its job (rank, size, the other ranks' addresses) through PMI, the process-manager
interface that hydra (mpirun) and Slurm serve: a socket named by ``PMI_FD``, one request line
``cmd=<name> key=value ...\\n`` and one reply line at a time (MPICH's src/pmi, "PMI-1 wire
protocol"). torchrun and other torch launchers start processes that share a key-value store
instead (torch's TCPStore). This module serves PMI-1 to this process's MPI library from such a
store, so ``MPI_Init`` sees one job of ``size`` ranks and MPI stays the transport.

1. ``PmiServer(store, rank, size, nodes, timeout)`` opens a socketpair and answers on a daemon
   thread; ``environ()`` is what MPICH's ``PMI_Init`` reads (PMI_FD, PMI_RANK, PMI_SIZE).
2. Local answers: init (PMI 1.1, so MPICH makes no group barriers), get_maxes (hydra's limits),
   get_appnum (0), get_my_kvsname, get_universe_size (size), finalize, abort (recorded).
3. Through the store: ``put`` sets ``<prefix>kvs/<key>``; ``get`` reads it (a missing key answers
   rc=1 "key_not_found", as hydra does); ``barrier_in`` adds 1 to the epoch's counter, the last
   rank to arrive sets the epoch's release key, everyone waits for it. MPICH gets only after a
   barrier, so a key is always there when it is read.
4. ``PMI_process_mapping`` (which ranks share a node: MPICH's shared memory and
   ``MPI_Comm_split_type(SHARED)``) comes from ``nodes``; ``PMI_hwloc_xmlfile`` is "unavailable".
5. Never a hang: a barrier not complete within ``timeout`` seconds, or a store that stops
   answering, answers rc=-1 with a message naming the missing ranks (or the store). MPICH then
   fails ``MPI_Init`` (or whatever asked); the message is printed on stderr and kept in ``error``.

The store is duck-typed as torch's ``dist.Store``: ``set(key, value)``, ``get(key) -> bytes``,
``add(key, n) -> int``, ``check(keys) -> bool``.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

# hydra's limits (src/pm/hydra/lib/pmiserv_common.h); MPICH's client trims vallen to its line size
MAXES = {"kvsname_max": 256, "keylen_max": 64, "vallen_max": 1024}


def process_mapping(nodes: Sequence[int]) -> str:
    """MPICH's PMI_process_mapping for rank r on node nodes[r] (small integers):
    ``(vector,(first_node,node_count,ranks_per_node),...)``, runs of consecutive ranks per node,
    runs on consecutive nodes of equal length merged (block placement: one triple)."""
    runs: list[list[int]] = []  # [node, length]
    for n in nodes:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    blocks: list[list[int]] = []  # [first node, node count, ranks per node]
    for node, length in runs:
        b = blocks[-1] if blocks else None
        if b is not None and b[2] == length and b[0] + b[1] == node:
            b[1] += 1
        else:
            blocks.append([node, 1, length])
    return "(vector," + ",".join(f"({a},{b},{c})" for a, b, c in blocks) + ")"


def parse_line(line: str) -> dict[str, str]:
    """One PMI-1 request line to {key: raw value}; values keep their backslash escapes (MPICH's
    client unescapes what it reads back, so a value stored raw returns unchanged)."""
    fields: dict[str, str] = {}
    token, i = [], 0
    parts: list[str] = []
    while i < len(line):
        c = line[i]
        if c == "\\" and i + 1 < len(line):
            token.append(line[i : i + 2])
            i += 2
            continue
        if c == " ":
            parts.append("".join(token))
            token = []
        else:
            token.append(c)
        i += 1
    parts.append("".join(token))
    for p in parts:
        if p:
            key, _, value = p.partition("=")
            fields[key] = value
    return fields


class PmiError(RuntimeError):
    """The PMI job could not go on: a rank missing at a barrier, or the store gone."""


class PmiServer:
    """Serves PMI-1 to this process over a socketpair, from a shared store (module docstring)."""

    def __init__(
        self,
        store: Any,
        rank: int,
        size: int,
        nodes: Sequence[int],
        timeout: float,
        prefix: str = "zcoll/pmi/",
        kvsname: str = "zcoll_kvs",
        describe_store: str = "the store",
    ):
        if not 0 <= rank < size or len(nodes) != size:
            raise ValueError(f"PmiServer: rank {rank}, size {size}, {len(nodes)} node entries")
        self.store, self.rank, self.size, self.timeout = store, rank, size, float(timeout)
        self.prefix, self.kvsname, self.describe_store = prefix, kvsname, describe_store
        self.mapping = process_mapping(nodes)
        self.error: str | None = None  # the first failure, as reported to MPI
        self.aborted: str | None = None  # what an abort request said
        self._epoch = 0
        self._acked_finalize = False
        self._ours, self._theirs = socket.socketpair()
        self._thread = threading.Thread(target=self._serve, name="zcoll-pmi", daemon=True)
        self._thread.start()

    def environ(self) -> dict[str, str]:
        """What MPICH's PMI_Init reads from the environment."""
        return {"PMI_FD": str(self._theirs.fileno()), "PMI_RANK": str(self.rank), "PMI_SIZE": str(self.size)}

    def answer_finalize_in_advance(self) -> None:
        """After MPI_Finalize: MPICH sends PMI's finalize from its C exit hook, when Python
        threads no longer run, and waits for the reply; the reply is put on the socket now."""
        self._acked_finalize = True
        self._ours.sendall(b"cmd=finalize_ack rc=0\n")

    def close(self) -> None:
        """Closes both ends (after MPI_Finalize: MPICH keeps its end until then)."""
        for s in (self._theirs, self._ours):
            try:
                s.close()
            except OSError:
                pass

    # -- the loop ----------------------------------------------------------------------------
    def _serve(self) -> None:
        buf = b""
        while True:
            try:
                data = self._ours.recv(65536)
            except OSError:
                return
            if not data:
                return
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                reply = self.handle(line.decode("utf-8", "replace"))
                if reply is not None:
                    try:
                        self._ours.sendall(reply.encode() + b"\n")
                    except OSError:
                        return

    def handle(self, line: str) -> str | None:
        """The reply line (without its newline) to one request line; None when none is due."""
        req = parse_line(line.strip())
        cmd = req.get("cmd", "")
        extra = f" thrid={req['thrid']}" if "thrid" in req else ""
        local = {
            "init": "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0",
            "get_maxes": "cmd=maxes rc=0 " + " ".join(f"{k}={v}" for k, v in MAXES.items()),
            "get_appnum": "cmd=appnum rc=0 appnum=0",
            "get_my_kvsname": f"cmd=my_kvsname rc=0 kvsname={self.kvsname}",
            "get_universe_size": f"cmd=universe_size rc=0 size={self.size}",
            "finalize": "cmd=finalize_ack rc=0",
        }
        if cmd == "finalize" and self._acked_finalize:
            return None  # answered in advance (answer_finalize_in_advance)
        if cmd in local:
            return local[cmd] + extra
        if cmd == "abort":
            self.aborted = req.get("message", "abort")
            return None
        try:
            if cmd == "put":
                self.store.set(self.prefix + "kvs/" + req["key"], req.get("value", ""))
                return "cmd=put_result rc=0" + extra
            if cmd == "get":
                return self._get(req["key"]) + extra
            if cmd == "barrier_in":
                self._barrier()
                return "cmd=barrier_out rc=0" + extra
        except PmiError as e:
            return self._fail(cmd, str(e), extra)
        except Exception as e:  # noqa: BLE001  (the store's own errors: refused, reset, ...)
            return self._fail(
                cmd, f"{self.describe_store} stopped answering ({type(e).__name__}: {e})", extra
            )
        return self._fail(
            cmd, f"zcoll's PMI server does not serve {cmd!r} (spawn and name publishing)", extra
        )

    def _fail(self, cmd: str, why: str, extra: str) -> str:
        message = f"zcoll (rank {self.rank} of {self.size}): MPI's start-up ({cmd}) failed: {why}"
        if self.error is None:
            self.error = message
            print(message, file=sys.stderr, flush=True)
        response = {"get": "get_result", "put": "put_result", "barrier_in": "barrier_out"}.get(cmd, cmd)
        return f"cmd={response} rc=-1 msg={message.replace(' ', '_')}" + extra

    def _get(self, key: str) -> str:
        if key == "PMI_process_mapping":
            return f"cmd=get_result rc=0 msg=success value={self.mapping}"
        if key == "PMI_hwloc_xmlfile":
            return "cmd=get_result rc=0 msg=success value=unavailable"
        full = self.prefix + "kvs/" + key
        if not self.store.check([full]):
            return "cmd=get_result rc=1 msg=key_not_found"
        value = self.store.get(full)
        return "cmd=get_result rc=0 msg=success value=" + (
            value.decode() if isinstance(value, bytes) else value
        )

    def _barrier(self) -> None:
        """Every rank's barrier_in number e meets here; the last one in releases the others."""
        self._epoch += 1
        base = f"{self.prefix}barrier/{self._epoch}/"
        self.store.set(f"{base}in/{self.rank}", "1")
        if self.store.add(base + "count", 1) == self.size:
            self.store.set(base + "out", "1")
        wait_for_key(self.store, base + "out", self.timeout, lambda: self._missing_message(base))

    def _missing_message(self, base: str) -> str:
        missing = [r for r in range(self.size) if not self.store.check([f"{base}in/{r}"])]
        what = "MPI_Init" if self._epoch <= 2 else "MPI"
        return (
            f"rank(s) {missing} of {self.size} never reached PMI barrier {self._epoch} ({what}) within "
            f"{self.timeout:g} s: they exited, hang, or run a different program"
        )


def wait_for_key(store: Any, key: str, timeout: float, missing: Any) -> None:
    """Waits until `key` is in `store`; after `timeout` seconds raises PmiError(missing()).
    Polls (1 ms doubling to 20 ms) rather than store.wait: a TCPStore wait that times out can
    leave a late reply on the client's connection."""
    deadline = time.monotonic() + timeout
    pause = 0.001
    while not store.check([key]):
        if time.monotonic() > deadline:
            raise PmiError(missing())
        time.sleep(pause)
        pause = min(pause * 2, 0.02)
