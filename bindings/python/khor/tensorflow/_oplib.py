"""The TensorFlow ops' library, libkhor_tf.so (bindings/tensorflow): found, loaded once with
tf.load_op_library (which registers the ops) and then with ctypes on the same file, for the
two plain C functions it exports: khor_tf_set_engine and khor_tf_built_version. Its
TensorFlow version is checked against this one's (major.minor) before it is loaded.

It is looked for, in order: the file or directory KHOR_TF_LIBRARY_PATH names, next to the
libkhor that khor loaded (a build tree keeps both at its top), next to this package and the
directories libkhor's own search uses (khor._lib).
"""

import ctypes
import os

import tensorflow as tf

from .. import _core, _lib

NAME = "libkhor_tf.so"


def _candidates():
    env = os.environ.get("KHOR_TF_LIBRARY_PATH")
    if env:
        yield os.path.join(env, NAME) if os.path.isdir(env) else env
    yield os.path.join(os.path.dirname(os.path.abspath(_lib.path)), NAME)
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, NAME)
    yield os.path.join(os.path.dirname(here), NAME)
    for path in _lib._candidates():
        if os.sep in path:
            yield os.path.join(os.path.dirname(path), NAME)


def _built_for(path):
    """The TensorFlow version the file was built for, read from its bytes (khor_tf_ops.c's
    marker) without loading it; "unknown" without the marker."""
    with open(path, "rb") as f:
        data = f.read()
    i = data.find(b"KHOR_TF_BUILT_FOR=")
    if i < 0:
        return "unknown"
    end = data.find(b"\0", i)
    return data[i + len(b"KHOR_TF_BUILT_FOR="):end].decode("ascii", "replace")


def _major_minor(v):
    return tuple(v.split(".")[:2])


def check_version(path, running=None):
    """The version path was built for; ImportError naming both when its major.minor is not
    the running TensorFlow's."""
    running = running or tf.__version__
    built = _built_for(path)
    if _major_minor(built) != _major_minor(running):
        raise ImportError(
            "khor.tensorflow: %s was built for TensorFlow %s; this is TensorFlow %s. Rebuild "
            "it against this one (cmake -DKHOR_TF_PYTHON=<this python>)"
            % (path, built, running))
    return built


def _load():
    tried = []
    for path in _candidates():
        if path in tried:
            continue
        tried.append(path)
        if os.path.exists(path):
            break
    else:
        raise ImportError(
            "khor.tensorflow: cannot find %s; build it (cmake -DKHOR_TF_PYTHON=<python with "
            "tensorflow> and cmake --build) and set KHOR_TF_LIBRARY_PATH to the file or its "
            "directory. Looked in: %s" % (NAME, ", ".join(tried[:6])))
    built = check_version(path)
    # TensorFlow first: the library registers its ops when it is first opened, and
    # load_op_library makes the Python wrappers of the ops registered during its own load.
    try:
        ops = tf.load_op_library(path)
    except Exception as e:  # TensorFlow's own errors, with its text
        raise ImportError("khor.tensorflow: TensorFlow %s cannot load %s (built for %s): %s"
                          % (tf.__version__, path, built, e)) from e
    c = ctypes.CDLL(path)
    c.khor_tf_set_engine.restype = None
    c.khor_tf_set_engine.argtypes = [ctypes.c_void_p]
    c.khor_tf_built_version.restype = ctypes.c_char_p
    c.khor_tf_built_version.argtypes = []
    return ops, c, path, _lib.text(c.khor_tf_built_version())


ops, _c, path, built_version = _load()
_given = [None]


def sync_engine():
    """Hands the ops the engine khor has now (None before init and after shutdown). Cheap:
    it calls into the library only when the engine changed."""
    e = _core._state.engine
    v = e.value if e is not None else None
    if v != _given[0]:
        _c.khor_tf_set_engine(v)
        _given[0] = v


class _Link:
    """Clears the ops' engine at shutdown, before the engine stops (khor._core.on_shutdown
    holds its method weakly; the module keeps the object)."""

    def clear(self):
        _c.khor_tf_set_engine(None)
        _given[0] = None


_link = _Link()
_core.on_shutdown(_link.clear)
