"""SyncBatchNormalization: Keras's BatchNormalization whose training-time moments are those of
the whole batch over every rank of the process set (Horovod's hvd.SyncBatchNormalization),
for the Keras that tf.keras is (Keras 3 or tf-keras). Each rank's sum, sum of squares and
count go into one grouped allreduce; the mean and variance come from the totals, so ranks
with different batch sizes weigh by their rows."""

import inspect

import tensorflow as tf

from .._core import Sum, global_process_set


def _global_moments(x, axes, keepdims, weights, process_set):
    dtype = x.dtype if x.dtype in (tf.float32, tf.float64) else tf.float32
    x = tf.cast(x, dtype)
    if weights is None:
        w = tf.ones_like(x)
    else:
        w = tf.cast(tf.broadcast_to(weights, tf.shape(x)), dtype)
    s = tf.reduce_sum(x * w, axes, keepdims=True)
    sq = tf.reduce_sum(tf.square(x) * w, axes, keepdims=True)
    n = tf.reduce_sum(w, axes, keepdims=True)
    from . import grouped_allreduce
    s, sq, n = grouped_allreduce([s, sq, n], op=Sum, process_set=process_set)
    n = tf.maximum(n, 1e-7)
    mean = s / n
    var = tf.maximum(sq / n - tf.square(mean), 0.0)
    if not keepdims:
        mean = tf.squeeze(mean, axes)
        var = tf.squeeze(var, axes)
    return mean, var


def _make():
    from .keras._impl import keras_for_tf
    keras = keras_for_tf()
    base = keras.layers.BatchNormalization
    # Keras 3's BatchNormalization._moments(inputs, mask); tf-keras's takes the axes too
    keras3 = list(inspect.signature(base._moments).parameters) == ["self", "inputs", "mask"]

    class SyncBatchNormalization(base):
        """BatchNormalization with moments over the ranks of process_set (training only;
        inference uses the moving averages, as plain BatchNormalization)."""

        def __init__(self, *args, process_set=global_process_set, **kwargs):
            if not keras3:
                kwargs["fused"] = False  # the fused kernel computes its own moments
            kwargs.pop("synchronized", None)
            super().__init__(*args, **kwargs)
            self._khor_process_set = process_set

        if keras3:
            def _moments(self, inputs, mask):
                weights = None
                if mask is not None:
                    weights = tf.expand_dims(tf.cast(mask, inputs.dtype), -1)
                return _global_moments(inputs, self._reduction_axes, False, weights,
                                       self._khor_process_set)
        else:
            def _moments(self, inputs, reduction_axes, keep_dims, mask=None):
                weights = None
                if mask is not None:
                    weights = tf.expand_dims(tf.cast(mask, inputs.dtype), -1)
                return _global_moments(inputs, reduction_axes, keep_dims, weights,
                                       self._khor_process_set)

    SyncBatchNormalization.__module__ = "khor.tensorflow"
    return SyncBatchNormalization


_cls = None


def sync_batch_normalization_class():
    global _cls
    if _cls is None:
        _cls = _make()
    return _cls
