"""Horovod's helpers around the collectives: broadcast_parameters, broadcast_optimizer_state,
broadcast_object and allgather_object."""

import io
import pickle

import torch

from .. import _core
from .._core import global_process_set
from .mpi_ops import broadcast_async_, allgather, broadcast_, synchronize


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Broadcasts a model's parameters (a state_dict, or a list of (name, tensor) as
    model.named_parameters() gives) from root_rank, in place, all at once."""
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list) or hasattr(params, "__iter__"):
        items = list(params)
        if items and not isinstance(items[0], tuple):
            raise ValueError("broadcast_parameters expects a state_dict or (name, tensor) "
                             "pairs")
    else:
        raise ValueError("invalid params of type: %s" % type(params))
    handles = []
    for name, p in items:
        if p is None or not isinstance(p, torch.Tensor):
            continue
        t = p.data if isinstance(p, torch.nn.Parameter) else p
        handles.append(broadcast_async_(t, root_rank, name="broadcast.%s" % name,
                                        process_set=process_set))
    for h in handles:
        synchronize(h)


def broadcast_optimizer_state(optimizer, root_rank, process_set=global_process_set):
    """Makes every rank's optimizer state (moments, step counts, hyper-parameters such as the
    learning rate) equal root_rank's, including on ranks whose state is still empty."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state = broadcast_object(optimizer.state_dict(), root_rank,
                             name="broadcast_optimizer_state", process_set=process_set)
    optimizer.load_state_dict(state)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Pickles obj on root_rank and returns the same object on every rank."""
    name = name or "broadcast_object"
    me = _core.rank()  # root_rank is a world rank, as in Horovod
    if me == root_rank:
        buf = io.BytesIO()
        torch.save(obj, buf, pickle_protocol=pickle.HIGHEST_PROTOCOL)
        data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        n = torch.tensor([data.numel()], dtype=torch.int64)
    else:
        n = torch.tensor([0], dtype=torch.int64)
    broadcast_(n, root_rank, name=name + ".size", process_set=process_set)
    if me != root_rank:
        data = torch.empty(int(n.item()), dtype=torch.uint8)
    broadcast_(data, root_rank, name=name + ".data", process_set=process_set)
    if me == root_rank:
        return obj
    return torch.load(io.BytesIO(data.numpy().tobytes()))


def allgather_object(obj, name=None, process_set=global_process_set):
    """Pickles obj on every rank; returns the list of every rank's object, in rank order."""
    name = name or "allgather_object"
    buf = io.BytesIO()
    torch.save(obj, buf, pickle_protocol=pickle.HIGHEST_PROTOCOL)
    data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    sizes = allgather(torch.tensor([data.numel()], dtype=torch.int64), name=name + ".sizes",
                      process_set=process_set).tolist()
    gathered = allgather(data, name=name + ".data", process_set=process_set)
    out, off = [], 0
    for s in sizes:
        out.append(torch.load(io.BytesIO(gathered[off:off + s].numpy().tobytes())))
        off += s
    return out
