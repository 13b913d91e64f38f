"""khor.torch.elastic: Horovod's elastic API for torch (``hvd.elastic``): TorchState,
ElasticSampler and the run decorator (khor.elastic's loop; see there and docs/ELASTIC.md).

    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        ...

    train(state)
"""

from ...elastic import run, run_fn, State, ObjectState
from ...exceptions import HorovodInternalError, HostsUpdatedInterrupt, WorkerRemoved
from .sampler import ElasticSampler
from .state import (ModelStateHandler, OptimizerStateHandler, SamplerStateHandler,
                    StateHandler, TorchState, get_handler_registry, set_handler_registry)

__all__ = ["TorchState", "ElasticSampler", "run", "run_fn", "State", "ObjectState",
           "StateHandler", "ModelStateHandler", "OptimizerStateHandler",
           "SamplerStateHandler", "get_handler_registry", "set_handler_registry",
           "HorovodInternalError", "HostsUpdatedInterrupt", "WorkerRemoved"]
