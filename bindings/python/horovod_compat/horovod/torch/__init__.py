"""horovod.torch is khor.torch (see horovod/__init__.py)."""

from khor.torch import *  # noqa: F401,F403
from khor.torch import HorovodInternalError, __all__  # noqa: F401
