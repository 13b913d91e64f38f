"""horovod.tensorflow.functions is khor.tensorflow.functions."""

from khor.tensorflow.functions import (allgather_object, broadcast_object,  # noqa: F401
                                       broadcast_variables)
