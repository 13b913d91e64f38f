"""horovod.torch.elastic is khor.torch.elastic."""

from khor.torch.elastic import *  # noqa: F401,F403
from khor.torch.elastic import __all__  # noqa: F401
