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


def _check_tensor(t, what):
    if not isinstance(t, torch.Tensor):
        raise TypeError("%s: expected a torch.Tensor, got %s" % (what, type(t).__name__))
    if t.device.type == "cuda":
        if not _lib.built_with("cuda"):
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

def _int_scaling(tensors, op, prescale, postscale, process_set):
    """Horovod scales integer tensors too, in float64, truncating back to the integer type
    (Average folds 1/size into the postscale). The engine scales floating point only, so for
    integers this does the scaling here: returns (inputs to send, op, post-step or None)."""
    if (prescale == 1.0 and postscale == 1.0) or \
            all(t.dtype.is_floating_point for t in tensors):
        return tensors, op, prescale, postscale, None
    if any(t.dtype.is_floating_point for t in tensors):
        return tensors, op, prescale, postscale, None   # mixed: the engine says what it takes
    if op not in (Sum, Average):
        return tensors, op, prescale, postscale, None
    post = float(postscale)
    if op == Average:
        ps = process_set if process_set is not None else global_process_set
        post /= ps.size()
    ins = [t if prescale == 1.0 else (t.double() * float(prescale)).to(t.dtype)
           for t in tensors]

    def after(o):
        if post != 1.0:
            o.copy_((o.double() * post).to(o.dtype))
    return ins, Sum, 1.0, 1.0, after


def _allreduce_async(tensors, outputs, name, op, prescale, postscale, process_set, kind,
                     write_back=None):
    names = name if isinstance(name, list) else [name]
    tensors, op, prescale, postscale, after = _int_scaling(list(tensors), op, prescale,
                                                           postscale, process_set)
    ins = [_contig(t) for t in tensors]
    outs = [o if o.is_contiguous() else torch.empty_like(o, memory_format=torch.contiguous_format)
            for o in outputs]

    def finish(p):
        for o, want in zip(outs, outputs):
            if after is not None:
                after(o)
            if o is not want:
                want.copy_(o)
        return outputs[0] if kind == "one" else list(outputs)
    return _core.enqueue_allreduce(names, [_buf(t) for t in ins], [_buf(o) for o in outs], op,
                                   prescale, postscale, process_set, finish, (tensors,))


def _ptr(t):
    return t.data_ptr() if t.numel() else 0


def _host_plain(t, prescale, postscale):
    """The khor dtype of t when its allreduce can take the hot path (a dense contiguous CPU
    tensor, scaled by the engine or not at all), else None."""
    if not isinstance(t, torch.Tensor) or not t.is_cpu or t.is_sparse or \
            not t.is_contiguous():
        return None
    dt = _DTYPES.get(t.dtype)
    if dt is not None and not t.dtype.is_floating_point and \
            (prescale != 1.0 or postscale != 1.0):
        return None   # integer scaling is done here (_int_scaling)
    return dt


def _keep_first(p):
    return p.keep[0]


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts an allreduce of tensor into a new tensor; synchronize(handle) returns it."""
    dt = _host_plain(tensor, prescale_factor, postscale_factor)
    if dt is None:
        _check_tensor(tensor, "allreduce")
    op = handle_average_backwards_compatibility(op, average)
    out = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    nm = _core.auto_name("allreduce", name, process_set)
    if dt is not None:
        return _core.enqueue_allreduce_host(
            nm, _ptr(tensor), _ptr(out), dt, tensor.shape, op, prescale_factor,
            postscale_factor, process_set, _keep_first, (out, tensor))
    return _allreduce_async([tensor], [out], nm, op, prescale_factor, postscale_factor,
                            process_set, "one")


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """Starts an in-place allreduce of tensor."""
    dt = _host_plain(tensor, prescale_factor, postscale_factor)
    if dt is None:
        _check_tensor(tensor, "allreduce_")
    op = handle_average_backwards_compatibility(op, average)
    nm = _core.auto_name("allreduce", name, process_set)
    if dt is not None:
        ptr = _ptr(tensor)
        return _core.enqueue_allreduce_host(nm, ptr, ptr, dt, tensor.shape, op,
                                            prescale_factor, postscale_factor, process_set,
                                            _keep_first, (tensor,))
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


def _grouped_host(tensors, prescale, postscale):
    """The khor dtypes of a group that can take the hot path (two or more tensors, each as
    _host_plain says), else None."""
    if not isinstance(tensors, (list, tuple)) or len(tensors) < 2:
        return None
    dts = [_host_plain(t, prescale, postscale) for t in tensors]
    return None if None in dts else dts


def _list_first(p):
    return list(p.keep[0])


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Starts one allreduce of a list of tensors, negotiated and completed as one."""
    dts = _grouped_host(tensors, prescale_factor, postscale_factor)
    if dts is None:
        for t in tensors:
            _check_tensor(t, "grouped_allreduce")
    op = handle_average_backwards_compatibility(op, average)
    outs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    names = _group_names("allreduce", name, len(tensors), process_set)
    if dts is not None:
        return _core.enqueue_grouped_allreduce_host(
            names, [_ptr(t) for t in tensors], [_ptr(o) for o in outs], dts,
            [t.shape for t in tensors], op, prescale_factor, postscale_factor, process_set,
            _list_first, (outs, tensors))
    return _allreduce_async(list(tensors), outs, names, op, prescale_factor, postscale_factor,
                            process_set, "group")


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    dts = _grouped_host(tensors, prescale_factor, postscale_factor)
    if dts is None:
        for t in tensors:
            _check_tensor(t, "grouped_allreduce_")
    op = handle_average_backwards_compatibility(op, average)
    names = _group_names("allreduce", name, len(tensors), process_set)
    if dts is not None:
        ptrs = [_ptr(t) for t in tensors]
        return _core.enqueue_grouped_allreduce_host(
            names, ptrs, ptrs, dts, [t.shape for t in tensors], op, prescale_factor,
            postscale_factor, process_set, _list_first, (list(tensors),))
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


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """A sparse tensor's "allreduce", as Horovod's: allgathers its indices and values (the
    duplicates sum when the result is used); returns a function that waits and gives the
    sparse result (Average divides the values by the set's size)."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async takes a sparse torch.Tensor")
    if op not in (Sum, Average):
        raise ValueError("sparse_allreduce_async: op must be Sum or Average")
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    ps = process_set if process_set is not None else global_process_set
    ih = allgather_async(t._indices().transpose(0, 1).contiguous(),
                         name="%s.indices" % name, process_set=process_set)
    vh = allgather_async(t._values().contiguous(), name="%s.values" % name,
                         process_set=process_set)

    def handle():
        values = synchronize(vh)
        indices = synchronize(ih)
        if op == Average:
            values = values / ps.size()
        if indices.dim() == 0 or values.dim() == 0:
            return t.new().resize_as_(t)
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.size(),
                                       dtype=values.dtype)
    return handle


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


class HorovodGroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.ps = process_set
        ctx.dims = [t.shape[0] if t.dim() > 0 else 1 for t in tensors]
        return tuple(synchronize(grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx, *grads):
        # Horovod's: the average of every rank's gradient, this rank's rows of it.
        reduced = grouped_allreduce(list(grads), average=True, process_set=ctx.ps)
        dims = grouped_allgather([torch.tensor([d], dtype=torch.int64) for d in ctx.dims],
                                 process_set=ctx.ps)
        me = ctx.ps.rank() if ctx.ps is not None else rank()
        out = [g.narrow(0, int(d[:me].sum()), n) for g, d, n in zip(reduced, dims, ctx.dims)]
        return (None, None) + tuple(out)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Every rank's tensors concatenated along dim 0, one list entry per tensor; records
    autograd (Horovod >= 0.27)."""
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


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

def _check_splits(tensor, splits, n):
    """Horovod's argument errors, raised here as ValueError before anything is enqueued:
    splits must be 32-bit integers (a list is taken as such), they may not ask for more rows
    than dim 0 has, and without splits dim 0 must divide by the set's size."""
    d0 = tensor.shape[0] if tensor.dim() > 0 else 1
    if splits is None:
        if d0 % n:
            raise ValueError("alltoall: dim 0 (%d) of the tensor does not divide evenly by the "
                             "%d ranks of the process set; pass splits" % (d0, n))
        return None
    if isinstance(splits, torch.Tensor):
        if splits.dtype != torch.int32:
            raise ValueError("alltoall: splits must be a tensor of 32-bit integers "
                             "(torch.int32), got %s" % splits.dtype)
        sp = [int(x) for x in splits.reshape(-1).tolist()]
    else:
        sp = [int(x) for x in splits]
    if len(sp) != n:
        raise ValueError("alltoall: %d splits for a process set of %d ranks" % (len(sp), n))
    if any(x < 0 for x in sp):
        raise ValueError("alltoall: negative split in %r" % (sp,))
    if sum(sp) > d0:
        raise ValueError("alltoall: the splits ask for %d rows of dim 0, which has %d"
                         % (sum(sp), d0))
    return sp


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an alltoall: splits[j] rows of dim 0 to rank j (even when None); synchronize
    returns (received tensor, received splits), as Horovod's."""
    _check_tensor(tensor, "alltoall")
    t = _contig(tensor if tensor.dim() > 0 else tensor.reshape(1))
    n = process_set.size() if process_set is not None else size()
    sp = _check_splits(t, splits, n)

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
        if splits is None:
            return out
        ctx.mark_non_differentiable(rsplits)
        return out, rsplits

    @staticmethod
    def backward(ctx, grad_output, *dead):
        grad, _ = alltoall(grad_output, splits=ctx.rsplits, process_set=ctx.ps)
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Horovod 0.28's return: the received tensor alone when splits is None, (received
    tensor, received splits) when splits is given."""
    return HorovodAlltoall.apply(tensor, splits, name, process_set)


# ---- reducescatter --------------------------------------------------------------------------

def _rs_grad_scale(ctx, grad):
    """Horovod 0.28.1's reducescatter backward scales the gradient before allgathering it:
    by the set's size for Sum (test_horovod_reducescatter_grad expects grad == size), then by
    the prescale and postscale factors; Average's is the allgather alone."""
    if ctx.op == Sum:
        grad = grad * (ctx.ps.size() if ctx.ps is not None else size())
    if ctx.pre != 1.0:
        grad = grad * ctx.pre
    if ctx.post != 1.0:
        grad = grad * ctx.post
    return grad


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
    return _reducescatter_async([tensor], name, op, process_set, prescale_factor,
                                postscale_factor, "one")


def _reducescatter_async(tensors, name, op, process_set, prescale, postscale, kind):
    ts, outs = [], []
    for t in tensors:
        _check_tensor(t, "reducescatter" if kind == "one" else "grouped_reducescatter")
        if t.dim() == 0:
            raise ValueError("reducescatter needs tensors of at least one dimension (got a "
                             "scalar)")
    ins, op, prescale, postscale, after = _int_scaling(list(tensors), op, prescale, postscale,
                                                       process_set)
    for t in ins:
        ts.append(_contig(t))
        outs.append(_rs_out(ts[-1], process_set))

    def finish(p):
        if after is not None:
            for o in outs:
                after(o)
        return outs[0] if kind == "one" else outs
    if kind == "one":
        names = [_core.auto_name("reducescatter", name, process_set)]
    else:
        names = _group_names("reducescatter", name, len(ts), process_set)
    return _core.enqueue_reducescatter(names, [_buf(t) for t in ts], [_buf(o) for o in outs],
                                       op, prescale, postscale, process_set, finish, None)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    return _reducescatter_async(list(tensors), name, op, process_set, prescale_factor,
                                postscale_factor, "group")


class HorovodReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op, ctx.ps, ctx.pre, ctx.post = op, process_set, prescale_factor, postscale_factor
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                               postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        return (allgather(_rs_grad_scale(ctx, grad_output), process_set=ctx.ps),
                None, None, None, None, None)


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    compressed, cctx = compression.compress(tensor)
    out = HorovodReducescatter.apply(compressed, name, op, process_set, prescale_factor,
                                     postscale_factor)
    return compression.decompress(out, cctx)


class HorovodGroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op, ctx.ps, ctx.pre, ctx.post = op, process_set, prescale_factor, postscale_factor
        return tuple(synchronize(grouped_reducescatter_async(
            list(tensors), name, op, process_set, prescale_factor, postscale_factor)))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, None, None, None) + tuple(grouped_allgather(
            [_rs_grad_scale(ctx, g) for g in grads], process_set=ctx.ps))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    pairs = [compression.compress(t) for t in tensors]
    out = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor,
                                            postscale_factor, *[c for c, _ in pairs])
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
