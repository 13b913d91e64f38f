"""khor.tensorflow: Horovod's TensorFlow 2 API over khor (``import khor.tensorflow as hvd``).

Same names, arguments and defaults as ``horovod.tensorflow``: init, size, rank, the
collectives (allreduce with tf.IndexedSlices, grouped forms, allgather, broadcast, alltoall,
reducescatter, join, barrier), broadcast_variables, broadcast_ (in place),
broadcast_global_variables, broadcast_object, allgather_object, Compression, process sets,
the timeline, DistributedGradientTape, PartialDistributedGradientTape, SyncBatchNormalization
and DistributedOptimizer (for Keras optimizers, through khor.tensorflow.keras). They work
eagerly, inside tf.function and in a TensorFlow 1 graph run by a session; the ops are khor's
C kernels (libkhor_tf.so, bindings/tensorflow), CPU only. What is not here: TensorFlow 1's
optimizers and hooks, Adasum, GPU kernels. hvd.elastic has TensorFlowState, KerasState and
run (eager mode)."""

from .. import _core
from .._core import (Average, Sum, Adasum, Min, Max, Product, ProcessSet, global_process_set,
                     add_process_set, remove_process_set, is_initialized, rank, size,
                     local_rank, local_size, cross_rank, cross_size, is_homogeneous,
                     start_timeline, stop_timeline)
from .._lib import KhorError
from ..exceptions import HorovodInternalError, HostsUpdatedInterrupt

import tensorflow as tf

from . import _oplib
from .compression import Compression
from .mpi_ops import (_allreduce, _grouped_allreduce, _reducescatter, _grouped_reducescatter,
                      allgather, grouped_allgather, broadcast, alltoall, join, barrier,
                      size_op, rank_op, local_size_op, local_rank_op, process_set_included_op,
                      handle_average_backwards_compatibility)
from .functions import (allgather_object, broadcast_object, broadcast_object_fn,
                        broadcast_variables, broadcast_, broadcast_global_variables)
from .gradient_tape import DistributedGradientTape, PartialDistributedGradientTape
from . import util
from . import elastic
from .util import _executing_eagerly

__version__ = _core._lib.text(_core._lib.khor_version())


def init(comm=None, process_sets=None):
    """Joins the job, starts the engine and hands it to the ops (Horovod: hvd.init). comm:
    None or a list of ranks; process_sets: ProcessSets to register, or "dynamic"."""
    _core.init(comm, process_sets)
    _oplib.sync_engine()


def shutdown():
    """Leaves the job; the ops fail with "not initialized" until init runs again."""
    _core.shutdown()


def _on(device, tensor):
    """tensor as an input of an op under tf.device(device): a copy on the CPU when device
    names the CPU (how a GPU tensor reaches khor's CPU kernels), else tensor itself."""
    tensor = tf.convert_to_tensor(tensor)
    if device and "CPU" in device.upper() and "CPU" not in (tensor.device or "CPU").upper():
        return tf.identity(tensor)
    return tensor


def _sparse_allreduce(tensor, op, prescale_factor, postscale_factor, process_set,
                      ignore_name_scope, grouped=False):
    if op == Adasum:
        raise NotImplementedError("The Adasum reduction does not support sparse tensors; pass "
                                  "sparse_as_dense=True")
    if op not in (Sum, Average):
        raise NotImplementedError("Only Sum and Average ops are supported with "
                                  "tf.IndexedSlices")
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise NotImplementedError("Pre/postscale_factor are not supported with "
                                  "tf.IndexedSlices")
    ps = process_set if process_set is not None else global_process_set
    values = allgather(tensor.values, process_set=ps, ignore_name_scope=ignore_name_scope)
    indices = allgather(tensor.indices, process_set=ps, ignore_name_scope=ignore_name_scope)
    if op == Average:
        values = values / tf.cast(ps.size(), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)


def allreduce(tensor, average=None, device_dense='', device_sparse='',
              compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, name=None, process_set=global_process_set,
              ignore_name_scope=False):
    """The reduction of a tf.Tensor (or Variable) over the set's ranks; a tf.IndexedSlices
    becomes two allgathers (values and indices), Average dividing the values by the set's
    size, as Horovod's."""
    op = handle_average_backwards_compatibility(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        with tf.device(device_sparse):
            return _sparse_allreduce(tensor, op, prescale_factor, postscale_factor,
                                     process_set, ignore_name_scope)
    with tf.device(device_dense):
        compressed, ctx = compression.compress(_on(device_dense, tensor))
        reduced = _allreduce(compressed, name=name, op=op, prescale_factor=prescale_factor,
                             postscale_factor=postscale_factor,
                             ignore_name_scope=ignore_name_scope, process_set=process_set)
        return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors, average=None, device_dense='', device_sparse='',
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set,
                      ignore_name_scope=False, name=None):
    """allreduce of a list: its dense tensors as one grouped op per dtype, its
    tf.IndexedSlices as allgathers. Returns the list in the same order."""
    if not tensors:
        return tensors
    op = handle_average_backwards_compatibility(op, average)
    out = [None] * len(tensors)
    dense = []
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            with tf.device(device_sparse):
                out[i] = _sparse_allreduce(t, op, prescale_factor, postscale_factor,
                                           process_set, ignore_name_scope)
        else:
            dense.append(i)
    with tf.device(device_dense):
        pairs = {i: compression.compress(_on(device_dense, tensors[i])) for i in dense}
        by_dtype = {}
        for i in dense:
            by_dtype.setdefault(pairs[i][0].dtype, []).append(i)
        for k, (dtype, idx) in enumerate(sorted(by_dtype.items(), key=lambda kv: kv[1][0])):
            nm = name if name is None or len(by_dtype) == 1 else "%s_%d" % (name, k)
            reduced = _grouped_allreduce([pairs[i][0] for i in idx], name=nm, op=op,
                                         prescale_factor=prescale_factor,
                                         postscale_factor=postscale_factor,
                                         ignore_name_scope=ignore_name_scope,
                                         process_set=process_set)
            for i, r in zip(idx, reduced):
                out[i] = compression.decompress(r, pairs[i][1])
    return out


def reducescatter(tensor, device_dense='', compression=Compression.none, op=Average,
                  name=None, process_set=global_process_set, ignore_name_scope=False,
                  prescale_factor=1.0, postscale_factor=1.0):
    """The reduction over the set's ranks, cut along dim 0: this rank keeps its rows (the
    first d0 % n ranks get one more)."""
    with tf.device(device_dense):
        compressed, ctx = compression.compress(_on(device_dense, tensor))
        out = _reducescatter(compressed, name=name, op=op, process_set=process_set,
                             ignore_name_scope=ignore_name_scope,
                             prescale_factor=prescale_factor,
                             postscale_factor=postscale_factor)
        return compression.decompress(out, ctx)


def grouped_reducescatter(tensors, device_dense='', compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    if not tensors:
        return tensors
    with tf.device(device_dense):
        pairs = [compression.compress(_on(device_dense, t)) for t in tensors]
        outs = _grouped_reducescatter([c for c, _ in pairs], op=op, process_set=process_set,
                                      prescale_factor=prescale_factor,
                                      postscale_factor=postscale_factor)
        return [compression.decompress(o, c) for o, (_, c) in zip(outs, pairs)]


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense='',
                         device_sparse='', compression=Compression.none,
                         sparse_as_dense=False, backward_passes_per_step=1, op=Average,
                         gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=global_process_set,
                         scale_local_gradients=True):
    """A Keras optimizer whose gradients are averaged over the ranks before they are
    applied (khor.tensorflow.keras makes it). TensorFlow 1's tf.compat.v1.train.Optimizer is
    not supported."""
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise NotImplementedError("khor.tensorflow.DistributedOptimizer takes Keras optimizers "
                                  "(TensorFlow 2); tf.compat.v1.train.Optimizer is not "
                                  "supported: use DistributedGradientTape")
    if op == Adasum:
        raise ValueError("op == Adasum is not supported yet with Keras")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    from .keras._impl import create_distributed_optimizer
    return create_distributed_optimizer(
        optimizer=optimizer, name=name, device_dense=device_dense,
        device_sparse=device_sparse, compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, op=op,
        num_groups=num_groups, groups=groups, process_set=process_set,
        scale_local_gradients=scale_local_gradients)


# What this build has, truthfully: no MPI, Gloo, DDL, oneCCL or ROCm; no GPU kernels for
# TensorFlow (whatever libkhor itself was built with).
def mpi_built(verbose=False):
    return False


def mpi_enabled():
    return False


def mpi_threads_supported():
    return False


def gloo_built(verbose=False):
    return False


def gloo_enabled():
    return False


def nccl_built(verbose=False):
    return 0


def ddl_built(verbose=False):
    return False


def ccl_built(verbose=False):
    return False


def cuda_built(verbose=False):
    return False


def rocm_built(verbose=False):
    return False


__all__ = [n for n in dir() if not n.startswith("_") and n not in ("tf",)]


def __getattr__(name):
    # Made on first use, from the Keras that tf.keras is (importing Keras here would slow
    # every `import khor.tensorflow`).
    if name == "SyncBatchNormalization":
        from .sync_batch_norm import sync_batch_normalization_class
        return sync_batch_normalization_class()
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
