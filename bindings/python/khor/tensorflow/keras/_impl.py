"""The Keras machinery behind khor.tensorflow.keras and khor.keras: the distributed
optimizer (a subclass made at run time of the wrapped optimizer's own class), load_model's
rewrapping, and the value helpers. The keras module is a parameter where it matters
(tf.keras for khor.tensorflow.keras, standalone keras for khor.keras); the optimizer itself
says which Keras it belongs to: Keras 3 optimizers have ``stateless_apply``, tf-keras
(Keras 2) ones do not.

Gradients are allreduced where the optimizer takes them: Keras 3's ``apply`` (which
``apply_gradients`` and model.fit's train step call) and tf-keras's ``apply_gradients``
(which ``minimize`` calls). So the collective sits inside the compiled train step of
model.fit, as a TensorFlow op; XLA cannot compile khor's ops, so ``jit_compile`` must be
off (Keras 3's "auto" turns it off on CPU-only hosts; pass ``jit_compile=False`` to
compile() where a GPU is visible).
"""

import tensorflow as tf

import khor.tensorflow as hvd
from khor.tensorflow import Average, Sum, Compression, global_process_set


def keras_for_tf():
    """The keras module tf.keras resolves to: tf-keras when TF_USE_LEGACY_KERAS is set to
    1/true, Keras 3 otherwise (TensorFlow >= 2.16 decides this itself, on first use)."""
    return tf.keras


def is_keras3_optimizer(optimizer):
    return hasattr(optimizer, "stateless_apply")


class _Settings:
    """What one DistributedOptimizer class does with gradients; a plain object so that
    neither Keras's nor TensorFlow's attribute tracking takes it for state to save."""

    def __init__(self, name, compression, sparse_as_dense, gradient_predivide_factor, op,
                 backward_passes_per_step, average_aggregated_gradients, groups,
                 process_set, scale_local_gradients):
        if backward_passes_per_step < 1:
            raise ValueError("khor DistributedOptimizer: backward_passes_per_step must be "
                             ">= 1 (got %r)" % (backward_passes_per_step,))
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("khor DistributedOptimizer: gradient_predivide_factor other "
                             "than 1.0 needs op=Average (got op=%r)" % (op,))
        if groups is not None and not (isinstance(groups, int) or
                                       isinstance(groups, (list, tuple))):
            raise ValueError("khor DistributedOptimizer: groups must be a number of groups "
                             "or a list of lists of variables (got %r)" % (type(groups),))
        self.name = name
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.op = op
        # Horovod splits Average's 1/size into a prescale of 1/f and a postscale of f (the
        # engine still divides by size for Average), so that fp16 sums do not overflow.
        self.prescale = 1.0 / gradient_predivide_factor if op == Average else 1.0
        self.postscale = gradient_predivide_factor if op == Average else 1.0
        self.gradient_predivide_factor = gradient_predivide_factor
        self.passes = int(backward_passes_per_step)
        self.average_aggregated = average_aggregated_gradients
        self.groups = groups
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients


class _State:
    """Per-optimizer state that is not the wrapped optimizer's: worker-local variables and,
    with backward_passes_per_step > 1, the local accumulators (tf.Variables that are not
    Keras variables, so a saved model holds exactly the wrapped optimizer's variables)."""

    def __init__(self):
        self.local_vars = set()
        self.acc = None
        self.count = None


def _dense(g):
    return tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g


def _tf_var(v):
    """The tf.Variable under a Keras 3 variable (its ``value``); tf.Variables as they are."""
    if isinstance(v, tf.Variable):
        return v
    inner = getattr(v, "value", None)
    return inner if isinstance(inner, tf.Variable) else v


class _DistributedMixin:
    """Methods common to both Keras flavours; ``_khor_settings`` is set on the class."""

    _khor_settings = None

    def _khor_init(self):
        s = self._khor_settings
        self._khor = _State()
        if s.name is None:
            s.name = "Distributed%s" % type(self).__name__

    def register_local_var(self, var):
        """Marks var as worker-local: its gradient is not allreduced (Horovod divides it by
        the set's size unless scale_local_gradients=False)."""
        self._khor.local_vars.add(_tf_var(var).ref())

    def _khor_allreduce(self, grads, variables):
        """grads averaged (or op-reduced) over the process set; None stays None."""
        s = self._khor_settings
        grads = list(grads)
        if s.sparse_as_dense:
            grads = [_dense(g) if g is not None else None for g in grads]
        size = s.process_set.size()
        todo = []
        out = list(grads)
        for i, (g, v) in enumerate(zip(grads, variables)):
            if g is None:
                continue
            if _tf_var(v).ref() in self._khor.local_vars:
                if s.scale_local_gradients and size > 1:
                    out[i] = (tf.IndexedSlices(g.values / size, g.indices, g.dense_shape)
                              if isinstance(g, tf.IndexedSlices) else g / size)
                continue
            todo.append(i)
        if not todo:
            return out
        kw = dict(compression=s.compression, op=s.op, prescale_factor=s.prescale,
                  postscale_factor=s.postscale, process_set=s.process_set)
        with tf.name_scope(s.name + "_Allreduce"):
            for group_no, group in enumerate(self._khor_groups(todo, variables)):
                if s.groups is None:
                    (i,) = group
                    out[i] = hvd.allreduce(grads[i], name="%s.grad_%d" % (s.name, i), **kw)
                    continue
                reduced = hvd.grouped_allreduce(
                    [grads[i] for i in group], name="%s.group_%d" % (s.name, group_no), **kw)
                for i, r in zip(group, reduced):
                    out[i] = r
        return out

    def _khor_groups(self, todo, variables):
        """Index lists that go to the engine together: one per gradient without groups,
        num_groups nearly equal slices, or the user's variable lists (the rest alone)."""
        s = self._khor_settings
        if s.groups is None:
            return [[i] for i in todo]
        if isinstance(s.groups, int):
            n = max(1, min(s.groups, len(todo)))
            k, r = divmod(len(todo), n)
            cuts, at = [], 0
            for j in range(n):
                cuts.append(todo[at:at + k + (1 if j < r else 0)])
                at += k + (1 if j < r else 0)
            return [c for c in cuts if c]
        where = {_tf_var(variables[i]).ref(): i for i in todo}
        out = []
        for group in s.groups:
            idx = [where.pop(_tf_var(v).ref()) for v in group if _tf_var(v).ref() in where]
            if idx:
                out.append(idx)
        out.extend([i] for i in todo if _tf_var(variables[i]).ref() in where)
        return out

    def _khor_build_accumulators(self, variables):
        if self._khor.acc is not None:
            return
        with tf.init_scope():
            self._khor.acc = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                                          name="khor_grad_acc_%d" % i)
                              for i, v in enumerate(variables)]
            self._khor.count = tf.Variable(0, dtype=tf.int64, trainable=False,
                                           name="khor_grad_acc_count")

    def _khor_step(self, grads, variables, apply_fn):
        """One backward pass's gradients: allreduced and applied at once, or with
        backward_passes_per_step = N added to local accumulators and, every N-th call,
        allreduced (divided by N first if average_aggregated_gradients) and applied."""
        s = self._khor_settings
        if s.passes == 1:
            return apply_fn(self._khor_allreduce(grads, variables))
        self._khor_build_accumulators(variables)
        st = self._khor
        present = [g is not None for g in grads]
        for a, g in zip(st.acc, grads):
            if g is not None:
                a.assign_add(_dense(g))
        count = st.count.assign_add(1)

        def flush():
            summed = [a.read_value() if p else None for a, p in zip(st.acc, present)]
            if s.average_aggregated:
                summed = [g / s.passes if g is not None else None for g in summed]
            apply_fn(self._khor_allreduce(summed, variables))
            for a, p in zip(st.acc, present):
                if p:
                    a.assign(tf.zeros_like(a))
            st.count.assign(0)
            return tf.constant(True)

        return tf.cond(count >= s.passes, flush, lambda: tf.constant(False))


class _Keras3Mixin(_DistributedMixin):
    """Keras 3: model.fit's train step and apply_gradients both end in ``apply``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._khor_init()

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if not grads:
            return super().apply(grads, trainable_variables)
        if trainable_variables is None:
            variables = list(self._trainable_variables)
        else:
            variables = list(trainable_variables)
            if not self.built:
                self.build(variables)
        self._khor_step(grads, variables,
                        lambda g: super(_Keras3Mixin, self).apply(g, trainable_variables))


class _Keras2Mixin(_DistributedMixin):
    """tf-keras (Keras 2): minimize() and model.fit end in ``apply_gradients``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._khor_init()

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        pairs = list(grads_and_vars)
        if not pairs:
            return super().apply_gradients(pairs, *args, **kwargs)
        grads, variables = [list(t) for t in zip(*pairs)]
        if self._khor_settings.passes > 1 and hasattr(self, "_var_key") and \
                hasattr(self, "build") and not hasattr(self, "_create_all_weights"):
            with tf.init_scope():
                self.build(variables)   # slots exist before the first apply in tf.cond
        result = []

        def apply(g):
            result.append(super(_Keras2Mixin, self).apply_gradients(
                list(zip(g, variables)), *args, **kwargs))
        flushed = self._khor_step(grads, variables, apply)
        return result[0] if self._khor_settings.passes == 1 else flushed


def distributed_class(base, settings):
    """A subclass of base that allreduces gradients as settings say. It keeps base's name,
    module and qualname, so a saved model names the plain optimizer and loads without khor."""
    if getattr(base, "_khor_settings", None) is not None:
        base = next(c for c in base.__mro__ if not issubclass(c, _DistributedMixin))
    mixin = _Keras3Mixin if hasattr(base, "stateless_apply") else _Keras2Mixin
    cls = type(base.__name__, (mixin, base), {
        "__module__": base.__module__, "__qualname__": base.__qualname__,
        "__doc__": base.__doc__, "_khor_settings": settings})
    return cls


def create_distributed_optimizer(optimizer, name=None, device_dense='', device_sparse='',
                                 compression=Compression.none, sparse_as_dense=False,
                                 gradient_predivide_factor=1.0, op=Average,
                                 backward_passes_per_step=1,
                                 average_aggregated_gradients=False, groups=None,
                                 process_set=global_process_set, num_groups=0,
                                 scale_local_gradients=True, **ignored):
    """A new optimizer of a made subclass of type(optimizer), from optimizer's config, whose
    gradients are allreduced over process_set before they are applied. device_dense and
    device_sparse are accepted for Horovod's signature; khor places its ops itself."""
    if num_groups and groups is None:
        groups = int(num_groups)
    if getattr(optimizer, "_khor_settings", None) is not None:
        raise ValueError("khor DistributedOptimizer: %s is already distributed; wrap the "
                         "plain optimizer once" % type(optimizer).__name__)
    settings = _Settings(name, compression, sparse_as_dense, gradient_predivide_factor, op,
                         backward_passes_per_step, average_aggregated_gradients, groups,
                         process_set, scale_local_gradients)
    cls = distributed_class(type(optimizer), settings)
    return cls.from_config(optimizer.get_config())


def rewrap_in_place(optimizer, compression):
    """Turns a loaded plain optimizer into a distributed one without rebuilding it, so its
    restored slots and iteration count stay (load_model)."""
    settings = _Settings(None, compression, False, 1.0, Average, 1, False, None,
                         global_process_set, True)
    optimizer.__class__ = distributed_class(type(optimizer), settings)
    optimizer._khor_init()
    return optimizer


def load_model(keras, filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none):
    objects = {}
    for cls in custom_optimizers or ():
        objects[cls.__name__] = cls
    objects.update(custom_objects or {})
    model = keras.models.load_model(filepath, custom_objects=objects)
    opt = getattr(model, "optimizer", None)
    if opt is not None and getattr(opt, "_khor_settings", None) is None:
        rewrap_in_place(opt, compression)
    return model


def broadcast_global_variables(root_rank):
    fn = getattr(hvd, "broadcast_global_variables", None)
    if fn is None or tf.executing_eagerly():
        raise RuntimeError(
            "khor: broadcast_global_variables(%d) needs TF1 graph mode, which has a global "
            "variable collection; in TF2 use hvd.broadcast_variables(model.variables, "
            "root_rank) or callbacks.BroadcastGlobalVariablesCallback(%d)"
            % (root_rank, root_rank))
    return fn(root_rank)


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0,
              op=None, compression=Compression.none, process_set=global_process_set):
    if op is None:
        op = Sum if average is False else Average
    return hvd.allreduce(tf.constant(value), op=op, prescale_factor=prescale_factor,
                         postscale_factor=postscale_factor, compression=compression,
                         name=name, process_set=process_set)


def allgather(value, name=None, process_set=global_process_set):
    return hvd.allgather(tf.constant(value), name=name, process_set=process_set)


def broadcast(value, root_rank, name=None, process_set=global_process_set):
    return hvd.broadcast(tf.constant(value), root_rank, name=name, process_set=process_set)


def reducescatter(value, name=None, op=Average, process_set=global_process_set):
    fn = getattr(hvd, "reducescatter", None)
    if fn is None:
        raise NotImplementedError("khor.tensorflow has no reducescatter yet")
    return fn(tf.constant(value), op=op, name=name, process_set=process_set)
