"""pytest configuration for khor.tensorflow's tests, run under khorrun on every rank with the
Python that has TensorFlow (CTest: tf_pytest_n2, tf_pytest_n4):

    PYTHONPATH=bindings/python KHOR_LIBRARY_PATH=build/libkhor.so \
        build/khorrun -np 2 $TF_PYTHON -m pytest -q -x tests/tensorflow

libkhor_tf.so is found next to libkhor (KHOR_TF_LIBRARY_PATH overrides). Every rank runs the
same session, so each test runs the same collectives on every rank and asserts after them;
KHOR_TIMEOUT (30 s unless set) bounds every wait, and KHOR_STALL_SHUTDOWN_TIME (20 s) an op
that other ranks submit under another name. The job is joined once; after each test the
ranks meet at a barrier, so a test whose ranks ran different collectives fails in its own
teardown. A rank whose test failed skips the barrier and, with -x, exits without the
collective shutdown, so that the others see its links close instead of waiting.
"""

import os
import sys

os.environ.setdefault("KHOR_TIMEOUT", "30s")
# A tensor that some ranks name differently (a naming bug) would wait for its partner
# forever; the stall inspector fails it after this long instead.
os.environ.setdefault("KHOR_STALL_CHECK_TIME", "10")
os.environ.setdefault("KHOR_STALL_SHUTDOWN_TIME", "20")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow", reason="khor.tensorflow needs tensorflow")

try:
    import khor  # the one PYTHONPATH names
except ImportError:      # else the tree's own
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(_HERE)), "bindings",
                                    "python"))
    import khor
import khor.tensorflow as hvd  # noqa: E402


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.khor_failed = rep.failed


@pytest.fixture(autouse=True)
def khor_job(request):
    if not hvd.is_initialized():
        hvd.init()
    yield
    if not hvd.is_initialized():
        hvd.init()
    if getattr(request.node, "khor_failed", False):
        return
    khor.barrier()


def pytest_sessionfinish(session, exitstatus):
    if hvd.is_initialized() and exitstatus == 0:
        hvd.shutdown()
    elif hvd.is_initialized():
        import atexit
        from khor import _core
        atexit.unregister(_core._atexit_shutdown)
