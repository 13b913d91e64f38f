"""horovod.torch.elastic.state is khor.torch.elastic.state."""

from khor.torch.elastic.state import (StateHandler, ModelStateHandler,  # noqa: F401
                                      OptimizerStateHandler, SamplerStateHandler, TorchState,
                                      get_handler_registry, set_handler_registry)
