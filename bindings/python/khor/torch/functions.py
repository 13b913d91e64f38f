"""Horovod's helpers around the collectives: broadcast_parameters, broadcast_optimizer_state,
broadcast_object and allgather_object. Objects go through cloudpickle, as Horovod's do, so
lambdas and classes defined inside a function arrive on every rank."""

import io

import cloudpickle
import torch

from .. import _core
from .._core import global_process_set
from .mpi_ops import broadcast_async_, allgather, broadcast_, synchronize


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Broadcasts parameters from root_rank, in place, all at once: a state_dict (any dict of
    name -> tensor), or a list of (name, tensor) pairs (model.named_parameters()) or of plain
    tensors (model.parameters()), as Horovod's."""
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    elif hasattr(params, "__iter__") and not isinstance(params, torch.Tensor):
        # a generator (model.named_parameters() or .parameters()), which Horovod refuses
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError("invalid params of type: %s" % type(params))
    handles = []
    for name, p in items:
        if p is None:
            continue
        if not isinstance(p, torch.Tensor):
            raise ValueError("broadcast_parameters: %s is a %s, not a tensor"
                             % (name or "an entry", type(p).__name__))
        t = p.data if isinstance(p, torch.nn.Parameter) else p
        handles.append(broadcast_async_(t, root_rank, name=None if name is None else
                                        "broadcast.%s" % name, process_set=process_set))
    for h in handles:
        synchronize(h)


def broadcast_optimizer_state(optimizer, root_rank, model=None, process_set=global_process_set):
    """Makes every rank's optimizer state (moments, step counts, hyper-parameters such as the
    learning rate) equal root_rank's. As Horovod's, an optimizer whose state is still empty
    is first initialized by one step of zero gradients (left in p.grad; sparse for
    SparseAdam, and for SGD on model's sparse embeddings); unlike Horovod's, that step does
    not move the parameters (their values are put back)."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    sd = optimizer.state_dict()
    if len(sd["state"]) == 0:
        sparse = set()
        if model is not None:
            for m in model.modules():
                if isinstance(m, torch.nn.Embedding) and m.sparse:
                    sparse.update(id(p) for p in m.parameters())
        saved = []
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    p.grad = p.data.new(p.size()).zero_()
                    if isinstance(optimizer, torch.optim.SparseAdam) or \
                            (isinstance(optimizer, torch.optim.SGD) and id(p) in sparse):
                        p.grad = p.grad.to_sparse()
                    saved.append((p, p.data.clone()))
        # The wrapped optimizer's own step: a DistributedOptimizer's would allreduce, which
        # deadlocks unless every rank calls it here.
        if getattr(type(optimizer), "_khor_distributed", False):
            super(type(optimizer), optimizer).step()
        else:
            optimizer.step()
        with torch.no_grad():
            for p, v in saved:
                p.copy_(v)
    # The whole state_dict from root_rank (also the options of a stateless optimizer, and
    # a state on ranks where the step above made none).
    state = broadcast_object(optimizer.state_dict(), root_rank,
                             name="broadcast_optimizer_state", process_set=process_set)
    optimizer.load_state_dict(state)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Pickles obj on root_rank and returns the same object on every rank."""
    name = name or "broadcast_object"
    me = _core.rank()  # root_rank is a world rank, as in Horovod
    if me == root_rank:
        data = torch.frombuffer(bytearray(_dumps(obj)), dtype=torch.uint8)
        n = torch.tensor([data.numel()], dtype=torch.int64)
    else:
        n = torch.tensor([0], dtype=torch.int64)
    broadcast_(n, root_rank, name=name + ".size", process_set=process_set)
    if me != root_rank:
        data = torch.empty(int(n.item()), dtype=torch.uint8)
    broadcast_(data, root_rank, name=name + ".data", process_set=process_set)
    if me == root_rank:
        return obj
    return cloudpickle.loads(data.numpy().tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Pickles obj on every rank; returns the list of every rank's object, in rank order."""
    name = name or "allgather_object"
    data = torch.frombuffer(bytearray(_dumps(obj)), dtype=torch.uint8)
    sizes = allgather(torch.tensor([data.numel()], dtype=torch.int64), name=name + ".sizes",
                      process_set=process_set).tolist()
    gathered = allgather(data, name=name + ".data", process_set=process_set)
    out, off = [], 0
    for s in sizes:
        out.append(cloudpickle.loads(gathered[off:off + s].numpy().tobytes()))
        off += s
    return out


def _dumps(obj):
    buf = io.BytesIO()
    cloudpickle.dump(obj, buf)
    return buf.getvalue() or b"\0"
