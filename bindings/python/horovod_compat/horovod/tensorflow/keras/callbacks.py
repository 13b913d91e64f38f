"""horovod.tensorflow.keras.callbacks is khor.tensorflow.keras.callbacks."""

from khor.tensorflow.keras.callbacks import *  # noqa: F401,F403
