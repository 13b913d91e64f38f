"""horovod.tensorflow.functions is khor.tensorflow.functions."""

from khor.tensorflow.functions import (allgather_object, broadcast_, broadcast_object,  # noqa: F401,E501
                                       broadcast_object_fn, broadcast_global_variables,
                                       broadcast_variables)
