"""Horovod's torch collectives over khor's engine: allreduce, allgather, broadcast, alltoall,
reducescatter (plain, in place, async, grouped), join, barrier, poll, synchronize.

Tensors must be on the CPU. A contiguous tensor goes to the engine by address (no copy); a
non-contiguous one is copied to a contiguous tensor first, and the in-place forms copy the
result back. Allgather and alltoall outputs are copied once out of the engine's buffer (their
size is known only after negotiation). The non-async forms record autograd: each backward
is the matching collective, as in Horovod.
"""

import ctypes

import torch

from .. import _core, _lib
from .._core import Average, Sum, global_process_set, rank, size
from .compression import Compression

_DTYPES = {
    torch.float32: _lib.FLOAT32, torch.float64: _lib.FLOAT64, torch.float16: _lib.FLOAT16,
    torch.bfloat16: _lib.BFLOAT16, torch.int32: _lib.INT32, torch.int64: _lib.INT64,
    torch.int16: _lib.INT16, torch.int8: _lib.INT8, torch.uint8: _lib.UINT8,
    torch.bool: _lib.BOOL,
}


def _lib_built(word):
    """What this libkhor was built with: word ("cuda", "nccl", ...) from khor_build_info."""
    fn = getattr(_lib, "khor_build_info", None)
    if fn is None:
        return False
    info = _lib.text(fn())
    return ("%s=1" % word) in info.split()


def _check_tensor(t, what):
    if not isinstance(t, torch.Tensor):
        raise TypeError("%s: expected a torch.Tensor, got %s" % (what, type(t).__name__))
    if t.device.type == "cuda":
        if not _lib_built("cuda"):
            raise NotImplementedError("%s: this libkhor was built without CUDA, so it takes "
                                      "CPU tensors only (got %s); build it with the CUDA "
                                      "toolkit installed (KHOR_CUDA=ON)" % (what, t.device))
    elif t.device.type != "cpu":
        raise NotImplementedError("%s: khor takes CPU and CUDA tensors (got %s)"
                                  % (what, t.device))
    if t.dtype not in _DTYPES:
        raise TypeError("%s: dtype %s is not supported" % (what, t.dtype))
    if t.is_sparse:
        raise NotImplementedError("%s: sparse tensors are not supported (see "
                                  "DistributedOptimizer's sparse_as_dense)" % what)


# The CUDA path. An input's ready event is recorded on the caller's current stream when it
# is enqueued, so the engine reads it after every kernel queued before the call and nothing
# waits for the whole device. A handle completes with its output in place and nothing of it
# left on any stream, so the caller's stream may use the output as soon as synchronize
# returns. Outputs that negotiation sizes (allgather, alltoall) are made on the engine's
# thread from a stream of khor's own that runs no kernels; taking one records the caller's
# stream on it, so that the caching allocator does not hand its memory to a later output
# while the caller's kernels still read it.
_alloc_streams = {}


def _alloc_stream(device):
    s = _alloc_streams.get(device)
    if s is None:
        s = _alloc_streams[device] = torch.cuda.Stream(device)
    return s


def _device_buf(t):
    dev = t.device
    stream = _alloc_stream(dev)
    ready = torch.cuda.Event()
    ready.record(torch.cuda.current_stream(dev))

    def alloc(nbytes):
        with torch.cuda.device(dev), torch.cuda.stream(stream):
            owner = torch.empty(max(int(nbytes), 16), dtype=torch.uint8, device=dev)
        return owner.data_ptr(), owner
    return _core.Buf(t.data_ptr() if t.numel() else 0, _DTYPES[t.dtype], t.shape, (t, ready),
                     event=ready.cuda_event, alloc=alloc)


def _buf(t):
    if t.is_cuda:
        return _device_buf(t)
    return _core.Buf(t.data_ptr() if t.numel() else 0, _DTYPES[t.dtype], t.shape, t)


def _contig(t):
    return t if t.is_contiguous() else t.contiguous()


def handle_average_backwards_compatibility(op, average):
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of "
                             "them.")
        return op
    if average is not None:
        return Average if average else Sum
    return Average


def _from_engine(h, i, dtype, device=None):
    """Tensor i's output of an allgather or alltoall: the device tensor made for it, or a copy
    out of the engine's host buffer."""
    addr, dims = _core.output(h, i)
    owner = _core.take_output(addr) if addr else None
    if owner is not None:
        owner.record_stream(torch.cuda.current_stream(owner.device))
        n = 1
        for d in dims:
            n *= d
        return owner[:n * torch.empty((), dtype=dtype).element_size()].view(dtype).view(dims)
    out = torch.empty(dims, dtype=dtype, device=device if device is not None else "cpu")
    if out.numel():
        ctypes.memmove(out.data_ptr(), addr, out.numel() * out.element_size())
    return out


# ---- allreduce ---------------------------------------------------------------------------

def _allreduce_async(tensors, outputs, name, op, prescale, postscale, process_set, kind,
                     write_back=None):
    names = name if isinstance(name, list) else [name]
    ins = [_contig(t) for t in tensors]
    outs = [o if o.is_contiguous() else torch.empty_like(o, memory_format=torch.contiguous_format)
            for o in outputs]

    def finish(p):
        for o, want in zip(outs, outputs):
            if o is not want:
                want.copy_(o)
        return outputs[0] if kind == "one" else list(outputs)
    return _core.enqueue_allreduce(names, [_buf(t) for t in ins], [_buf(o) for o in outs], op,
                                   prescale, postscale, process_set, finish, None)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts an allreduce of tensor into a new tensor; synchronize(handle) returns it."""
    _check_tensor(tensor, "allreduce")
    op = handle_average_backwards_compatibility(op, average)
    out = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    nm = _core.auto_name("allreduce", name, process_set)
    return _allreduce_async([tensor], [out], nm, op, prescale_factor, postscale_factor,
                            process_set, "one")


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """Starts an in-place allreduce of tensor."""
    _check_tensor(tensor, "allreduce_")
    op = handle_average_backwards_compatibility(op, average)
    nm = _core.auto_name("allreduce", name, process_set)
    return _allreduce_async([tensor], [tensor], nm, op, prescale_factor, postscale_factor,
                            process_set, "one")


class HorovodAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.op, ctx.pre, ctx.post, ctx.ps = op, prescale_factor, postscale_factor, process_set
        return synchronize(allreduce_async(tensor, None, name, op, prescale_factor,
                                           postscale_factor, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        return (allreduce(grad_output, op=ctx.op, prescale_factor=ctx.pre,
                          postscale_factor=ctx.post, process_set=ctx.ps),
                None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """The reduction of tensor over the ranks of process_set, as a new tensor."""
    op = handle_average_backwards_compatibility(op, average)
    compressed, cctx = compression.compress(tensor)
    summed = HorovodAllreduce.apply(compressed, name, op, prescale_factor, postscale_factor,
                                    process_set)
    return compression.decompress(summed, cctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """In-place allreduce; returns tensor."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def _group_names(kind, name, n, process_set=None):
    if name is None:
        base = _core.auto_name("grouped_" + kind, None, process_set)
    else:
        base = name
    return ["%s.%d" % (base, i) for i in range(n)]


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Starts one allreduce of a list of tensors, negotiated and completed as one."""
    for t in tensors:
        _check_tensor(t, "grouped_allreduce")
    op = handle_average_backwards_compatibility(op, average)
    outs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    names = _group_names("allreduce", name, len(tensors), process_set)
    return _allreduce_async(list(tensors), outs, names, op, prescale_factor, postscale_factor,
                            process_set, "group")


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    for t in tensors:
        _check_tensor(t, "grouped_allreduce_")
    op = handle_average_backwards_compatibility(op, average)
    names = _group_names("allreduce", name, len(tensors), process_set)
    return _allreduce_async(list(tensors), list(tensors), names, op, prescale_factor,
                            postscale_factor, process_set, "group")


class HorovodGroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.op, ctx.pre, ctx.post, ctx.ps = op, prescale_factor, postscale_factor, process_set
        return tuple(synchronize(grouped_allreduce_async(list(tensors), None, name, op,
                                                         prescale_factor, postscale_factor,
                                                         process_set)))

    @staticmethod
    def backward(ctx, *grads):
        out = grouped_allreduce(list(grads), op=ctx.op, prescale_factor=ctx.pre,
                                postscale_factor=ctx.post, process_set=ctx.ps)
        return (None, None, None, None, None) + tuple(out)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set):
    op = handle_average_backwards_compatibility(op, average)
    pairs = [compression.compress(t) for t in tensors]
    out = HorovodGroupedAllreduce.apply(name, op, prescale_factor, postscale_factor,
                                        process_set, *[c for c, _ in pairs])
    return [compression.decompress(t, c) for t, (_, c) in zip(out, pairs)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


# ---- allgather ------------------------------------------------------------------------------

def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts an allgather: every rank's tensor concatenated along dim 0 (dim 0 may differ)."""
    _check_tensor(tensor, "allgather")
    t = _contig(tensor if tensor.dim() > 0 else tensor.reshape(1))
    nm = _core.auto_name("allgather", name, process_set)
    return _core.enqueue_allgather([nm], [_buf(t)], process_set,
                                   lambda p: _from_engine(p.h, 0, t.dtype, t.device), None)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    ts = []
    for t in tensors:
        _check_tensor(t, "grouped_allgather")
        ts.append(_contig(t if t.dim() > 0 else t.reshape(1)))
    names = _group_names("allgather", name, len(ts), process_set)
    return _core.enqueue_allgather(
        names, [_buf(t) for t in ts], process_set,
        lambda p: [_from_engine(p.h, i, t.dtype, t.device) for i, t in enumerate(ts)], None)


def _dim0s(tensor, process_set):
    d = torch.tensor([tensor.shape[0] if tensor.dim() > 0 else 1], dtype=torch.int64)
    return synchronize(allgather_async(d, process_set=process_set)).tolist()


class HorovodAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.ps = process_set
        ctx.dim0 = tensor.shape[0] if tensor.dim() > 0 else 1
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        reduced = allreduce(grad_output, average=True, process_set=ctx.ps)
        dims = _dim0s(torch.empty(ctx.dim0), ctx.ps)
        me = ctx.ps.rank() if ctx.ps is not None else rank()
        off = sum(dims[:me])
        return reduced.narrow(0, off, ctx.dim0), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    return HorovodAllgather.apply(tensor, name, process_set)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    return synchronize(grouped_allgather_async(tensors, name, process_set))


# ---- broadcast ------------------------------------------------------------------------------

def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    _check_tensor(tensor, "broadcast")
    t = _contig(tensor)
    out = torch.empty_like(t)
    nm = _core.auto_name("broadcast", name, process_set)
    return _core.enqueue_broadcast(nm, _buf(t), _buf(out), root_rank, process_set,
                                   lambda p: out, None)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    _check_tensor(tensor, "broadcast_")
    t = _contig(tensor)

    def finish(p):
        if t is not tensor:
            tensor.copy_(t)
        return tensor
    nm = _core.auto_name("broadcast", name, process_set)
    return _core.enqueue_broadcast(nm, _buf(t), _buf(t), root_rank, process_set, finish, None)


class HorovodBroadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root, ctx.ps = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        reduced = allreduce(grad_output, average=True, process_set=ctx.ps)
        if rank() != ctx.root:  # a world rank, as in Horovod
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ---- alltoall -------------------------------------------------------------------------------

def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an alltoall: splits[j] rows of dim 0 to rank j (even when None); synchronize
    returns (received tensor, received splits)."""
    _check_tensor(tensor, "alltoall")
    t = _contig(tensor if tensor.dim() > 0 else tensor.reshape(1))
    sp = None
    if splits is not None:
        sp = [int(x) for x in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    n = process_set.size() if process_set is not None else size()

    def finish(p):
        return (_from_engine(p.h, 0, t.dtype, t.device),
                torch.tensor(_core.splits(p.h, n), dtype=torch.int32))
    nm = _core.auto_name("alltoall", name, process_set)
    return _core.enqueue_alltoall(nm, _buf(t), sp, process_set, finish, None)


class HorovodAlltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        ctx.ps = process_set
        out, rsplits = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.rsplits = rsplits
        ctx.mark_non_differentiable(rsplits)
        return out, rsplits

    @staticmethod
    def backward(ctx, grad_output, grad_splits=None):
        grad, _ = alltoall(grad_output, splits=ctx.rsplits, process_set=ctx.ps)
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Returns (received tensor, received splits), as Horovod >= 0.24."""
    return HorovodAlltoall.apply(tensor, splits, name, process_set)


# ---- reducescatter --------------------------------------------------------------------------

def _rs_out(t, process_set):
    ps = process_set if process_set is not None else global_process_set
    n, r = ps.size(), ps.rank()
    d0 = t.shape[0]
    return torch.empty((d0 // n + (1 if r < d0 % n else 0),) + tuple(t.shape[1:]),
                       dtype=t.dtype, device=t.device)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts a reduce-scatter along dim 0: this rank keeps its rows of the reduction (the
    first d0 % n ranks get one more)."""
    _check_tensor(tensor, "reducescatter")
    if tensor.dim() == 0:
        raise ValueError("reducescatter needs a tensor of at least one dimension")
    t = _contig(tensor)
    out = _rs_out(t, process_set)
    nm = _core.auto_name("reducescatter", name, process_set)
    return _core.enqueue_reducescatter([nm], [_buf(t)], [_buf(out)], op, prescale_factor,
                                       postscale_factor, process_set, lambda p: out, None)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    ts, outs = [], []
    for t in tensors:
        _check_tensor(t, "grouped_reducescatter")
        ts.append(_contig(t))
        outs.append(_rs_out(ts[-1], process_set))
    names = _group_names("reducescatter", name, len(ts), process_set)
    return _core.enqueue_reducescatter(names, [_buf(t) for t in ts], [_buf(o) for o in outs],
                                       op, prescale_factor, postscale_factor, process_set,
                                       lambda p: outs, None)


class HorovodReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op, ctx.ps = op, process_set
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                               postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allgather(grad_output, process_set=ctx.ps)
        if ctx.op == Average:
            grad = grad / (ctx.ps.size() if ctx.ps is not None else size())
        return grad, None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    compressed, cctx = compression.compress(tensor)
    out = HorovodReducescatter.apply(compressed, name, op, process_set, prescale_factor,
                                     postscale_factor)
    return compression.decompress(out, cctx)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    pairs = [compression.compress(t) for t in tensors]
    out = synchronize(grouped_reducescatter_async([c for c, _ in pairs], name, op, process_set,
                                                  prescale_factor, postscale_factor))
    return [compression.decompress(t, c) for t, (_, c) in zip(out, pairs)]


# ---- join, barrier, synchronize ----------------------------------------------------------------

def join(device=-1):
    """This rank has no more data: until every rank has joined, the others' allreduces run
    with its zeros. Returns the rank that joined last (the same everywhere)."""
    hid = _core.enqueue_join(global_process_set)
    _core._state.pending[hid].finish = lambda p: _core.join_rank(p.h)
    return synchronize(hid)


def barrier(process_set=global_process_set):
    synchronize(_core.enqueue_barrier(process_set))


def synchronize(handle):
    """Waits for an async operation; returns its output (raises HorovodInternalError)."""
    return _core.synchronize(handle)
