"""Horovod's Keras callbacks, for tf.keras's Callback (what each does: _callbacks)."""

from . import _callbacks, _impl

(BroadcastGlobalVariablesCallback, MetricAverageCallback, LearningRateScheduleCallback,
 LearningRateWarmupCallback) = _callbacks.classes(_impl.keras_for_tf().callbacks.Callback,
                                                  __name__)

__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback"]
