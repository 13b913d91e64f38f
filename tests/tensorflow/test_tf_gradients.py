"""The gradients khor.tensorflow registers, against Horovod's rules, eagerly and inside
tf.function: allreduce (the allreduce of the gradient, same op and factors), allgather (the
average of the gradients, this rank's rows), broadcast (the average on the root, zeros
elsewhere), alltoall (sent back along the received splits), reducescatter (the allgather of
the gradient, times the set's size for Sum and the factors), and the grouped forms. Each
rank's output gradient differs, so that a rule that skips the reduction fails."""

import numpy as np
import pytest
import tensorflow as tf

import khor.tensorflow as hvd
from tftest import MODES, rank_size, split_rows


def grad_of(mode, fn, xs, gys):
    """d(fn(xs)) / d(xs) with output gradients gys (lists), eagerly or in a tf.function."""
    def g(xs, gys):
        with tf.GradientTape() as tape:
            for x in xs:
                tape.watch(x)
            ys = fn(*xs)
        return tape.gradient(ys, xs, output_gradients=gys)
    if mode == "function":
        g = tf.function(g)
    return [t.numpy() for t in g(list(xs), list(gys))]


def gy(k, shape, salt=0):
    """rank k's output gradient"""
    return (np.arange(int(np.prod(shape))).reshape(shape) + 10 * k + salt).astype(np.float64)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=["sum", "average"])
def test_allreduce_grad(op, mode):
    r, n = rank_size()
    x = tf.ones([2, 3], tf.float64)
    (dx,) = grad_of(mode, lambda x: hvd.allreduce(x, op=op, prescale_factor=2.0,
                                                  postscale_factor=0.5), [x],
                    [tf.constant(gy(r, [2, 3]))])
    want = sum(2.0 * gy(k, [2, 3]) for k in range(n)) * 0.5
    np.testing.assert_allclose(dx, want / (n if op == hvd.Average else 1))


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allreduce_grad(mode):
    r, n = rank_size()
    xs = [tf.ones([3], tf.float32), tf.ones([2, 2], tf.float32)]
    dxs = grad_of(mode, lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Sum), xs,
                  [tf.constant(gy(r, [3]), tf.float32),
                   tf.constant(gy(r, [2, 2], 1), tf.float32)])
    np.testing.assert_allclose(dxs[0], sum(gy(k, [3]) for k in range(n)))
    np.testing.assert_allclose(dxs[1], sum(gy(k, [2, 2], 1) for k in range(n)))


@pytest.mark.parametrize("mode", MODES)
def test_allgather_grad(mode):
    """Rank k gives k + 1 rows."""
    r, n = rank_size()
    total = n * (n + 1) // 2
    (dx,) = grad_of(mode, hvd.allgather, [tf.ones([r + 1, 2], tf.float64)],
                    [tf.constant(gy(r, [total, 2]))])
    avg = sum(gy(k, [total, 2]) for k in range(n)) / n
    off = r * (r + 1) // 2
    np.testing.assert_allclose(dx, avg[off:off + r + 1])


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allgather_grad(mode):
    r, n = rank_size()
    dxs = grad_of(mode, lambda a, b: hvd.grouped_allgather([a, b]),
                  [tf.ones([r + 1], tf.float64), tf.ones([1, 3], tf.float64)],
                  [tf.constant(gy(r, [n * (n + 1) // 2])), tf.constant(gy(r, [n, 3], 2))])
    off = r * (r + 1) // 2
    np.testing.assert_allclose(dxs[0], (sum(gy(k, [n * (n + 1) // 2]) for k in range(n)) /
                                        n)[off:off + r + 1])
    np.testing.assert_allclose(dxs[1], (sum(gy(k, [n, 3], 2) for k in range(n)) / n)[r:r + 1])


@pytest.mark.parametrize("mode", MODES)
def test_broadcast_grad(mode):
    r, n = rank_size()
    root = n - 1
    (dx,) = grad_of(mode, lambda x: hvd.broadcast(x, root), [tf.ones([4], tf.float64)],
                    [tf.constant(gy(r, [4]))])
    want = sum(gy(k, [4]) for k in range(n)) / n if r == root else np.zeros(4)
    np.testing.assert_allclose(dx, want)


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_grad(mode):
    """Rank k sends j + 1 rows to rank j; the gradient of what rank r received from rank k
    goes back to rank k, into the rows it sent."""
    r, n = rank_size()
    splits = [j + 1 for j in range(n)]
    d0 = sum(splits)
    (dx,) = grad_of(mode, lambda x: hvd.alltoall(x, splits=tf.constant(splits))[0],
                    [tf.ones([d0, 2], tf.float64)], [tf.constant(gy(r, [n * (r + 1), 2]))])
    # rank j's output gradient holds, at rows [k * (j + 1), (k + 1) * (j + 1)), the gradient
    # of the rows rank k sent it
    want = np.concatenate([gy(j, [n * (j + 1), 2])[r * (j + 1):(r + 1) * (j + 1)]
                           for j in range(n)])
    np.testing.assert_allclose(dx, want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=["sum", "average"])
def test_reducescatter_grad(op, mode):
    """Horovod's rule: allgather of the gradient, times the set's size for Sum."""
    r, n = rank_size()
    d0 = 2 * n + 1
    cnt = split_rows(d0, n, r)[1]
    (dx,) = grad_of(mode, lambda x: hvd.reducescatter(x, op=op), [tf.ones([d0, 2], tf.float64)],
                    [tf.constant(gy(r, [cnt, 2]))])
    want = np.concatenate([gy(k, [split_rows(d0, n, k)[1], 2]) for k in range(n)])
    np.testing.assert_allclose(dx, want * (n if op == hvd.Sum else 1))


@pytest.mark.parametrize("mode", MODES)
def test_grouped_reducescatter_grad(mode):
    r, n = rank_size()
    dxs = grad_of(mode, lambda a, b: hvd.grouped_reducescatter([a, b], op=hvd.Average),
                  [tf.ones([n, 2], tf.float64), tf.ones([n], tf.float64)],
                  [tf.constant(gy(r, [1, 2])), tf.constant(gy(r, [1], 5))])
    np.testing.assert_allclose(dxs[0], np.concatenate([gy(k, [1, 2]) for k in range(n)]))
    np.testing.assert_allclose(dxs[1], np.concatenate([gy(k, [1], 5) for k in range(n)]))
