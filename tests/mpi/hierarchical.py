"""The hierarchical allreduce and the topology-ordered ring over emulated nodes (ZCOLL_NODE_ID per
rank, or zcoll.tools.testbed's namespaces), at any world size.

    PYTHONPATH=tests mpirun ... python -m mpi4py tests/mpi/hierarchical.py --nodes=0,1,0,1 [case ...]

--nodes: the node each rank is on (numbered by each node's lowest rank), as the launch set them
up; the cases derive what to expect from it (equal nodes of more than one rank: hierarchical
crosses nodes; unequal: the extra ranks fold in, the compressed stage is refused; one node: shm).

1. hierarchical: every dtype and op, sizes from 0 to several pipeline blocks, in and out of
   place: integer-valued data gives exactly the reference, random data the same bits on every
   rank within float rounding of the float64 sum; on unequal nodes too (the extra ranks fold
   into the others).
2. hierarchical_compressed: int8 / int4 / fp16 on the inter-node stage (algorithm="hierarchical"
   with compression=): the same bits on every rank, within the quantizer's bound; error feedback
   keeps its invariant (sum of results + sum of residuals = sum of inputs); NaN on one rank
   raises FloatingPointError on every rank. On unequal nodes: ValueError naming the node sizes
   on every rank (the compressed stage needs equal nodes).
   `auto` with int8 gives the bits of the explicit hierarchical call on such nodes.
3. auto_choice: what `auto` ran at 1 MiB (read back from the flight recorder): hierarchical on
   equal nodes of several ranks (not on unequal ones), shm on one node, the ordered ring once a topology with a slow
   link is set, the ring otherwise.
4. ordered_ring: set_topology with one directed link at 1/4 rate: the ring order avoids it (from
   3 ranks on), results exact and identical on every rank; check mode raises MismatchError on
   every rank when one rank holds another order; without a topology the algorithm is refused.
5. topology_from_env: ZCOLL_TOPOLOGY=probe.json orders every communicator's ring at creation
   (a sub-communicator by its own ranks' links); unset, no topology is known.
6. node_link_ratio: what `auto` ran at 1 MiB on 2 equal nodes given the probe's bandwidths within
   and across nodes (rule 6): --want-auto names it (the ring below a ratio of 2, hierarchical
   from 2); without a probe hierarchical on such nodes (the ratio unknown).
"""

from __future__ import annotations

import json
import os


from harness import WORLD, Checks, option, rng_for, run_cases

# isort: split
import numpy as np
import torch
import zcoll

comm = zcoll.Communicator()
p, rank = comm.size, comm.rank
expected = [int(x) for x in option("nodes", ",".join("0" * WORLD.size)).split(",")]
node_sizes = [expected.count(n) for n in sorted(set(expected))]
equal_nodes = len(set(node_sizes)) == 1
multi_level = equal_nodes and len(node_sizes) > 1 and node_sizes[0] > 1  # auto runs hierarchical
# 0, 1, odd, around a block of 256, several 4 KiB segments (the launch sets ZCOLL_SEGMENT_BYTES)
SIZES = (0, 1, 7, 1000, 40_003)


def exact_ints(n: int, r: int, dtype) -> np.ndarray:
    """Small integers, exact in any dtype and summation order (prod stays within int8: 1 or 2)."""
    return ((np.arange(n) * 7 + 3 * r) % 5 + 1).astype(dtype)


def reference(xs: list, op: str) -> np.ndarray:
    stack = np.stack([x.astype(np.float64) for x in xs])
    return {"sum": stack.sum(0), "avg": stack.mean(0), "max": stack.max(0), "min": stack.min(0),
            "prod": stack.prod(0)}[op]


def every_rank(x: np.ndarray) -> list:
    return WORLD.allgather(x)


def case_hierarchical(ck: Checks):
    for dtype in ("float32", "float64", "int32", "int8"):
        for op in ("sum", "max", "min", "prod", "avg"):
            if op == "avg" and dtype.startswith("int"):
                continue
            for n in SIZES:
                x = exact_ints(n, rank, dtype) if op != "prod" else (exact_ints(n, rank, dtype) % 2 + 1).astype(dtype)
                want = reference(every_rank(x), op)
                in_place = n == 1000
                y = x.copy() if in_place else None
                y = comm.allreduce(x if not in_place else y, op=op, algorithm="hierarchical",
                                   out=y if in_place else None)
                what = f"{dtype} {op} n={n}{' in place' if in_place else ''}"
                if op == "avg":
                    ck.check(np.allclose(y.astype(np.float64), want, rtol=1e-6), what, "not the reference")
                else:
                    ck.check(np.array_equal(y.astype(np.float64), want), what, "not the reference")
                ck.same_on_all_ranks(what, y.tobytes())
    for dtype, tol in (("float32", 2.0**-22), ("float16", 2.0**-9), ("bfloat16", 2.0**-6)):
        for op in ("sum", "avg"):
            x64 = rng_for(11, rank, len(dtype)).standard_normal(40_003)
            x = torch.from_numpy(x64).to(getattr(torch, dtype))
            xs = every_rank(x.to(torch.float64).numpy())
            want = reference(xs, op)
            y = comm.allreduce(x, op=op, algorithm="hierarchical").to(torch.float64).numpy()
            slack = tol * p * np.abs(np.stack(xs)).sum(0) + tol
            ck.check(np.all(np.abs(y - want) <= slack), f"random {dtype} {op}", "beyond rounding")
            ck.same_on_all_ranks(f"random {dtype} {op}", y.tobytes())


def hier_int8(x: np.ndarray) -> np.ndarray:
    return comm.allreduce(x, algorithm="hierarchical", compression=zcoll.GradientQuantizer(8, error_feedback=False))


def case_hierarchical_compressed(ck: Checks):
    if not equal_nodes:
        ck.raises(ValueError, lambda: comm.allreduce(np.ones(100, np.float32), algorithm="hierarchical",
                                                     compression=zcoll.GradientQuantizer(8, error_feedback=False)),
                  "same number of ranks", what="unequal nodes refused (compressed)")
        return
    n = 40_003
    x = (rng_for(12, rank).standard_normal(n) * 3).astype(np.float32)
    xs = every_rank(x.astype(np.float64))
    exact = np.sum(xs, axis=0)
    A = np.sum([np.abs(v).max() for v in xs])
    for name, make, q in (
        ("int8", lambda: zcoll.GradientQuantizer(8, error_feedback=False), 127),
        ("int4", lambda: zcoll.GradientQuantizer(4, error_feedback=False), 7),
        ("fp16", lambda: zcoll.HalfPrecision("fp16"), 1024)  # unit roundoff 2^-11,
    ):
        for op in ("sum", "avg"):
            y = comm.allreduce(x, op=op, algorithm="hierarchical", compression=make()).astype(np.float64)
            want = exact / p if op == "avg" else exact
            bound = p * A / (2 * q) / (p if op == "avg" else 1)
            err = np.abs(y - want).max()
            ck.check(err <= bound, f"{name} {op}", f"max error {err} > bound {bound}")
            ck.same_on_all_ranks(f"{name} {op}", y.tobytes())
    # in place: the same bits as out of place
    inplace = x.copy()
    comm.allreduce(inplace, algorithm="hierarchical", out=inplace,
                   compression=zcoll.GradientQuantizer(8, error_feedback=False))
    ck.check(inplace.tobytes() == hier_int8(x).tobytes(), "int8 in place")
    # auto: the hierarchical allreduce on equal nodes of several ranks, the compressed ring
    # otherwise (which the explicit hierarchical call also is with one rank per node)
    auto = comm.allreduce(x, compression=zcoll.GradientQuantizer(8, error_feedback=False))
    hier = hier_int8(x)
    ck.check(auto.tobytes() == hier.tobytes(), "auto with int8 is hierarchical here")
    # error feedback: what went in = what came out + what is still owed, over a few steps
    c = zcoll.GradientQuantizer(8)
    acc = np.zeros(n)
    for _ in range(4):
        acc += comm.allreduce(x, algorithm="hierarchical", compression=c, key="w")
    e_sum = np.sum(every_rank(c.residual("w").astype(np.float64)), axis=0)
    gap = np.abs(acc + e_sum - 4 * exact).max()
    ck.check(gap <= 1e-4 * 4 * A, "error feedback invariant", f"gap {gap}")
    # a NaN on the last rank: every rank raises
    bad = x.copy()
    if rank == p - 1:
        bad[n // 2] = np.nan
    ck.raises(FloatingPointError, lambda: comm.allreduce(bad, algorithm="hierarchical",
                                                         compression=zcoll.GradientQuantizer(8, error_feedback=False)),
              what="NaN raises everywhere")


def last_algorithm() -> str:
    """The algorithm of this communicator's latest call, from its flight-recorder dump."""
    path = comm.dump("tests/mpi/hierarchical.py")
    with open(path) as f:
        calls = json.load(f)["calls"]
    os.unlink(path)
    return calls[-1]["algorithm"]


def slow_link_matrix() -> np.ndarray:
    """1 GB/s everywhere but the directed link 0 -> 1, at a quarter of that."""
    bw = np.full((p, p), 1e9)
    np.fill_diagonal(bw, np.nan)
    if p > 1:
        bw[0, 1] = 0.25e9
    return bw


def case_auto_choice(ck: Checks):
    x = np.ones(1 << 18, np.float32)  # 1 MiB
    one_node = len(node_sizes) == 1
    want = "shm" if one_node and p > 1 else "hierarchical" if multi_level else "ring"
    if p == 1:
        want = None  # one rank: nothing to choose between
    y = comm.allreduce(x)
    ck.check(np.array_equal(y, np.full_like(x, p)), "auto result")
    if want:
        got = last_algorithm()
        ck.check(got == want, "auto without a topology", f"ran {got}, want {want} (nodes {expected})")
    comm.set_topology(slow_link_matrix())
    try:
        comm.allreduce(x)
        if want and p >= 3:
            # The other rules come first; but the matrix is as fast within a node as across
            # (node/link ratio 1.0 < 2), so on 2 nodes rule 6 drops hierarchical for the ring.
            two_nodes = multi_level and len(node_sizes) == 2
            want_topo = "ordered_ring" if want == "ring" or two_nodes else want
            got = last_algorithm()
            ck.check(got == want_topo, "auto with a slow link", f"ran {got}, want {want_topo}")
    finally:
        comm.set_topology(None)


def case_ordered_ring(ck: Checks):
    x = np.ones(1000, np.float32)
    ck.raises(ValueError, lambda: comm.allreduce(x, algorithm="ordered_ring"), "ordered_ring", "topology",
              what="refused without a topology")
    comm.set_topology(slow_link_matrix())
    try:
        order = list(comm.ring_order)
        ck.check(sorted(order) == list(range(p)) and order[0] == 0, "ring_order is a permutation from 0", str(order))
        hops = [(order[k], order[(k + 1) % p]) for k in range(p)]
        if p >= 3:
            ck.check((0, 1) not in hops, "the slow link is not a hop", str(order))
            ck.check(abs(comm.ring_gain - 4.0) < 1e-9, "ring_gain", f"{comm.ring_gain}")
        for n in SIZES:
            x = exact_ints(n, rank, np.float32)
            y = comm.allreduce(x, algorithm="ordered_ring")
            ck.check(np.array_equal(y.astype(np.float64), reference(every_rank(x), "sum")), f"n={n}")
            ck.same_on_all_ranks(f"ordered_ring n={n}", y.tobytes())
        r = rng_for(13, rank).standard_normal(40_003).astype(np.float32)
        ck.same_on_all_ranks("ordered_ring random", comm.allreduce(r, op="avg", algorithm="ordered_ring").tobytes())
        if p >= 3:
            # one rank believes another link is the slow one: its order differs, check mode says so
            bw = slow_link_matrix()
            if rank == p - 1:
                bw[0, 1], bw[0, 2] = 1e9, 0.25e9
            checked = zcoll.Communicator(check=True, topology=bw)
            try:
                ck.raises(zcoll.MismatchError, lambda: checked.allreduce(x, algorithm="ordered_ring"), "ring order",
                          what="different orders raise MismatchError everywhere")
            finally:
                checked.free()
    finally:
        comm.set_topology(None)
    ck.raises(ValueError, lambda: comm.set_topology(np.ones((p + 1, p + 1))), "bandwidth matrix",
              what="wrong shape refused")


def case_topology_from_env(ck: Checks):
    """With ZCOLL_TOPOLOGY (the launch writes a probe.json whose only slow link is 0 -> 1): every
    communicator orders its ring by it at creation, a sub-communicator by its own ranks' links.
    Without it: no topology."""
    if not zcoll._C.env_get("ZCOLL_TOPOLOGY"):
        ck.check(list(comm.ring_order) == [] and comm.ring_gain == 1.0, "no topology without ZCOLL_TOPOLOGY",
                 f"{comm.ring_order} {comm.ring_gain}")
        return
    order = list(comm.ring_order)
    hops = {(order[k], order[(k + 1) % p]) for k in range(p)}
    ck.check(sorted(order) == list(range(p)) and (0, 1) not in hops, "world ring order", str(order))
    x = np.ones(1 << 18, np.float32)
    ck.check(np.array_equal(comm.allreduce(x), np.full_like(x, p)), "auto result")
    ck.check(last_algorithm() == "ordered_ring", "auto runs the ordered ring", last_algorithm())
    # ranks rotated by one: world 0 -> 1 is sub rank p-1 -> 0, a hop of the sub's rank order
    sub = zcoll.Communicator(WORLD.Split(0, (rank - 1) % p))
    try:
        order = list(sub.ring_order)
        hops = {(order[k], order[(k + 1) % p]) for k in range(p)}
        ck.check((p - 1, 0) not in hops and abs(sub.ring_gain - 4.0) < 1e-9, "sub-communicator order",
                 f"{order}, gain {sub.ring_gain}")
        y = sub.allreduce(exact_ints(1000, sub.rank, np.float32), algorithm="ordered_ring")
        ck.check(np.array_equal(y.astype(np.float64), reference(every_rank(exact_ints(1000, sub.rank, np.float32)), "sum")),
                 "ordered ring on the sub-communicator")
        ck.same_on_all_ranks("sub ordered_ring", y.tobytes())
    finally:
        sub.free()


def case_node_link_ratio(ck: Checks):
    two_equal = multi_level and len(node_sizes) == 2
    want = option("want-auto", "hierarchical" if two_equal else None)
    x = np.ones(1 << 18, np.float32)  # 1 MiB: above MPI's and recursive doubling's ranges
    ck.check(np.array_equal(comm.allreduce(x), np.full_like(x, p)), "auto result")
    if want and p > 1:
        got = last_algorithm()
        ck.check(got == want, "auto on 2 nodes", f"ran {got}, want {want} (ZCOLL_TOPOLOGY "
                 f"{zcoll._C.env_get('ZCOLL_TOPOLOGY') or 'unset'})")


if __name__ == "__main__":
    run_cases(globals(), teardown=comm.free)
