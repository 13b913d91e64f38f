"""khor.tensorflow's collectives, eagerly and inside tf.function, over every dtype Horovod
takes for them: allreduce (Sum, Average, Min, Max, Product, scale factors), grouped_allreduce,
allgather (uneven and empty dim 0), grouped_allgather, broadcast (every root), alltoall (even
and given splits, int32 and int64), reducescatter (uneven rows), grouped_reducescatter, join,
barrier; static shapes inside tf.function; ops that ranks trace in different orders."""

import numpy as np
import pytest
import tensorflow as tf

import khor.tensorflow as hvd
from tftest import (DTYPES, FLOATS, MODES, assert_close, contrib, dtype_modes, rank_size, run,
                    split_rows, tensor)

INTS = [tf.uint8, tf.int8, tf.int32, tf.int64]


@pytest.mark.parametrize("dtype,mode", dtype_modes(DTYPES))
def test_allreduce_sum(dtype, mode):
    r, n = rank_size()
    shape = [3, 4]
    got = run(mode, lambda x: hvd.allreduce(x, op=hvd.Sum), tensor(r, shape, dtype))
    assert_close(got, sum(contrib(k, shape, dtype) for k in range(n)), dtype, "sum")


@pytest.mark.parametrize("dtype,mode", dtype_modes([tf.int32, tf.int64] + FLOATS))
def test_allreduce_average(dtype, mode):
    """Average is the default op; integers truncate toward zero."""
    r, n = rank_size()
    got = run(mode, hvd.allreduce, tensor(r, [5], dtype))
    want = sum(contrib(k, [5], dtype) for k in range(n)) / n
    if dtype in INTS:
        want = np.trunc(want)
    assert_close(got, want, dtype, "average")


@pytest.mark.parametrize("op,np_fn", [(hvd.Min, np.minimum.reduce), (hvd.Max, np.maximum.reduce),
                                      (hvd.Product, np.multiply.reduce)],
                         ids=["min", "max", "product"])
@pytest.mark.parametrize("dtype,mode", dtype_modes([tf.int32, tf.int64, tf.float32, tf.float64]))
def test_allreduce_min_max_product(dtype, op, np_fn, mode):
    r, n = rank_size()
    got = run(mode, lambda x: hvd.allreduce(x, op=op), tensor(r, [6], dtype, lo=1, hi=3))
    want = np_fn([contrib(k, [6], dtype, lo=1, hi=3) for k in range(n)])
    assert_close(got, want, dtype, "op %d" % op)


@pytest.mark.parametrize("dtype,mode", dtype_modes([tf.int32, tf.int64, tf.float32, tf.float64,
                                                   tf.float16]))
def test_allreduce_scale_factors(dtype, mode):
    """Horovod scales integers too (through float64, truncated back)."""
    r, n = rank_size()
    got = run(mode, lambda x: hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0,
                                            postscale_factor=0.25), tensor(r, [4], dtype))
    want = sum(2.0 * contrib(k, [4], dtype) for k in range(n)) * 0.25
    if dtype in INTS:
        want = np.trunc(want)
    assert_close(got, want, dtype, "scaled")
    got = run(mode, lambda x: hvd.allreduce(x, op=hvd.Average, postscale_factor=3.0),
              tensor(r, [4], dtype))
    want = sum(contrib(k, [4], dtype) for k in range(n)) * 3.0 / n
    if dtype in INTS:
        want = np.trunc(want)
    assert_close(got, want, dtype, "average scaled")


@pytest.mark.parametrize("mode", MODES)
def test_allreduce_scalar_and_empty(mode):
    r, n = rank_size()
    got = run(mode, lambda a, b: (hvd.allreduce(a, op=hvd.Sum), hvd.allreduce(b, op=hvd.Sum)),
              tf.constant(float(r)), tf.zeros([0, 3]))
    assert got[0].numpy() == sum(range(n)) and got[0].shape == []
    assert got[1].shape == [0, 3]


@pytest.mark.parametrize("dtype,mode", dtype_modes([tf.int32, tf.float32, tf.float64]))
def test_grouped_allreduce(dtype, mode):
    r, n = rank_size()
    shapes = [[3], [2, 2], [1]]
    got = run(mode, lambda *xs: hvd.grouped_allreduce(list(xs), op=hvd.Sum),
              *[tensor(r, s, dtype, salt=i) for i, s in enumerate(shapes)])
    assert len(got) == 3
    for i, (g, s) in enumerate(zip(got, shapes)):
        assert_close(g, sum(contrib(k, s, dtype, salt=i) for k in range(n)), dtype, "t%d" % i)


def test_grouped_allreduce_mixed_dtypes_and_empty():
    """Horovod's grouped op takes one dtype; khor splits a mixed list into one op per
    dtype and keeps the order."""
    r, n = rank_size()
    assert hvd.grouped_allreduce([]) == []
    got = hvd.grouped_allreduce([tf.constant([r], tf.int32), tf.constant([1.5]),
                                 tf.constant([2], tf.int32)], op=hvd.Sum)
    assert [g.dtype for g in got] == [tf.int32, tf.float32, tf.int32]
    assert got[0].numpy().tolist() == [sum(range(n))]
    assert got[1].numpy().tolist() == [1.5 * n] and got[2].numpy().tolist() == [2 * n]


@pytest.mark.parametrize("dtype,mode", dtype_modes(DTYPES + [tf.bool]))
def test_allgather(dtype, mode):
    """Rank k gives k + 1 rows (rank 0 none when there are several ranks)."""
    r, n = rank_size()
    rows = lambda k: (k + 1) if n == 1 or k > 0 else 0  # noqa: E731
    got = run(mode, hvd.allgather, tensor(r, [rows(r), 3], dtype))
    want = np.concatenate([contrib(k, [rows(k), 3], dtype) for k in range(n)])
    assert_close(got, want, dtype, "allgather")


def test_allgather_static_shape_in_function():
    seen = {}

    @tf.function
    def f(x):
        out = hvd.allgather(x)
        seen["shape"] = out.shape.as_list()
        return out
    f(tf.ones([2, 5]))
    assert seen["shape"] == [None, 5]


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allgather(mode):
    r, n = rank_size()
    got = run(mode, lambda a, b: hvd.grouped_allgather([a, b]),
              tensor(r, [r + 1, 2], tf.float32), tensor(r, [1], tf.float32, salt=1))
    assert_close(got[0], np.concatenate([contrib(k, [k + 1, 2], tf.float32)
                                         for k in range(n)]), tf.float32, "t0")
    assert_close(got[1], np.concatenate([contrib(k, [1], tf.float32, salt=1)
                                         for k in range(n)]), tf.float32, "t1")


@pytest.mark.parametrize("dtype,mode", dtype_modes(DTYPES + [tf.bool]))
def test_broadcast(dtype, mode):
    r, n = rank_size()
    for root in range(n):
        got = run(mode, lambda x: hvd.broadcast(x, root), tensor(r, [2, 3], dtype))
        assert_close(got, contrib(root, [2, 3], dtype), dtype, "root %d" % root)


@pytest.mark.parametrize("dtype,mode", dtype_modes(DTYPES + [tf.bool]))
def test_alltoall_even(dtype, mode):
    """Without splits, dim 0 divides evenly: rank k sends rows [2j, 2j + 2) to rank j, and the
    received splits are not returned (Horovod's return)."""
    r, n = rank_size()
    got = run(mode, hvd.alltoall, tensor(r, [2 * n, 3], dtype))
    assert not isinstance(got, tuple)
    want = np.concatenate([contrib(k, [2 * n, 3], dtype)[2 * r:2 * r + 2] for k in range(n)])
    assert_close(got, want, dtype, "alltoall")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("splits_dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("dtype", [tf.uint8, tf.int64, tf.float16, tf.float32])
def test_alltoall_splits(dtype, splits_dtype, mode):
    """Rank k sends j + 1 rows to rank j (the first rows of its tensor in rank order, and a
    spare row it keeps); the received splits say k + ... how many came from each."""
    r, n = rank_size()
    splits = [j + 1 for j in range(n)]
    d0 = sum(splits) + 1
    out, rs = run(mode, lambda x, s: hvd.alltoall(x, splits=s), tensor(r, [d0, 2], dtype),
                  tf.constant(splits, splits_dtype))
    off = sum(splits[:r])
    want = np.concatenate([contrib(k, [d0, 2], dtype)[off:off + r + 1] for k in range(n)])
    assert_close(out, want, dtype, "alltoall")
    assert rs.dtype == splits_dtype and rs.numpy().tolist() == [r + 1] * n


@pytest.mark.parametrize("dtype,mode", dtype_modes(DTYPES))
def test_reducescatter(dtype, mode):
    """d0 = 2n + 1 rows: rank 0 gets one more. Sum, and Average (the default; integers
    truncate)."""
    r, n = rank_size()
    d0 = 2 * n + 1
    off, cnt = split_rows(d0, n, r)
    total = sum(contrib(k, [d0, 3], dtype) for k in range(n))
    got = run(mode, lambda x: hvd.reducescatter(x, op=hvd.Sum), tensor(r, [d0, 3], dtype))
    assert_close(got, total[off:off + cnt], dtype, "sum")
    got = run(mode, hvd.reducescatter, tensor(r, [d0, 3], dtype))
    want = total[off:off + cnt] / n
    assert_close(got, np.trunc(want) if dtype in INTS else want, dtype, "average")


def test_reducescatter_static_shape_in_function():
    r, n = rank_size()
    seen = {}

    @tf.function
    def f(x):
        out = hvd.reducescatter(x, op=hvd.Sum)
        seen["shape"] = out.shape.as_list()
        return out
    f(tf.ones([2 * n + 1, 4]))
    assert seen["shape"] == [split_rows(2 * n + 1, n, r)[1], 4]


@pytest.mark.parametrize("mode", MODES)
def test_grouped_reducescatter(mode):
    r, n = rank_size()
    got = run(mode, lambda a, b: hvd.grouped_reducescatter([a, b], op=hvd.Sum),
              tensor(r, [n, 2], tf.float32), tensor(r, [3 * n + 2], tf.float32, salt=1))
    for i, (g, d0, shape) in enumerate(zip(got, [n, 3 * n + 2], [[n, 2], [3 * n + 2]])):
        off, cnt = split_rows(d0, n, r)
        total = sum(contrib(k, shape, tf.float32, salt=i) for k in range(n))
        assert_close(g, total[off:off + cnt], tf.float32, "t%d" % i)


@pytest.mark.parametrize("mode", MODES)
def test_different_order_per_rank(mode):
    """Ranks write two collectives in opposite orders: the async kernels and negotiation by
    name finish both (a stateful op would be ordered as written and deadlock)."""
    r, n = rank_size()

    def f(a, b):
        if r % 2 == 0:
            x = hvd.allreduce(a, op=hvd.Sum, name="order_a")
            y = hvd.allgather(b, name="order_b")
        else:
            y = hvd.allgather(b, name="order_b")
            x = hvd.allreduce(a, op=hvd.Sum, name="order_a")
        return x, y
    if mode == "eager":
        pytest.skip("eager ops run in program order: opposite orders would wait")
    x, y = run(mode, f, tf.ones([3]), tf.fill([1], float(r)))
    assert x.numpy().tolist() == [float(n)] * 3
    assert y.numpy().tolist() == [float(k) for k in range(n)]


def test_join_and_barrier():
    r, n = rank_size()
    hvd.barrier()
    last = hvd.join()
    assert last.dtype == tf.int32 and last.shape == []
    assert 0 <= int(last) < n
    assert hvd.allgather(tf.reshape(last, [1])).numpy().tolist() == [int(last)] * n


def test_join_and_barrier_in_function():
    """Join and barrier are stateful, so a tf.function keeps them though nothing uses their
    result."""
    r, n = rank_size()

    @tf.function
    def f():
        hvd.barrier()
        return hvd.join()
    last = f()
    assert 0 <= int(last) < n


def test_join_lets_others_allreduce():
    """Rank 0 joins at once; the others allreduce (rank 0 contributes zeros), then join."""
    r, n = rank_size()
    if n < 2:
        pytest.skip("needs two ranks")
    if r == 0:
        last = hvd.join()
    else:
        got = hvd.allreduce(tf.ones([2]), op=hvd.Sum, name="join.ar")
        assert got.numpy().tolist() == [float(n - 1)] * 2
        last = hvd.join()
    assert int(last) != 0


def test_ignore_name_scope():
    """Ranks that trace the op under different name scopes meet when the scope is ignored
    (the engine's name is then the op's own name)."""
    r, n = rank_size()

    @tf.function
    def f(x):
        with tf.name_scope("scope_of_rank_%d" % r):
            return hvd.allreduce(x, op=hvd.Sum, name="scoped_sum", ignore_name_scope=True)
    assert f(tf.ones([2])).numpy().tolist() == [float(n)] * 2


def test_tape_generic_names_under_different_scopes():
    """use_generic_names=True names the gradients' allreduces grad_<i> without scopes, so
    ranks whose variables and scopes are named differently still meet."""
    r, n = rank_size()
    w = tf.Variable([1.0, 1.0], name="w_of_rank_%d" % r)

    @tf.function
    def step():
        with tf.name_scope("tower_%d" % r):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(w * float(r + 1))
            tape = hvd.DistributedGradientTape(tape)
            return tape.gradient(loss, [w], use_generic_names=True)[0]
    np.testing.assert_allclose(step().numpy(), [sum(k + 1 for k in range(n)) / n] * 2)
