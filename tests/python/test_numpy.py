"""khor's own numpy collectives (no torch needed): allreduce with every op, dtype and the
scale factors, async with poll/synchronize, in place, non-contiguous input; allgather with
dim 0 differing per rank; broadcast from each root; alltoall with uneven splits;
reducescatter with uneven dim 0; barrier; join; errors."""

import time

import pytest

np = pytest.importorskip("numpy", reason="khor's array collectives need numpy")

import khor  # noqa: E402
from khortest import even_odd_ranks, int16_param, rank_size, split_rows  # noqa: E402

DTYPES = [np.uint8, np.int8, int16_param(np.int16), np.int32, np.int64, np.float16, np.float32,
          np.float64]
OPS = {"sum": khor.Sum, "average": khor.Average, "min": khor.Min, "max": khor.Max,
       "product": khor.Product}


def contrib(k, shape, dtype, salt=0, lo=1, hi=7):
    n = int(np.prod(shape)) if len(shape) else 1
    v = (np.arange(n, dtype=np.int64) * 3 + k * 5 + salt * 7) % (hi - lo) + lo
    v = v.reshape(shape)
    if dtype == np.bool_:
        return (v % 2).astype(np.bool_)
    return v.astype(dtype)


def reference(op, inputs, dtype, pre=1.0, post=1.0):
    n = len(inputs)
    isfloat = np.issubdtype(np.dtype(dtype), np.floating)
    stack = np.stack([a.astype(np.float64 if isfloat else np.int64) for a in inputs])
    if isfloat:
        stack = stack * pre
    if op == "sum":
        out = stack.sum(0)
    elif op == "average":
        out = stack.sum(0) / n if isfloat else stack.sum(0) // n
    elif op == "min":
        out = stack.min(0)
    elif op == "max":
        out = stack.max(0)
    else:
        out = stack.prod(0)
    if isfloat:
        out = out * post
    return out.astype(dtype)


def check(actual, expected, what=""):
    assert actual.dtype == expected.dtype, "%s: dtype %s want %s" % (what, actual.dtype,
                                                                    expected.dtype)
    assert actual.shape == expected.shape, "%s: shape %s want %s" % (what, actual.shape,
                                                                    expected.shape)
    if np.issubdtype(actual.dtype, np.floating):
        tol = 2e-3 if actual.dtype == np.float16 else 1e-6
        np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64),
                                   rtol=tol, atol=tol, err_msg=what)
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=what)


def test_rank_and_size():
    r, n = rank_size()
    assert 0 <= r < n
    assert khor.is_initialized()
    assert 0 <= khor.local_rank() < khor.local_size()
    ranks = khor.allgather(np.array([r], np.int64))
    assert ranks.tolist() == list(range(n))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", list(OPS))
def test_allreduce(op, dtype):
    r, n = rank_size()
    shape = (3, 5)
    hi = 4 if op == "product" else 7      # 3**4 fits int8
    out = khor.allreduce(contrib(r, shape, dtype, hi=hi), op=OPS[op], name="np.ar.%s" % op)
    check(out, reference(op, [contrib(k, shape, dtype, hi=hi) for k in range(n)], dtype),
          "%s %s" % (op, np.dtype(dtype).name))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", ["sum", "average", "max"])
def test_allreduce_scale_factors(op, dtype):
    r, n = rank_size()
    out = khor.allreduce(contrib(r, (7,), dtype), op=OPS[op], prescale_factor=0.5,
                         postscale_factor=3.0)
    check(out, reference(op, [contrib(k, (7,), dtype) for k in range(n)], dtype, 0.5, 3.0))


def test_allreduce_default_op_is_average():
    r, n = rank_size()
    out = khor.allreduce(contrib(r, (4,), np.float64))
    check(out, reference("average", [contrib(k, (4,), np.float64) for k in range(n)],
                         np.float64))


def test_allreduce_async_poll_inplace_noncontiguous():
    r, n = rank_size()
    a = contrib(r, (6,), np.float32)
    h1 = khor.allreduce_async(a, op=khor.Sum, name="np.async.1", inplace=True)
    base = contrib(r, (4, 6), np.float64)
    view = base[:, ::2]                     # not C-contiguous: copied first
    h2 = khor.allreduce_async(view, op=khor.Max, name="np.async.2")
    deadline = time.time() + 30
    while not (khor.poll(h1) and khor.poll(h2)) and time.time() < deadline:
        time.sleep(0.001)
    res1 = khor.synchronize(h1)
    res2 = khor.synchronize(h2)
    assert res1 is a
    check(a, reference("sum", [contrib(k, (6,), np.float32) for k in range(n)], np.float32))
    check(res2, reference("max", [contrib(k, (4, 6), np.float64)[:, ::2] for k in range(n)],
                          np.float64))
    with pytest.raises(ValueError):
        khor.synchronize(h1)


def test_allreduce_scalar_and_empty():
    r, n = rank_size()
    s = khor.allreduce(np.array(r + 1, np.int64), op=khor.Sum)
    e = khor.allreduce(np.zeros((0, 3), np.float32), op=khor.Sum)
    assert s.shape == () and int(s) == n * (n + 1) // 2
    assert e.shape == (0, 3) and e.dtype == np.float32


@pytest.mark.parametrize("dtype", DTYPES + [np.bool_], ids=lambda d: np.dtype(d).name)
def test_allgather_uneven(dtype):
    r, n = rank_size()
    out = khor.allgather(contrib(r, (r + 1, 3), dtype))
    check(out, np.concatenate([contrib(k, (k + 1, 3), dtype) for k in range(n)]))


def test_allgather_async():
    r, n = rank_size()
    h = khor.allgather_async(np.full((2,), r, np.int32), name="np.ag.async")
    out = khor.synchronize(h)
    check(out, np.repeat(np.arange(n, dtype=np.int32), 2))


@pytest.mark.parametrize("dtype", [np.uint8, int16_param(np.int16), np.float32, np.float64,
                                   np.bool_],
                         ids=lambda d: np.dtype(d).name)
def test_broadcast_each_root(dtype):
    r, n = rank_size()
    results = []
    for root in range(n):
        a = contrib(r, (2, 5), dtype)
        out = khor.broadcast(a, root, name="np.bc.%d" % root)
        results.append((root, a, out))
    for root, a, out in results:
        check(out, contrib(root, (2, 5), dtype), "root %d" % root)
        check(a, contrib(r, (2, 5), dtype), "input left alone")


def test_broadcast_async():
    r, n = rank_size()
    h = khor.broadcast_async(np.full(3, r, np.int64), n - 1)
    check(khor.synchronize(h), np.full(3, n - 1, np.int64))


def _a2a_splits(src, n):
    return [(src + j) % 3 for j in range(n)]  # includes zeros


def _a2a_rows(src, dst, count):
    return np.array([[100 * src + 10 * dst + i, -i] for i in range(count)],
                    np.int32).reshape(count, 2)


def test_alltoall_uneven():
    r, n = rank_size()
    sp = _a2a_splits(r, n)
    send = np.concatenate([_a2a_rows(r, j, sp[j]) for j in range(n)])
    out, rsplits = khor.alltoall(send, splits=sp)
    want_splits = [_a2a_splits(k, n)[r] for k in range(n)]
    want = np.concatenate([_a2a_rows(k, r, want_splits[k]) for k in range(n)])
    assert list(rsplits) == want_splits
    check(out, want)


def test_alltoall_even():
    r, n = rank_size()
    send = np.arange(2 * n, dtype=np.float64) + 100 * r
    out, rsplits = khor.alltoall(send)
    assert list(rsplits) == [2] * n
    want = np.concatenate([np.arange(2 * r, 2 * r + 2) + 100 * k for k in range(n)])
    check(out, want.astype(np.float64))


@pytest.mark.parametrize("op", ["sum", "average", "min", "max"])
def test_reducescatter_uneven(op):
    r, n = rank_size()
    d0 = 2 * n + 1
    out = khor.reducescatter(contrib(r, (d0, 3), np.float32), op=OPS[op])
    full = reference(op, [contrib(k, (d0, 3), np.float32) for k in range(n)], np.float32)
    off, cnt = split_rows(d0, n, r)
    check(out, full[off:off + cnt])


def test_reducescatter_scale_factors():
    r, n = rank_size()
    d0 = n + 1
    out = khor.reducescatter(contrib(r, (d0, 2), np.float64), op=khor.Sum,
                             prescale_factor=0.25, postscale_factor=2.0)
    full = reference("sum", [contrib(k, (d0, 2), np.float64) for k in range(n)], np.float64,
                     0.25, 2.0)
    off, cnt = split_rows(d0, n, r)
    check(out, full[off:off + cnt])


def test_barrier_waits_for_everyone():
    r, n = rank_size()
    if r == 0:
        time.sleep(0.3)
    t0 = time.time()
    khor.barrier()
    waited = time.time() - t0
    waits = khor.allgather(np.array([waited]))
    if n > 1:
        assert min(waits[1:]) > 0.2, waits


@pytest.mark.parametrize("worker", ["first", "last"])
def test_join(worker):
    r, n = rank_size()
    w = 0 if worker == "first" else n - 1
    if r == w:
        s = khor.allreduce(np.full(3, r + 1.0), op=khor.Sum, name="np.join.sum")
        a = khor.allreduce(np.full(3, r + 1.0), op=khor.Average, name="np.join.avg")
    last = khor.join()
    lasts = khor.allgather(np.array([last], np.int64))
    assert lasts.tolist() == [w] * n
    if r == w:
        check(s, np.full(3, w + 1.0))
        check(a, np.full(3, (w + 1.0) / n))


def test_errors_raise_everywhere():
    r, n = rank_size()
    if n == 1:
        pytest.skip("a mismatch needs two ranks")
    with pytest.raises(khor.KhorError, match="np.err.shape"):
        khor.allreduce(np.ones(3 + r, np.float32), name="np.err.shape")
    with pytest.raises(khor.KhorError, match="np.err.dtype"):
        khor.allreduce(np.ones(3, np.float32 if r % 2 else np.float64), name="np.err.dtype")
    # The job still works afterwards.
    check(khor.allreduce(np.ones(2), op=khor.Sum), np.full(2, float(n)))


def test_local_errors():
    with pytest.raises(NotImplementedError):
        khor.allreduce(np.ones(3), op=khor.Adasum)
    with pytest.raises(TypeError):
        khor.allreduce(np.ones(3, np.complex64))
    with pytest.raises(ValueError):
        khor.allreduce(np.ones(3), op=99)


def test_process_sets():
    r, n = rank_size()
    if n < 2:
        pytest.skip("needs two ranks")
    even, odd = even_odd_ranks(n)
    es = khor.add_process_set(even)
    os_ = khor.add_process_set(khor.ProcessSet(odd))
    mine, members = (es, even) if r % 2 == 0 else (os_, odd)
    s = khor.allreduce(contrib(r, (3,), np.int64), op=khor.Sum, process_set=mine)
    g = khor.allgather(contrib(r, (r + 1,), np.float32), process_set=mine)
    rs = khor.reducescatter(contrib(r, (len(members) + 1,), np.float64), op=khor.Sum,
                            process_set=mine)
    khor.barrier(process_set=mine)
    removed = (khor.remove_process_set(os_), khor.remove_process_set(es))
    check(s, sum(contrib(k, (3,), np.int64) for k in members))
    check(g, np.concatenate([contrib(k, (k + 1,), np.float32) for k in members]))
    off, cnt = split_rows(len(members) + 1, len(members), members.index(r))
    check(rs, sum(contrib(k, (len(members) + 1,), np.float64) for k in members)[off:off + cnt])
    assert removed == (True, True)


def test_broadcast_on_process_set_root_is_global_rank():
    r, n = rank_size()
    if n < 2:
        pytest.skip("needs two ranks")
    even, odd = even_odd_ranks(n)
    es, os_ = khor.add_process_set(even), khor.add_process_set(odd)
    mine, members = (es, even) if r % 2 == 0 else (os_, odd)
    bad = []
    for root in members:
        try:
            out = khor.broadcast(np.full(2, r, np.int32), root, process_set=mine)
            if out.tolist() != [root, root]:
                bad.append("rank %d root %d: got %s" % (r, root, out.tolist()))
        except khor.KhorError as e:
            bad.append("rank %d root %d: %s" % (r, root, e))
    khor.remove_process_set(os_)
    khor.remove_process_set(es)
    nbad = khor.allreduce(np.array([len(bad)], np.int64), op=khor.Sum)  # all ranks agree
    assert nbad[0] == 0, bad
