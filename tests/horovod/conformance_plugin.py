"""A pytest plugin for tests/horovod/conformance.py: every rank's pytest appends one JSON line
per test to $CONFORMANCE_OUT/rank<R>.jsonl as each test ends (so a job killed for hanging
still leaves what it finished, and the test it was in is the one without an end), and a
"start" line as each test begins."""

import json
import os

_OUT = os.environ.get("CONFORMANCE_OUT")
_RANK = next((os.environ[v] for v in ("KHOR_RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK",
                                      "PMI_RANK") if v in os.environ), "0")
_seen, _why = {}, {}


def _write(rec):
    if not _OUT:
        return
    with open(os.path.join(_OUT, "rank%s.jsonl" % _RANK), "a") as f:
        f.write(json.dumps(rec) + "\n")


def pytest_runtest_logstart(nodeid, location):
    _seen[nodeid] = "passed"
    _write({"test": nodeid, "event": "start"})


def pytest_runtest_logreport(report):
    # A failure in any phase fails the test; a skip in setup or call skips it.
    if report.failed:
        _seen[report.nodeid] = "failed"
        _why.setdefault(report.nodeid, "%s: %s" % (report.when, report.longreprtext[-800:]))
    elif report.skipped and _seen.get(report.nodeid) != "failed":
        _seen[report.nodeid] = "skipped"
    if report.when == "teardown":
        rec = {"test": report.nodeid, "event": "end", "outcome": _seen.get(report.nodeid)}
        if report.nodeid in _why:
            rec["why"] = _why.pop(report.nodeid)
        _write(rec)
