"""horovod.tensorflow is khor.tensorflow (see horovod/__init__.py)."""

from khor.tensorflow import *  # noqa: F401,F403
from khor.tensorflow import HorovodInternalError, _executing_eagerly, __all__  # noqa: F401
from . import util  # noqa: F401


def __getattr__(name):
    import khor.tensorflow
    return getattr(khor.tensorflow, name)
