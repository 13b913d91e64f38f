"""Helpers of the Keras tests: which keras tf.keras is, small models whose initial weights
are a function of a seed, and per-rank data that every rank can rebuild for every other rank
(so each computes the expected result of a distributed step locally)."""

import numpy as np
import tensorflow as tf

keras = tf.keras
LEGACY = not hasattr(keras.optimizers.SGD, "stateless_apply")   # tf-keras (Keras 2)


def model(seed=0, n_in=3, n_out=2):
    """Dense(4, relu) -> Dense(n_out), weights drawn from seed (not from a global RNG)."""
    init = lambda k: keras.initializers.RandomNormal(stddev=0.5, seed=seed * 10 + k)  # noqa
    m = keras.Sequential([keras.Input((n_in,)),
                          keras.layers.Dense(4, activation="relu", kernel_initializer=init(1),
                                             bias_initializer=init(2)),
                          keras.layers.Dense(n_out, kernel_initializer=init(3))])
    return m


def data(k, rows=8, n_in=3, n_out=2, salt=0):
    """Rank k's inputs and targets."""
    rng = np.random.default_rng(1000 * salt + k)
    return (rng.normal(size=(rows, n_in)).astype("float32"),
            rng.normal(size=(rows, n_out)).astype("float32"))


def grads(m, x, y):
    with tf.GradientTape() as tape:
        loss = keras.losses.MeanSquaredError()(y, m(x, training=True))
    return tape.gradient(loss, m.trainable_variables)


def close(a_list, b_list, rtol=1e-5, atol=1e-6):
    for a, b in zip(a_list, b_list):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)
