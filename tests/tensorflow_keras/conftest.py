"""pytest configuration for khor's Keras tests, run under khorrun on every rank:

    PYTHONPATH=bindings/python KHOR_LIBRARY_PATH=build/libkhor.so \
        build/khorrun -np 2 $TF_PYTHON -m pytest -q -x tests/tensorflow_keras

with TF_USE_LEGACY_KERAS=1 for tf-keras instead of Keras 3. Every rank runs the same session
(the same collectives in the same order) and asserts after them. The job is joined once by
khor.tensorflow.init (which hands the engine to the TensorFlow ops); after each test every
rank meets at a barrier, unless its test failed: then, with -x, it exits and the others see
its links close instead of waiting in a collective it will never join. KHOR_TIMEOUT (60 s
unless set) bounds every wait.
"""

import os
import sys

os.environ.setdefault("KHOR_TIMEOUT", "60s")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow", reason="the Keras tests need tensorflow")

try:
    import khor  # the one PYTHONPATH names
except ImportError:      # else the tree's own
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(_HERE)), "bindings",
                                    "python"))
    import khor
import khor.tensorflow.keras as hvd  # noqa: E402


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.khor_failed = rep.failed


@pytest.fixture(autouse=True)
def khor_job(request):
    if not khor.is_initialized():
        hvd.init()
    yield
    if getattr(request.node, "khor_failed", False):
        return
    khor.barrier()


def pytest_sessionfinish(session, exitstatus):
    if khor.is_initialized() and exitstatus == 0:
        hvd.shutdown()
    elif khor.is_initialized():
        import atexit
        from khor import _core
        atexit.unregister(_core._atexit_shutdown)
