"""pytest configuration for khor's Python tests, run under khorrun on every rank:

    PYTHONPATH=bindings/python KHOR_LIBRARY_PATH=build/libkhor.so \
        build/khorrun -np 2 /usr/bin/python3 -m pytest -q -x tests/python

Every rank runs the same session, so every test runs the same collectives in the same order
on every rank and asserts after them. KHOR_TIMEOUT (30 s unless set) bounds every wait, so a
rank that fails or leaves early makes the others fail, never hang.

The job is joined once and stays joined between tests; a test that shuts it down (the
init/shutdown cycles, init(process_sets=...)) leaves it joined again or the next test's
fixture rejoins it (init takes milliseconds). After each test every rank meets at a barrier,
so a test that ran different collectives on different ranks fails in its own teardown rather
than somewhere later. A rank whose test failed skips that barrier and, with -x, exits without
the (collective) shutdown, so the others see its links close and fail at once. After a test
that xfailed (a known bug; those tests make every rank agree on the outcome) the job is
rejoined afresh.
"""

import os
import sys

os.environ.setdefault("KHOR_TIMEOUT", "30s")

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import pytest  # noqa: E402

try:
    import khor  # the one PYTHONPATH names
except ImportError:      # else the tree's own
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(_HERE)), "bindings",
                                    "python"))
    import khor


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.khor_failed = rep.failed
        item.khor_xfailed = rep.skipped and hasattr(rep, "wasxfail")


@pytest.fixture(autouse=True)
def khor_job(request):
    """Every test starts inside a joined job and ends at a barrier of all ranks, unless it
    failed here: then this rank goes on (with -x: exits) at once, since the others may be
    waiting in a collective of that test which this rank will not run."""
    if not khor.is_initialized():
        khor.init()
    yield
    if not khor.is_initialized():
        khor.init()
    if getattr(request.node, "khor_failed", False):
        return
    khor.barrier()
    if getattr(request.node, "khor_xfailed", False):
        # A known bug may have left pending handles or automatic names that differ between
        # ranks (an op that ran on some ranks only): start the next test on a fresh job.
        khor.shutdown()
        khor.init()


def pytest_sessionfinish(session, exitstatus):
    """A clean session leaves the job with the others (shutdown is collective); a failed
    one just exits, so that the ranks still running see its links close at once instead of
    waiting out KHOR_TIMEOUT for a shutdown or a collective it will never join."""
    if khor.is_initialized() and exitstatus == 0:
        khor.shutdown()
    elif khor.is_initialized():
        # nor at exit (khor registers shutdown with atexit, as Horovod does)
        import atexit
        from khor import _core
        atexit.unregister(_core._atexit_shutdown)
