"""Horovod's keras API over khor (``import khor.keras as hvd``) for standalone keras
(``import keras``: Keras 3 on TensorFlow). The same functions as khor.tensorflow.keras;
load_model and the callbacks use this keras module."""

import keras as _keras

from khor.tensorflow.keras import (  # noqa: F401
    Average, Sum, Adasum, Min, Max, Product, Compression, ProcessSet, global_process_set,
    init, shutdown, is_initialized, size, rank, local_size, local_rank, cross_size,
    cross_rank, broadcast_object, allgather_object, DistributedOptimizer,
    broadcast_global_variables, allreduce, allgather, broadcast, reducescatter)
from khor.tensorflow.keras import _impl
from . import callbacks  # noqa: F401

__all__ = ["Average", "Sum", "Adasum", "Min", "Max", "Product", "Compression", "ProcessSet",
           "global_process_set", "init", "shutdown", "is_initialized", "size", "rank",
           "local_size", "local_rank", "cross_size", "cross_rank", "broadcast_object",
           "allgather_object", "DistributedOptimizer", "broadcast_global_variables",
           "allreduce", "allgather", "broadcast", "reducescatter", "load_model", "callbacks"]


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none):
    """keras.models.load_model, then the model's optimizer rewrapped as a
    DistributedOptimizer in place (its restored state kept)."""
    return _impl.load_model(_keras, filepath, custom_optimizers, custom_objects,
                            compression)
