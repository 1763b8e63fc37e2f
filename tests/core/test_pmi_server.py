"""zcoll.core.pmi_server and the arrival step of zcoll.core.store_launch, without MPI: several
servers on one in-memory store, each asked what MPICH's simple PMI-1 client asks during MPI_Init
(the line format of MPICH's src/pmi/src/pmi_v1.c), and the failures: a rank missing at a barrier
or at arrival, a mismatched world size, a second process with the same rank, a store that fails."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest
from zcoll.core.pmi_server import PmiServer, parse_line, process_mapping
from zcoll.core.store_launch import PmiError, arrive


class MemoryStore:
    """The part of torch's dist.Store the server uses, in memory, shared by threads."""

    def __init__(self):
        self.data, self.cond = {}, threading.Condition()

    def set(self, key, value):
        with self.cond:
            self.data[key] = value.encode() if isinstance(value, str) else value
            self.cond.notify_all()

    def get(self, key):
        with self.cond:
            return self.data[key]

    def add(self, key, n):
        with self.cond:
            self.data[key] = str(int(self.data.get(key, b"0")) + n).encode()
            self.cond.notify_all()
            return int(self.data[key])

    def check(self, keys):
        with self.cond:
            return all(k in self.data for k in keys)


class BrokenStore(MemoryStore):
    def set(self, key, value):
        raise ConnectionResetError("Connection reset by peer")


def client(server: PmiServer) -> socket.socket:
    return socket.socket(fileno=os.dup(int(server.environ()["PMI_FD"])))


def ask(sock: socket.socket, line: str) -> dict:
    sock.sendall(line.encode() + b"\n")
    reply = b""
    while not reply.endswith(b"\n"):
        reply += sock.recv(4096)
    return parse_line(reply.decode().strip())


@pytest.mark.parametrize(
    "nodes, mapping",
    [
        ([0], "(vector,(0,1,1))"),
        ([0, 0, 1, 1], "(vector,(0,2,2))"),
        ([0, 1, 0, 1], "(vector,(0,2,1),(0,2,1))"),
        ([0, 0, 0, 1], "(vector,(0,1,3),(1,1,1))"),
        ([0, 0, 1, 1, 2], "(vector,(0,2,2),(2,1,1))"),
    ],
)
def test_process_mapping(nodes, mapping):
    assert process_mapping(nodes) == mapping


def test_parse_line_keeps_escapes():
    assert parse_line(r"cmd=put kvsname=k key=a value=x\ y\\z") == {
        "cmd": "put",
        "kvsname": "k",
        "key": "a",
        "value": r"x\ y\\z",
    }


def mpi_init_conversation(server: PmiServer, size: int, out: dict) -> None:
    """What MPICH's PMI-1 client sends while MPI_Init runs, then finalize."""
    s, r = client(server), server.rank
    replies = [
        ask(s, "cmd=init pmi_version=1 pmi_subversion=2"),
        ask(s, "cmd=get_maxes"),
        ask(s, "cmd=get_appnum"),
        ask(s, "cmd=get_my_kvsname"),
        ask(s, "cmd=get kvsname=k key=PMI_process_mapping"),
        ask(s, "cmd=get kvsname=k key=PMI_hwloc_xmlfile"),
        ask(s, rf"cmd=put kvsname=k key=card-{r} value=addr\ {r}"),
        ask(s, "cmd=barrier_in"),
        ask(s, f"cmd=get kvsname=k key=card-{(r + 1) % size}"),
        ask(s, "cmd=get kvsname=k key=never-put"),
        ask(s, "cmd=barrier_in"),
        ask(s, "cmd=finalize"),
    ]
    out[r] = replies
    s.close()


def test_mpi_init_conversation_on_three_ranks():
    store, size, out = MemoryStore(), 3, {}
    servers = [PmiServer(store, r, size, [0, 0, 1], timeout=10) for r in range(size)]
    threads = [threading.Thread(target=mpi_init_conversation, args=(s, size, out)) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert sorted(out) == [0, 1, 2]
    for r, replies in out.items():
        cmds = [x["cmd"] for x in replies]
        assert cmds == [
            "response_to_init", "maxes", "appnum", "my_kvsname", "get_result", "get_result",
            "put_result", "barrier_out", "get_result", "get_result", "barrier_out", "finalize_ack",
        ]  # fmt: skip
        init, maxes = replies[0], replies[1]
        assert (init["pmi_version"], init["pmi_subversion"], init["rc"]) == ("1", "1", "0")
        assert int(maxes["vallen_max"]) >= 256 and int(maxes["keylen_max"]) >= 64
        assert replies[4]["value"] == "(vector,(0,1,2),(1,1,1))"
        assert replies[5]["value"] == "unavailable"
        assert replies[8]["value"] == rf"addr\ {(r + 1) % size}"  # escapes returned as MPICH sent them
        assert replies[9]["rc"] == "1"  # a key nobody put: hydra's answer
        assert all(x.get("rc", "0") == "0" for i, x in enumerate(replies) if i != 9)
    for s in servers:
        assert s.error is None
        s.close()


def test_a_rank_missing_at_a_barrier_is_named_within_the_timeout():
    store = MemoryStore()
    servers = [PmiServer(store, r, 3, [0, 0, 0], timeout=0.5) for r in range(3)]
    s0, s2 = client(servers[0]), client(servers[2])
    start = time.monotonic()
    got = {}
    t = threading.Thread(target=lambda: got.update(r2=ask(s2, "cmd=barrier_in")))
    t.start()
    reply = ask(s0, "cmd=barrier_in")
    t.join(5)
    assert time.monotonic() - start < 3
    assert reply["cmd"] == "barrier_out" and reply["rc"] == "-1"
    assert got["r2"]["rc"] == "-1"
    assert "rank(s) [1] of 3 never reached PMI barrier 1" in servers[0].error
    for s in servers:
        s.close()


def test_a_failing_store_is_named():
    server = PmiServer(BrokenStore(), 0, 2, [0, 0], timeout=1, describe_store="torch's store at h:1")
    reply = ask(client(server), "cmd=put kvsname=k key=a value=b")
    assert reply["rc"] == "-1"
    assert "torch's store at h:1 stopped answering" in server.error and "reset" in server.error
    server.close()


def test_arrival_gives_every_rank_the_node_labels():
    store, out = MemoryStore(), {}
    threads = [
        threading.Thread(target=lambda r=r: out.update({r: arrive(store, r, 3, f"n{r // 2}", 5, "p/")}))
        for r in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert out == {r: ["n0", "n0", "n1"] for r in range(3)}


def test_arrival_names_the_ranks_that_never_came():
    start = time.monotonic()
    with pytest.raises(PmiError, match=r"rank\(s\) \[1, 2\] of 3 did not arrive within 0.3 s"):
        arrive(MemoryStore(), 0, 3, "n", 0.3, "p/")
    assert time.monotonic() - start < 2


def test_arrival_fails_at_once_on_another_world_size():
    store = MemoryStore()
    store.set("p/arrive/1", "3 n otherhost 42")
    start = time.monotonic()
    with pytest.raises(PmiError, match=r"rank 1 \(host otherhost, pid 42\) says WORLD_SIZE=3, rank 0 says 2"):
        arrive(store, 0, 2, "n", 30, "p/")
    assert time.monotonic() - start < 2


def test_arrival_refuses_a_rank_outside_the_world_and_a_rank_taken_twice():
    with pytest.raises(PmiError, match="outside a world of size 2"):
        arrive(MemoryStore(), 2, 2, "n", 1, "p/")

    class Overwrite(MemoryStore):  # another process writes rank 0's key right after this one
        def set(self, key, value):
            super().set(key, value)
            if key == "p/arrive/0":
                super().set(key, "1 n elsewhere 7")

    store = Overwrite()
    with pytest.raises(PmiError, match="two processes claim rank 0: elsewhere 7"):
        arrive(store, 0, 1, "n", 1, "p/")
