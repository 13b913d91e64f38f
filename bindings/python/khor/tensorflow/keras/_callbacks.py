"""What Horovod's Keras callbacks do, written once for any keras module: each class here is
a mixin that khor.tensorflow.keras.callbacks and khor.keras.callbacks put in front of their
keras's Callback. Learning rates are read and written through ``optimizer.learning_rate``
(a variable in both Keras 3 and tf-keras, so a compiled train step sees the change)."""

import numpy as np
import tensorflow as tf

import khor.tensorflow as hvd
from ._impl import _tf_var


def _value(x):
    return float(np.asarray(x))


class BroadcastImpl:
    """Makes every rank start from root_rank's weights: the model's variables at the start
    of training, and model and optimizer variables again after the first batch (tf-keras
    makes optimizer slots only on the first apply; Horovod broadcasts at that point too)."""

    def __init__(self, root_rank, device='', local_variables=None):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.broadcast_done = False
        self._local_vars = set()
        # Horovod's local_variables: variables (a list, or one) left as each rank has them
        if local_variables is not None:
            if not isinstance(local_variables, (list, tuple, set)):
                local_variables = [local_variables]
            for v in local_variables:
                self.register_local_var(v)

    def register_local_var(self, var):
        """var is worker-local: it is not broadcast."""
        self._local_vars.add(_tf_var(var).ref())

    def _model_vars(self):
        return [_tf_var(v) for v in self.model.variables
                if _tf_var(v).ref() not in self._local_vars]

    def _optimizer_vars(self):
        vs = getattr(self.model.optimizer, "variables", None)
        vs = vs() if callable(vs) else (vs or [])
        return [_tf_var(v) for v in vs]

    def on_train_begin(self, logs=None):
        if not self.broadcast_done:
            hvd.broadcast_variables(self._model_vars(), root_rank=self.root_rank)

    def on_train_batch_end(self, batch, logs=None):
        if self.broadcast_done:
            return
        hvd.broadcast_variables(self._model_vars(), root_rank=self.root_rank)
        opt_vars = self._optimizer_vars()
        if opt_vars:
            hvd.broadcast_variables(opt_vars, root_rank=self.root_rank)
        self.broadcast_done = True


class MetricAverageImpl:
    """Replaces each epoch's logged metrics by their average over ranks, in place, so the
    callbacks after this one (checkpoints, early stopping, schedules) see the same numbers
    on every rank. Ranks must log the same metric names."""

    def __init__(self, device=''):
        super().__init__()
        self.device = device

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        for metric in sorted(logs):
            value = logs[metric]
            try:
                x = tf.constant(value, dtype=tf.float64)
            except (TypeError, ValueError):
                continue
            logs[metric] = float(hvd.allreduce(
                x, op=hvd.Average, name="MetricAverageCallback.%s" % metric).numpy())


class ScheduleImpl:
    """Sets the learning rate to initial_lr * multiplier(epoch) from start_epoch up to (not
    including) end_epoch: at each epoch's first batch with staircase, else every batch with
    a fractional epoch (epoch + batch / steps_per_epoch). With momentum_correction the
    momentum is scaled by new_lr / old_lr for the batch in which the rate changes, where the
    optimizer keeps momentum in a variable (tf-keras's legacy optimizers); Keras 3 and new
    tf-keras optimizers keep it as a Python float that a compiled step does not re-read, so
    there it is left alone."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        if initial_lr is None:
            raise ValueError("khor LearningRateScheduleCallback: initial_lr is required")
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        self.restore_momentum = None
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.multiplier = lambda epoch: multiplier ** (epoch - start_epoch)

    def _steps(self):
        p = self.params or {}
        if p.get("steps"):
            return p["steps"]
        if p.get("samples") and p.get("batch_size"):
            return p["samples"] // p["batch_size"]
        raise ValueError("khor %s: cannot tell the number of steps per epoch from "
                         "model.fit's parameters; pass steps_per_epoch="
                         % type(self).__name__)

    def _momentum_var(self):
        m = getattr(self.model.optimizer, "momentum", None)
        return m if isinstance(m, tf.Variable) or hasattr(m, "assign") else None

    def _adjust(self, epoch):
        opt = self.model.optimizer
        old = _value(opt.learning_rate)
        new = self.initial_lr * self.multiplier(epoch)
        try:
            opt.learning_rate = new
        except (TypeError, ValueError, AttributeError) as e:
            raise TypeError("khor %s: cannot set the learning rate of %s (%s); give the "
                            "optimizer a float learning rate, not a schedule"
                            % (type(self).__name__, type(opt).__name__, e)) from None
        m = self._momentum_var() if self.momentum_correction else None
        if m is not None and old > 0:
            self.restore_momentum = _value(m)
            m.assign(self.restore_momentum * new / old)

    def on_train_begin(self, logs=None):
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._steps()

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        e = self.current_epoch
        if e < self.start_epoch or (self.end_epoch is not None and e >= self.end_epoch):
            return
        if self.staircase:
            if batch == 0:
                self._adjust(e)
        else:
            self._adjust(e + float(batch) / self.steps_per_epoch)

    def on_train_batch_end(self, batch, logs=None):
        if self.restore_momentum is not None:
            self._momentum_var().assign(self.restore_momentum)
            self.restore_momentum = None

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = _value(self.model.optimizer.learning_rate)


class WarmupImpl(ScheduleImpl):
    """Goes from initial_lr / size to initial_lr over warmup_epochs, linearly per batch
    (Goyal et al., "Accurate, Large Minibatch SGD"); initial_lr is the already scaled rate."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            epoch += 1.0 / self.steps_per_epoch
            n = hvd.size()
            return 1.0 / n * (epoch * (n - 1) / warmup_epochs + 1)
        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and hvd.rank() == 0:
            print("\nEpoch %d: finished gradual learning rate warmup to %g."
                  % (epoch + 1, _value(self.model.optimizer.learning_rate)))


_PUBLIC = (("BroadcastGlobalVariablesCallback", BroadcastImpl),
           ("MetricAverageCallback", MetricAverageImpl),
           ("LearningRateScheduleCallback", ScheduleImpl),
           ("LearningRateWarmupCallback", WarmupImpl))


def classes(callback_base, module):
    """Horovod's four callbacks as subclasses of callback_base (the Callback of one keras
    module), named as Horovod names them and living in module."""
    return tuple(type(name, (impl, callback_base), {"__module__": module,
                                                     "__qualname__": name,
                                                     "__doc__": impl.__doc__})
                 for name, impl in _PUBLIC)
