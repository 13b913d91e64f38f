"""khor.tensorflow above the ops: broadcast_variables (eager and in tf.function),
broadcast_object and allgather_object (cloudpickle), Compression.fp16, allreduce of
tf.IndexedSlices, DistributedGradientTape (default, groups, sparse gradients, sparse_as_dense,
gradient_predivide_factor, local sources, a training step that keeps ranks equal), process
sets, and the horovod.tensorflow alias."""

import os
import sys

import numpy as np
import pytest
import tensorflow as tf

import khor.tensorflow as hvd
from tftest import MODES, even_odd_ranks, rank_size


def test_broadcast_variables():
    r, n = rank_size()
    a = tf.Variable([float(r)] * 3)
    b = tf.Variable([[r, r + 1]], dtype=tf.int64)
    root = n - 1
    hvd.broadcast_variables([a, b], root)
    assert a.numpy().tolist() == [float(root)] * 3
    assert b.numpy().tolist() == [[root, root + 1]]


def test_broadcast_variables_in_function():
    r, n = rank_size()
    v = tf.Variable(tf.fill([2], float(r)))

    @tf.function
    def f():
        hvd.broadcast_variables([v], 0)
    f()
    assert v.numpy().tolist() == [0.0, 0.0]


def test_broadcast_object():
    r, n = rank_size()
    root = n - 1
    obj = {"rank": r, "fn": lambda x: x + r} if r == root else None
    got = hvd.broadcast_object(obj, root_rank=root)
    assert got["rank"] == root and got["fn"](1) == 1 + root


def test_allgather_object():
    r, n = rank_size()
    got = hvd.allgather_object({"r": r, "pad": "x" * r})
    assert got == [{"r": k, "pad": "x" * k} for k in range(n)]


@pytest.mark.parametrize("mode", MODES)
def test_fp16_compression(mode):
    r, n = rank_size()
    x = tf.constant([0.5 * (r + 1)] * 3, tf.float64)
    got = (tf.function(hvd.allreduce) if mode == "function" else hvd.allreduce)(
        x, op=hvd.Sum, compression=hvd.Compression.fp16)
    assert got.dtype == tf.float64
    assert got.numpy().tolist() == [0.5 * n * (n + 1) / 2] * 3
    ints = hvd.allreduce(tf.constant([r]), op=hvd.Sum, compression=hvd.Compression.fp16)
    assert ints.dtype == tf.int32 and ints.numpy().tolist() == [n * (n - 1) // 2]


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=["sum", "average"])
def test_allreduce_indexed_slices(op):
    """Horovod's: the values and indices are allgathered; Average divides the values."""
    r, n = rank_size()
    s = tf.IndexedSlices(tf.fill([1, 2], float(r + 1)), tf.constant([r]),
                         dense_shape=tf.constant([n, 2]))
    got = hvd.allreduce(s, op=op)
    assert isinstance(got, tf.IndexedSlices)
    assert got.indices.numpy().tolist() == list(range(n))
    want = [[float(k + 1) / (n if op == hvd.Average else 1)] * 2 for k in range(n)]
    np.testing.assert_allclose(got.values.numpy(), want)
    dense = tf.convert_to_tensor(got)
    np.testing.assert_allclose(dense.numpy(), want)


def _model_step(tape_kwargs, r):
    """A linear model's gradients through DistributedGradientTape, rank r's data."""
    w = tf.Variable([[1.0], [2.0]])
    b = tf.Variable([0.5])
    x = tf.constant([[1.0 + r, 2.0]])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.matmul(x, w) + b)
    tape = hvd.DistributedGradientTape(tape, **tape_kwargs)
    return tape.gradient(loss, [w, b])


@pytest.mark.parametrize("kwargs", [{}, {"groups": 1}, {"groups": 2},
                                    {"gradient_predivide_factor": 2.0},
                                    {"op": hvd.Sum}, {"compression": hvd.Compression.fp16}],
                         ids=["default", "groups1", "groups2", "predivide", "sum", "fp16"])
def test_distributed_gradient_tape(kwargs):
    r, n = rank_size()
    gw, gb = _model_step(kwargs, r)
    scale = n if kwargs.get("op") == hvd.Sum else 1
    mean_x0 = sum(1.0 + k for k in range(n)) / n
    np.testing.assert_allclose(gw.numpy(), [[mean_x0 * scale], [2.0 * scale]], rtol=1e-3)
    np.testing.assert_allclose(gb.numpy(), [1.0 * scale])


def test_distributed_gradient_tape_groups_of_variables():
    r, n = rank_size()
    a, b, c = tf.Variable([1.0]), tf.Variable([2.0]), tf.Variable([3.0])
    with tf.GradientTape() as tape:
        loss = (a * float(r) + b * 2.0 + c * float(r * r))[0]
    tape = hvd.DistributedGradientTape(tape, groups=[[a, c]])
    ga, gb, gc = tape.gradient(loss, [a, b, c])
    assert ga.numpy().tolist() == [sum(range(n)) / n]
    assert gb.numpy().tolist() == [2.0]
    np.testing.assert_allclose(gc.numpy(), [sum(k * k for k in range(n)) / n])


def test_distributed_gradient_tape_sparse():
    """An embedding's gradient is tf.IndexedSlices: allgathered (values averaged), or dense
    with sparse_as_dense."""
    r, n = rank_size()
    for sparse_as_dense in (False, True):
        emb = tf.Variable(tf.zeros([n, 2]))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(emb, [r]) * float(r + 1))
        tape = hvd.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense)
        (g,) = tape.gradient(loss, [emb])
        assert isinstance(g, tf.IndexedSlices) != sparse_as_dense
        want = [[float(k + 1) / n] * 2 for k in range(n)]
        np.testing.assert_allclose(tf.convert_to_tensor(g).numpy(), want)


def test_distributed_gradient_tape_local_source():
    r, n = rank_size()
    shared, local = tf.Variable([1.0]), tf.Variable([1.0])
    with tf.GradientTape() as tape:
        loss = (shared * float(r + 1) + local * float(r + 1))[0]
    tape = hvd.DistributedGradientTape(tape)
    tape.register_local_source(local)
    gs, gl = tape.gradient(loss, [shared, local])
    np.testing.assert_allclose(gs.numpy(), [sum(k + 1 for k in range(n)) / n])
    np.testing.assert_allclose(gl.numpy(), [(r + 1) / n])


def test_training_keeps_ranks_equal():
    """A few steps of SGD in a tf.function with different data per rank: the weights stay
    the same on every rank (the gradients are averaged) and move."""
    r, n = rank_size()
    w = tf.Variable(tf.fill([3, 1], float(r)))
    hvd.broadcast_variables([w], 0)
    x = tf.constant(np.random.RandomState(r).rand(8, 3), tf.float32)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0))
        tape = hvd.DistributedGradientTape(tape)
        (g,) = tape.gradient(loss, [w])
        w.assign_sub(0.1 * g)
        return loss
    for _ in range(3):
        step()
    gathered = hvd.allgather(tf.reshape(w, [1, 3])).numpy()
    assert np.allclose(gathered, gathered[0]), gathered
    assert not np.allclose(gathered[0], 0.0)


@pytest.fixture
def sets():
    r, n = rank_size()
    if n < 2:
        pytest.skip("process sets of even and odd ranks need two ranks")
    even, odd = even_odd_ranks(n)
    es = hvd.add_process_set(even)
    os_ = hvd.add_process_set(hvd.ProcessSet(odd))
    yield es, os_, (es if r % 2 == 0 else os_), (even if r % 2 == 0 else odd)
    hvd.remove_process_set(os_)
    hvd.remove_process_set(es)


@pytest.mark.parametrize("mode", MODES)
def test_process_sets(sets, mode):
    es, os_, mine, members = sets
    r, n = rank_size()

    def f(x):
        return (hvd.allreduce(x, op=hvd.Sum, process_set=mine),
                hvd.allgather(x, process_set=mine),
                hvd.broadcast(x, members[-1], process_set=mine),
                hvd.reducescatter(tf.tile(x, [len(members)]), op=hvd.Sum, process_set=mine),
                hvd.alltoall(tf.tile(x, [len(members)]), process_set=mine))
    fn = tf.function(f) if mode == "function" else f
    ar, ag, bc, rs, a2a = fn(tf.constant([float(r)]))
    assert ar.numpy().tolist() == [float(sum(members))]
    assert ag.numpy().tolist() == [float(k) for k in members]
    assert bc.numpy().tolist() == [float(members[-1])]
    assert rs.numpy().tolist() == [float(sum(members))]
    assert a2a.numpy().tolist() == [float(k) for k in members]


def test_process_set_gradient_and_tape(sets):
    es, os_, mine, members = sets
    r, n = rank_size()
    w = tf.Variable([1.0])
    with tf.GradientTape() as tape:
        loss = (w * float(r))[0]
    tape = hvd.DistributedGradientTape(tape, process_set=mine)
    (g,) = tape.gradient(loss, [w])
    np.testing.assert_allclose(g.numpy(), [sum(members) / len(members)])


def test_process_set_errors(sets):
    es, os_, mine, members = sets
    other = os_ if mine is es else es
    with pytest.raises(ValueError, match="not in"):
        hvd.allreduce(tf.ones([1]), process_set=other)
    with pytest.raises(ValueError, match="root_rank"):
        hvd.broadcast(tf.ones([1]), other.ranks[0], process_set=mine)


def test_horovod_alias():
    compat = os.path.join(os.path.dirname(os.path.dirname(hvd.__file__)), "..",
                          "horovod_compat")
    sys.path.insert(0, os.path.normpath(compat))
    try:
        import horovod.tensorflow as hhvd
        from horovod.tensorflow.mpi_ops import allgather
        from horovod.tensorflow.compression import Compression
    finally:
        sys.path.pop(0)
    assert hhvd.allreduce is hvd.allreduce and allgather is hvd.allgather
    assert Compression is hvd.Compression and hhvd.HorovodInternalError is \
        hvd.HorovodInternalError
    assert hhvd.rank() == hvd.rank() and not hhvd.mpi_built()


def test_eager_tape_traces_once():
    """A loop that wraps its tape anew every step reuses one tf.function of the reduction,
    traced once for gradients of one structure."""
    from khor.tensorflow import gradient_tape
    r, n = rank_size()
    w = tf.Variable([1.0, 2.0])
    for step in range(3):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * float(r + step))
        tape = hvd.DistributedGradientTape(tape, gradient_predivide_factor=4.0)
        (g,) = tape.gradient(loss, [w])
        np.testing.assert_allclose(g.numpy(), [sum(k + step for k in range(n)) / n] * 2)
    assert tape._allreduce_grads.experimental_get_tracing_count() == 1
    assert tape._allreduce_grads is gradient_tape.make_allreduce_grads_fn(
        "DistributedGradientTape", gradient_predivide_factor=4.0)


def test_device_dense_cpu():
    """device_dense='/cpu:0' places the op (and a copy of a tensor from elsewhere) on the
    CPU, where khor's kernels are."""
    r, n = rank_size()
    got = hvd.allreduce(tf.constant([1.0 * r]), op=hvd.Sum, device_dense="/cpu:0")
    assert got.numpy().tolist() == [float(sum(range(n)))]
    assert "CPU" in got.device
    got = hvd.grouped_allreduce([tf.constant([1.0])], op=hvd.Sum, device_dense="/cpu:0")
    assert got[0].numpy().tolist() == [float(n)]
