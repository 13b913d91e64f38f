"""DistributedOptimizer in model.fit and in custom loops: ranks that train on different data
end with the same weights, equal to plain steps on the rank-averaged gradients; Sum,
gradient_predivide_factor, groups, local variables; backward_passes_per_step with and
without average_aggregated_gradients; the class a model saves; bad arguments."""

import numpy as np
import pytest
import tensorflow as tf

import khor.tensorflow.keras as hvd
from kerastest import LEGACY, close, data, grads, keras, model


def expected_weights(steps, lr=0.1, reduce="mean", passes=1, average_aggregated=False,
                     rows=8, batch=8, factor=None):
    """The weights a single process gets from plain SGD on, each step, the gradients of
    every rank's batch combined as DistributedOptimizer combines them."""
    n = hvd.size()
    ref = model()
    opt = keras.optimizers.SGD(lr)
    per_rank = [data(k, rows) for k in range(n)]
    micro = []
    for s in range(steps):
        lo = (s * batch) % rows
        gs = [grads(ref, x[lo:lo + batch], y[lo:lo + batch]) for x, y in per_rank]
        micro.append(gs)
        if len(micro) < passes:
            continue
        # local sums over the passes, then the op over ranks
        local = [[sum(m[k][i] for m in micro) for i in range(len(gs[0]))] for k in range(n)]
        if average_aggregated:
            local = [[g / passes for g in lk] for lk in local]
        comb = [sum(lk[i] for lk in local) for i in range(len(gs[0]))]
        if reduce == "mean":
            comb = [g / n for g in comb]
        opt.apply_gradients(zip(comb, ref.trainable_variables))
        micro = []
    return ref.get_weights()


@pytest.mark.parametrize("run_eagerly", [False, True])
def test_fit_averages_gradients(run_eagerly):
    x, y = data(hvd.rank())
    m = model()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    m.compile(optimizer=opt, loss="mse", run_eagerly=run_eagerly)
    m.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    mine = m.get_weights()
    every = hvd.allgather_object([w.tolist() for w in mine])
    for other in every:
        close(mine, other, rtol=0, atol=0)   # bit-identical on every rank
    close(mine, expected_weights(4, batch=4))


def test_custom_loop_in_tf_function():
    x, y = data(hvd.rank())
    m = model()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))

    @tf.function
    def step(x, y):
        g = grads(m, x, y)
        opt.apply_gradients(zip(g, m.trainable_variables))

    for _ in range(3):
        step(x, y)
    close(m.get_weights(), expected_weights(3))


def test_sum_and_predivide():
    x, y = data(hvd.rank())
    m = model()
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Sum),
              loss="mse")
    m.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    close(m.get_weights(), expected_weights(2, reduce="sum"))
    # a predivide factor changes where the division happens, not the average
    m = model()
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                                 gradient_predivide_factor=2.0),
              loss="mse")
    m.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    close(m.get_weights(), expected_weights(2))


@pytest.mark.parametrize("groups", ["num_groups", "lists"])
def test_groups(groups):
    x, y = data(hvd.rank())
    m = model()
    if groups == "num_groups":
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), num_groups=2)
    else:
        v = m.trainable_variables
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), groups=[[v[0], v[3]]])
    m.compile(optimizer=opt, loss="mse")
    m.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    close(m.get_weights(), expected_weights(2))


@pytest.mark.parametrize("average_aggregated", [False, True])
def test_backward_passes_per_step(average_aggregated):
    x, y = data(hvd.rank())
    m = model()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2,
                                   average_aggregated_gradients=average_aggregated)
    m.compile(optimizer=opt, loss="mse")
    # 8 rows in batches of 2: 4 backward passes per epoch, 2 updates
    m.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0)
    assert int(opt.iterations.numpy()) == 2, "one update per 2 passes"
    close(m.get_weights(), expected_weights(4, passes=2, batch=2,
                                            average_aggregated=average_aggregated))


def test_backward_passes_leaves_weights_between_updates():
    x, y = data(hvd.rank())
    m = model()
    before = m.get_weights()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=3)
    m.compile(optimizer=opt, loss="mse")
    m.fit(x[:4], y[:4], batch_size=2, epochs=1, shuffle=False, verbose=0)  # 2 of 3 passes
    close(m.get_weights(), before, rtol=0, atol=0)
    m.fit(x[4:6], y[4:6], batch_size=2, epochs=1, shuffle=False, verbose=0)  # the 3rd
    assert any(np.abs(a - b).max() > 0 for a, b in zip(m.get_weights(), before))


def test_local_variable_is_not_reduced():
    x, y = data(hvd.rank())
    m = model()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), scale_local_gradients=False)
    last_bias = m.trainable_variables[-1]
    opt.register_local_var(last_bias)
    m.compile(optimizer=opt, loss="mse")
    m.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    # every variable but the local one as averaged; the local one as this rank alone
    avg = expected_weights(1)
    ref = model()
    keras.optimizers.SGD(0.1).apply_gradients(zip(grads(ref, x, y), ref.trainable_variables))
    close(m.get_weights()[:-1], avg[:-1])
    close(m.get_weights()[-1:], ref.get_weights()[-1:])
    if hvd.size() > 1:
        every = hvd.allgather_object(m.get_weights()[-1].tolist())
        assert every[0] != every[1], "a local variable's gradient was reduced"


def test_class_keeps_the_wrapped_optimizers_name_and_config():
    plain = keras.optimizers.Adam(0.01, beta_1=0.8)
    opt = hvd.DistributedOptimizer(plain)
    assert isinstance(opt, type(plain))
    assert type(opt).__name__ == "Adam" and type(opt).__module__ == type(plain).__module__
    assert opt.get_config() == plain.get_config()


def test_bad_arguments_say_what_is_wrong():
    with pytest.raises(ValueError, match="backward_passes_per_step must be >= 1"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=0)
    with pytest.raises(ValueError, match="gradient_predivide_factor .* needs op=Average"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Sum,
                                 gradient_predivide_factor=2.0)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match="already distributed"):
        hvd.DistributedOptimizer(opt)


def test_ranks_that_disagree_fail_instead_of_hanging():
    """A gradient whose shape differs between ranks is an error on every rank, naming the
    op, not a hang."""
    if hvd.size() < 2:
        pytest.skip("needs two ranks")
    n_in = 3 + hvd.rank()
    m = model(n_in=n_in)
    x, y = data(0, n_in=n_in)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), name="Mismatch")
    with pytest.raises(Exception) as e:
        opt.apply_gradients(zip(grads(m, x, y), m.trainable_variables))
    text = str(e.value)
    assert "Mismatch" in text and "shape" in text and "rank" in text, text
