"""horovod.tensorflow.keras.elastic is khor.tensorflow.elastic (KerasState, run)."""

from khor.tensorflow.elastic import *  # noqa: F401,F403
from khor.tensorflow.elastic import __all__  # noqa: F401
