"""The first piece of khor's TensorFlow ops, run by hand (not in CTest yet, issue 28):
KhorBroadcast and KhorAllgather (uneven, empty), and KhorAllreduce eagerly, inside tf.function with two ops that ranks write in different orders
(the async kernels must not deadlock), and a shape mismatch that must fail as a TF error on
every rank. Under khorrun, with the Python that has tensorflow:
  bindings/tensorflow/build.sh $PY build /tmp && PYTHONPATH=bindings/python \
  KHOR_LIBRARY_PATH=build/libkhor.so build/khorrun -np 4 $PY tests/tensorflow/proto_ops.py \
  /tmp/libkhor_tf.so
"""
import ctypes, sys, time
import tensorflow as tf
import khor
from khor import _core
khor.init()
r, n = khor.rank(), khor.size()
lib = tf.load_op_library(sys.argv[1])
c = ctypes.CDLL(sys.argv[1])
c.khor_tf_set_engine.argtypes = [ctypes.c_void_p]
c.khor_tf_set_engine(_core._state.engine)
# eager
x = tf.constant([1.0, 2.0, 3.0]) * (r + 1)
y = lib.khor_allreduce(x, tensor_name="e/x", reduce_op=0)
want = [sum(k + 1 for k in range(n)) * v for v in (1.0, 2.0, 3.0)]
assert y.numpy().tolist() == want, (y, want)
# graph mode, two ops whose order differs per rank: async kernels must not deadlock
@tf.function
def f(a, b):
    if r % 2 == 0:
        return lib.khor_allreduce(a, tensor_name="g/a"), lib.khor_allreduce(b, tensor_name="g/b")
    bb = lib.khor_allreduce(b, tensor_name="g/b")
    return lib.khor_allreduce(a, tensor_name="g/a"), bb
for i in range(3):
    a, b = f(tf.ones([4], tf.int32) * r, tf.ones([2, 2], tf.float64))
    assert a.numpy().tolist() == [n * (n - 1) // 2] * 4, a
    assert b.numpy().tolist() == [[n, n], [n, n]], b
# broadcast from the last rank
z = lib.khor_broadcast(tf.fill([3, 2], float(r)), tensor_name="e/bc", root_rank=n - 1)
assert z.numpy().tolist() == [[float(n - 1)] * 2] * 3, z
# allgather, uneven first dimension (rank k gives k + 1 rows of k), eager and in tf.function
def gathered():
    return [[k, k] for k in range(n) for _ in range(k + 1)]
g = lib.khor_allgather(tf.fill([r + 1, 2], r), tensor_name="e/ag")
assert g.numpy().tolist() == gathered(), g
@tf.function
def ag(t):
    return lib.khor_allgather(t, tensor_name="g/ag")
for i in range(2):
    g = ag(tf.fill([r + 1, 2], r))
    assert g.numpy().tolist() == gathered(), g
# an empty contribution from every rank but 0
g = lib.khor_allgather(tf.zeros([1 if r == 0 else 0, 3], tf.int64), tensor_name="e/ag0")
assert g.shape == (1, 3), g.shape
# a mismatch fails as a TF error, not a hang
try:
    lib.khor_allreduce(tf.ones([r + 1]), tensor_name="bad/x")
    print("rank", r, "no error for a shape mismatch"); sys.exit(1)
except tf.errors.OpError as e:
    print("rank", r, "mismatch:", type(e).__name__, str(e).splitlines()[0][:160])
print("rank", r, "ok", y.numpy())
c.khor_tf_set_engine(None)
khor.shutdown()
