"""Horovod's TensorFlow collectives over khor's ops (libkhor_tf.so): allreduce, allgather,
broadcast, alltoall, reducescatter (plain and grouped), join and barrier, with their
gradients registered as Horovod registers them.

Names. The engine matches tensors across ranks by name. Inside tf.function (a graph) an op's
name is its node's name, 'HorovodAllreduce_<input tensor's name>' unless given, with its name
scopes (ignore_name_scope=True drops them): every rank that traces the same function gets the
same names, in whatever order its ops then run. Eagerly, ops run one at a time in program
order, so every unnamed eager op of one kind shares one name (as in Horovod), which also keeps
TensorFlow's eager kernel cache from growing with every call.

Tensors are CPU tensors: the kernels are CPU kernels, which read the input in place and write
their output straight into TensorFlow's own output tensor (no copy). Errors are TensorFlow's:
a mismatch between ranks is tf.errors.FailedPreconditionError on every rank, a refused argument
InvalidArgumentError, a failed peer or link UnknownError, as with Horovod.
"""

import re

import tensorflow as tf

from .. import _core
from .._core import (Average, Sum, Adasum, Min, Max, Product, ProcessSet, global_process_set,
                     rank)
from . import _oplib

_ops = _oplib.ops


def _eager():
    return tf.executing_eagerly()


def _normalize_name(name):
    """A tensor's name as an op name (TensorFlow's rules)."""
    return re.sub("[^a-zA-Z0-9_]", "_", name)


def handle_average_backwards_compatibility(op, average):
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of "
                             "them.")
        return op
    if average is not None:
        return Average if average else Sum
    return Average


def _set(process_set):
    """The registered set (this rank must be in it) and its id, for the op's attrs."""
    _oplib.sync_engine()
    ps = process_set if process_set is not None else global_process_set
    return ps, _core.set_id(ps)


def _process_set_of(set_id):
    """The ProcessSet of an op's process_set_id attr (gradients)."""
    ps = _core._state.sets.get(set_id)
    if ps is None:
        raise ValueError("process set %d is no longer registered" % set_id)
    return ps


def _check_device(tensor, what):
    dev = getattr(tensor, "device", "") or ""
    if "GPU" in dev.upper():
        raise NotImplementedError(
            "khor.tensorflow %s: the tensor is on %s, and libkhor_tf has CPU kernels only; "
            "place it on the CPU (with tf.device('/cpu:0'), or device_dense='/cpu:0')"
            % (what, dev))


def _names(kind, name, tensors, grouped=False):
    """The op's name= and tensor_name attr. Graph: the node name (scoped), the engine reads
    it; eager: the given name or one per kind."""
    if _eager():
        return None, name if name is not None else "Horovod" + kind
    if name is None:
        if grouped:
            name = _normalize_name("Horovod%s_%s_%s" % (kind, tensors[0].name,
                                                         tensors[-1].name))
        else:
            name = "Horovod%s_%s" % (kind, _normalize_name(tensors[0].name))
    return name, ""


def _op_number(op):
    if op == Adasum:
        raise NotImplementedError("khor does not support the Adasum reduction; use Average or "
                                  "Sum")
    if op not in (Average, Sum, Min, Max, Product):
        raise ValueError("unknown reduction op %r (use Average, Sum, Min, Max or Product)"
                         % (op,))
    return int(op)


def _int_scaled(tensors, op, prescale, postscale, ps):
    """The engine scales floating-point tensors only; Horovod scales integers too, in float64,
    truncating back. For integer tensors with factors this scales here: returns (inputs,
    op, prescale, postscale, post-step)."""
    if (prescale == 1.0 and postscale == 1.0) or op not in (Sum, Average) or \
            all(t.dtype.is_floating for t in tensors):
        return tensors, op, prescale, postscale, None
    post = float(postscale) / (ps.size() if op == Average else 1)
    ins = [t if prescale == 1.0 else
           tf.cast(tf.cast(t, tf.float64) * float(prescale), t.dtype) for t in tensors]

    def after(o):
        return o if post == 1.0 else tf.cast(tf.cast(o, tf.float64) * post, o.dtype)
    return ins, Sum, 1.0, 1.0, after


# ---- allreduce ---------------------------------------------------------------------------

def _allreduce(tensor, name=None, op=Sum, prescale_factor=1.0, postscale_factor=1.0,
               ignore_name_scope=False, process_set=global_process_set):
    """The op itself: the reduction of tensor over the set's ranks (no compression)."""
    tensor = tf.convert_to_tensor(tensor)
    _check_device(tensor, "allreduce")
    ps, sid = _set(process_set)
    (tensor,), op, pre, post, after = _int_scaled([tensor], op, prescale_factor,
                                                  postscale_factor, ps)
    opname, tname = _names("Allreduce", name, [tensor])
    out = _ops.khor_allreduce(tensor, reduce_op=_op_number(op), prescale_factor=pre,
                              postscale_factor=post, tensor_name=tname,
                              ignore_name_scope=ignore_name_scope, process_set_id=sid,
                              name=opname)
    return after(out) if after is not None else out


@tf.RegisterGradient("KhorAllreduce")
def _allreduce_grad(op, grad):
    """Horovod's: the allreduce of the gradient, with the same op and factors."""
    return _allreduce(grad, op=op.get_attr("reduce_op"),
                      prescale_factor=op.get_attr("prescale_factor"),
                      postscale_factor=op.get_attr("postscale_factor"),
                      ignore_name_scope=op.get_attr("ignore_name_scope"),
                      process_set=_process_set_of(op.get_attr("process_set_id")))


def _grouped_allreduce(tensors, name=None, op=Sum, prescale_factor=1.0, postscale_factor=1.0,
                       ignore_name_scope=False, process_set=global_process_set):
    """One op for a list of tensors of one dtype (negotiated and completed as one)."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    for t in tensors:
        _check_device(t, "grouped_allreduce")
    if len({t.dtype for t in tensors}) > 1:
        raise ValueError("grouped_allreduce: the tensors of one group must share a dtype, got "
                         "%s" % sorted({t.dtype.name for t in tensors}))
    ps, sid = _set(process_set)
    tensors, op, pre, post, after = _int_scaled(tensors, op, prescale_factor,
                                                postscale_factor, ps)
    opname, tname = _names("GroupedAllreduce", name, tensors, grouped=True)
    outs = _ops.khor_grouped_allreduce(tensors, reduce_op=_op_number(op), prescale_factor=pre,
                                       postscale_factor=post, tensor_name=tname,
                                       ignore_name_scope=ignore_name_scope,
                                       process_set_id=sid, name=opname)
    return [after(o) for o in outs] if after is not None else list(outs)


@tf.RegisterGradient("KhorGroupedAllreduce")
def _grouped_allreduce_grad(op, *grads):
    return _grouped_allreduce(list(grads), op=op.get_attr("reduce_op"),
                              prescale_factor=op.get_attr("prescale_factor"),
                              postscale_factor=op.get_attr("postscale_factor"),
                              ignore_name_scope=op.get_attr("ignore_name_scope"),
                              process_set=_process_set_of(op.get_attr("process_set_id")))


# ---- allgather ---------------------------------------------------------------------------

def _gathered_shape(out, tensor):
    if not _eager() and tensor.shape.rank is not None:
        out.set_shape([None] + tensor.shape.as_list()[1:])
    return out


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Every rank's tensor concatenated along dim 0 (which may differ between ranks)."""
    tensor = tf.convert_to_tensor(tensor)
    _check_device(tensor, "allgather")
    _, sid = _set(process_set)
    opname, tname = _names("Allgather", name, [tensor])
    out = _ops.khor_allgather(tensor, tensor_name=tname, ignore_name_scope=ignore_name_scope,
                              process_set_id=sid, name=opname)
    return _gathered_shape(out, tensor)


def _dim0s(x, ps, ignore_name_scope):
    """Every rank's dim 0 of x, as a vector of the set's size."""
    with tf.device("/cpu:0"):
        d = tf.reshape(tf.shape(x)[0], [1])
        return tf.reshape(allgather(d, ignore_name_scope=ignore_name_scope, process_set=ps),
                          [ps.size()])


@tf.RegisterGradient("KhorAllgather")
def _allgather_grad(op, grad):
    """Horovod's: the average of every rank's gradient, this rank's rows of it."""
    ps = _process_set_of(op.get_attr("process_set_id"))
    ins = op.get_attr("ignore_name_scope")
    grad = _allreduce(grad, op=Average, ignore_name_scope=ins, process_set=ps)
    splits = tf.split(grad, num_or_size_splits=_dim0s(op.inputs[0], ps, ins), axis=0,
                      num=ps.size())
    return splits[ps.rank()]


def grouped_allgather(tensors, name=None, ignore_name_scope=False,
                      process_set=global_process_set):
    """allgather of each tensor of the list, as one op (one dtype)."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    for t in tensors:
        _check_device(t, "grouped_allgather")
    if len({t.dtype for t in tensors}) > 1:
        return [allgather(t, name=None if name is None else "%s.%d" % (name, i),
                          ignore_name_scope=ignore_name_scope, process_set=process_set)
                for i, t in enumerate(tensors)]
    _, sid = _set(process_set)
    opname, tname = _names("GroupedAllgather", name, tensors, grouped=True)
    outs = _ops.khor_grouped_allgather(tensors, tensor_name=tname,
                                       ignore_name_scope=ignore_name_scope,
                                       process_set_id=sid, name=opname)
    return [_gathered_shape(o, t) for o, t in zip(outs, tensors)]


@tf.RegisterGradient("KhorGroupedAllgather")
def _grouped_allgather_grad(op, *grads):
    ps = _process_set_of(op.get_attr("process_set_id"))
    ins = op.get_attr("ignore_name_scope")
    # one allreduce each: TensorFlow may hand float32 zeros for a float64 output's gradient
    grads = [_allreduce(g, op=Average, ignore_name_scope=ins, process_set=ps) for g in grads]
    return [tf.split(g, num_or_size_splits=_dim0s(x, ps, ins), axis=0,
                     num=ps.size())[ps.rank()] for g, x in zip(grads, op.inputs)]


# ---- broadcast ---------------------------------------------------------------------------

def broadcast(tensor, root_rank, name=None, ignore_name_scope=False,
              process_set=global_process_set):
    """root_rank's tensor on every rank of the set (root_rank is a world rank)."""
    tensor = tf.convert_to_tensor(tensor)
    _check_device(tensor, "broadcast")
    ps, sid = _set(process_set)
    root = int(root_rank)
    if ps.ranks is not None:
        if root not in ps.ranks:
            raise ValueError("broadcast: root_rank %d is not in %r" % (root, ps))
        set_root = ps.ranks.index(root)
    else:
        set_root = root
    opname, tname = _names("Broadcast", name, [tensor])
    return _ops.khor_broadcast(tensor, root_rank=root, set_root_rank=set_root,
                               tensor_name=tname, ignore_name_scope=ignore_name_scope,
                               process_set_id=sid, name=opname)


@tf.RegisterGradient("KhorBroadcast")
def _broadcast_grad(op, grad):
    """Horovod's: the average of the gradients on the root, zeros elsewhere."""
    reduced = _allreduce(grad, op=Average, ignore_name_scope=op.get_attr("ignore_name_scope"),
                         process_set=_process_set_of(op.get_attr("process_set_id")))
    if rank() != op.get_attr("root_rank"):
        return reduced * 0
    return reduced


# ---- alltoall ----------------------------------------------------------------------------

def alltoall(tensor, splits=None, name=None, ignore_name_scope=False,
             process_set=global_process_set):
    """splits[j] rows of dim 0 go to rank j (dim 0 divided evenly without splits). Returns
    the rows received from every rank in rank order, and, when splits is given, how many
    came from each (Horovod's return)."""
    tensor = tf.convert_to_tensor(tensor)
    _check_device(tensor, "alltoall")
    ps, sid = _set(process_set)
    sp = tf.convert_to_tensor(splits) if splits is not None else tf.constant([], tf.int32)
    if sp.dtype not in (tf.int32, tf.int64):
        raise ValueError("alltoall: splits must be int32 or int64, got %s" % sp.dtype.name)
    opname, tname = _names("Alltoall", name, [tensor])
    out, rsplits = _ops.khor_alltoall(tensor, sp, set_size=ps.size(), set_rank=ps.rank(),
                                      tensor_name=tname, ignore_name_scope=ignore_name_scope,
                                      process_set_id=sid, name=opname)
    _gathered_shape(out, tensor)
    if not _eager():
        rsplits.set_shape([ps.size()])
    return (out, rsplits) if splits is not None else out


@tf.RegisterGradient("KhorAlltoall")
def _alltoall_grad(op, grad, _grad_splits):
    """Horovod's: the gradient goes back the way the rows came (the received splits)."""
    g, _ = alltoall(grad, splits=op.outputs[1],
                    ignore_name_scope=op.get_attr("ignore_name_scope"),
                    process_set=_process_set_of(op.get_attr("process_set_id")))
    return [g, None]


# ---- reducescatter -----------------------------------------------------------------------

def _check_not_scalar(tensors):
    # Eagerly the engine refuses a scalar (InvalidArgumentError); a graph knows the shape
    # when the op is made, and refuses it then with a ValueError (as Horovod's may).
    if _eager():
        return
    for t in tensors:
        if t.shape.rank == 0:
            raise ValueError("reducescatter: a scalar cannot be scattered (the tensor needs "
                             "at least one dimension)")


def _scattered_shape(out, tensor, ps):
    if not _eager() and tensor.shape.rank is not None:
        d0 = tensor.shape[0]
        if d0 is not None:
            base, extra = divmod(int(d0), ps.size())
            d0 = base + (1 if ps.rank() < extra else 0)
        out.set_shape([d0] + tensor.shape.as_list()[1:])
    return out


def _reducescatter(tensor, name=None, op=Sum, ignore_name_scope=False,
                   process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """The op itself: this rank's rows of the reduction (the first d0 % n ranks get one
    more)."""
    tensor = tf.convert_to_tensor(tensor)
    _check_device(tensor, "reducescatter")
    _check_not_scalar([tensor])
    ps, sid = _set(process_set)
    (tensor,), op, pre, post, after = _int_scaled([tensor], op, prescale_factor,
                                                  postscale_factor, ps)
    opname, tname = _names("Reducescatter", name, [tensor])
    out = _ops.khor_reducescatter(tensor, reduce_op=_op_number(op), prescale_factor=pre,
                                  postscale_factor=post, set_size=ps.size(),
                                  set_rank=ps.rank(), tensor_name=tname,
                                  ignore_name_scope=ignore_name_scope, process_set_id=sid,
                                  name=opname)
    out = _scattered_shape(out, tensor, ps)
    return after(out) if after is not None else out


def _rs_grad_scale(op, grad, ps):
    """Horovod's reducescatter gradient scaling: by the set's size for Sum, then by the
    factors."""
    if op.get_attr("reduce_op") == Sum:
        grad = grad * tf.cast(ps.size(), grad.dtype)
    for f in ("prescale_factor", "postscale_factor"):
        v = op.get_attr(f)
        if v != 1.0:
            grad = grad * tf.cast(v, grad.dtype)
    return grad


@tf.RegisterGradient("KhorReducescatter")
def _reducescatter_grad(op, grad):
    ps = _process_set_of(op.get_attr("process_set_id"))
    return allgather(_rs_grad_scale(op, grad, ps),
                     ignore_name_scope=op.get_attr("ignore_name_scope"), process_set=ps)


def _grouped_reducescatter(tensors, name=None, op=Sum, ignore_name_scope=False,
                           process_set=global_process_set, prescale_factor=1.0,
                           postscale_factor=1.0):
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    for t in tensors:
        _check_device(t, "grouped_reducescatter")
    _check_not_scalar(tensors)
    if len({t.dtype for t in tensors}) > 1:
        raise ValueError("grouped_reducescatter: the tensors of one group must share a dtype, "
                         "got %s" % sorted({t.dtype.name for t in tensors}))
    ps, sid = _set(process_set)
    tensors, op, pre, post, after = _int_scaled(tensors, op, prescale_factor,
                                                postscale_factor, ps)
    opname, tname = _names("GroupedReducescatter", name, tensors, grouped=True)
    outs = _ops.khor_grouped_reducescatter(tensors, reduce_op=_op_number(op),
                                           prescale_factor=pre, postscale_factor=post,
                                           set_size=ps.size(), set_rank=ps.rank(),
                                           tensor_name=tname,
                                           ignore_name_scope=ignore_name_scope,
                                           process_set_id=sid, name=opname)
    outs = [_scattered_shape(o, t, ps) for o, t in zip(outs, tensors)]
    return [after(o) for o in outs] if after is not None else outs


@tf.RegisterGradient("KhorGroupedReducescatter")
def _grouped_reducescatter_grad(op, *grads):
    ps = _process_set_of(op.get_attr("process_set_id"))
    ins = op.get_attr("ignore_name_scope")
    return [allgather(_rs_grad_scale(op, g, ps), ignore_name_scope=ins, process_set=ps)
            for g in grads]


# ---- join, barrier, and the graph-time queries -------------------------------------------

def join(process_set=global_process_set):
    """This rank is out of data: until every rank has joined, the others' allreduces run
    with its zeros. Returns the rank that joined last (an int32 scalar tensor)."""
    _, sid = _set(process_set)
    return _ops.khor_join(process_set_id=sid)


def barrier(process_set=global_process_set):
    """Returns once every rank of the set has reached it (eagerly; in a graph, when the op
    runs)."""
    _, sid = _set(process_set)
    return _ops.khor_barrier(process_set_id=sid)


def size_op(process_set_id=0, name=None):
    """The set's size as an int32 tensor (khor knows it when the graph is built, and a job's
    size does not change without an elastic reset, which rebuilds the graph)."""
    return tf.constant(_process_set_of(process_set_id).size(), tf.int32, name=name)


def rank_op(name=None):
    return tf.constant(rank(), tf.int32, name=name)


def local_size_op(name=None):
    return tf.constant(_core.local_size(), tf.int32, name=name)


def local_rank_op(name=None):
    return tf.constant(_core.local_rank(), tf.int32, name=name)


def process_set_included_op(process_set_id=0, name=None):
    return tf.constant(1 if _process_set_of(process_set_id).included() else 0, tf.int32,
                       name=name)


tf.no_gradient("KhorJoin")
tf.no_gradient("KhorBarrier")

__all__ = ["Average", "Sum", "Adasum", "Min", "Max", "Product", "ProcessSet",
           "global_process_set", "allgather", "grouped_allgather", "broadcast", "alltoall",
           "join", "barrier", "size_op", "rank_op", "local_size_op", "local_rank_op",
           "process_set_included_op", "handle_average_backwards_compatibility"]
