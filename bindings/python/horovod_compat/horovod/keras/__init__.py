"""horovod.keras is khor.keras (see horovod/__init__.py)."""

from khor.keras import *  # noqa: F401,F403
from khor.keras import __all__  # noqa: F401
from . import callbacks  # noqa: F401
