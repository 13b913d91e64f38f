"""Horovod's Keras callbacks, for standalone keras's Callback."""

import keras as _keras

from khor.tensorflow.keras import _callbacks

(BroadcastGlobalVariablesCallback, MetricAverageCallback, LearningRateScheduleCallback,
 LearningRateWarmupCallback) = _callbacks.classes(_keras.callbacks.Callback, __name__)

__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback"]
