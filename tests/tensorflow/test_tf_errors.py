"""khor.tensorflow's errors: tensors that differ across ranks (allreduce shape, dtype and
rank, allgather beyond dim 0, broadcast roots, alltoall, reducescatter) fail on every rank as
tf.errors.FailedPreconditionError naming the tensor, quickly, eagerly and in tf.function,
and the job goes on; arguments the kernel refuses are InvalidArgumentError; ops before init
are FailedPreconditionError; Adasum and unknown ops raise before anything runs; a library
built for another TensorFlow is refused with both versions named."""

import os
import shutil
import time

import pytest
import tensorflow as tf

import khor.tensorflow as hvd
from khor.tensorflow import _oplib
from tftest import MODES, rank_size


def _skip_single():
    if hvd.size() == 1:
        pytest.skip("a mismatch needs two ranks")


def _fails_everywhere(mode, fn, name, exc=tf.errors.FailedPreconditionError):
    t0 = time.time()
    err = None
    try:
        if mode == "function":
            tf.function(fn)()
        else:
            fn()
    except exc as e:
        err = e
    took = time.time() - t0
    raised = hvd.allgather(tf.constant([err is not None]))
    assert raised.numpy().all(), "raised on %s only" % raised.numpy().tolist()
    assert name in str(err), "the message does not name %r: %s" % (name, err)
    assert took < 10, "the error took %.1f s" % took
    n = hvd.size()
    assert hvd.allreduce(tf.ones([2]), op=hvd.Sum).numpy().tolist() == [float(n)] * 2


# case -> (tensor name, the call on rank r)
CASES = {
    "allreduce_shape": ("err.ar.shape", lambda r, nm: hvd.allreduce(tf.ones([3 + r]), name=nm)),
    "allreduce_dtype": ("err.ar.dtype", lambda r, nm: hvd.allreduce(
        tf.ones([3], tf.float32 if r % 2 == 0 else tf.float64), name=nm)),
    "allreduce_rank": ("err.ar.rank", lambda r, nm: hvd.allreduce(tf.ones([2] * (1 + r % 2)),
                                                                  name=nm)),
    "allgather_dim1": ("err.ag.dim1", lambda r, nm: hvd.allgather(tf.ones([1, 2 + r]),
                                                                  name=nm)),
    "broadcast_root": ("err.bc.root", lambda r, nm: hvd.broadcast(tf.ones([2]), r % 2,
                                                                  name=nm)),
    "alltoall_dtype": ("err.a2a.dtype", lambda r, nm: hvd.alltoall(
        tf.ones([hvd.size()], tf.int32 if r % 2 else tf.float32), name=nm)),
    "reducescatter_shape": ("err.rs.shape", lambda r, nm: hvd.reducescatter(
        tf.ones([hvd.size(), 1 + r]), name=nm)),
    "grouped_allreduce_shape": ("err.gar", lambda r, nm: hvd.grouped_allreduce(
        [tf.ones([2]), tf.ones([1 + r])], name=nm)),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_mismatch_fails_on_every_rank(case, mode):
    _skip_single()
    r = hvd.rank()
    name, fn = CASES[case]
    _fails_everywhere(mode, lambda: fn(r, name), name)


def test_mismatch_of_unnamed_function_ops_names_the_node():
    """Inside tf.function an unnamed op's name is its node's: HorovodAllreduce_<input>."""
    _skip_single()
    r = hvd.rank()

    def f():
        x = tf.ones([2 + r], name="mism_x")
        return hvd.allreduce(x)
    _fails_everywhere("function", f, "HorovodAllreduce_mism_x")


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_argument_errors(mode):
    """Refused on each rank by the kernel itself (nothing is enqueued)."""
    r, n = rank_size()
    if n == 1:
        pytest.skip("every dim 0 divides by one rank")
    with pytest.raises(tf.errors.InvalidArgumentError, match="does not divide"):
        (tf.function(hvd.alltoall) if mode == "function" else hvd.alltoall)(tf.ones([n + 1]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="ask for"):
        hvd.alltoall(tf.ones([n - 1]), splits=[1] * n)
    with pytest.raises(tf.errors.InvalidArgumentError, match="splits for a process set"):
        hvd.alltoall(tf.ones([n]), splits=[1] * (n + 1))
    with pytest.raises(tf.errors.InvalidArgumentError, match="negative"):
        hvd.alltoall(tf.ones([n]), splits=[-1] + [1] * (n - 1))


def test_scalar_errors():
    with pytest.raises(tf.errors.InvalidArgumentError, match="scalar"):
        hvd.allgather(tf.constant(1.0))
    with pytest.raises(tf.errors.InvalidArgumentError, match="scalar"):
        hvd.reducescatter(tf.constant(1.0))


def test_bad_ops():
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(tf.ones([2]), op=hvd.Adasum)
    with pytest.raises(ValueError, match="unknown reduction op"):
        hvd.allreduce(tf.ones([2]), op=42)
    with pytest.raises(ValueError, match="supersedes"):
        hvd.allreduce(tf.ones([2]), op=hvd.Sum, average=True)
    with pytest.raises(NotImplementedError, match="IndexedSlices"):
        hvd.allreduce(tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0])), op=hvd.Max)


def test_ops_before_init_fail():
    """Every rank shuts down, so an op has no engine: FailedPrecondition saying what to do;
    init makes the ops work again."""
    hvd.shutdown()
    from khor.tensorflow import _oplib as lib
    with pytest.raises(tf.errors.FailedPreconditionError, match="not initialized"):
        lib.ops.khor_allreduce(tf.ones([2]), tensor_name="before.init")
    hvd.init()
    n = hvd.size()
    assert hvd.allreduce(tf.ones([1]), op=hvd.Sum).numpy().tolist() == [float(n)]


def test_library_for_another_tensorflow_is_refused(tmp_path):
    path = str(tmp_path / "libkhor_tf.so")
    shutil.copy(_oplib.path, path)
    assert _oplib.check_version(path) == tf.__version__
    data = open(path, "rb").read()
    marker = b"KHOR_TF_BUILT_FOR=" + _oplib.built_version.encode()
    assert marker in data
    other = b"KHOR_TF_BUILT_FOR=" + b"1.9".ljust(len(_oplib.built_version), b".")[:len(
        _oplib.built_version)]
    with open(path, "wb") as f:
        f.write(data.replace(marker, other))
    with pytest.raises(ImportError) as e:
        _oplib.check_version(path)
    msg = str(e.value)
    assert "was built for TensorFlow 1.9" in msg and "this is TensorFlow %s" % tf.__version__ \
        in msg, msg
    os.remove(path)


def test_shutdown_fails_a_pending_op():
    """Rank 0 has an allreduce that no other rank submits, in flight on a thread, when every
    rank shuts down: the op fails on rank 0 naming the tensor (no hang), shutdown returns
    everywhere, and init brings the ops back."""
    import threading
    r, n = rank_size()
    if n == 1:
        pytest.skip("a lone op needs another rank that does not submit it")
    got = {}

    def lonely():
        try:
            hvd.allreduce(tf.ones([2]), name="err.never.matched")
        except tf.errors.OpError as e:
            got["err"] = e
    if r == 0:
        t = threading.Thread(target=lonely)
        t.start()
        time.sleep(0.5)
    t0 = time.time()
    hvd.shutdown()
    assert time.time() - t0 < 10
    if r == 0:
        t.join(10)
        assert not t.is_alive(), "the op never ended"
        assert "err.never.matched" in str(got.get("err")), got
    hvd.init()
    assert hvd.allreduce(tf.ones([1]), op=hvd.Sum).numpy().tolist() == [float(n)]


def test_long_names():
    """Names up to 1023 bytes work; a longer one is refused (a cut one could equal another
    tensor's name)."""
    n = hvd.size()
    long_name = "x" * 1000
    assert hvd.allreduce(tf.ones([1]), op=hvd.Sum, name=long_name).numpy().tolist() == [n]
    with pytest.raises(tf.errors.InvalidArgumentError, match="a tensor name of 1100 bytes"):
        hvd.allreduce(tf.ones([1]), name="y" * 1100)
