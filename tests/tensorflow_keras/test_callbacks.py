"""The callbacks in model.fit under khorrun: BroadcastGlobalVariablesCallback makes ranks
that start from different weights train from root's; MetricAverageCallback gives later
callbacks the rank average of the epoch's metrics; the learning rate schedule and warmup
callbacks set the rate Horovod's formulas give, batch by batch, and the compiled step uses
it."""

import numpy as np
import pytest

import khor.tensorflow.keras as hvd
from kerastest import LEGACY, close, data, grads, keras, model


class Record(keras.callbacks.Callback):
    """Keeps a copy of each epoch's logs and the learning rate at each batch's start."""

    def __init__(self):
        super().__init__()
        self.epochs, self.lrs = [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.lrs.append(float(np.asarray(self.model.optimizer.learning_rate)))

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(dict(logs or {}))


@pytest.mark.parametrize("root", [0, "last"])
def test_broadcast_callback_trains_from_roots_weights(root):
    root = hvd.size() - 1 if root == "last" else root
    x, y = data(hvd.rank())
    m = model(seed=hvd.rank())          # different initial weights on every rank
    roots_initial = model(seed=root).get_weights()
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    m.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(root)])
    close(m.get_weights(), roots_initial, rtol=0, atol=0)   # lr 0: root's start, unchanged


def test_broadcast_callback_then_identical_training():
    x, y = data(hvd.rank())
    m = model(seed=hvd.rank())
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    m.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    every = hvd.allgather_object([w.tolist() for w in m.get_weights()])
    for other in every:
        close(m.get_weights(), other, rtol=0, atol=0)
    opt_vars = hvd.allgather_object([np.asarray(v).tolist() for v in m.optimizer.variables])
    assert all(o == opt_vars[0] for o in opt_vars), "optimizer state differs between ranks"


def test_metric_average_callback():
    x, y = data(hvd.rank(), salt=hvd.rank())
    m = model()
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse",
              metrics=["mae"])
    before, after = Record(), Record()
    m.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
          callbacks=[before, hvd.callbacks.MetricAverageCallback(), after])
    local = [e["loss"] for e in before.epochs]
    every = hvd.allgather_object(local)
    want = np.mean(every, axis=0)
    np.testing.assert_allclose([e["loss"] for e in after.epochs], want, rtol=1e-6)
    maes = np.mean(hvd.allgather_object([e["mae"] for e in before.epochs]), axis=0)
    np.testing.assert_allclose([e["mae"] for e in after.epochs], maes, rtol=1e-6)
    if hvd.size() > 1:
        assert len({tuple(v) for v in every}) > 1, "the ranks' losses should differ"


def test_warmup_callback_schedule():
    n, steps, warmup = hvd.size(), 4, 2
    x, y = data(hvd.rank(), rows=8)
    m = model()
    lr = 0.04 * n
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(lr)), loss="mse")
    rec = Record()
    m.fit(x, y, batch_size=2, epochs=3, shuffle=False, verbose=0,
          callbacks=[hvd.callbacks.LearningRateWarmupCallback(lr, warmup_epochs=warmup),
                     rec])
    want = []
    for e in range(3):
        for b in range(steps):
            if e < warmup:
                ep = e + b / steps + 1.0 / steps
                want.append(lr / n * (ep * (n - 1) / warmup + 1))
            else:
                want.append(want[-1])       # warmup over: the rate stays where it ended
    np.testing.assert_allclose(rec.lrs, want, rtol=1e-6)
    assert abs(rec.lrs[-1] - lr) < 1e-6 * lr
    assert rec.epochs[0]["lr"] == pytest.approx(want[steps - 1], rel=1e-6)


def test_schedule_callback_staircase_and_the_step_uses_it():
    x, y = data(hvd.rank())
    m = model()
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(1.0)), loss="mse")
    rec = Record()
    cb = hvd.callbacks.LearningRateScheduleCallback(0.1, multiplier=0.5, start_epoch=1,
                                                    end_epoch=3)
    m.fit(x, y, batch_size=8, epochs=4, shuffle=False, verbose=0, callbacks=[cb, rec])
    # epoch 0 before start: the compiled-in 1.0; then 0.1 * 0.5 ** (e - 1) for e in 1, 2;
    # after end_epoch the last value stays
    np.testing.assert_allclose(rec.lrs, [1.0, 0.1, 0.05, 0.05], rtol=1e-6)
    # the step used the rate the callback set: replay the updates by hand
    ref = model()
    w = None
    for lr in rec.lrs:
        w = _one_step(ref, lr)
    close(m.get_weights(), w)


def _one_step(ref, lr):
    """Plain SGD at rate lr on the rank-averaged gradients; the weights after it."""
    n = hvd.size()
    gs = [grads(ref, *data(k)) for k in range(n)]
    avg = [sum(g[i] for g in gs) / n for i in range(len(gs[0]))]
    keras.optimizers.SGD(lr).apply_gradients(zip(avg, ref.trainable_variables))
    return ref.get_weights()


def test_schedule_callback_needs_initial_lr():
    with pytest.raises(ValueError, match="initial_lr is required"):
        hvd.callbacks.LearningRateScheduleCallback(None, 0.5)


def test_momentum_correction_on_a_legacy_optimizer():
    """tf-keras's legacy SGD keeps momentum in a variable: for the batch in which the rate
    changes it runs at momentum * new_lr / old_lr, then goes back."""
    if not LEGACY:
        pytest.skip("only tf-keras's legacy optimizers keep momentum in a variable")
    x, y = data(hvd.rank())
    m = model()
    opt = hvd.DistributedOptimizer(keras.optimizers.legacy.SGD(0.1, momentum=0.9))
    m.compile(optimizer=opt, loss="mse")
    seen = []

    class Momentum(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(float(np.asarray(self.model.optimizer.momentum)))

    cb = hvd.callbacks.LearningRateScheduleCallback(0.1, lambda e: 0.5 if e >= 1 else 1.0,
                                                    staircase=True)
    m.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0,
          callbacks=[cb, Momentum()])
    # epoch 0: 0.1 -> 0.1 (x1); epoch 1: 0.1 -> 0.05 at its first batch (x0.5), then back
    np.testing.assert_allclose(seen, [0.9, 0.9, 0.45, 0.9], rtol=1e-6)
    assert float(np.asarray(opt.momentum)) == pytest.approx(0.9)
    every = hvd.allgather_object([w.tolist() for w in m.get_weights()])
    for other in every:
        close(m.get_weights(), other, rtol=0, atol=0)


def test_broadcast_variables_of_a_keras_model():
    """hvd.broadcast_variables(model.variables, root), as Horovod's Keras examples call it:
    under Keras 3 the model's variables are not tf.Variables (a tf.function traced them as
    tensors without assign() before khor took their tf.Variable)."""
    import khor.tensorflow as hvd_tf
    root = hvd.size() - 1
    m = model(seed=hvd.rank())
    hvd_tf.broadcast_variables(m.variables, root_rank=root)
    close([v.numpy() for v in m.variables], [v.numpy() for v in model(seed=root).variables])
