"""TorchState: the elastic state of a torch script (Horovod's). Each keyword argument
becomes an attribute; one whose type has a handler in the registry (a module, an optimizer,
an ElasticSampler) is saved, restored and synced by it, the others as plain objects
(pickled from rank 0)."""

import copy

import torch

from ...elastic import ObjectState, sync_root
from ..functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from ..functions import allgather_object
from ..mpi_ops import rank
from .sampler import ElasticSampler


class StateHandler:
    """Saves, restores and syncs one value of a TorchState."""

    def __init__(self, value):
        self.value = value

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def reset(self):
        """After a reset, before the sync: adjust to the new ranks (nothing by default)."""

    def set_value(self, value):
        self.value = value
        self.save()


class _StateDictHandler(StateHandler):
    """A value with state_dict() / load_state_dict(): saved as a deep copy of the dict."""

    def __init__(self, value):
        super().__init__(value)
        self._saved = copy.deepcopy(value.state_dict())

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)


class ModelStateHandler(_StateDictHandler):
    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=sync_root())


class OptimizerStateHandler(_StateDictHandler):
    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=sync_root())


class SamplerStateHandler(_StateDictHandler):
    def sync(self):
        # The sync root's epoch and count; the indices each rank recorded, of every rank.
        sd = broadcast_object(self.value.state_dict(), root_rank=sync_root(),
                              name="khor.elastic.sampler")
        done = allgather_object(self.value.processed_indices,
                                name="khor.elastic.sampler.indices")
        sd["processed_indices"] = set().union(*done)
        self.value.load_state_dict(sd)

    def reset(self):
        # A reset without a sync (hosts only removed) must still reshard on the new size.
        self.value.reset()


_handler_registry = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry():
    """The (type, handler class) pairs, first match wins."""
    return _handler_registry


def set_handler_registry(registry):
    global _handler_registry
    _handler_registry = registry


def _handler_for(value):
    for typ, cls in _handler_registry:
        if isinstance(value, typ):
            return cls(value)
    return None


class TorchState(ObjectState):
    """The elastic state of a torch script: model and optimizer (either may be None, and
    more of each may come as keyword arguments) and any other attributes to keep."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers, plain = {}, {}
        for k, v in kwargs.items():
            h = _handler_for(v)
            if h is None:
                plain[k] = v
            else:
                handlers[k] = h
        self._handlers = handlers
        for k, h in handlers.items():
            setattr(self, k, h.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **plain)

    def save(self):
        for h in self._handlers.values():
            h.save()
        super().save()

    def restore(self):
        for h in self._handlers.values():
            h.restore()
        super().restore()

    def sync(self):
        # What the sync brought is saved, as ObjectState's attributes are: a restore before
        # the next commit goes back to rank 0's state, not to this rank's before the sync.
        for h in self._handlers.values():
            h.sync()
            h.save()
        super().sync()

    def reset(self):
        for h in self._handlers.values():
            h.reset()
        super().reset()

    def __setattr__(self, name, value):
        # Assigning a handled attribute (state.model = other) saves the new value.
        handlers = self.__dict__.get("_handlers")
        if handlers is not None and name in handlers and name in self.__dict__:
            handlers[name].set_value(value)
        super().__setattr__(name, value)
