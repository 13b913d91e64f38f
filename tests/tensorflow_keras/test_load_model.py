"""model.save and load_model: a model trained with DistributedOptimizer saves the plain
optimizer (plain Keras loads the file without khor), and hvd.load_model gives it back
distributed with its state (iterations, slots) so that training goes on averaged."""

import os
import shutil
import tempfile

import numpy as np
import pytest

import khor.tensorflow.keras as hvd
from kerastest import LEGACY, close, data, grads, keras, model


@pytest.fixture
def shared_dir():
    """A directory every rank sees (one host): made by rank 0, its name broadcast."""
    path = hvd.broadcast_object(tempfile.mkdtemp(prefix="khor-keras-") if hvd.rank() == 0
                                else None, root_rank=0)
    yield path
    hvd.allgather_object(None)      # nobody still reads it
    if hvd.rank() == 0:
        shutil.rmtree(path, ignore_errors=True)


def _trained(path, ext):
    x, y = data(hvd.rank())
    m = model()
    # a loss object, not "mse": Keras 3 cannot read the name back from an HDF5 file
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)),
              loss=keras.losses.MeanSquaredError())
    m.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    f = os.path.join(path, "model" + ext)
    if hvd.rank() == 0:
        m.save(f)
    hvd.allgather_object(None)      # the file is complete before anyone reads it
    return m, f


@pytest.mark.parametrize("ext", [".keras", ".h5"])
def test_round_trip_keeps_state_and_stays_distributed(shared_dir, ext):
    if ext == ".h5":
        pytest.importorskip("h5py", reason="HDF5 saving needs h5py")
        if not LEGACY:
            pytest.skip("Keras 3 cannot train a model it loaded from HDF5, khor or not "
                        "(its optimizer rejects the new model's variables as unknown)")
    m, f = _trained(shared_dir, ext)
    loaded = hvd.load_model(f)
    opt = loaded.optimizer
    assert type(opt).__name__ == "Adam"
    assert getattr(opt, "_khor_settings", None) is not None, "not rewrapped"
    assert int(np.asarray(opt.iterations)) == int(np.asarray(m.optimizer.iterations)) == 2
    close(loaded.get_weights(), m.get_weights(), rtol=0, atol=0)
    # one more averaged step on each; the two models stay equal, and equal on every rank
    x, y = data(hvd.rank(), salt=1)
    m.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    loaded.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    close(loaded.get_weights(), m.get_weights(), rtol=1e-6, atol=1e-7)
    every = hvd.allgather_object([w.tolist() for w in loaded.get_weights()])
    for other in every:
        close(loaded.get_weights(), other, rtol=0, atol=0)


def test_plain_keras_loads_the_file(shared_dir):
    m, f = _trained(shared_dir, ".keras")
    plain = keras.models.load_model(f)
    assert getattr(plain.optimizer, "_khor_settings", None) is None
    assert type(plain.optimizer).__name__ == "Adam"
    close(plain.get_weights(), m.get_weights(), rtol=0, atol=0)


def test_custom_optimizer_and_compression(shared_dir):
    @keras.utils.register_keras_serializable(package="khortest")
    class MySGD(keras.optimizers.SGD):
        pass

    x, y = data(hvd.rank())
    m = model()
    m.compile(optimizer=hvd.DistributedOptimizer(MySGD(0.1)), loss="mse")
    m.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    f = os.path.join(shared_dir, "custom.keras")
    if hvd.rank() == 0:
        m.save(f)
    hvd.allgather_object(None)
    loaded = hvd.load_model(f, custom_optimizers=[MySGD],
                            compression=hvd.Compression.fp16)
    assert isinstance(loaded.optimizer, MySGD)
    assert loaded.optimizer._khor_settings.compression is hvd.Compression.fp16
    loaded.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    every = hvd.allgather_object([w.tolist() for w in loaded.get_weights()])
    for other in every:
        close(loaded.get_weights(), other, rtol=0, atol=0)
