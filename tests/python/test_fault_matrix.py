"""The fault matrix of tests/runtime/test_fault_matrix.c through the Python API: khor.torch
and its engine, under khorrun, while rank 0's link to rank 1 fails on schedule (KHOR_FAULTS,
transport/filter/filter.h).

Not a rank program: plain pytest launches the jobs (CTest's pytest_fault_matrix),

    KHORRUN=build/khorrun KHOR_LIBRARY_PATH=build/libkhor.so PYTHONPATH=bindings/python \\
        /usr/bin/python3 -m pytest -v tests/python/test_fault_matrix.py

and skips itself when it finds itself a rank of a khorrun job (pytest_n2/n4 collect the whole
directory). The ranks run tests/python/fault_worker.py: six iterations of allreduce (64K
floats), broadcast (16K, root it % size), allgather (1K) and 20 allreduce_async_ +
synchronize, each element checked.

One test per case, transport (tcp, shm) and n (2, 4, 8). For each n, one khorrun job runs all
of its cases in turn, both transports (one hvd.init() and hvd.shutdown() a case, each a new
generation of the job's store keys): importing torch in eight python3 processes costs more
than all the cases together. With KHOR_FAULT_MATRIX_SEPARATE=1 every case is a khorrun job of
its own instead, the fault in its environment (-x KHOR_FAULTS=...), which is how a script
meets it: the failed ranks exit and khorrun stops the rest (a torch import per case and
rank: minutes). test_fault_alone runs a few cases that way at n=2 in any case.

Every case must end one of two ways, as in the C matrix:

  - OK: every rank finished with the right results (a delay, a stall: slow is not broken);
  - FAILS: every rank raised, and with the same first failure: a rank whose error does not
    say "aborted by another rank" (the root), whose text holds one of the case's marks (what
    the fault looks like from the inside), and the first 200 characters of whose error are
    in every rank's error (the others carry it as "the job was aborted by another rank:
    <it>"); within 10 s of each other. A rank whose error is that of an operation enqueued
    after its set had failed ("... not started, set 0 failed earlier: <the set's error>")
    reports the set's error.

Never a hang (no verdict from a rank within CASE_DEADLINE_S of the previous case's end),
never a wrong result reported as success (the worker checks every element, and a damaged
payload must be caught by KHOR_CHECKSUM), and every rank gets through its shutdown at exit.
"""

import importlib.util
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

if os.environ.get("KHOR_LAUNCHER") or "KHOR_RANK" in os.environ:
    pytest.skip("this rank is in a khorrun job: the fault matrix launches jobs of its own "
                "(CTest's pytest_fault_matrix runs it under plain pytest)",
                allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "fault_worker.py")

# A job's startup (n python3 processes importing torch at once) and then each case: a case
# whose verdicts have not all come this long after the previous case's is a hang.
START_DEADLINE_S = 180.0
CASE_DEADLINE_S = 60.0
# The ranks' failures of one case, at most this far apart (the C matrix's bound).
SPREAD_S = 10.0
CORE = 200

OK, FAILS = "ok", "fails"

# (KHOR_FAULTS, KHOR_CHECKSUM, outcome, marks): the C matrix's cases less regfail (ib only),
# AT = 512K (past init's traffic, in the second or third iteration at every n).
CASES = [
    ("", False, OK, None),
    ("", True, OK, None),
    ("0>1:drop@512K", False, FAILS, "connection|closed|KHOR_FAULTS rule 0"),
    ("0>1:trunc@512K", False, FAILS, "but the receive posted here is|message has"),
    ("0>1:hdr=len@512K", False, FAILS, "but the receive posted here is|message has"),
    ("0>1:hdr=meta@512K", False, FAILS, "was sent by|but this rank posted"),
    ("0>1:hdr=seq@512K", False, FAILS, "KHOR_TIMEOUT|deadlock|cycle"),
    ("0>1:data@512K", True, FAILS, "KHOR_CHECKSUM"),
    ("0>1:fail@12", False, FAILS, "KHOR_FAULTS rule 0|closed|connection|reset"),
    ("0>1:delay=20ms@512K", False, OK, None),
    ("0>1:stall=2500ms@512K", True, OK, None),
]
TRANSPORTS = ("tcp", "shm")
# KHOR_FAULT_MATRIX_NS: the sizes ("2,4,8" by hand); CTest passes "2,4" (the C matrices run
# n = 8 in CI; eight ranks importing torch cost this one 70 s of CI's time).
SIZES = tuple(int(v) for v in os.environ.get("KHOR_FAULT_MATRIX_NS", "2,4,8").split(",") if v)

# The cases test_fault_alone runs as jobs of their own at n=2: (transport, rule).
ALONE = [("tcp", "0>1:drop@512K"), ("shm", "0>1:hdr=seq@512K")]

SEPARATE = os.environ.get("KHOR_FAULT_MATRIX_SEPARATE", "") not in ("", "0")

# "[R] KIND [case K] rank R[ (time)][: text]": the worker's lines as khorrun prefixes them.
VERDICT = re.compile(r"^\[(\d+)\] (FAULT_OK|FAULT_ERR|WRONG RESULT|FAULT_EXIT|FAULT_SHUTDOWN)"
                     r"(?: case (\d+))? rank (\S+?)(?: \(([^)]*)\))?(?:: (.*))?$")


def case_id(c):
    return (c[0] or "no fault") + (" KHOR_CHECKSUM=1" if c[1] else "")


def param_id(c):
    return (c[0] or "nofault") + ("+checksum" if c[1] else "")


def _khorrun():
    for p in (os.environ.get("KHORRUN"), os.path.join(ROOT, "build", "khorrun"),
              shutil.which("khorrun")):
        if p and os.access(p, os.X_OK):
            return p
    return None


def _library():
    p = os.environ.get("KHOR_LIBRARY_PATH") or os.path.join(ROOT, "build", "libkhor.so")
    return p if os.path.exists(p) else None


@pytest.fixture(scope="module")
def launch():
    """(khorrun, environment) for the jobs, or a skip naming what is missing."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("%s has no torch (apt-get install python3-torch)" % sys.executable)
    khorrun = _khorrun()
    if khorrun is None:
        pytest.skip("no khorrun: build khor (cmake --build build) or set KHORRUN")
    lib = _library()
    if lib is None:
        pytest.skip("no libkhor: build khor (cmake --build build) or set KHOR_LIBRARY_PATH")
    env = dict(os.environ)
    env["KHOR_LIBRARY_PATH"] = lib
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(ROOT, "bindings", "python")] +
        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    for k in ("KHOR_FAULTS", "KHOR_CHECKSUM", "KHOR_TRANSPORT"):
        env.pop(k, None)
    return khorrun, env


class Job:
    """A khorrun job whose output lines are read, with their arrival times, as they come."""

    def __init__(self, argv, env):
        self.t0 = time.monotonic()
        self.p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  start_new_session=True, text=True, errors="replace")
        self.lines = []          # (seconds since start, line), every line
        self.q = queue.Queue()   # the same, for the reader of verdicts; None at EOF
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            item = (time.monotonic() - self.t0, line.rstrip("\n"))
            self.lines.append(item)
            self.q.put(item)
        self.q.put(None)

    def next_line(self, deadline):
        """The next line, or None at EOF; raises queue.Empty past deadline (monotonic)."""
        return self.q.get(timeout=max(0.0, deadline - time.monotonic()))

    def _ranks(self):
        """The process groups of khorrun's children (each rank leads its own)."""
        out = []
        for d in os.listdir("/proc"):
            try:
                with open("/proc/%s/stat" % d) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError, ValueError):
                continue
            if fields[1] == str(self.p.pid):  # ppid
                out.append(int(fields[2]))    # pgrp
        return out

    def finish(self, wait_s):
        """Waits up to wait_s for khorrun to exit, then stops it and its ranks: SIGTERM twice
        (khorrun forwards the first, which the worker only notes, and kills its ranks at
        once on the second), then SIGKILL for the ranks and khorrun."""
        try:
            self.p.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            pass
        for sig, wait in ((signal.SIGTERM, 2), (signal.SIGTERM, 10), (signal.SIGKILL, None)):
            if self.p.poll() is not None:
                break
            if sig == signal.SIGKILL:
                for pg in self._ranks():
                    try:
                        os.killpg(pg, signal.SIGKILL)
                    except OSError:
                        pass
            try:
                os.kill(self.p.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.p.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
        self.took = time.monotonic() - self.t0

    def tail(self, n=60):
        return "\n".join("%7.1f %s" % (t, ln) for t, ln in self.lines[-n:])


class Result:
    """What a job said: verdicts[k][rank] = (kind, text, seconds), the first case without
    all its verdicts (hung; None: none), the ranks without FAULT_EXIT, the job itself."""

    def __init__(self, job, ncases, verdicts, hung, no_exit):
        self.job, self.ncases, self.verdicts = job, ncases, verdicts
        self.hung, self.no_exit = hung, no_exit


def run_job(launch, n, specs, extra_x=(), keyed=True):
    """Runs one job of fault_worker.py (specs: its arguments, one a case; keyed: the lines
    carry "case K", else the job is one case, 0) and reads its verdicts until every rank gave
    one for every case and said FAULT_EXIT, or a case (or the exits) misses its deadline."""
    khorrun, env = launch
    argv = [khorrun, "-np", str(n), "--grace", "20s", "-x", "KHOR_TIMEOUT=1s",
            "-x", "KHOR_INIT_TIMEOUT=120s", "-x", "KHOR_COST_ALPHA_US=10",
            "-x", "KHOR_COST_BETA_GBPS=2", "-x", "KHOR_COST_GAMMA_GBPS=4"]
    for x in extra_x:
        argv += ["-x", x]
    argv += [sys.executable, WORKER] + list(specs)
    ncases = len(specs) if keyed else 1
    verdicts = {k: {} for k in range(ncases)}
    exits = set()
    done = 0                       # cases with all n verdicts, in order
    job = Job(argv, env)
    deadline = job.t0 + START_DEADLINE_S
    try:
        while len(exits) < n or done < ncases:
            try:
                item = job.next_line(deadline)
            except queue.Empty:
                break
            if item is None:
                break
            t, line = item
            m = VERDICT.match(line)
            if m is None:
                continue
            kind, rank = m.group(2), int(m.group(1))
            case = int(m.group(3)) if keyed and m.group(3) else 0
            if kind == "FAULT_EXIT":
                exits.add(rank)
            elif kind != "FAULT_SHUTDOWN" and case < ncases:
                verdicts[case].setdefault(rank, (kind, m.group(6) or "", t))
            while done < ncases and len(verdicts[done]) == n:
                done += 1
                deadline = time.monotonic() + CASE_DEADLINE_S
    finally:
        job.finish(30 if done == ncases else 0)
    return Result(job, ncases, verdicts, done if done < ncases else None,
                  sorted(set(range(n)) - exits))


# An operation enqueued after its set failed raises with the set's error behind this
# (engine.c: "rank R on HOST, engine: broadcast 'x' not started, set 0 failed earlier: ...");
# what the rank reports is that error, and the others carry it without the wrapper.
_NOT_STARTED = re.compile(r" not started, set \d+ failed earlier: ")


def _set_failure(text):
    m = _NOT_STARTED.search(text)
    return text[m.end():] if m else text


def _has_mark(text, marks):
    return any(w in text for w in marks.split("|"))


def judge(what, c, got, n):
    """The C matrix's rules on one case's verdicts ({rank: (kind, text, t)}): a list of what
    is wrong (empty: the case passed) and a line saying what happened."""
    want, marks = c[2], c[3]
    bad = []
    for r in range(n):
        if r not in got:
            bad.append("%s: rank %d gave no verdict (a hang, or it died: see the output)"
                       % (what, r))
        elif got[r][0] == "WRONG RESULT":
            bad.append("%s: rank %d: WRONG RESULT %s" % (what, r, got[r][1]))
    if bad:
        return bad, "%s: no verdict from some rank, or a WRONG RESULT" % what
    if want == OK:
        failed = [r for r in range(n) if got[r][0] != "FAULT_OK"]
        for r in failed:
            bad.append("%s: rank %d failed: %s" % (what, r, got[r][1]))
        if not failed:
            return bad, "%s: right results on every rank" % what
        return bad, "%s: should have succeeded; rank(s) %s failed, rank %d: %.300s" % (
            what, failed, failed[0], got[failed[0]][1])
    for r in range(n):
        if got[r][0] != "FAULT_ERR":
            bad.append("%s: rank %d finished (%s), not with the job's error"
                       % (what, r, got[r][0]))
    errs = {r: got[r][1] for r in range(n) if got[r][0] == "FAULT_ERR"}
    root = next((r for r in sorted(errs) if "aborted by another rank" not in errs[r]), None)
    if root is None:
        bad.append("%s: no rank failed with an error of its own: %s" % (what, errs))
        return bad, "%s: no rank failed with an error of its own" % what
    text = _set_failure(errs[root])
    if not _has_mark(text, marks):
        bad.append("%s: the first failure (rank %d) does not say %s: %s"
                   % (what, root, marks, errs[root]))
    core = text[:CORE]
    for r in sorted(errs):
        if core not in errs[r]:
            bad.append("%s: rank %d's error is not the job's first failure (rank %d: %s): %s"
                       % (what, r, root, core, errs[r]))
    times = [got[r][2] for r in errs]
    spread = max(times) - min(times)
    if spread > SPREAD_S:
        bad.append("%s: the ranks failed %.1f s apart" % (what, spread))
    return bad, "%s: every rank failed (%.1f s apart), first rank %d: %.300s" % (
        what, spread, root, text)


def _verdict(what, c, res, k, n):
    """Judges case k of res; fails the test with what is wrong."""
    if res.hung is not None and k >= res.hung:
        at = res.hung
        msg = ("%s: not judged: the job hung at its case %d (no verdict from rank(s) %s "
               "within %.0f s)" % (what, at, sorted(set(range(n)) - set(res.verdicts[at])),
                                   START_DEADLINE_S if at == 0 else CASE_DEADLINE_S))
        if k == at:
            msg = "%s: a HANG: no verdict from rank(s) %s within %.0f s" % (
                what, sorted(set(range(n)) - set(res.verdicts[at])),
                START_DEADLINE_S if at == 0 else CASE_DEADLINE_S)
        sys.stderr.write("FAIL " + msg + "\n")
        pytest.fail(msg + "\n\n-- the job's last lines (seconds, line):\n" + res.job.tail(),
                    pytrace=False)
    bad, line = judge(what, c, res.verdicts[k], n)
    sys.stderr.write(("FAIL " if bad else "pass ") + line + "\n")
    if bad:
        pytest.fail("\n".join(bad), pytrace=False)


# The jobs of the matrix, one per n (run by the first of its tests), and their cases.
_jobs = {}
ORDER = [(tp, k) for tp in TRANSPORTS for k in range(len(CASES))]


def _spec(tp, c):
    return "%s:%d:%s" % (tp, 1 if c[1] else 0, c[0])


def _matrix_job(launch, n):
    if n not in _jobs:
        _jobs[n] = run_job(launch, n, [_spec(tp, CASES[k]) for tp, k in ORDER])
    return _jobs[n]


PARAMS = [(n, tp, k) for n in SIZES for tp in TRANSPORTS for k in range(len(CASES))]


@pytest.mark.parametrize("n,tp,k", PARAMS,
                         ids=["n%d-%s-%s" % (n, tp, param_id(CASES[k])) for n, tp, k in PARAMS])
def test_fault_matrix(launch, n, tp, k):
    c = CASES[k]
    what = "%s n=%d [%s]" % (tp, n, case_id(c))
    if SEPARATE:
        res = run_job(launch, n, [], extra_x=["KHOR_TRANSPORT=" + tp, "KHOR_FAULTS=" + c[0],
                                              "KHOR_CHECKSUM=%d" % (1 if c[1] else 0)],
                      keyed=False)
        _verdict(what, c, res, 0, n)
        _check_exit(what, res, 0 if c[2] == OK else 3)
        return
    _verdict(what, c, _matrix_job(launch, n), ORDER.index((tp, k)), n)


def _check_exit(what, res, want_rc):
    rc = res.job.p.returncode
    if res.hung is None and res.no_exit:
        pytest.fail("%s: rank(s) %s never got through their shutdown at exit (no FAULT_EXIT)"
                    "\n\n-- the job's last lines:\n%s" % (what, res.no_exit, res.job.tail()),
                    pytrace=False)
    if res.hung is None and rc != want_rc:
        pytest.fail("%s: khorrun exited %s, not %d\n\n-- the job's last lines:\n%s"
                    % (what, rc, want_rc, res.job.tail()), pytrace=False)


@pytest.mark.skipif(SEPARATE, reason="KHOR_FAULT_MATRIX_SEPARATE=1: every case is a job")
@pytest.mark.parametrize("n", SIZES, ids=["n%d" % n for n in SIZES])
def test_fault_matrix_job(launch, n):
    """The job of n's cases ended well: every rank through its shutdown, khorrun's status 0
    (the worker's is 20 after a wrong result)."""
    res = _matrix_job(launch, n)
    sys.stderr.write("n=%d: %d cases in one job, %.1f s\n" % (n, len(ORDER), res.job.took))
    _check_exit("the n=%d job" % n, res, 0)


@pytest.mark.parametrize("tp,rule", ALONE, ids=["%s-%s" % a for a in ALONE])
def test_fault_alone(launch, tp, rule):
    """A few cases as a script meets them: the fault in the job's environment, and the
    failed ranks exit (khorrun then stops the others, which must still report the same
    first failure: the worker outlives the SIGTERM, for --grace)."""
    c = next(c for c in CASES if c[0] == rule)
    what = "%s n=2 [%s] (a job of its own)" % (tp, case_id(c))
    res = run_job(launch, 2, [], extra_x=["KHOR_TRANSPORT=" + tp, "KHOR_FAULTS=" + c[0],
                                          "KHOR_CHECKSUM=%d" % (1 if c[1] else 0)],
                  keyed=False)
    _verdict(what, c, res, 0, 2)
    _check_exit(what, res, 0 if c[2] == OK else 3)
