"""khor.tensorflow.elastic: Horovod's elastic API for TensorFlow 2 (``hvd.elastic``):
TensorFlowState (variables plus plain attributes), KerasState (a model and its optimizer) and
the run decorator: khor.elastic's loop, whose reset also hands the new engine to the
TensorFlow ops. Eager execution only, as Horovod's TensorFlow 2 elastic mode.

    state = hvd.elastic.TensorFlowState(model.variables, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        ...
"""

import tensorflow as tf

from .. import _core
from .. import elastic as _elastic
from ..elastic import ObjectState, State, sync_root
from ..exceptions import HorovodInternalError, HostsUpdatedInterrupt, WorkerRemoved
from . import _oplib
from .functions import broadcast_object, broadcast_variables


def reset():
    """khor.elastic.reset, then the TensorFlow ops are given the new generation's engine."""
    try:
        _elastic.reset()
    finally:
        _oplib.sync_engine()


def run_fn(func, reset_fn=reset):
    return _elastic.run_fn(func, reset_fn)


def run(func):
    """Runs func(state, ...) until it returns, through failures and host changes (see
    khor.elastic)."""
    return _elastic.run_fn(func, reset)


def _variables_of(x):
    if x is None:
        return []
    vs = getattr(x, "variables", x)
    vs = vs() if callable(vs) else vs
    return list(vs)


class TensorFlowState(ObjectState):
    """variables (tf.Variables, or Keras variables) and the keyword arguments as
    attributes: save copies the variables' values to host memory, restore assigns them
    back, sync sets them to the sync root's on every rank (then saves)."""

    def __init__(self, variables=None, **kwargs):
        if not tf.executing_eagerly():
            raise RuntimeError("hvd.elastic.TensorFlowState runs in eager mode (TensorFlow 2)")
        self._tf_variables = list(variables) if variables is not None else None
        self._saved_values = None
        super().__init__(bcast_object=broadcast_object, get_rank=_core.rank, **kwargs)
        self._save_variables()

    def _variables(self):
        if self._tf_variables is not None:
            return self._tf_variables
        return tf.compat.v1.global_variables()

    def _save_variables(self):
        self._saved_values = [tf.identity(v).numpy() for v in self._variables()]

    def save(self):
        self._save_variables()
        super().save()

    def restore(self):
        for v, val in zip(self._variables(), self._saved_values or []):
            v.assign(val)
        super().restore()

    def sync(self):
        vs = self._variables()
        if vs:
            broadcast_variables(vs, root_rank=sync_root())
        self._save_variables()
        super().sync()


class KerasState(TensorFlowState):
    """A Keras model and optimizer (their variables, the optimizer's as they exist when
    saved or synced: Keras makes its slots on the first step) and the keyword arguments."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        self.model = model
        self.optimizer = optimizer if optimizer is not None else \
            getattr(model, "optimizer", None)
        self.backend = backend
        super().__init__(variables=None, **kwargs)

    def _variables(self):
        return _variables_of(self.model) + _variables_of(self.optimizer)

    def _save_variables(self):
        self._saved_values = [tf.identity(_plain(v)).numpy() for v in self._variables()]

    def restore(self):
        vs = self._variables()
        for v, val in zip(vs, self._saved_values or []):
            v.assign(val)
        ObjectState.restore(self)

    def sync(self):
        vs = [_plain(v) for v in self._variables()]
        if vs:
            broadcast_variables(vs, root_rank=sync_root())
        self._save_variables()
        ObjectState.sync(self)


def _plain(v):
    """The tf.Variable under a Keras 3 variable; others as they are."""
    if isinstance(v, tf.Variable):
        return v
    inner = getattr(v, "value", None)
    return inner if isinstance(inner, tf.Variable) else v


__all__ = ["TensorFlowState", "KerasState", "run", "run_fn", "reset", "State", "ObjectState",
           "HorovodInternalError", "HostsUpdatedInterrupt", "WorkerRemoved"]
