"""khor: collective communication for distributed deep learning, from Python.

A pure-Python package over libkhor's C ABI (ctypes; nothing compiled against a framework).
``khor`` itself runs Horovod's collectives on numpy arrays and other buffer-protocol objects;
``khor.torch`` is Horovod's torch API (``import khor.torch as hvd``).

    import khor, numpy as np
    khor.init()                                   # under khorrun, torchrun or Slurm
    x = khor.allreduce(np.ones(4, np.float32), op=khor.Sum)
    khor.shutdown()

Arrays go to the engine by address when they are C-contiguous (no copy); a non-contiguous
one is copied into a contiguous array first. Outputs whose size is known only after
negotiation (allgather, alltoall) are copied once out of the engine's buffer.
"""

from . import _lib
from ._core import (Average, Sum, Adasum, Min, Max, Product, ProcessSet, global_process_set,
                    init, shutdown, is_initialized, rank, size, local_rank, local_size,
                    cross_rank, cross_size, is_homogeneous, add_process_set,
                    remove_process_set, poll, synchronize, start_timeline, stop_timeline)
from ._lib import KhorError
from .exceptions import HorovodInternalError, HostsUpdatedInterrupt

__version__ = _lib.text(_lib.khor_version())
__all__ = ["Average", "Sum", "Adasum", "Min", "Max", "Product", "ProcessSet",
           "global_process_set", "init", "shutdown", "is_initialized", "rank", "size",
           "local_rank", "local_size", "cross_rank", "cross_size", "is_homogeneous",
           "add_process_set", "remove_process_set", "poll", "synchronize", "start_timeline",
           "stop_timeline", "KhorError", "HorovodInternalError", "HostsUpdatedInterrupt",
           "allreduce", "allreduce_async", "allgather", "allgather_async", "broadcast",
           "broadcast_async", "alltoall", "reducescatter", "barrier", "join", "library_path"]

library_path = _lib.path


def _np():
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy is a Debian package everywhere here
        raise ImportError("khor's array collectives need numpy (apt-get install "
                          "python3-numpy)") from None
    return numpy


def _np_dtype_code(np, dt):
    table = {np.dtype(np.float32): _lib.FLOAT32, np.dtype(np.float64): _lib.FLOAT64,
             np.dtype(np.float16): _lib.FLOAT16, np.dtype(np.int32): _lib.INT32,
             np.dtype(np.int64): _lib.INT64, np.dtype(np.int16): _lib.INT16,
             np.dtype(np.int8): _lib.INT8, np.dtype(np.uint8): _lib.UINT8,
             np.dtype(np.bool_): _lib.BOOL}
    try:
        return table[np.dtype(dt)]
    except KeyError:
        raise TypeError("khor: dtype %s is not supported (float16/32/64, int8/16/32/64, "
                        "uint8, bool)" % (dt,)) from None


def _as_array(x):
    np = _np()
    a = np.asarray(x)
    if not a.flags["C_CONTIGUOUS"]:
        a = np.ascontiguousarray(a)
    return a


def _buf(a):
    from ._core import Buf
    np = _np()
    return Buf(a.ctypes.data if a.size else 0, _np_dtype_code(np, a.dtype), a.shape, a)


def _copy_out(addr, dims, dtype):
    np = _np()
    out = np.empty(dims, dtype=dtype)
    if out.nbytes:
        import ctypes
        ctypes.memmove(out.ctypes.data, addr, out.nbytes)
    return out


def allreduce_async(array, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set, inplace=False):
    """Starts an allreduce of ``array``; synchronize(handle) returns the result (a new array,
    or ``array`` itself with inplace=True)."""
    from . import _core
    a = _as_array(array)
    if inplace and a is not array:
        raise ValueError("in-place allreduce needs a C-contiguous numpy array")
    out = a if inplace else _np().empty_like(a)
    nm = _core.auto_name("allreduce", name, process_set)
    return _core.enqueue_allreduce([nm], [_buf(a)], [_buf(out)], op, prescale_factor,
                                   postscale_factor, process_set, lambda p: out, None)


def allreduce(array, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
              process_set=global_process_set):
    return synchronize(allreduce_async(array, op, name, prescale_factor, postscale_factor,
                                       process_set))


def allgather_async(array, name=None, process_set=global_process_set):
    """Concatenates every rank's array along dim 0 (which may differ per rank)."""
    from . import _core
    a = _as_array(array)
    if a.ndim == 0:
        a = a.reshape(1)
    nm = _core.auto_name("allgather", name, process_set)
    return _core.enqueue_allgather([nm], [_buf(a)], process_set,
                                   lambda p: _copy_out(*_core.output(p.h, 0), a.dtype), None)


def allgather(array, name=None, process_set=global_process_set):
    return synchronize(allgather_async(array, name, process_set))


def broadcast_async(array, root_rank, name=None, process_set=global_process_set):
    from . import _core
    a = _as_array(array)
    out = _np().empty_like(a)
    nm = _core.auto_name("broadcast", name, process_set)
    return _core.enqueue_broadcast(nm, _buf(a), _buf(out), root_rank, process_set,
                                   lambda p: out, None)


def broadcast(array, root_rank, name=None, process_set=global_process_set):
    return synchronize(broadcast_async(array, root_rank, name, process_set))


def alltoall(array, splits=None, name=None, process_set=global_process_set):
    """Sends splits[j] rows (dim 0) to rank j; returns (received array, received splits)."""
    from . import _core
    a = _as_array(array)
    n = process_set.size() if process_set is not None else size()
    nm = _core.auto_name("alltoall", name, process_set)

    def finish(p):
        return _copy_out(*_core.output(p.h, 0), a.dtype), _np().array(_core.splits(p.h, n))
    return synchronize(_core.enqueue_alltoall(nm, _buf(a), None if splits is None
                                              else list(splits), process_set, finish, None))


def reducescatter(array, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
                  process_set=global_process_set):
    """Reduces over ranks and keeps this rank's rows of dim 0 (the first d0 % n ranks get one
    more)."""
    from . import _core
    a = _as_array(array)
    ps = process_set if process_set is not None else global_process_set
    n, r = ps.size(), ps.rank()
    d0 = a.shape[0]
    rows = d0 // n + (1 if r < d0 % n else 0)
    out = _np().empty((rows,) + a.shape[1:], dtype=a.dtype)
    nm = _core.auto_name("reducescatter", name, process_set)
    return synchronize(_core.enqueue_reducescatter([nm], [_buf(a)], [_buf(out)], op,
                                                   prescale_factor, postscale_factor,
                                                   process_set, lambda p: out, None))


def barrier(process_set=global_process_set):
    from . import _core
    synchronize(_core.enqueue_barrier(process_set))


def join(process_set=global_process_set):
    """This rank is out of data; returns the rank that joined last, once all have."""
    from . import _core
    hid = _core.enqueue_join(process_set)
    p = _core._state.pending[hid]
    p.finish = lambda q: _core.join_rank(q.h)
    return synchronize(hid)
