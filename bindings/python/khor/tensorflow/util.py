"""khor.tensorflow.util: the small helpers Horovod's horovod.tensorflow.util has, which scripts
and Horovod's own tests import (``from horovod.tensorflow.util import _executing_eagerly``)."""

import tensorflow as tf


def _executing_eagerly():
    """True when ops run eagerly here (not inside a tf.function or a TF1 graph)."""
    return tf.executing_eagerly()


def _make_subgraph(f):
    """f as one traced tf.function."""
    return tf.function(f)


def _cache(f):
    """f memoised on its (hashable) arguments and on whether it was called eagerly."""
    memo = {}

    def cached(*args):
        key = (args, _executing_eagerly())
        if key not in memo:
            memo[key] = f(*args)
        return memo[key]
    return cached


def vars_to_refs(variables):
    """A list (nested) of variables as a tuple of their hashable refs."""
    if isinstance(variables, list):
        return tuple(vars_to_refs(v) for v in variables)
    return variables.ref()


def refs_to_vars(refs):
    """The inverse of vars_to_refs."""
    if isinstance(refs, tuple):
        return [refs_to_vars(r) for r in refs]
    return refs.deref()
