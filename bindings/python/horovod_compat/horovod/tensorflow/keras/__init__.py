"""horovod.tensorflow.keras is khor.tensorflow.keras (see horovod/__init__.py)."""

from khor.tensorflow.keras import *  # noqa: F401,F403
from khor.tensorflow.keras import __all__  # noqa: F401
from . import callbacks  # noqa: F401
