"""horovod.common.exceptions is khor.exceptions."""

from khor.exceptions import *  # noqa: F401,F403
from khor.exceptions import __all__  # noqa: F401
