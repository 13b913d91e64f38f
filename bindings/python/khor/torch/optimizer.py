"""DistributedOptimizer: Horovod's wrapper that averages gradients across ranks as backprop
produces them.

A hook on each parameter's gradient accumulator enqueues that gradient's allreduce (in
place, named after the parameter) the moment backward computes it, so communication
overlaps the rest of backward and the engine fuses the small ones; step() waits for them and
then runs the wrapped optimizer's own step. With groups (num_groups or groups), the
gradients of a group go as one grouped allreduce once all of them are ready.
"""

import contextlib
import warnings

import torch

from .. import _core
from .._core import Average, Adasum, global_process_set
from .compression import Compression
from .mpi_ops import (allreduce_async_, grouped_allreduce_async_, sparse_allreduce_async,
                      synchronize)


class _DistributedOptimizer(torch.optim.Optimizer):
    _khor_distributed = True    # broadcast_optimizer_state steps the wrapped optimizer

    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1,
                 op=Average, gradient_predivide_factor=1.0, groups=None,
                 sparse_as_dense=False, process_set=global_process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [("allreduce.noname.%s.%s" % (i, j), v)
                                for i, param_group in enumerate(self.param_groups)
                                for j, v in enumerate(param_group["params"])]
        if any(not isinstance(p, tuple) for p in named_parameters):
            raise ValueError("named_parameters should be a sequence of tuples (name, "
                             "parameter), usually produced by model.named_parameters().")
        dups = _find_duplicates([k for k, _ in named_parameters])
        if dups:
            raise ValueError("Parameter names in named_parameters must be unique. Found "
                             "duplicates: %s" % ", ".join(dups))
        all_ids = {id(v) for group in self.param_groups for v in group["params"]}
        named_ids = {id(v) for _, v in named_parameters}
        unnamed = all_ids - named_ids
        if unnamed:
            raise ValueError("named_parameters was specified, but one or more model "
                             "parameters were not named. Python object ids: %s"
                             % ", ".join(str(i) for i in unnamed))
        self._parameter_names = {v: k for k, v in sorted(named_parameters)}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: self.backward_passes_per_step
                                 for _, v in sorted(named_parameters)}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._handles = {}
        self._grad_accs = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        self._groups = None
        self._p_to_group = {}
        self._group_counts = {}
        if groups is not None:
            if isinstance(groups, int):
                plist = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
                k = max(1, groups)
                per = (len(plist) + k - 1) // k
                groups = [plist[i:i + per] for i in range(0, len(plist), per)]
            self._groups = [list(g) for g in groups]
            for gi, g in enumerate(self._groups):
                for p in g:
                    self._p_to_group[p] = gi
        # Hooks on every size, 1 included: one code path (a one-rank set runs at once). A
        # rank outside process_set registers none: its gradients stay its own (Horovod's).
        if self.process_set.included():
            self._register_hooks()
        _core.on_shutdown(self._forget_handles)

    def _forget_handles(self):
        """The job ended (an elastic reset, say) with gradients in flight: their handles
        died with it, and the next generation starts the step afresh."""
        self._handles = {}
        self._group_counts = {}
        self._synchronized = False
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step

    def load_state_dict(self, *args, **kwargs):
        self._forget_handles()
        self._should_synchronize = True
        super(self.__class__, self).load_state_dict(*args, **kwargs)

    @staticmethod
    def find_duplicates(lst):
        return _find_duplicates(lst)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step

    def _register_hooks(self):
        for param_group in self.param_groups:
            for p in param_group["params"]:
                if p.requires_grad:
                    self._requires_update.add(p)
                    p_tmp = p.expand_as(p)
                    grad_acc = p_tmp.grad_fn.next_functions[0][0]
                    grad_acc.register_hook(self._make_hook(p))
                    self._grad_accs.append(grad_acc)

    def _scale_factors(self):
        pre, post = 1.0, 1.0
        if self.op == Average and self.gradient_predivide_factor != 1.0:
            pre = 1.0 / self.gradient_predivide_factor
            post = self.gradient_predivide_factor
        return pre, post

    def _allreduce_grad_async(self, p):
        if p.grad is None:
            # A parameter that got no gradient this step still takes part, with zeros.
            p.grad = p.data.new(p.size()).zero_()
        name = self._parameter_names.get(p)
        tensor = p.grad
        if tensor.is_sparse:
            if not self.sparse_as_dense:
                # Horovod's: allgather the indices and values; synchronize() calls it.
                return sparse_allreduce_async(tensor, name="allreduce.%s" % name, op=self.op,
                                              process_set=self.process_set), None
            # allreduced dense, put back into the sparse p.grad by synchronize()
            tensor = tensor.to_dense()
        tensor_compressed, ctx = self._compression.compress(tensor)
        pre, post = self._scale_factors()
        handle = allreduce_async_(tensor_compressed, name="allreduce.%s" % name, op=self.op,
                                  prescale_factor=pre, postscale_factor=post,
                                  process_set=self.process_set)
        return handle, (tensor_compressed, ctx)

    def _grouped_allreduce_async(self, gi):
        ps = self._groups[gi]
        for p in ps:
            if p.grad is None:
                p.grad = p.data.new(p.size()).zero_()
        comp = [self._compression.compress(p.grad) for p in ps]
        pre, post = self._scale_factors()
        handle = grouped_allreduce_async_([c for c, _ in comp],
                                          name="grouped_allreduce.group%d.%s"
                                          % (gi, self._parameter_names.get(ps[0])),
                                          op=self.op, prescale_factor=pre,
                                          postscale_factor=post, process_set=self.process_set)
        return handle, comp

    def _make_hook(self, p):
        def hook(*ignore):
            if p in self._handles and self._handles[p][0] is not None:
                if self._allreduce_delay[p] <= 0:
                    raise AssertionError(
                        "Gradients were computed more than backward_passes_per_step times "
                        "before call to step(). Increase backward_passes_per_step to "
                        "accumulate gradients locally.")
            assert not p.grad.requires_grad
            assert self._allreduce_delay[p] > 0
            handle, ctx = None, None
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                if self._groups is not None and p in self._p_to_group:
                    gi = self._p_to_group[p]
                    self._group_counts[gi] = self._group_counts.get(gi, 0) + 1
                    if self._group_counts[gi] == len(self._groups[gi]):
                        self._group_counts[gi] = 0
                        handle, ctx = self._grouped_allreduce_async(gi)
                        for q in self._groups[gi]:
                            self._handles[q] = (handle, ctx)
                        return
                    self._handles[p] = (None, None)
                    return
                handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    def synchronize(self):
        """Waits for every gradient's allreduce (enqueueing those backward did not reach).
        On a rank outside the optimizer's process set there are none."""
        if not self.process_set.included():
            self._synchronized = True
            return
        missing = self._requires_update - set(self._handles.keys())
        for p in missing:
            if self._groups is not None and p in self._p_to_group:
                self._handles[p] = (None, None)
            else:
                self._handles[p] = self._allreduce_grad_async(p)
        if self._groups is not None:
            for gi, g in enumerate(self._groups):
                if any(self._handles.get(q, (None, None))[0] is None for q in g):
                    self._group_counts[gi] = 0
                    h, comp = self._grouped_allreduce_async(gi)
                    for q in g:
                        self._handles[q] = (h, comp)
        for p, (handle, _) in list(self._handles.items()):
            if handle is None:
                handle, ctx = self._allreduce_grad_async(p)
                self._handles[p] = (handle, ctx)
        done = {}
        for p, (handle, ctx) in self._handles.items():
            if handle not in done:
                done[handle] = handle() if callable(handle) else synchronize(handle)
            out = done[handle]
            self._allreduce_delay[p] = self.backward_passes_per_step
            if isinstance(ctx, list):
                # by identity: list.index compares tensors with ==
                idx = next(k for k, q in enumerate(self._groups[self._p_to_group[p]])
                           if q is p)
                t, c = ctx[idx]
                p.grad.set_(self._compression.decompress(out[idx], c))
            elif ctx is None:       # sparse_allreduce_async's result
                p.grad.zero_().add_(out)
            else:
                t, c = ctx
                out = self._compression.decompress(out, c)
                if p.grad.is_sparse:
                    # sparse_as_dense: back to sparse (sparse grads do not support set_)
                    p.grad.zero_().add_(out if out.is_sparse else out.to_sparse())
                else:
                    p.grad.set_(out)
        self._handles.clear()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside it does not synchronize (call synchronize() yourself first)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def _find_duplicates(lst):
    seen, dups = set(), set()
    for el in lst:
        if el in seen:
            dups.add(el)
        seen.add(el)
    return sorted(dups)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wraps optimizer so that step() applies gradients averaged (op) over the ranks of
    process_set; same arguments as Horovod's."""
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if op == Adasum:
        raise NotImplementedError("khor does not support the Adasum reduction; use Average "
                                  "or Sum")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be "
                      "removed in v0.23.0.", DeprecationWarning)
        if groups is None:
            groups = num_groups
    if groups is not None:
        if not (isinstance(groups, list) or groups > 0):
            raise ValueError("groups should be a non-negative integer or a list of list of "
                             "torch.Tensor.")
        if isinstance(groups, list):
            grouped_id = set()
            for g in groups:
                for p in g:
                    if not isinstance(p, torch.Tensor):
                        raise TypeError("groups must consist of torch.Tensor.")
                    if id(p) in grouped_id:
                        raise ValueError("A parameter can only appear once in groups.")
                    grouped_id.add(id(p))
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, groups, sparse_as_dense, process_set)
