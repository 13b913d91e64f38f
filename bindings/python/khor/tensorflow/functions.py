"""Horovod's helpers around the collectives: broadcast_variables, broadcast_object and
allgather_object. Objects go through cloudpickle, as Horovod's do, so lambdas and classes
defined inside a function arrive on every rank. The object helpers need the bytes' length
before the broadcast of the bytes: eagerly they read it; in a TensorFlow 1 graph they run the
two steps in the session given (or the default one)."""

import io

import cloudpickle
import tensorflow as tf

from .. import _core
from .._core import global_process_set
from .mpi_ops import allgather, broadcast

_assign_fns = {}


def _assign_broadcast(variables, root_rank, process_set):
    for v in variables:
        v.assign(broadcast(v, root_rank, process_set=process_set))


def _tf_variable(v):
    """The tf.Variable a variable is: a Keras 3 variable is not one, and a tf.function given
    it would trace a tensor without assign(); its value under the TensorFlow backend is."""
    if not isinstance(v, tf.Variable) and isinstance(getattr(v, "value", None), tf.Variable):
        return v.value
    return v


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False):
    """Sets every variable to root_rank's value (root_rank is a world rank). Eagerly this
    runs as one tf.function, so the broadcasts of all the variables are in flight at once;
    in a graph it returns the group of assign ops. inplace is accepted for Horovod's
    signature (the output goes into a new tensor that is then assigned)."""
    variables = [_tf_variable(v) for v in variables]
    if not tf.executing_eagerly():
        return tf.group(*[v.assign(broadcast(v, root_rank, process_set=process_set))
                          for v in variables])
    fn = _assign_fns.get("fn")
    if fn is None:
        fn = _assign_fns["fn"] = tf.function(_assign_broadcast)
    return fn(variables, root_rank, process_set)


def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Horovod's in-place broadcast: every variable takes root_rank's value; returns, in
    order, tensors holding the values assigned (eagerly, the variables). khor broadcasts
    into a new tensor and assigns it (no aliasing op), which gives the same values."""
    out = []
    for i, v in enumerate(_tf_variable(v) for v in variables):
        nm = None if name is None else "%s.%d" % (name, i)
        out.append(v.assign(broadcast(v, root_rank, name=nm, process_set=process_set)))
    return out


def broadcast_global_variables(root_rank):
    """TensorFlow 1: an op that sets every global variable to root_rank's value. Eagerly
    there are no global variables: RuntimeError, as Horovod's."""
    if tf.executing_eagerly():
        raise RuntimeError("hvd.broadcast_global_variables() does not support eager "
                           "execution; use hvd.broadcast_variables(<model/optimizer "
                           "variables>, root_rank)")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def _graph_session(session, what):
    sess = session or tf.compat.v1.get_default_session()
    if sess is None:
        raise RuntimeError("%s in a TensorFlow 1 graph needs a session: pass session= or "
                           "call it inside `with tf.compat.v1.Session()`" % what)
    return sess


def _graph_broadcast_object(obj, root_rank, session, name, process_set):
    """broadcast_object in a graph: the two broadcasts (length, bytes) run in session."""
    sess = _graph_session(session, "broadcast_object")
    root = _core.rank() == root_rank
    blob = _dumps(obj) if root else b""
    n_in = tf.compat.v1.placeholder(tf.int32, [1])
    n = sess.run(broadcast(n_in, root_rank, name=name + ".sz", process_set=process_set),
                 {n_in: [len(blob)]})
    data_in = tf.compat.v1.placeholder(tf.uint8, [None])
    fill = bytearray(blob) if root else bytearray(int(n[0]))
    data = sess.run(broadcast(data_in, root_rank, name=name + ".t",
                              process_set=process_set), {data_in: list(fill)})
    return obj if root else cloudpickle.loads(data.tobytes())


def _graph_allgather_object(obj, session, name, process_set):
    sess = _graph_session(session, "allgather_object")
    blob = _dumps(obj)
    n_in = tf.compat.v1.placeholder(tf.int32, [1])
    data_in = tf.compat.v1.placeholder(tf.uint8, [None])
    sizes = sess.run(allgather(n_in, name=name + ".sz", process_set=process_set),
                     {n_in: [len(blob)]})
    gathered = sess.run(allgather(data_in, name=name + ".t", process_set=process_set),
                        {data_in: list(bytearray(blob))})
    out, off = [], 0
    for s in sizes:
        out.append(cloudpickle.loads(gathered[off:off + s].tobytes()))
        off += s
    return out


def broadcast_object_fn(root_rank=0, session=None, name=None,
                        process_set=global_process_set):
    """A function obj -> root_rank's object (Horovod's, for TensorFlow 1 graphs; eagerly
    it is broadcast_object)."""
    def fn(obj):
        return broadcast_object(obj, root_rank, session=session, name=name,
                                process_set=process_set)
    return fn


def _dumps(obj):
    b = io.BytesIO()
    cloudpickle.dump(obj, b)
    return b.getvalue()


def broadcast_object(obj, root_rank=0, session=None, name=None,
                     process_set=global_process_set):
    """root_rank's object on every rank of the set (pickled there, unpickled elsewhere)."""
    # Horovod's default name is the object's type, which differs between the root and the
    # others (None there); khor's engine matches names across ranks, so the name is fixed.
    name = name or "broadcast_object"
    if not tf.executing_eagerly():
        return _graph_broadcast_object(obj, root_rank, session, name, process_set)
    if _core.rank() == root_rank:
        data = tf.constant(bytearray(_dumps(obj)), dtype=tf.uint8)
        n = tf.constant([int(data.shape[0])], tf.int32)
    else:
        n = tf.constant([0], tf.int32)
    n = broadcast(n, root_rank, name=name + ".sz", process_set=process_set)
    if _core.rank() != root_rank:
        data = tf.zeros([int(n.numpy()[0])], tf.uint8)
    data = broadcast(data, root_rank, name=name + ".t", process_set=process_set)
    if _core.rank() == root_rank:
        return obj
    return cloudpickle.loads(data.numpy().tobytes())


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Every rank's object, in rank order of the set."""
    name = name or "allgather_object"
    if not tf.executing_eagerly():
        return _graph_allgather_object(obj, session, name, process_set)
    data = tf.constant(bytearray(_dumps(obj)), dtype=tf.uint8)
    sizes = allgather(tf.constant([int(data.shape[0])], tf.int32), name=name + ".sz",
                      process_set=process_set).numpy()
    gathered = allgather(data, name=name + ".t", process_set=process_set).numpy()
    out, off = [], 0
    for s in sizes:
        out.append(cloudpickle.loads(gathered[off:off + s].tobytes()))
        off += s
    return out
