"""The C boundary: loads libkhor once, declares every function this package calls, and turns
a failed ``khor_status`` into an exception carrying the library's error text.

Nothing else in the package touches ctypes. The library is looked for, in order: the file or
directory named by ``KHOR_LIBRARY_PATH``, next to this package (a wheel or an in-tree copy),
the directories ``cmake --install`` uses (``<prefix>/lib``, ``<prefix>/lib/<multiarch>``
relative to this file's install location, then /usr/local/lib and /usr/lib), and the
system's search path.
"""

import ctypes
import ctypes.util
import os
import sys

# khor.h's enums, fixed values (the ABI).
SUCCESS = 0
IN_PROGRESS = 1
ERR_INVALID_ARG = 2
ERR_NO_MEMORY = 3
ERR_SYSTEM = 4
ERR_TIMEOUT = 5
ERR_REMOTE = 6
ERR_PROTOCOL = 7
ERR_AUTH = 8
ERR_NOT_SUPPORTED = 9
ERR_INTERNAL = 10
ERR_MEMBERSHIP = 11   # an elastic job's membership changed: reset (finalize, init again)
ERR_REMOVED = 12      # khor_init: this worker is no longer in the elastic job

FLOAT32, FLOAT64, INT32, INT64, FLOAT16, BFLOAT16, INT8, UINT8, BOOL, INT16 = range(10)
SUM, AVG, MIN, MAX, PROD = range(5)


class KhorError(RuntimeError):
    """A khor call failed. ``status`` is the khor_status; the message is the library's own
    text, which names this rank and host, the peer, the tensor or operation and the cause."""

    def __init__(self, message, status=ERR_INTERNAL):
        super().__init__(message)
        self.status = status


def _candidates():
    env = os.environ.get("KHOR_LIBRARY_PATH")
    names = ("libkhor.so.0", "libkhor.so")
    if env:
        if os.path.isdir(env):
            for n in names:
                yield os.path.join(env, n)
        else:
            yield env
    here = os.path.dirname(os.path.abspath(__file__))
    for n in names:
        yield os.path.join(here, n)
    # <prefix>/lib/python3/dist-packages/khor -> <prefix>/lib, <prefix>/lib/<multiarch>
    prefix = here
    for _ in range(4):
        prefix = os.path.dirname(prefix)
        for sub in ("lib", "lib64", os.path.join("lib", _multiarch())):
            for n in names:
                yield os.path.join(prefix, sub, n)
    for d in ("/usr/local/lib", "/usr/lib", os.path.join("/usr/lib", _multiarch())):
        for n in names:
            yield os.path.join(d, n)
    found = ctypes.util.find_library("khor")
    if found:
        yield found


def _multiarch():
    return getattr(sys.implementation, "_multiarch", "x86_64-linux-gnu")


def _load():
    tried = []
    for path in _candidates():
        if path in tried:
            continue
        tried.append(path)
        if os.sep in path and not os.path.exists(path):
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError:
            continue
    raise ImportError(
        "khor: cannot find libkhor.so; build it (cmake --build build) and set "
        "KHOR_LIBRARY_PATH to the library or its directory, or install it with "
        "cmake --install build. Looked in: " + ", ".join(tried[:8]))


lib, path = _load()

c_void_p = ctypes.c_void_p
c_int = ctypes.c_int
c_int64 = ctypes.c_int64
c_uint64 = ctypes.c_uint64
c_size_t = ctypes.c_size_t
c_double = ctypes.c_double
c_char_p = ctypes.c_char_p
P = ctypes.POINTER

ALLOC_FN = ctypes.CFUNCTYPE(c_void_p, c_void_p, c_int, P(c_int64), c_size_t)
DONE_FN = ctypes.CFUNCTYPE(None, c_void_p, c_void_p, c_int)


def _proto(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    globals()[name] = f


_proto("khor_version", c_char_p)
_proto("khor_strerror", c_char_p, c_int)
_proto("khor_dtype_size", c_size_t, c_int)
_proto("khor_config_create", c_int, P(c_void_p))
_proto("khor_config_set", c_int, c_void_p, c_char_p, c_char_p)
_proto("khor_config_destroy", None, c_void_p)
_proto("khor_init", c_int, c_void_p, c_char_p, c_size_t, P(c_void_p))
_proto("khor_finalize", c_int, c_void_p)
for _g in ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size"):
    _proto("khor_" + _g, c_int, c_void_p)
_proto("khor_comm_split", c_int, c_void_p, c_int, c_int, P(c_void_p))
_proto("khor_comm_create_group", c_int, c_void_p, P(c_int), c_int, P(c_void_p))
_proto("khor_comm_free", c_int, c_void_p)
_proto("khor_comm_id", c_int64, c_void_p)
_proto("khor_comm_world_rank", c_int, c_void_p, c_int)
_proto("khor_comm_error", c_char_p, c_void_p)
_proto("khor_allreduce", c_int, c_void_p, c_void_p, c_void_p, c_size_t, c_int, c_int)
_proto("khor_broadcast", c_int, c_void_p, c_void_p, c_size_t, c_int, c_int)
_proto("khor_barrier", c_int, c_void_p)
_proto("khor_allgather", c_int, c_void_p, c_void_p, c_void_p, c_size_t, c_int)

_proto("khor_engine_start", c_int, c_void_p, c_void_p, P(c_void_p))
_proto("khor_engine_stop", c_int, c_void_p)
_proto("khor_engine_error", c_char_p, c_void_p)
_proto("khor_engine_add_process_set", c_int, c_void_p, c_void_p, P(c_int))
_proto("khor_engine_remove_process_set", c_int, c_void_p, c_int)
_proto("khor_engine_fd", c_int, c_void_p)
_proto("khor_engine_timeline_start", c_int, c_void_p, c_char_p, c_int)
_proto("khor_engine_timeline_stop", c_int, c_void_p)
_proto("khor_engine_tuning", c_int, c_void_p, P(c_int64), P(c_double))
_proto("khor_engine_stats", c_int, c_void_p, c_int, P(c_uint64), P(c_uint64), P(c_uint64))
_ENQ = (c_void_p, c_int)
_proto("khor_enqueue_allreduce", c_int, *_ENQ, c_char_p, c_void_p, c_void_p, c_int, c_int,
       P(c_int64), c_int, c_double, c_double, P(c_void_p))
_proto("khor_enqueue_grouped_allreduce", c_int, *_ENQ, c_int, P(c_char_p), P(c_void_p),
       P(c_void_p), P(c_int), P(c_int), P(c_int64), c_int, c_double, c_double, P(c_void_p))
_proto("khor_enqueue_allgather", c_int, *_ENQ, c_char_p, c_void_p, c_int, c_int, P(c_int64),
       ALLOC_FN, c_void_p, P(c_void_p))
_proto("khor_enqueue_grouped_allgather", c_int, *_ENQ, c_int, P(c_char_p), P(c_void_p),
       P(c_int), P(c_int), P(c_int64), ALLOC_FN, c_void_p, P(c_void_p))
_proto("khor_enqueue_broadcast", c_int, *_ENQ, c_char_p, c_void_p, c_void_p, c_int, c_int,
       P(c_int64), c_int, P(c_void_p))
_proto("khor_enqueue_alltoall", c_int, *_ENQ, c_char_p, c_void_p, c_int, c_int, P(c_int64),
       P(c_int64), ALLOC_FN, c_void_p, P(c_void_p))
_proto("khor_enqueue_reducescatter", c_int, *_ENQ, c_char_p, c_void_p, c_void_p, c_int, c_int,
       P(c_int64), c_int, c_double, c_double, P(c_void_p))
_proto("khor_enqueue_grouped_reducescatter", c_int, *_ENQ, c_int, P(c_char_p), P(c_void_p),
       P(c_void_p), P(c_int), P(c_int), P(c_int64), c_int, c_double, c_double, P(c_void_p))
_proto("khor_enqueue_barrier", c_int, *_ENQ, P(c_void_p))
_proto("khor_enqueue_join", c_int, *_ENQ, P(c_void_p))
_proto("khor_handle_test", c_int, c_void_p)
_proto("khor_handle_wait", c_int, c_void_p)
_proto("khor_handle_error", c_char_p, c_void_p)
_proto("khor_handle_output", c_int, c_void_p, c_int, P(c_void_p), P(c_int), P(c_int64))
_proto("khor_handle_splits", c_int, c_void_p, P(c_int64), c_int)
_proto("khor_handle_join_rank", c_int, c_void_p)
_proto("khor_handle_free", None, c_void_p)


def _proto_optional(name, restype, *argtypes):
    """Declares a function that an older libkhor lacks; None there."""
    try:
        _proto(name, restype, *argtypes)
    except AttributeError:
        globals()[name] = None


# The elastic mode's calls (docs/ELASTIC.md). Without them the library has no elastic mode,
# and only the elastic calls say so (elastic_missing names what is missing).
_proto_optional("khor_generation", c_int, c_void_p)
_proto_optional("khor_hosts_updated", c_int, c_void_p)
_proto_optional("khor_is_elastic", c_int, c_void_p)
_proto_optional("khor_elastic_state", c_int, c_void_p, c_int, P(c_int64))
elastic_missing = [n for n in ("khor_generation", "khor_hosts_updated", "khor_is_elastic",
                               "khor_elastic_state") if globals()[n] is None]

# What the library was built with ("version=X tcp=1 shm=1 ib=0 cuda=0 nccl=0 gdr=0"); a
# libkhor older than khor_build_info says nothing, and build_info() is then {}.
_proto_optional("khor_build_info", c_char_p)


def build_info():
    """khor_build_info's words as a dict of str -> str ({} when the library lacks it)."""
    if khor_build_info is None:
        return {}
    out = {}
    for word in text(khor_build_info()).split():
        k, _, v = word.partition("=")
        out[k] = v
    return out


def built_with(feature):
    """True when khor_build_info says feature=1 (False when it is 0 or not said)."""
    return build_info().get(feature, "0") == "1"


# The _event forms (device inputs a stream is still producing): the plain form's arguments
# and then the ready event (one, or an array of one per tensor for the grouped forms).
for _f, _tail in (("allreduce", (c_void_p,)), ("grouped_allreduce", (P(c_void_p),)),
                  ("allgather", (c_void_p,)), ("grouped_allgather", (P(c_void_p),)),
                  ("broadcast", (c_void_p,)), ("alltoall", (c_void_p,)),
                  ("reducescatter", (c_void_p,)), ("grouped_reducescatter", (P(c_void_p),))):
    _plain = globals()["khor_enqueue_" + _f]
    _proto_optional("khor_enqueue_%s_event" % _f, c_int,
                    *(list(_plain.argtypes[:-1]) + list(_tail) + [P(c_void_p)]))

NULL_ALLOC = ALLOC_FN()


def text(b):
    return b.decode("utf-8", "replace") if b else ""


def check(status, message_fn):
    """Raises KhorError(message_fn()) unless status is SUCCESS."""
    if status != SUCCESS:
        msg = message_fn() or text(lib.khor_strerror(status))
        raise KhorError(msg, status)


def _load_fast():
    """khor._khorfast (bindings/python/ext/khorfast.c), the hot path in C, bound to the
    functions of the libkhor loaded above: from beside that library (a build tree), else
    from this package (an install). None when it is not built or KHOR_FAST=0, and the
    package then makes the same calls through ctypes."""
    if os.environ.get("KHOR_FAST", "1") == "0":
        return None
    import importlib.machinery
    import importlib.util
    dirs = [os.path.dirname(os.path.abspath(__file__))]
    if os.sep in path:
        dirs.insert(0, os.path.dirname(os.path.abspath(path)))
    for d in dirs:
        f = os.path.join(d, "_khorfast.abi3.so")
        if not os.path.exists(f):
            continue
        try:
            loader = importlib.machinery.ExtensionFileLoader("khor._khorfast", f)
            spec = importlib.util.spec_from_file_location("khor._khorfast", f, loader=loader)
            mod = importlib.util.module_from_spec(spec)
            loader.exec_module(mod)
        except ImportError as e:
            sys.stderr.write("khor: %s does not load (%s); using ctypes\n" % (f, e))
            return None
        try:
            mod.bind(*[ctypes.cast(fn, c_void_p).value for fn in
                       (khor_enqueue_allreduce, khor_enqueue_grouped_allreduce,
                        khor_handle_wait, khor_handle_test, khor_handle_free)])
        except TypeError as e:   # a module from another build of the package
            sys.stderr.write("khor: %s does not match this package (%s); using ctypes\n"
                             % (f, e))
            return None
        return mod
    return None


fast = _load_fast()
