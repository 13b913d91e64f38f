"""horovod.common.elastic is khor.elastic (State, ObjectState, run_fn)."""

from khor.elastic import *  # noqa: F401,F403
from khor.elastic import __all__  # noqa: F401
