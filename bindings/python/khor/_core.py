"""The job and the engine that every front end of this package shares: the world comm, the
engine started on it, the process sets, and pending operations keyed by Horovod-style
integer handles. Front ends (``khor`` for numpy and buffers, ``khor.torch``) describe their
tensors as ``Buf`` (address, dtype code, shape, a reference that keeps the memory alive)
and call the functions here; nothing here knows numpy or torch.
"""

import atexit
import ctypes
import itertools
import os
import sys
import threading
import warnings
import weakref

from . import _lib
from ._lib import KhorError
from .exceptions import (HorovodInternalError, InvalidArgumentError, KhorValueError,
                         WorkerRemoved)

# Horovod's reduction ops, same values (horovod/common/basics).
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5

_fast = _lib.fast   # khor._khorfast, or None: the same calls through ctypes

_OPS = {Average: _lib.AVG, Sum: _lib.SUM, Min: _lib.MIN, Max: _lib.MAX, Product: _lib.PROD}


def khor_op(op):
    if op == Adasum:
        raise NotImplementedError(
            "khor does not support the Adasum reduction; use Average or Sum")
    try:
        return _OPS[op]
    except KeyError:
        raise ValueError("unknown reduction op %r (use Average, Sum, Min, Max or Product)"
                         % (op,)) from None


class Buf:
    """One tensor as the engine sees it: memory at ``ptr`` of ``shape`` and khor dtype
    ``dtype``; ``keep`` is whatever owns the memory (it stays referenced until the
    operation completes)."""

    __slots__ = ("ptr", "dtype", "shape", "keep", "event", "alloc")

    def __init__(self, ptr, dtype, shape, keep, event=None, alloc=None):
        self.ptr = ptr
        self.dtype = dtype
        self.shape = tuple(int(d) for d in shape)
        self.keep = keep
        # Device memory only: event is the address of a CUDA event recorded after the work
        # that produces the input (the engine waits for it on its own thread; None = ready
        # now); alloc(nbytes) -> (address, owner) makes memory on the input's device for an
        # output whose size negotiation decides (allgather, alltoall).
        self.event = event
        self.alloc = alloc

    def dims(self):
        return (ctypes.c_int64 * max(1, len(self.shape)))(*self.shape)


class _State:
    def __init__(self):
        self.lock = threading.RLock()
        self.comm = None
        self.engine = None
        self.sets = {}          # id -> ProcessSet
        self.pending = {}       # int handle -> _Pending
        self.handles = itertools.count(1)
        self.counters = {}      # op kind -> noname counter
        self.order = []         # the registered sets but the global one, in order
        self.last_sets = []     # those of the job shutdown() left (an elastic reset's)
        self.elastic = False    # the job joined is an elastic one
        self.on_shutdown = []   # weak references to callables run by shutdown()
        self.context = None     # the comm khor_init gave (finalized at shutdown): the world,
                                # or its parent when init(comm=[ranks]) ran on a group
        self.homogeneous = None  # is_homogeneous(), learnt at init
        self.set_ops = 0        # add/remove_process_set calls (names of their collectives)
        self.device_out = {}    # address -> owner of outputs made by a Buf's alloc


_state = _State()

# The statuses of failures that a new generation of an elastic job cures (docs/ELASTIC.md).
_RESET_STATUSES = frozenset((_lib.ERR_MEMBERSHIP, _lib.ERR_REMOTE, _lib.ERR_TIMEOUT,
                             _lib.ERR_SYSTEM, _lib.ERR_PROTOCOL))


def collective_error(message, status):
    """The exception for a failed collective: HorovodInternalError in a fixed job (any
    failure, as Horovod), in an elastic job only for a failure that a reset cures; the other
    failures there (a mismatch, a name in flight) stay plain KhorErrors, so that
    hvd.elastic.run does not reset into the same mistake."""
    if not _state.elastic or status in _RESET_STATUSES:
        return HorovodInternalError(message, status)
    return KhorError(message, status)


def enqueue_error(message, status):
    """The exception for an enqueue the engine refused: a ValueError too for refused
    arguments (Horovod's type for them), else collective_error's."""
    if status == _lib.ERR_INVALID_ARG:
        if not _state.elastic:
            return InvalidArgumentError(message, status)
        return KhorValueError(message, status)
    return collective_error(message, status)


def check_collective(status, message_fn):
    if status != _lib.SUCCESS:
        raise collective_error(message_fn() or _lib.text(_lib.khor_strerror(status)), status)


def _engine_error():
    return _lib.text(_lib.khor_engine_error(_state.engine)) if _state.engine else ""


def _comm_error(comm=None):
    c = comm if comm is not None else _state.comm
    return _lib.text(_lib.khor_comm_error(c)) if c else ""


def require_init():
    if _state.engine is None:
        raise ValueError("khor has not been initialized; call init() first "
                         "(Horovod: hvd.init())")


class ProcessSet:
    """A group of ranks that runs collectives of its own (Horovod's ProcessSet). Make one
    with a list of world ranks and register it with add_process_set (every rank calls it,
    in the same order) or give it to init(process_sets=...)."""

    def __init__(self, ranks=None):
        self.ranks = None if ranks is None else sorted(int(r) for r in ranks)
        self.process_set_id = None
        self._comm = None

    def size(self):
        return len(self.ranks) if self.ranks is not None else size()

    def rank(self):
        r = rank()
        return self.ranks.index(r) if self.ranks is not None and r in self.ranks else \
            (r if self.ranks is None else -1)

    def included(self):
        return self.ranks is None or rank() in self.ranks

    def __repr__(self):
        return "ProcessSet(process_set_id=%r, ranks=%r)" % (self.process_set_id, self.ranks)


global_process_set = ProcessSet(None)


def _comm_ranks(comm):
    """init's comm: None, or a list of world ranks (Horovod's first form); khor has no MPI
    communicators (the second)."""
    if comm is None:
        return None
    if isinstance(comm, (str, bytes)) or not hasattr(comm, "__iter__"):
        raise ValueError("init(comm=%r): khor runs without MPI and takes no communicator; "
                         "comm may be a list of ranks (the job is then those ranks)" % (comm,))
    ranks = [int(r) for r in comm]
    return ranks or None


def _atexit_shutdown():
    """Horovod registers shutdown with atexit: a script that ends without hvd.shutdown()
    still leaves the job in step with the others (no "peer died" on them) and closes its
    timeline."""
    try:
        shutdown()
    except Exception as e:  # exiting anyway; say why the goodbye failed
        sys.stderr.write("khor: shutdown at exit failed: %s\n" % e)


def _forget_secret():
    """Takes the job secret out of this process's environment once khor_init has read it.
    libkhor keeps its copy in a page that core dumps leave out and wipes the C
    environment's; os.environ holds a copy of its own (bytes made at startup), which a core
    dump of the rank would carry: its bytes are zeroed in place, then the variable unset. A
    later init (elastic) uses libkhor's copy."""
    try:
        value = os.environ._data.get(os.environ.encodekey("KHOR_SECRET"))
    except (AttributeError, TypeError):  # not CPython's os.environ
        value = None
    if isinstance(value, bytes) and value:
        ctypes.memset(value, 0, len(value))
    os.environ.pop("KHOR_SECRET", None)


def init(comm=None, process_sets=None, config=None):
    """Joins the job (khor_init: khorrun's, torchrun's or Slurm's variables) and starts the
    engine. ``comm``: None (every rank launched), or a list of ranks, as Horovod's: the job
    is then those ranks, renumbered 0.. in list order; a launched rank outside the list
    gets ValueError (it has no job to be in). khor has no MPI communicators to take.
    ``config``: extra KHOR_* settings as a dict."""
    ranks = _comm_ranks(comm)
    if isinstance(process_sets, str):
        if process_sets != "dynamic":
            raise ValueError("process_sets: a list of ProcessSet or \"dynamic\", not %r"
                             % (process_sets,))
        process_sets = None         # khor's sets may always be added and removed
    with _state.lock:
        if _state.engine is not None:
            return
        cfg = ctypes.c_void_p()
        _lib.check(_lib.khor_config_create(ctypes.byref(cfg)), lambda: "khor_config_create")
        try:
            for k, v in (config or {}).items():
                _lib.check(_lib.khor_config_set(cfg, k.encode(), str(v).encode()),
                           lambda: "unknown or bad setting %s=%r" % (k, v))
            err = ctypes.create_string_buffer(2048)
            world = ctypes.c_void_p()
            st = _lib.khor_init(cfg, err, len(err), ctypes.byref(world))
        finally:
            _lib.khor_config_destroy(cfg)
        if st == _lib.ERR_REMOVED:
            why = _lib.text(err.value) or "this worker is no longer in the elastic job"
            sys.stderr.write("khor: %s; exiting with status 0\n" % why)
            raise WorkerRemoved(why)
        _lib.check(st, lambda: _lib.text(err.value))
        _forget_secret()
        context = world
        if ranks is not None:
            world = _group_of(context, ranks)
        try:
            # Every host the same number of ranks? Learnt now, on this thread, before the
            # engine owns the comm: is_homogeneous() then is a local read.
            ls = (ctypes.c_int64 * 2)(_lib.khor_local_size(world), -_lib.khor_local_size(world))
            check_collective(_lib.khor_allreduce(world, ls, ls, 2, _lib.INT64, _lib.MAX),
                             lambda: _comm_error(world))
        except Exception:
            _lib.khor_finalize(context)
            raise
        eng = ctypes.c_void_p()
        st = _lib.khor_engine_start(world, None, ctypes.byref(eng))
        if st != _lib.SUCCESS:
            msg = _comm_error(world)
            _lib.khor_finalize(context)
            raise KhorError(msg, st)
        _state.comm, _state.engine, _state.context = world, eng, context
        _state.homogeneous = ls[0] == -ls[1]
        _state.set_ops = 0
        _state.elastic = _lib.khor_is_elastic is not None and _lib.khor_is_elastic(world) == 1
        _state.sets = {0: global_process_set}
        _state.order = []
        global_process_set.process_set_id = 0
        global_process_set._comm = world
        _state.counters = {}
        if not getattr(_state, "atexit", False):
            atexit.register(_atexit_shutdown)
            _state.atexit = True
    if process_sets:
        for ps in process_sets:
            add_process_set(ps)


def shutdown():
    """Stops the engine and leaves the job. Pending operations fail; init() may follow.
    The process sets are unregistered; an elastic reset registers them again
    (restore_process_sets)."""
    with _state.lock:
        if _state.engine is None:
            return
        hooks, _state.on_shutdown = _state.on_shutdown, []
        for ref in hooks:
            fn = ref()
            if fn is not None:
                _state.on_shutdown.append(ref)
                fn()
        _state.last_sets = list(_state.order)
        if _lib.khor_engine_stop(_state.engine) == _lib.ERR_TIMEOUT:
            # A rank never joined the stop within KHOR_TIMEOUT: shutdown goes on (as
            # Horovod's never raises) but says which rank, which only the comm's text holds.
            warnings.warn("khor: shutdown: " + _lib.text(_lib.khor_comm_error(_state.comm)),
                          RuntimeWarning, stacklevel=2)
        for pid, ps in list(_state.sets.items()):
            if pid != 0 and ps._comm:
                _lib.khor_comm_free(ps._comm)
            ps._comm = None
            ps.process_set_id = None
        _lib.khor_finalize(_state.context)
        _state.comm = _state.engine = _state.context = None
        _state.sets = {}
        _state.order = []
        _state.pending.clear()


def on_shutdown(method):
    """Runs method (a bound method; held weakly) at every shutdown, before the engine stops:
    for front-end objects that hold handles of the job, which die with it."""
    with _state.lock:
        _state.on_shutdown.append(weakref.WeakMethod(method))


def restore_process_sets():
    """After an elastic reset's init: registers again, in their order, the process sets of
    the job left last, the same ProcessSet objects (so whatever holds one, such as a
    DistributedOptimizer, uses it in the new generation). A set with a rank beyond the new
    size cannot be: it stays unregistered, with a warning. Every rank of the new generation
    must register the same sets in the same order: the survivors here, a new worker by the
    add_process_set calls that its script makes before the elastic function."""
    require_init()
    n = size()
    dropped = []
    for ps in _state.last_sets:
        if ps.ranks[-1] < n:
            add_process_set(ps)
        else:
            dropped.append(ps)
    _state.last_sets = []
    if dropped:
        warnings.warn("khor: the job has %d ranks now; process sets %s do not fit and are not "
                      "registered again (register new ones in a reset callback)"
                      % (n, ", ".join(str(ps.ranks) for ps in dropped)), RuntimeWarning)
    return dropped


def is_initialized():
    return _state.engine is not None


def _get(fn):
    require_init()
    return fn(_state.comm)


def rank():
    return _get(_lib.khor_rank)


def size():
    return _get(_lib.khor_size)


def local_rank():
    return _get(_lib.khor_local_rank)


def local_size():
    return _get(_lib.khor_local_size)


def cross_rank():
    return _get(_lib.khor_cross_rank)


def cross_size():
    return _get(_lib.khor_cross_size)


def is_homogeneous():
    """True when every host runs the same number of ranks (learnt at init: no collective
    here, so one rank may ask alone)."""
    require_init()
    return bool(_state.homogeneous)


def _group_of(context, ranks):
    """init(comm=ranks): the comm of those world ranks (khor_comm_create_group: only they
    meet, through the store). A rank outside the list leaves the job with ValueError."""
    n = _lib.khor_size(context)
    me = _lib.khor_rank(context)
    if any(r < 0 or r >= n for r in ranks) or len(set(ranks)) != len(ranks):
        _lib.khor_finalize(context)
        raise ValueError("init(comm=%r): expected distinct ranks of 0..%d (the job khorrun "
                         "launched has %d)" % (ranks, n - 1, n))
    if me not in ranks:
        _lib.khor_finalize(context)
        raise ValueError("init(comm=%r): rank %d of the %d launched is not in the list, so it "
                         "is in no job; only the ranks listed may call init with it"
                         % (ranks, me, n))
    arr = (ctypes.c_int * len(ranks))(*ranks)
    sub = ctypes.c_void_p()
    st = _lib.khor_comm_create_group(context, arr, len(ranks), ctypes.byref(sub))
    if st != _lib.SUCCESS:
        msg = _comm_error(context)
        _lib.khor_finalize(context)
        raise KhorError("init(comm=%r): %s" % (ranks, msg), st)
    return sub


def add_process_set(process_set):
    """Registers a process set (a ProcessSet or a list of ranks); every rank of the job
    calls it, in the same order. Returns the ProcessSet with its id."""
    require_init()
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.ranks is None:
        raise ValueError("the global process set is registered already")
    n = size()
    if not ps.ranks or ps.ranks[0] < 0 or ps.ranks[-1] >= n or len(set(ps.ranks)) != len(
            ps.ranks):
        raise ValueError("process set ranks %r: expected distinct ranks of 0..%d"
                         % (ps.ranks, n - 1))
    with _state.lock:
        for other in _state.sets.values():
            if other.ranks == ps.ranks:
                raise ValueError("a process set with ranks %r exists already (id %d)"
                                 % (ps.ranks, other.process_set_id))
        # Nothing here runs on the world comm from this thread: the engine's thread drives
        # that one (set 0), and a call of ours there would race its negotiation. The members
        # meet through the store (create_group); the id and the final barrier go through
        # the engine, ordered with everything else on set 0.
        _state.set_ops += 1
        tag = "khor.process_set.%d" % _state.set_ops
        me = rank()
        member = me in ps.ranks
        sub = ctypes.c_void_p()
        sid = ctypes.c_int(-1)
        failure = None
        if member:
            arr = (ctypes.c_int * len(ps.ranks))(*ps.ranks)
            st = _lib.khor_comm_create_group(_state.comm, arr, len(ps.ranks),
                                             ctypes.byref(sub))
            if st != _lib.SUCCESS:
                failure = collective_error(_comm_error(), st)
            else:
                st = _lib.khor_engine_add_process_set(_state.engine, sub, ctypes.byref(sid))
                if st != _lib.SUCCESS:
                    failure = collective_error(_engine_error(), st)
                    _lib.khor_comm_free(sub)
                    sub = ctypes.c_void_p()
        # Every rank learns the id (members have it; the others take the max) and whether
        # every member succeeded (the second word: 1 from a member that failed).
        got = allreduce_ints([sid.value, 1 if failure is not None else 0], Max, tag)
        if failure is not None:
            raise failure
        if got[1] > 0:
            raise KhorError("add_process_set(%r): a member rank failed to register it"
                            % (ps.ranks,), _lib.ERR_REMOTE)
        ps.process_set_id = int(got[0])
        ps._comm = sub if sub.value else None
        _state.sets[ps.process_set_id] = ps
        _state.order.append(ps)
    return ps


def remove_process_set(process_set):
    """Unregisters a process set (every rank calls it). False when it was not registered."""
    require_init()
    ps = process_set
    with _state.lock:
        if ps is global_process_set or ps.process_set_id not in _state.sets:
            return False
        if ps._comm:
            check_collective(_lib.khor_engine_remove_process_set(_state.engine,
                                                                 ps.process_set_id),
                             _engine_error)
            _lib.khor_comm_free(ps._comm)
        # through the engine, not on the world comm from this thread (see add_process_set)
        _state.set_ops += 1
        synchronize(enqueue_barrier(global_process_set))
        del _state.sets[ps.process_set_id]
        _state.order.remove(ps)
        ps.process_set_id = None
        ps._comm = None
    return True


def set_id(process_set):
    ps = process_set if process_set is not None else global_process_set
    if ps.process_set_id is None or ps.process_set_id not in _state.sets:
        raise ValueError("%r is not registered (add_process_set first)" % (ps,))
    if not ps.included():
        raise ValueError("rank %d is not in %r" % (rank(), ps))
    return ps.process_set_id


def auto_name(kind, name, process_set=None):
    """Horovod's automatic names ("allreduce.noname.3"), counted per kind and per process
    set, so that unnamed calls on a set that some ranks are not in do not shift the names
    of the others' later calls."""
    if name is not None:
        return name
    sid = process_set.process_set_id if process_set is not None else 0
    with _state.lock:
        k = _state.counters.get((kind, sid), 0)
        _state.counters[(kind, sid)] = k + 1
    return "%s.noname.%d" % (kind, k) if not sid else "%s.set%d.noname.%d" % (kind, sid, k)


class _Pending:
    """One enqueued operation: its khor_handle, what must stay alive, and how to produce
    the result once it completes (``finish(pending)`` -> the front end's output)."""

    __slots__ = ("h", "keep", "finish", "name", "result", "done")

    def __init__(self, h, keep, finish, name):
        self.h = h
        self.keep = keep
        self.finish = finish
        self.name = name
        self.result = None
        self.done = False


def _register(h, keep, finish, name):
    # next() of an itertools.count and a dict's item assignment are atomic under the GIL:
    # no lock on the hot path.
    hid = next(_state.handles)
    _state.pending[hid] = _Pending(h, keep, finish, name)
    return hid


def _enqueue(fn, *args):
    h = ctypes.c_void_p()
    st = fn(_state.engine, *args, ctypes.byref(h))
    if st != _lib.SUCCESS:
        raise enqueue_error(_engine_error(), st)
    return h.value   # an int, as _khorfast's handles


def _names(names):
    arr = (ctypes.c_char_p * len(names))(*[n.encode() for n in names])
    return arr


def _group_arrays(bufs):
    n = len(bufs)
    ptrs = (ctypes.c_void_p * n)(*[b.ptr for b in bufs])
    dts = (ctypes.c_int * n)(*[b.dtype for b in bufs])
    nds = (ctypes.c_int * n)(*[len(b.shape) for b in bufs])
    flat = [d for b in bufs for d in b.shape]
    dims = (ctypes.c_int64 * max(1, len(flat)))(*flat)
    return ptrs, dts, nds, dims


def _event_form(fn_name, bufs):
    """The enqueue call for bufs: the plain form when no input has a ready event, else the
    _event form (a library without them fails here, naming the call)."""
    if len(bufs) == 1 and bufs[0].event is None or not any(b.event for b in bufs):
        return getattr(_lib, fn_name), ()
    fn = getattr(_lib, fn_name + "_event", None)
    if fn is None:
        raise KhorError("this libkhor has no %s_event: device tensors need a newer library"
                        % fn_name, _lib.ERR_NOT_SUPPORTED)
    if len(bufs) == 1 and not fn_name.startswith("khor_enqueue_grouped"):
        return fn, (bufs[0].event,)
    return fn, ((ctypes.c_void_p * len(bufs))(*[b.event for b in bufs]),)


class _DeviceOutputs:
    """The alloc callback for outputs that negotiation sizes (allgather, alltoall) of device
    inputs. The engine calls it on its own thread; each buffer comes from the inputs' alloc
    (all of one device) and stays in _state.device_out until take_output claims it, or until
    the operation is dropped."""

    def __init__(self, alloc):
        self.alloc = alloc
        self.made = []
        self.fn = _lib.ALLOC_FN(self._call)

    def _call(self, arg, ndim, dims, nbytes):
        try:
            addr, owner = self.alloc(int(nbytes))
        except Exception as e:  # noqa: BLE001 -- a raise cannot cross the C frame
            sys.stderr.write("khor: allocating a %d-byte device output failed: %s\n"
                             % (nbytes, e))
            return None
        _state.device_out[addr] = owner
        self.made.append(addr)
        return addr

    def __del__(self):
        for addr in self.made:
            _state.device_out.pop(addr, None)


def _alloc_for(bufs):
    """(alloc callback, its keeper) for bufs: the engine's own host buffer for host inputs,
    or memory of the inputs' device."""
    allocs = [b.alloc for b in bufs if b.alloc is not None]
    if not allocs:
        return _lib.NULL_ALLOC, None
    if len(allocs) != len(bufs):
        raise ValueError("a grouped allgather takes host tensors or device tensors, not both")
    keeper = _DeviceOutputs(allocs[0])
    return keeper.fn, keeper


def take_output(addr):
    """The owner of a device output made by a Buf's alloc at addr (None for the engine's own
    host buffer)."""
    return _state.device_out.pop(addr, None)


def enqueue_allreduce_host(name, inp, out, dtype, shape, op, prescale, postscale,
                           process_set, finish, keep):
    """One allreduce of host memory, the hot path: addresses, khor dtype and shape (a
    tuple) instead of Bufs, through _khorfast when it is built. name: str; keep: what must
    stay alive (finish(pending) reads it as pending.keep)."""
    if _fast is None:
        hid = enqueue_allreduce([name], [Buf(inp, dtype, shape, None)],
                                [Buf(out, dtype, shape, None)], op, prescale, postscale,
                                process_set, finish, None)
        _state.pending[hid].keep = keep
        return hid
    if _state.engine is None:
        require_init()
    sid = set_id(process_set) if process_set is not global_process_set else 0
    h = _fast.allreduce(_state.engine.value, sid, name.encode(), inp, out, dtype, shape,
                        khor_op(op), float(prescale), float(postscale))
    if h < 0:
        raise enqueue_error(_engine_error(), -h)
    return _register(h, keep, finish, [name])


def enqueue_grouped_allreduce_host(names, inps, outs, dtypes, shapes, op, prescale, postscale,
                                   process_set, finish, keep):
    """A grouped allreduce of host memory in one call (as enqueue_allreduce_host, each
    argument a list, one entry per tensor, at least two)."""
    if _fast is None:
        hid = enqueue_allreduce(names, [Buf(i, d, s, None) for i, d, s in
                                        zip(inps, dtypes, shapes)],
                                [Buf(o, d, s, None) for o, d, s in zip(outs, dtypes, shapes)],
                                op, prescale, postscale, process_set, finish, None)
        _state.pending[hid].keep = keep
        return hid
    if _state.engine is None:
        require_init()
    sid = set_id(process_set) if process_set is not global_process_set else 0
    h = _fast.grouped_allreduce(_state.engine.value, sid, [n.encode() for n in names], inps,
                                outs, dtypes, shapes, khor_op(op), float(prescale),
                                float(postscale))
    if h < 0:
        raise enqueue_error(_engine_error(), -h)
    return _register(h, keep, finish, names)


def enqueue_allreduce(name, ins, outs, op, prescale, postscale, process_set, finish, keep):
    """ins/outs: lists of Buf (one = a plain allreduce, more = grouped)."""
    require_init()
    sid = set_id(process_set)
    kop = khor_op(op)
    if len(ins) == 1:
        i, o = ins[0], outs[0]
        fn, ev = _event_form("khor_enqueue_allreduce", ins)
        h = _enqueue(fn, sid, name[0].encode(), i.ptr, o.ptr, i.dtype, len(i.shape), i.dims(),
                     kop, float(prescale), float(postscale), *ev)
    else:
        ptrs, dts, nds, dims = _group_arrays(ins)
        optrs = (ctypes.c_void_p * len(outs))(*[b.ptr for b in outs])
        fn, ev = _event_form("khor_enqueue_grouped_allreduce", ins)
        h = _enqueue(fn, sid, len(ins), _names(name), ptrs, optrs, dts, nds, dims, kop,
                     float(prescale), float(postscale), *ev)
    return _register(h, (ins, outs, keep), finish, name)


def enqueue_reducescatter(name, ins, outs, op, prescale, postscale, process_set, finish, keep):
    require_init()
    sid = set_id(process_set)
    kop = khor_op(op)
    if len(ins) == 1:
        i, o = ins[0], outs[0]
        fn, ev = _event_form("khor_enqueue_reducescatter", ins)
        h = _enqueue(fn, sid, name[0].encode(), i.ptr, o.ptr, i.dtype, len(i.shape), i.dims(),
                     kop, float(prescale), float(postscale), *ev)
    else:
        ptrs, dts, nds, dims = _group_arrays(ins)
        optrs = (ctypes.c_void_p * len(outs))(*[b.ptr for b in outs])
        fn, ev = _event_form("khor_enqueue_grouped_reducescatter", ins)
        h = _enqueue(fn, sid, len(ins), _names(name), ptrs, optrs, dts, nds, dims, kop,
                     float(prescale), float(postscale), *ev)
    return _register(h, (ins, outs, keep), finish, name)


def enqueue_allgather(name, ins, process_set, finish, keep):
    require_init()
    sid = set_id(process_set)
    alloc, keeper = _alloc_for(ins)
    if len(ins) == 1:
        i = ins[0]
        fn, ev = _event_form("khor_enqueue_allgather", ins)
        h = _enqueue(fn, sid, name[0].encode(), i.ptr, i.dtype, len(i.shape), i.dims(), alloc,
                     None, *ev)
    else:
        ptrs, dts, nds, dims = _group_arrays(ins)
        fn, ev = _event_form("khor_enqueue_grouped_allgather", ins)
        h = _enqueue(fn, sid, len(ins), _names(name), ptrs, dts, nds, dims, alloc, None, *ev)
    return _register(h, (ins, keep, keeper), finish, name)


def enqueue_broadcast(name, i, o, root, process_set, finish, keep):
    """root is a world rank, as in Horovod (also on a process set)."""
    require_init()
    sid = set_id(process_set)
    ps = process_set if process_set is not None else global_process_set
    root = int(root)
    if ps.ranks is not None:
        if root not in ps.ranks:
            raise ValueError("root_rank %d is not in %r" % (root, ps))
        root = ps.ranks.index(root)
    fn, ev = _event_form("khor_enqueue_broadcast", [i])
    h = _enqueue(fn, sid, name.encode(), i.ptr, o.ptr, i.dtype, len(i.shape), i.dims(), root,
                 *ev)
    return _register(h, (i, o, keep), finish, [name])


def enqueue_alltoall(name, i, splits, process_set, finish, keep):
    require_init()
    sid = set_id(process_set)
    sp = None
    if splits is not None:
        sp = (ctypes.c_int64 * len(splits))(*[int(s) for s in splits])
    alloc, keeper = _alloc_for([i])
    fn, ev = _event_form("khor_enqueue_alltoall", [i])
    h = _enqueue(fn, sid, name.encode(), i.ptr, i.dtype, len(i.shape), i.dims(), sp, alloc,
                 None, *ev)
    return _register(h, (i, sp, keep, keeper), finish, [name])


def enqueue_barrier(process_set):
    require_init()
    h = _enqueue(_lib.khor_enqueue_barrier, set_id(process_set))
    return _register(h, None, None, ["barrier"])


def enqueue_join(process_set):
    require_init()
    h = _enqueue(_lib.khor_enqueue_join, set_id(process_set))
    return _register(h, None, None, ["join"])


def output(h, i):
    """Tensor i's engine-allocated output: (address, dims)."""
    data = ctypes.c_void_p()
    nd = ctypes.c_int()
    dims = (ctypes.c_int64 * 8)()
    _lib.check(_lib.khor_handle_output(h, i, ctypes.byref(data), ctypes.byref(nd), dims),
               lambda: "no output for tensor %d" % i)
    return data.value, tuple(dims[k] for k in range(nd.value))


def splits(h, n):
    out = (ctypes.c_int64 * n)()
    _lib.check(_lib.khor_handle_splits(h, out, n), lambda: "no splits")
    return [int(x) for x in out]


def join_rank(h):
    return int(_lib.khor_handle_join_rank(h))


def poll(handle):
    """True when the operation has completed (successfully or not)."""
    p = _state.pending.get(handle)
    if p is None:
        raise ValueError("unknown handle %r" % (handle,))
    test = _fast.test if _fast is not None else _lib.khor_handle_test
    return p.done or test(p.h) != _lib.IN_PROGRESS


def synchronize(handle):
    """Waits for the operation and returns its result; raises KhorError with the engine's
    text (rank, peer, tensor, cause) when it failed. After KHOR_TIMEOUT without completion
    it raises with what the operation waits for, and the handle stays valid."""
    p = _state.pending.get(handle)
    if p is None:
        raise ValueError("unknown handle %r (already synchronized?)" % (handle,))
    st = _fast.wait(p.h) if _fast is not None else _lib.khor_handle_wait(p.h)
    if st == _lib.ERR_TIMEOUT:
        raise collective_error(_lib.text(_lib.khor_handle_error(p.h)), st)
    try:
        if st != _lib.SUCCESS:
            raise collective_error(_lib.text(_lib.khor_handle_error(p.h)), st)
        return p.finish(p) if p.finish is not None else None
    finally:
        _state.pending.pop(handle, None)
        if _fast is not None:
            _fast.free(p.h)
        else:
            _lib.khor_handle_free(p.h)


def start_timeline(file_path, mark_cycles=False):
    require_init()
    _lib.check(_lib.khor_engine_timeline_start(_state.engine, file_path.encode(),
                                               1 if mark_cycles else 0), _engine_error)


def stop_timeline():
    require_init()
    _lib.check(_lib.khor_engine_timeline_stop(_state.engine), _engine_error)


# ---- the elastic mode's calls (docs/ELASTIC.md) --------------------------------------------

def _elastic_fn(name):
    fn = getattr(_lib, name)
    if fn is None:
        raise KhorError("khor: %s has no elastic mode (it lacks %s); use a libkhor built "
                        "with it" % (_lib.path, ", ".join(_lib.elastic_missing)),
                        _lib.ERR_NOT_SUPPORTED)
    return fn


def is_elastic():
    """True when the job joined is an elastic one (khorrun's elastic driver)."""
    return _state.elastic


def generation():
    """The generation joined: the driver's number in an elastic job (1, 2, ...), this
    process's count of inits in a fixed one."""
    require_init()
    return int(_elastic_fn("khor_generation")(_state.comm))


def hosts_updated():
    """What the driver said of this generation's hosts: bit 1 added, bit 2 removed, 0 none
    (read locally; it costs nothing)."""
    require_init()
    return int(_elastic_fn("khor_hosts_updated")(_state.comm))


def elastic_state(hold):
    """The job-wide record of the training state (khor_elastic_state): hold=True says this
    worker now holds it; returns how many times workers said so (0: nobody ever held it)."""
    require_init()
    n = ctypes.c_int64(0)
    _lib.check(_elastic_fn("khor_elastic_state")(_state.comm, 1 if hold else 0,
                                                 ctypes.byref(n)),
               _comm_error)
    return n.value


def allreduce_ints(values, op, name):
    """The int32 allreduce of a few numbers over the global set, through the engine (so it
    orders with the script's other named collectives); returns the list."""
    arr = (ctypes.c_int32 * len(values))(*values)
    buf = Buf(ctypes.addressof(arr), _lib.INT32, (len(values),), arr)
    synchronize(enqueue_allreduce([name], [buf], [buf], op, 1.0, 1.0, global_process_set,
                                  None, None))
    return list(arr)


def world_allreduce_ints(values, op):
    """The int32 allreduce of a few numbers straight on the world comm, from this thread:
    no engine round trip (its sets run on comms of their own), so every rank must call it
    at the same point of its program, as check_host_updates is."""
    require_init()
    arr = (ctypes.c_int32 * len(values))(*values)
    check_collective(_lib.khor_allreduce(_state.comm, arr, arr, len(values), _lib.INT32,
                                         khor_op(op)), _comm_error)
    return list(arr)


def broadcast_bytes(data, root_rank, name):
    """root_rank's bytes on every rank (data is ignored elsewhere), in two broadcasts: the
    length, then the bytes."""
    me = rank()
    n = (ctypes.c_int64 * 1)(len(data) if me == root_rank else 0)
    nbuf = Buf(ctypes.addressof(n), _lib.INT64, (1,), n)
    synchronize(enqueue_broadcast(name + ".size", nbuf, nbuf, root_rank, global_process_set,
                                  None, None))
    raw = ctypes.create_string_buffer(data if me == root_rank else b"", max(1, n[0]))
    dbuf = Buf(ctypes.addressof(raw) if n[0] else 0, _lib.UINT8, (n[0],), raw)
    synchronize(enqueue_broadcast(name + ".data", dbuf, dbuf, root_rank, global_process_set,
                                  None, None))
    return raw.raw[:n[0]]
