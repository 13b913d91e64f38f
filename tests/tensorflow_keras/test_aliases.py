"""khor.keras (standalone keras) and the horovod.tensorflow.keras / horovod.keras aliases:
the same functions, callbacks on the right keras's Callback, and khor.keras's optimizer and
callbacks averaging in model.fit as khor.tensorflow.keras's do."""

import os
import sys

import pytest

import khor.tensorflow.keras as hvd
from kerastest import LEGACY, close, data, grads, model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPAT = os.path.join(ROOT, "bindings", "python", "horovod_compat")


def test_horovod_aliases_are_khor():
    if COMPAT not in sys.path:
        sys.path.insert(0, COMPAT)
    import horovod
    import horovod.keras as hk
    import horovod.tensorflow.keras as htk
    import khor.keras
    assert horovod.__khor__
    assert htk.DistributedOptimizer is hvd.DistributedOptimizer
    assert htk.callbacks.MetricAverageCallback is hvd.callbacks.MetricAverageCallback
    assert htk.load_model is hvd.load_model
    assert hk.load_model is khor.keras.load_model
    assert hk.callbacks.BroadcastGlobalVariablesCallback is \
        khor.keras.callbacks.BroadcastGlobalVariablesCallback
    for name in hvd.__all__:
        assert hasattr(htk, name), name


def test_khor_keras_trains_with_standalone_keras():
    import keras
    import khor.keras as hk
    assert issubclass(hk.callbacks.MetricAverageCallback, keras.callbacks.Callback)
    if LEGACY:
        pytest.skip("tf.keras is tf-keras here; standalone keras (Keras 3) models are "
                    "tested without TF_USE_LEGACY_KERAS")
    x, y = data(hvd.rank())
    m = model(seed=hvd.rank())
    root = model(seed=0)
    opt = hk.DistributedOptimizer(keras.optimizers.SGD(0.1))
    m.compile(optimizer=opt, loss="mse")
    m.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0,
          callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(0),
                     hk.callbacks.MetricAverageCallback()])
    # broadcast at train begin, then one step on the averaged gradients
    gs = [grads(root, *data(k)) for k in range(hvd.size())]
    avg = [sum(g[i] for g in gs) / hvd.size() for i in range(len(gs[0]))]
    keras.optimizers.SGD(0.1).apply_gradients(zip(avg, root.trainable_variables))
    close(m.get_weights(), root.get_weights())
    every = hvd.allgather_object([w.tolist() for w in m.get_weights()])
    for other in every:
        close(m.get_weights(), other, rtol=0, atol=0)
