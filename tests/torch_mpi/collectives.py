"""The zcoll torch backend's collectives against references computed on every rank.

Inputs differ per rank and index (x_r[i] = f(r, i)), small integers so that every dtype, bf16
included, represents sums and products exactly; AVG compares with a tolerance.
Run: PYTHONPATH=tests mpirun -n 3 python -m mpi4py tests/torch_mpi/collectives.py [case ...]
"""

import time
from datetime import timedelta


from harness import Checks, run_cases

# isort: split
import torch
import torch.distributed as dist
import zcoll.torch
from zcoll.torch import ProcessGroupZcoll

zcoll.torch.init_process_group()
R, N = dist.get_rank(), dist.get_world_size()
PG = dist.group.WORLD
Op = dist.ReduceOp
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.int8, torch.uint8]
SIZES = [0, 1, 7, 33, 1000]


def x(rank, n, dtype, op=Op.SUM):
    i = torch.arange(n)
    if op == Op.PRODUCT:
        v = (i + rank) % 3 + 1  # product over 3 ranks <= 27
    else:
        v = (i * 7 + rank * 5) % 13 + rank  # <= 14, sum over 3 ranks fits in int8
    return v.to(dtype)


def expected(n, dtype, op):
    xs = torch.stack([x(r, n, torch.float64, op) for r in range(N)])
    ref = {
        Op.SUM: xs.sum(0),
        Op.PRODUCT: xs.prod(0),
        Op.MIN: xs.min(0).values,
        Op.MAX: xs.max(0).values,
        Op.AVG: xs.mean(0),
    }[op]
    return ref


def close(ck: Checks, got, want, dtype, what):
    tol = {torch.float16: 1e-2, torch.bfloat16: 2e-2}.get(dtype, 1e-6)
    got = got.to(torch.float64)
    same_shape = ck.check(got.shape == want.shape, what, f"shape {tuple(got.shape)} != {tuple(want.shape)}")
    if same_shape and got.numel():
        err = ((got - want).abs() / want.abs().clamp(min=1)).max().item()
        ck.check(err <= tol, what, f"max rel err {err} > {tol}\n got {got[:8]}\nwant {want[:8]}")


def case_backend_registered(ck: Checks):
    ck.check(isinstance(PG, ProcessGroupZcoll), message=f"{type(PG)}")
    ck.check(dist.get_backend() == "zcoll" and PG.name() == "zcoll")
    ck.check(PG.size() == N and PG.rank() == R)


def case_all_reduce_every_op_and_dtype(ck: Checks):
    for dtype in FLOATS + INTS:
        for op in (Op.SUM, Op.PRODUCT, Op.MIN, Op.MAX) + ((Op.AVG,) if dtype in FLOATS else ()):
            for n in SIZES:
                t = x(R, n, dtype, op)
                dist.all_reduce(t, op=op)
                ck.check(t.dtype == dtype)
                close(ck, t, expected(n, dtype, op), dtype, f"all_reduce {op} {dtype} n={n}")


def case_all_reduce_large_in_place(ck: Checks):
    n = (1 << 18) + 3  # several segments
    t = x(R, n, torch.float32)
    ptr = t.data_ptr()
    dist.all_reduce(t)
    ck.check(t.data_ptr() == ptr)
    close(ck, t, expected(n, torch.float32, Op.SUM), torch.float32, "large")


def case_all_reduce_avg_on_ints_is_an_error(ck: Checks):
    t = torch.ones(4, dtype=torch.int32)
    ck.raises(ValueError, lambda: dist.all_reduce(t, op=Op.AVG), "AVG", "int32")


def case_unsupported_op_is_not_implemented(ck: Checks):
    t = torch.ones(2, dtype=torch.int32)
    premul_sum = dist._make_nccl_premul_sum(2.0)
    ck.raises(NotImplementedError, lambda: dist.all_reduce(t, op=premul_sum), "PREMUL_SUM")


def case_broadcast_every_root(ck: Checks):
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for root in range(N):
            t = x(R, 33, dtype)
            dist.broadcast(t, src=root)
            ck.check(torch.equal(t, x(root, 33, dtype)), f"broadcast root {root} {dtype}")


def case_reduce_every_root(ck: Checks):
    for root in range(N):
        for op in (Op.SUM, Op.MAX, Op.AVG):
            t = x(R, 33, torch.float32, op)
            dist.reduce(t, dst=root, op=op)
            if R == root:
                close(ck, t, expected(33, torch.float32, op), torch.float32, f"reduce root {root} {op}")


def case_all_gather_list(ck: Checks):
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int8):
        inp = x(R, 7, dtype).reshape(7, 1)
        outs = [torch.empty(7, 1, dtype=dtype) for _ in range(N)]  # separate storages: staged
        dist.all_gather(outs, inp)
        for r in range(N):
            ck.check(torch.equal(outs[r].view(-1), x(r, 7, dtype)), f"all_gather {dtype} from {r}")
        big = torch.empty(N * 7, dtype=dtype)
        dist.all_gather(list(big.chunk(N)), inp.view(-1))  # back to back: gathered in place
        ck.check(torch.equal(big, torch.cat([x(r, 7, dtype) for r in range(N)])))


def case_all_gather_into_tensor(ck: Checks):
    for dtype in (torch.float32, torch.bfloat16):
        out = torch.empty(N, 5, dtype=dtype)
        dist.all_gather_into_tensor(out, x(R, 5, dtype))
        ck.check(torch.equal(out, torch.stack([x(r, 5, dtype) for r in range(N)])))
    if hasattr(dist, "all_gather_single"):  # the 2.13 name
        out = torch.empty(N * 3)
        dist.all_gather_single(out, x(R, 3, torch.float32))
        ck.check(torch.equal(out, torch.cat([x(r, 3, torch.float32) for r in range(N)])))


def case_reduce_scatter_list_and_tensor(ck: Checks):
    for op in (Op.SUM, Op.MIN, Op.AVG):
        full = x(R, 4 * N, torch.float32, op)
        want = expected(4 * N, torch.float32, op)[4 * R : 4 * R + 4]
        out = torch.empty(4)
        dist.reduce_scatter(out, [c.clone() for c in full.chunk(N)], op=op)
        close(ck, out, want, torch.float32, f"reduce_scatter {op}")
        out = torch.empty(4)
        dist.reduce_scatter_tensor(out, full, op=op)
        close(ck, out, want, torch.float32, f"reduce_scatter_tensor {op}")
    out = torch.empty(4, dtype=torch.bfloat16)
    dist.reduce_scatter_tensor(out, x(R, 4 * N, torch.bfloat16))
    close(ck, out, expected(4 * N, torch.bfloat16, Op.SUM)[4 * R : 4 * R + 4], torch.bfloat16, "rs bf16")


def case_all_to_all_single_equal_and_uneven(ck: Checks):
    inp = torch.arange(2 * N, dtype=torch.float32) + 100 * R
    out = torch.empty(2 * N)
    dist.all_to_all_single(out, inp)
    ck.check(torch.equal(out, torch.tensor([100.0 * r + 2 * R + k for r in range(N) for k in range(2)])))
    # rank r sends (j + 1) rows to rank j; receives (R + 1) rows from everyone
    in_splits = [j + 1 for j in range(N)]
    inp = torch.cat([torch.full((j + 1, 2), float(10 * R + j), dtype=torch.bfloat16) for j in range(N)])
    out = torch.empty((R + 1) * N, 2, dtype=torch.bfloat16)
    dist.all_to_all_single(out, inp, output_split_sizes=[R + 1] * N, input_split_sizes=in_splits)
    want = torch.cat([torch.full((R + 1, 2), float(10 * r + R), dtype=torch.bfloat16) for r in range(N)])
    ck.check(torch.equal(out, want))


def case_all_to_all_list(ck: Checks):
    ins = [torch.full((j + 1,), float(10 * R + j)) for j in range(N)]
    outs = [torch.empty(R + 1) for _ in range(N)]
    dist.all_to_all(outs, ins)
    for r in range(N):
        ck.check(torch.equal(outs[r], torch.full((R + 1,), float(10 * r + R))))


def case_gather_and_scatter(ck: Checks):
    root = N - 1
    outs = [torch.empty(3) for _ in range(N)] if R == root else None
    dist.gather(x(R, 3, torch.float32), outs, dst=root)
    if R == root:
        for r in range(N):
            ck.check(torch.equal(outs[r], x(r, 3, torch.float32)))
    out = torch.empty(3)
    dist.scatter(out, [x(r, 3, torch.float32) * 2 for r in range(N)] if R == 0 else None, src=0)
    ck.check(torch.equal(out, x(R, 3, torch.float32) * 2))


def case_barrier(ck: Checks):
    dist.barrier()
    w = dist.barrier(async_op=True)
    w.wait()
    ck.check(w.is_completed() and w.is_success())


def case_send_recv_ring(ck: Checks):
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        nxt, prv = (R + 1) % N, (R - 1) % N
        got = torch.empty(1000, dtype=dtype)
        s = dist.isend(x(R, 1000, dtype), nxt, tag=5)
        dist.recv(got, prv, tag=5)
        s.wait()
        ck.check(torch.equal(got, x(prv, 1000, dtype)))
    if R == 0:  # blocking send on one side, irecv + future on the other; tags keep messages apart
        dist.send(torch.full((4,), 2.0), 1, tag=2)
        dist.send(torch.full((4,), 1.0), 1, tag=1)
    elif R == 1:
        a, b = torch.empty(4), torch.empty(4)
        wa = dist.irecv(a, 0, tag=1)
        wb = dist.irecv(b, 0, tag=2)
        ck.check(wb.get_future().wait()[0] is b)
        wa.wait()
        ck.check(a.eq(1).all() and b.eq(2).all())


def case_async_ops_and_futures(ck: Checks):
    ts = [x(R, 1000, torch.float32) + k for k in range(6)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for k in reversed(range(6)):  # wait out of order
        works[k].wait()
        ck.check(works[k].is_completed())
        close(ck, ts[k], expected(1000, torch.float32, Op.SUM) + N * k, torch.float32, f"async {k}")
    t = x(R, 33, torch.bfloat16)
    w = dist.all_reduce(t, op=Op.MAX, async_op=True)
    chained = w.get_future().then(lambda f: f.value()[0].float().sum().item())
    ck.check(chained.wait() == expected(33, torch.float32, Op.MAX).sum().item())
    ck.check(w.get_future().value()[0] is t)
    # a synchronous call issued while async work is queued runs after it, in order
    a, b = torch.ones(1 << 16), torch.ones(4)
    wa = dist.all_reduce(a, async_op=True)
    dist.all_reduce(b)
    ck.check(wa.is_completed() and a.eq(N).all() and b.eq(N).all())
    outs = torch.empty(N * 2)
    dist.all_gather_into_tensor(outs, torch.full((2,), float(R)), async_op=True).wait()
    ck.check(torch.equal(outs, torch.arange(N).float().repeat_interleave(2)))
    w = dist.broadcast(torch.zeros(2), src=0, async_op=True)
    w.wait()
    ck.check(w.is_success() and w.exception() is None)


def case_async_error_reaches_the_future(ck: Checks):
    t = torch.ones(3)
    pg = PG
    w = pg.submit(lambda: (_ for _ in ()).throw(RuntimeError("boom")), [t])
    try:
        w.wait()
    except RuntimeError as e:
        ck.check("boom" in str(e))
    else:
        ck.fail("no error")
    dist.all_reduce(t)  # the group still works
    ck.check(t.eq(N).all())


def case_subgroups(ck: Checks):
    ranks = [r for r in range(N) if r != 1]  # non-contiguous for 3 ranks
    g1 = dist.new_group(ranks)
    g2 = dist.new_group([0, 1])
    if R in ranks:
        ck.check(isinstance(g1, ProcessGroupZcoll) and g1.size() == len(ranks))
        t = torch.full((5,), float(R + 1))
        dist.all_reduce(t, group=g1)
        ck.check(t.eq(sum(r + 1 for r in ranks)).all(), message=f"{t}")
        b = torch.full((2,), float(R), dtype=torch.bfloat16)
        dist.broadcast(b, src=ranks[-1], group=g1)  # src is a global rank
        ck.check(b.eq(ranks[-1]).all())
        out = torch.empty(len(ranks) * 2)
        dist.all_gather_into_tensor(out, torch.full((2,), float(R)), group=g1, async_op=True).wait()
        ck.check(torch.equal(out, torch.tensor([float(r) for r in ranks]).repeat_interleave(2)))
    else:
        ck.check(g1 == dist.GroupMember.NON_GROUP_MEMBER)
    if R in (0, 1):
        t = torch.full((3,), float(R))
        w = dist.all_reduce(t, op=Op.MAX, group=g2, async_op=True)
        w.wait()
        ck.check(t.eq(1).all())
        if R == 0:
            dist.send(torch.ones(2), dst=1, group=g2)
        else:
            r = torch.zeros(2)
            dist.recv(r, src=0, group=g2)
            ck.check(r.eq(1).all())
    t = torch.ones(2)
    dist.all_reduce(t)  # the world group is untouched
    ck.check(t.eq(N).all())
    for g in (g1, g2):
        if g != dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(g)


def case_functional_collectives(ck: Checks):
    import torch.distributed._functional_collectives as funcol

    t = funcol.all_reduce(torch.full((4,), float(R)), "sum", PG)
    ck.check(torch.equal(t.wait() if hasattr(t, "wait") else t, torch.full((4,), float(sum(range(N))))))


def case_stats_count_bytes(ck: Checks):
    comm = PG.communicator
    comm.reset_stats()
    dist.all_reduce(torch.ones(1 << 12))
    sent = comm.stats()["bytes_sent"]
    ck.check(sent >= 4 * (1 << 12) * (N - 1) // N, message=f"{sent}")


def case_error_list_length(ck: Checks):
    ck.raises(ValueError, lambda: PG.allreduce([torch.ones(2), torch.ones(2)]), "exactly one tensor", "got 2")
    ck.raises(ValueError, lambda: PG.broadcast([]), "exactly one tensor", "got 0")


def case_error_mixed_dtypes(ck: Checks):
    inp = torch.ones(2)
    ck.raises(
        ValueError,
        lambda: PG.allgather([[torch.empty(2, dtype=torch.float16) for _ in range(N)]], [inp]),
        "mixed dtypes",
    )
    ck.raises(
        ValueError, lambda: PG.all_gather_single(torch.empty(2 * N, dtype=torch.float64), inp), "mixed dtypes"
    )
    ck.raises(
        ValueError,
        lambda: PG.reduce_scatter_single(torch.empty(2, dtype=torch.bfloat16), torch.ones(2 * N)),
        "mixed dtypes",
    )
    ck.raises(
        ValueError,
        lambda: PG.allreduce_coalesced([torch.ones(2), torch.ones(2, dtype=torch.int32)]),
        "mixed dtypes",
    )


def case_error_non_contiguous(ck: Checks):
    t = torch.ones(4, 3).t()
    ck.raises(ValueError, lambda: PG.allreduce([t]), "not contiguous")
    ck.raises(ValueError, lambda: dist.all_reduce(t), "not contiguous")


def case_error_device_and_dtype(ck: Checks):
    meta = torch.empty(4, device="meta")
    ck.raises(ValueError, lambda: PG.allreduce([meta]), "on meta", "CPU tensors only")
    ck.raises(ValueError, lambda: PG.allreduce([torch.ones(2, dtype=torch.int16)]), "torch.int16")
    ck.raises(ValueError, lambda: PG.allreduce([torch.ones(2, dtype=torch.uint16)]), "uint16")


def case_error_sizes_and_unsupported_calls(ck: Checks):
    ck.raises(ValueError, lambda: PG.all_gather_single(torch.empty(3), torch.ones(2)), "elements")
    ck.raises(ValueError, lambda: dist.broadcast(torch.ones(2), src=N + 3), "")
    sparse = torch.eye(3).to_sparse()
    ck.raises(NotImplementedError, lambda: dist.all_reduce(sparse, op=Op.MAX), "SUM only")
    ck.raises(NotImplementedError, lambda: dist.broadcast(sparse, 0), "sparse tensors are not supported")
    ck.raises(NotImplementedError, lambda: PG.split_group([0]), "split_group")


def case_sparse_all_reduce_sum(ck: Checks):
    """Sparse COO tensors sum as gloo's do: different indices per rank, repeated ones, dense
    dimensions, an empty rank; in place, the same on every rank."""
    shape = (N + 3, 2)
    idx = torch.tensor([[R, N, N + 2 - (R % 2)], [0, 1, R % 2]])  # [R, 0] is rank R's own
    vals = torch.tensor([1.0 + R, 10.0, 0.5])
    t = torch.sparse_coo_tensor(idx, vals, shape)
    want = sum(
        torch.sparse_coo_tensor(
            torch.tensor([[r, N, N + 2 - (r % 2)], [0, 1, r % 2]]), torch.tensor([1.0 + r, 10.0, 0.5]), shape
        ).to_dense()
        for r in range(N)
    )
    dist.all_reduce(t)
    ck.check(t.is_sparse and torch.equal(t.to_dense(), want), "sum", f"{t.to_dense()} != {want}")
    ck.same_on_all_ranks("sparse sum", t.to_dense().numpy().tobytes())
    dense_dims = torch.sparse_coo_tensor(torch.tensor([[R]]), torch.full((1, 2, 2), float(R)), (N, 2, 2))
    dist.all_reduce(dense_dims, async_op=True).wait()
    ck.check(torch.equal(dense_dims.to_dense(), torch.arange(N).float().view(N, 1, 1).expand(N, 2, 2)))
    empty_here = torch.sparse_coo_tensor(
        torch.zeros(1, 0, dtype=torch.long) if R else torch.tensor([[1]]),
        torch.zeros(0) if R else torch.tensor([7.0]),
        (3,),
    )
    dist.all_reduce(empty_here)
    ck.check(
        torch.equal(empty_here.to_dense(), torch.tensor([0.0, 7.0, 0.0])), "empty ranks", f"{empty_here}"
    )
    ck.raises(
        ValueError,
        lambda: dist.all_reduce(torch.eye(3).to_sparse() if R else torch.eye(4).to_sparse()),
        "different shapes",
    )


def case_recv_without_src(ck: Checks):
    """recv / irecv without src take whichever rank's message comes; both name the sender."""
    if R == 0:
        senders = []
        for k in range(N - 1):
            got = torch.empty(5)
            if k % 2:
                w = dist.irecv(got, tag=9)
                w.wait()
                sender = w._source_rank()
            else:
                sender = dist.recv(got, tag=9)
            senders.append(sender)
            ck.check(got.eq(float(sender)).all(), "payload", f"from {sender}: {got}")
        ck.check(sorted(senders) == list(range(1, N)), "senders", f"{senders}")
    else:
        dist.send(torch.full((5,), float(R)), 0, tag=9)
        ck.check(True)


def case_monitored_barrier(ck: Checks):
    """gloo's monitored barrier: passes when everyone comes; otherwise rank 0 names who did not,
    the others are told; a late arrival of a failed barrier cannot pass a later one. Rank 0 waits
    2 s (the ranks meant to arrive do, even on a loaded machine); the late rank comes only after
    rank 0 gave up."""
    dist.monitored_barrier(timeout=timedelta(seconds=10))
    dist.monitored_barrier(timeout=10.0, wait_all_ranks=True)
    ck.check(True)
    late = N - 1
    if R == 0:
        ck.raises(
            dist.DistBackendError,
            lambda: dist.monitored_barrier(timeout=2.0),
            f"[Rank 0]: Rank {late} failed to pass monitoredBarrier in 2000 ms",
        )
    elif R != late:
        ck.raises(
            dist.DistBackendError,
            lambda: dist.monitored_barrier(timeout=2.0),
            f"Rank {R} successfully reached monitoredBarrier",
            "did not arrive",
        )
    dist.barrier()
    if R == late:  # after rank 0 gave up: no verdict comes, and its arrival stays behind
        ck.raises(
            dist.DistBackendError,
            lambda: dist.monitored_barrier(timeout=0.1),
            f"Rank {late} successfully reached monitoredBarrier",
            "no verdict",
        )
    dist.barrier()
    dist.monitored_barrier(timeout=10.0)  # the late arrival has its own call's tag
    if R == 0:  # rank `late` stays away: its stale arrival must not stand in for it
        ck.raises(
            dist.DistBackendError,
            lambda: dist.monitored_barrier(timeout=2.0, wait_all_ranks=True),
            f"Ranks {late} failed to pass monitoredBarrier in 2000 ms",
        )
    elif R != late:
        ck.raises(dist.DistBackendError, lambda: dist.monitored_barrier(timeout=2.0), "successfully reached")
    dist.barrier()
    if R == 0:
        ck.raises(
            dist.DistBackendError,
            lambda: PG.monitored_barrier(timedelta(0)),
            "Rank 0 timed out in monitoredBarrier after 0 ms",
        )


def case_failed_p2p_breaks_the_channel(ck: Checks):
    """A recv that timed out leaves its peer's late message unmatched forever: later send/recv
    on that group raise BrokenError; the group's collectives and other groups go on."""
    sub = dist.new_group([0, 1], timeout=timedelta(seconds=0.5))
    t = torch.zeros(4)
    if R == 0:
        ck.raises(
            zcoll.TimeoutError, lambda: dist.recv(t, 1, group=sub, tag=3), "recv from rank 1", "timed out"
        )
    dist.barrier()
    if R == 1:
        dist.send(torch.ones(4), 0, group=sub, tag=3)  # late: eager, so it completes here
    dist.barrier()
    if R == 0:
        ck.raises(
            zcoll.BrokenError, lambda: dist.recv(t, 1, group=sub, tag=3), "point-to-point channel broke"
        )
        ck.check(t.eq(0).all(), "the late message was never received", f"{t}")
    if R in (0, 1):
        u = torch.ones(2)
        dist.all_reduce(u, group=sub)
        ck.check(u.eq(2).all(), "collectives go on", f"{u}")
    ck.check(True)
    dist.destroy_process_group(sub)


def case_work_wait_timeout_gives_up_a_recv(ck: Checks):
    """Work.wait(timeout) on a recv that nothing will match: raises in time, cancels the receive
    and breaks the group's point-to-point channel."""
    sub = dist.new_group([0, 1])
    if R == 0:
        w = dist.irecv(torch.zeros(2), 1, group=sub, tag=6)
        start = time.monotonic()
        ck.raises(
            zcoll.TimeoutError, lambda: w.wait(timedelta(seconds=0.3)), "Work.wait(timeout=0.3 s) expired"
        )
        ck.check(time.monotonic() - start < 3, "gave up in time", f"{time.monotonic() - start:.1f} s")
        ck.raises(
            zcoll.BrokenError, lambda: dist.send(torch.ones(2), 1, group=sub), "point-to-point channel broke"
        )
    ck.check(True)
    dist.barrier()
    dist.destroy_process_group(sub)


def case_broken_group_refuses_all_to_all(ck: Checks):
    """After a collective of a group failed, its all-to-all (mpi4py, tag 0) refuses to run: a
    message of the failed call could still arrive and be matched."""
    sub = dist.new_group([0, 1], timeout=timedelta(seconds=0.5))
    if R == 0:
        ck.raises(zcoll.TimeoutError, lambda: dist.barrier(group=sub), "timed out", "the timeout of")
        out, inp = torch.empty(2), torch.ones(2)
        ck.raises(
            zcoll.BrokenError,
            lambda: dist.all_to_all_single(out, inp, group=sub),
            "all_to_all_single",
            "earlier collective failed",
        )
    ck.check(True)
    dist.barrier()
    dist.destroy_process_group(sub)


def case_truncated_recv_is_explained(ck: Checks):
    """MPI's bare 'message truncated' comes back as what happened: which receive, which peer."""
    sub = dist.new_group([0, 1])
    if R == 0:
        dist.send(torch.ones(8), 1, group=sub, tag=4)
    elif R == 1:
        ck.raises(
            zcoll.ZcollError,
            lambda: dist.recv(torch.empty(4), 0, group=sub, tag=4),
            "recv from rank 0 (tag 4)",
            "smaller receive buffer",
            "another operation",
        )
    ck.check(True)
    dist.barrier()
    dist.destroy_process_group(sub)


if __name__ == "__main__":
    run_cases(globals(), teardown=dist.destroy_process_group)
