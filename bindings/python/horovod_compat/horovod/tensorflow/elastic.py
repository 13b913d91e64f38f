"""horovod.tensorflow.elastic is khor.tensorflow.elastic."""

from khor.tensorflow.elastic import *  # noqa: F401,F403
from khor.tensorflow.elastic import __all__  # noqa: F401
