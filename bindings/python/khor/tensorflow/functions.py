"""Horovod's helpers around the collectives: broadcast_variables, broadcast_object and
allgather_object. Objects go through cloudpickle, as Horovod's do, so lambdas and classes
defined inside a function arrive on every rank. The object helpers run eagerly (they need the
bytes' length before the broadcast of the bytes)."""

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


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False):
    """Sets every variable to root_rank's value (root_rank is a world rank). Eagerly this
    runs as one tf.function, so the broadcasts of all the variables are in flight at once;
    in a graph it returns the group of assign ops. inplace is accepted for Horovod's
    signature (the output goes into a new tensor that is then assigned)."""
    variables = list(variables)
    if not tf.executing_eagerly():
        return tf.group(*[v.assign(broadcast(v, root_rank, process_set=process_set))
                          for v in variables])
    fn = _assign_fns.get("fn")
    if fn is None:
        fn = _assign_fns["fn"] = tf.function(_assign_broadcast)
    return fn(variables, root_rank, process_set)


def _dumps(obj):
    b = io.BytesIO()
    cloudpickle.dump(obj, b)
    return b.getvalue()


def broadcast_object(obj, root_rank=0, session=None, name=None,
                     process_set=global_process_set):
    """root_rank's object on every rank of the set (pickled there, unpickled elsewhere)."""
    if not tf.executing_eagerly():
        raise RuntimeError("broadcast_object runs eagerly (TensorFlow 1 sessions are not "
                           "supported)")
    # Horovod's default name is the object's type, which differs between the root and the
    # others (None there); khor's engine matches names across ranks, so the name is fixed.
    name = name or "broadcast_object"
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
    if not tf.executing_eagerly():
        raise RuntimeError("allgather_object runs eagerly (TensorFlow 1 sessions are not "
                           "supported)")
    name = name or "allgather_object"
    data = tf.constant(bytearray(_dumps(obj)), dtype=tf.uint8)
    sizes = allgather(tf.constant([int(data.shape[0])], tf.int32), name=name + ".sz",
                      process_set=process_set).numpy()
    gathered = allgather(data, name=name + ".t", process_set=process_set).numpy()
    out, off = [], 0
    for s in sizes:
        out.append(cloudpickle.loads(gathered[off:off + s].tobytes()))
        off += s
    return out
