"""Helpers of the TensorFlow tests: rank-dependent inputs that every rank can rebuild for every
other rank (so each computes the expected result itself), both ways of running an op (eagerly
and inside tf.function), and comparisons."""

import numpy as np
import tensorflow as tf

import khor.tensorflow as hvd

DTYPES = [tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32,
          tf.float64]
FLOATS = [tf.float16, tf.bfloat16, tf.float32, tf.float64]
MODES = ["eager", "function"]
# inside tf.function, what differs from eager is naming and static shapes, not the kernel:
# these dtypes are run both ways, the others eagerly only (it keeps the n = 4 run short)
FUNCTION_DTYPES = (tf.uint8, tf.float16, tf.float32, tf.int64, tf.bool)


def dtype_modes(dtypes):
    """(dtype, mode) pairs for parametrize: every dtype eagerly, some in tf.function."""
    import pytest
    return [pytest.param(d, m, id="%s-%s" % (d.name, m)) for d in dtypes for m in MODES
            if m == "eager" or d in FUNCTION_DTYPES]


def rank_size():
    return hvd.rank(), hvd.size()


def contrib(k, shape, dtype, salt=0, lo=1, hi=7):
    """Rank k's input as numpy float64: small integers in [lo, hi) laid out by position, rank
    and salt, exact in every dtype (bool: their parity)."""
    n = int(np.prod(shape)) if shape else 1
    v = (np.arange(n) * 3 + k * 5 + salt * 7) % (hi - lo) + lo
    v = v.reshape(shape).astype(np.float64)
    if dtype == tf.bool:
        return (v % 2).astype(bool)
    return v


def tensor(k, shape, dtype, salt=0, lo=1, hi=7):
    return tf.cast(tf.constant(contrib(k, shape, dtype, salt, lo, hi)), dtype)


def run(mode, fn, *args):
    """fn(*args) eagerly, or traced into a fresh tf.function."""
    if mode == "eager":
        return fn(*args)
    return tf.function(fn)(*args)


def assert_close(actual, expected, dtype, what=""):
    a = tf.cast(actual, tf.float64).numpy() if dtype != tf.bool else actual.numpy()
    e = np.asarray(expected)
    assert actual.dtype == dtype, "%s: dtype %s, want %s" % (what, actual.dtype, dtype)
    assert a.shape == e.shape, "%s: shape %s, want %s" % (what, a.shape, e.shape)
    if dtype in FLOATS:
        tol = {tf.float16: 2e-3, tf.bfloat16: 1.6e-2, tf.float32: 1e-5, tf.float64: 1e-12}[dtype]
        np.testing.assert_allclose(a, e, rtol=tol, atol=tol, err_msg=what)
    else:
        np.testing.assert_array_equal(a, e, err_msg=what)


def split_rows(d0, n, r):
    """reducescatter's rows for rank r of n: (offset, count); the first d0 % n get one more."""
    base, extra = divmod(d0, n)
    return r * base + min(r, extra), base + (1 if r < extra else 0)


def even_odd_ranks(n):
    return [k for k in range(n) if k % 2 == 0], [k for k in range(n) if k % 2 == 1]
