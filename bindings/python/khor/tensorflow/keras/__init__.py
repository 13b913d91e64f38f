"""Horovod's tensorflow.keras API over khor (``import khor.tensorflow.keras as hvd``), for the
keras that tf.keras resolves to: Keras 3 on TensorFlow, or tf-keras with
TF_USE_LEGACY_KERAS=1. The machinery is in _impl (optimizer, load_model) and _callbacks.

    hvd.init()
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.001 * hvd.size()))
    model.compile(optimizer=opt, loss=...)
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()])
"""

from khor.tensorflow import (Average, Sum, Adasum, Min, Max, Product, Compression,  # noqa
                             ProcessSet, global_process_set, init, shutdown, is_initialized,
                             size, rank, local_size, local_rank, cross_size, cross_rank,
                             broadcast_object, allgather_object)
from . import _impl
from . import callbacks  # noqa: F401
from khor.tensorflow import elastic  # noqa: F401  (KerasState, run)

__all__ = ["Average", "Sum", "Adasum", "Min", "Max", "Product", "Compression", "ProcessSet",
           "global_process_set", "init", "shutdown", "is_initialized", "size", "rank",
           "local_size", "local_rank", "cross_size", "cross_rank", "broadcast_object",
           "allgather_object", "DistributedOptimizer", "broadcast_global_variables",
           "allreduce", "allgather", "broadcast", "reducescatter", "load_model", "callbacks", "elastic"]


def DistributedOptimizer(optimizer, name=None, device_dense='', device_sparse='',
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=global_process_set,
                         scale_local_gradients=True):
    """Wraps a Keras optimizer so that gradients are combined with op (Average by default)
    over process_set before each update, inside model.fit's compiled train step.

    The result is a new optimizer (from optimizer's config) of a subclass of its class that
    keeps the class's name, so model.save() records the plain optimizer and load_model()
    here rewraps it. With backward_passes_per_step = N, gradients are summed locally over N
    calls and allreduced (divided by N first if average_aggregated_gradients) and applied
    on every N-th. num_groups or groups (a list of lists of variables) send gradients to the
    engine in groups. gradient_predivide_factor f divides by f before the sum and by
    size / f after it. Compile the model with jit_compile=False where XLA would be on:
    khor's ops run outside XLA."""
    return _impl.create_distributed_optimizer(
        optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
        gradient_predivide_factor, op, backward_passes_per_step,
        average_aggregated_gradients, groups, process_set, num_groups=num_groups,
        scale_local_gradients=scale_local_gradients)


def broadcast_global_variables(root_rank):
    """TF1 graph mode only (there is no global variable collection in TF2); in TF2 use
    callbacks.BroadcastGlobalVariablesCallback or khor.tensorflow.broadcast_variables."""
    return _impl.broadcast_global_variables(root_rank)


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0,
              op=None, compression=Compression.none, process_set=global_process_set):
    """value (a number, list or array) reduced over the ranks, as a tensor; Average unless
    op or average=False says otherwise."""
    return _impl.allreduce(value, name, average, prescale_factor, postscale_factor, op,
                           compression, process_set)


def allgather(value, name=None, process_set=global_process_set):
    """Every rank's value concatenated along the first dimension, in rank order."""
    return _impl.allgather(value, name, process_set)


def broadcast(value, root_rank, name=None, process_set=global_process_set):
    """root_rank's value on every rank."""
    return _impl.broadcast(value, root_rank, name, process_set)


def reducescatter(value, name=None, op=Average, process_set=global_process_set):
    """value reduced over the ranks, each rank keeping its slice of the first dimension."""
    return _impl.reducescatter(value, name, op, process_set)


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none):
    """tf.keras.models.load_model, then the model's optimizer rewrapped as a
    DistributedOptimizer in place (its restored state kept). custom_optimizers are optimizer
    classes the file names that Keras does not know."""
    return _impl.load_model(_impl.keras_for_tf(), filepath, custom_optimizers,
                            custom_objects, compression)
