"""DistributedGradientTape: a tf.GradientTape whose gradient() averages (by default) every
gradient over the ranks before returning it, as Horovod's; and make_allreduce_grads_fn, the
gradient reduction it uses, which Keras's DistributedOptimizer uses too.

Eagerly the reduction runs as one tf.function, so all of a step's allreduces are in flight at
once (the engine fuses them) and their names come from the graph, the same on every rank.
"""

import warnings

import tensorflow as tf

from .._core import Average, global_process_set
from .compression import Compression


def _ref(v):
    """A hashable key for a variable or tensor: Keras 3 variables have no ``ref()``; the
    tf.Variable under one (its ``value``) does."""
    if not hasattr(v, "ref"):
        inner = getattr(v, "value", None)
        if hasattr(inner, "ref"):
            return inner.ref()
    return v.ref()


def _split_list(items, n):
    """items cut into n contiguous parts of nearly equal length (the first ones longer)."""
    base, extra = divmod(len(items), n)
    out, i = [], 0
    for k in range(n):
        m = base + (1 if k < extra else 0)
        if m:
            out.append(items[i:i + m])
        i += m
    return out


_fns = {}


def make_allreduce_grads_fn(name, device_dense='', device_sparse='',
                            compression=Compression.none, sparse_as_dense=False, op=Average,
                            gradient_predivide_factor=1.0, groups=None,
                            process_set=global_process_set):
    """A function (grads, vars=None, use_generic_names=False) -> reduced grads (None stays
    None). op == Average with gradient_predivide_factor f scales by 1/f before the sum and by
    f/size after it. groups: None (one allreduce per gradient, which the engine fuses), an
    int n (n grouped allreduces over the gradients in order) or a list of lists of
    variables (each list one group; the other gradients one group each).

    Eagerly it is a tf.function, one per set of arguments: a training loop that wraps its
    tape anew every step then traces it once, not every step."""
    key = None
    if tf.executing_eagerly():
        gkey = tuple(tuple(_ref(v) for v in g) for g in groups) \
            if isinstance(groups, list) else groups
        key = (name, device_dense, device_sparse, compression, sparse_as_dense, op,
               gradient_predivide_factor, gkey, process_set)
        if key in _fns:
            return _fns[key]
    from . import allreduce, grouped_allreduce  # the package's, with IndexedSlices
    if op == Average:
        prescale, postscale = 1.0 / gradient_predivide_factor, gradient_predivide_factor
    else:
        prescale = postscale = 1.0
    group_refs = None
    if isinstance(groups, list):
        group_refs = [[_ref(v) for v in g] for g in groups]

    def reduce_one(grad, i, use_generic_names):
        return allreduce(grad, device_dense=device_dense, device_sparse=device_sparse,
                         compression=compression, op=op, prescale_factor=prescale,
                         postscale_factor=postscale, process_set=process_set,
                         name="grad_%d" % i if use_generic_names else None,
                         ignore_name_scope=use_generic_names)

    def reduce_group(pairs, k, use_generic_names):
        reduced = grouped_allreduce([g for _, g in pairs], device_dense=device_dense,
                                    device_sparse=device_sparse, compression=compression,
                                    op=op, prescale_factor=prescale,
                                    postscale_factor=postscale, process_set=process_set,
                                    name="grad_%d" % k if use_generic_names else None,
                                    ignore_name_scope=use_generic_names)
        return [(i, r) for (i, _), r in zip(pairs, reduced)]

    def allreduce_grads(grads, vars=None, use_generic_names=False):
        grads = list(grads)
        with tf.name_scope(name + "_Allreduce"):
            if sparse_as_dense:
                grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                         for g in grads]
            ps = process_set if process_set is not None else global_process_set
            if not ps.included() or ps.size() == 1:
                # nothing to reduce with (Horovod's _allreduce_cond)
                return grads
            if groups is None:
                return [reduce_one(g, i, use_generic_names) if g is not None else None
                        for i, g in enumerate(grads)]
            present = [(i, g) for i, g in enumerate(grads) if g is not None]
            if group_refs is not None:
                where = {_ref(vars[i]): (i, g) for i, g in present}
                parts = []
                for refs in group_refs:
                    part = [where.pop(r) for r in refs if r in where]
                    if part:
                        parts.append(part)
                parts += [[p] for p in sorted(where.values(), key=lambda p: p[0])]
            else:
                parts = _split_list(present, groups)
            out = [None] * len(grads)
            for k, part in enumerate(parts):
                for i, r in reduce_group(part, k, use_generic_names):
                    out[i] = r
            return out

    if key is not None:
        fn = _fns[key] = tf.function(allreduce_grads)
        return fn
    return allreduce_grads


class _DistributedGradientTape(tf.GradientTape):
    """The methods a distributed tape adds to the wrapped tape's class."""

    def _khor_setup(self, reduce_fn, process_set, scale_local_gradients):
        self._allreduce_grads = reduce_fn
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self._local_sources = set()

    def register_local_source(self, source):
        """source's gradient stays this rank's own (not reduced; divided by the set's size
        when scale_local_gradients)."""
        self._local_sources.add(_ref(source))

    def gradient(self, target, sources, output_gradients=None, use_generic_names=False):
        flat = tf.nest.flatten(sources)
        grads = super(self.__class__, self).gradient(target, flat, output_gradients)
        keys = [_ref(s) for s in flat]
        reduce_idx = [i for i, k in enumerate(keys) if k not in self._local_sources]
        reduced = self._allreduce_grads([grads[i] for i in reduce_idx],
                                        [flat[i] for i in reduce_idx], use_generic_names)
        out = list(grads)
        for i, r in zip(reduce_idx, reduced):
            out[i] = r
        if self.scale_local_gradients and self._local_sources:
            n = float(self.process_set.size())
            for i, k in enumerate(keys):
                if k in self._local_sources and out[i] is not None:
                    g = out[i]
                    out[i] = tf.IndexedSlices(g.values / n, g.indices, g.dense_shape) \
                        if isinstance(g, tf.IndexedSlices) else g / n
        return tf.nest.pack_sequence_as(sources, out)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None,
                                       use_generic_names=False):
        grads = self.gradient(target, sources, output_gradients, use_generic_names)
        local, glob = [], []
        for s, g in zip(sources, grads):
            (local if _ref(s) in self._local_sources else glob).append((s, g))
        return local, glob


def DistributedGradientTape(gradtape, device_dense='', device_sparse='',
                            compression=Compression.none, sparse_as_dense=False, op=Average,
                            gradient_predivide_factor=1.0, num_groups=0, groups=None,
                            process_set=global_process_set, scale_local_gradients=True):
    """Wraps gradtape (after its `with` block): its gradient() returns the gradients reduced
    over the set's ranks (averaged by default)."""
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be "
                      "removed in v0.23.0.", DeprecationWarning)
        if groups is None:
            groups = num_groups
    if groups is not None and not (isinstance(groups, list) or groups > 0):
        raise ValueError("groups should be a non-negative integer or a list of list of "
                         "tf.Variable.")
    fn = make_allreduce_grads_fn("DistributedGradientTape", device_dense, device_sparse,
                                 compression, sparse_as_dense, op, gradient_predivide_factor,
                                 groups, process_set)
    cls = type(gradtape.__class__.__name__, (gradtape.__class__,),
               {k: v for k, v in _DistributedGradientTape.__dict__.items()
                if k not in ("__dict__", "__weakref__")})
    tape = cls(gradtape._persistent, gradtape._watch_accessed_variables)
    # the recording made under the wrapped tape's `with` block
    tape._tape = gradtape._tape
    tape._recording = False
    tape._khor_setup(fn, process_set, scale_local_gradients)
    return tape


def PartialDistributedGradientTape(gradtape, device_dense='', device_sparse='',
                                   compression=Compression.none, sparse_as_dense=False,
                                   op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=global_process_set,
                                   local_layers=None, scale_local_gradients=True):
    """DistributedGradientTape whose local_layers (a Keras layer or a list of them) keep
    their trainable weights' gradients to this rank (each registered as a local source)."""
    if local_layers is None:
        local_layers = []
    elif hasattr(local_layers, "trainable_weights"):
        local_layers = [local_layers]
    local_layers = list(local_layers)
    if not all(hasattr(layer, "trainable_weights") for layer in local_layers):
        raise ValueError("All local layers must be Keras layers (tf.keras.layers.Layer).")
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)
    for layer in local_layers:
        for v in layer.trainable_weights:
            tape.register_local_source(v)
    return tape
