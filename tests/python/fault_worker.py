"""One rank of the Python fault matrix (tests/python/test_fault_matrix.py), run under khorrun.

The pattern of tests/runtime/test_fault_matrix.c through khor.torch and its engine: ITERS
iterations of an allreduce of 64K floats, a broadcast of 16K floats from root it % size and
an allgather of 1K floats, each checked element by element against the exact expected
values, then a batch of 20 small allreduce_async_ + synchronize (DistributedOptimizer's
pattern), checked the same way.

One case, the fault from the environment (KHOR_FAULTS, KHOR_CHECKSUM, KHOR_TRANSPORT):

    khorrun -np 4 -x KHOR_TRANSPORT=tcp -x 'KHOR_FAULTS=0>1:drop@512K' \\
        /usr/bin/python3 tests/python/fault_worker.py

prints one verdict line and exits with its status:

    FAULT_OK rank R                       every result right              exit 0
    WRONG RESULT rank R: ...              a wrong value taken as success  exit 20
    FAULT_ERR rank R: <error text>        khor raised (the text on one line)  exit 3

Several cases in one job (what the matrix runs: importing torch in 8 ranks costs more than
the cases themselves), each argument one case, "TRANSPORT:C:RULE": KHOR_TRANSPORT, the
KHOR_CHECKSUM value (0 or 1) and KHOR_FAULTS ("" for none):

    khorrun -np 4 /usr/bin/python3 tests/python/fault_worker.py \\
        tcp:0: shm:1: 'tcp:0:0>1:drop@512K' 'shm:1:0>1:data@512K'

Each case is a job of its own: hvd.init() with the case's settings in the environment, the
iterations, hvd.shutdown() (each init is a new generation of the store's keys, so a case's
abort does not reach the next). The verdict lines then say "FAULT_OK case K rank R" etc.
(K counts the arguments from 0); the exit status is 20 after any wrong result, else 0 (a
failed case is a verdict, not a failure of the worker). A rank that finds a wrong value
carries on with the case's remaining collectives, so that the others are not left waiting
for it.

Either way, after khor's shutdown at exit it prints "FAULT_EXIT rank R": a rank that hangs
in its shutdown never does. khorrun stops every other rank (SIGTERM) as soon as one exits
non-zero; this worker takes that SIGTERM as a note only (shown in FAULT_EXIT), so that each
rank goes on to learn of the failure from khor and report it. The test gives khorrun a
--grace long enough for that; a rank killed before its verdict counts as a hang.
"""

import atexit
import importlib.util
import os
import signal
import sys
import time

# As the C matrix: no calibration (init's traffic small and the same on every run) and a 1 s
# KHOR_TIMEOUT; the launch may override them. KHOR_INIT_TIMEOUT defaults to KHOR_TIMEOUT,
# which is far too short for N python3 processes importing torch on a small machine: joining
# is not what is tested.
os.environ.setdefault("KHOR_COST_ALPHA_US", "10")
os.environ.setdefault("KHOR_COST_BETA_GBPS", "2")
os.environ.setdefault("KHOR_COST_GAMMA_GBPS", "4")
os.environ.setdefault("KHOR_TIMEOUT", "1s")
os.environ.setdefault("KHOR_INIT_TIMEOUT", "120s")

ITERS = 6
COUNT, BCOUNT, GCOUNT = 64 * 1024, 16 * 1024, 1024
BATCH = 20

_rank = os.environ.get("KHOR_RANK", "?")
_t0 = time.time()
_sigterm = []


def _say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _on_sigterm(signum, frame):
    _sigterm.append(time.time() - _t0)


def _exit_line():
    # Registered before khor is imported: atexit runs it after khor's own shutdown.
    _say("FAULT_EXIT rank %s (%.1f s%s)" % (
        _rank, time.time() - _t0, ", SIGTERM at %.1f s" % _sigterm[0] if _sigterm else ""))


signal.signal(signal.SIGTERM, _on_sigterm)
atexit.register(_exit_line)

_here = os.path.dirname(os.path.abspath(__file__))
if importlib.util.find_spec("khor") is None:  # the one PYTHONPATH names, else the tree's
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(_here)), "bindings",
                                    "python"))

import torch  # noqa: E402
import khor.torch as hvd  # noqa: E402


def _one_line(e):
    return " ".join(str(e).split())


def _first_wrong(what, got, want):
    """None when got equals want exactly, else what is wrong."""
    if got.shape == want.shape and torch.equal(got, want):
        return None
    if got.shape != want.shape:
        return "%s: shape %s, not %s" % (what, tuple(got.shape), tuple(want.shape))
    bad = (got != want).nonzero().flatten()
    i = int(bad[0])
    return "%s: %d of %d elements wrong; element %d is %r, not %r" % (
        what, bad.numel(), want.numel(), i, got[i].item(), want[i].item())


def run(rank, n):
    """The iterations; returns the first wrong result (None: all right). Raises what khor
    raises. A wrong value does not stop the collectives: the others need this rank's."""
    wrong = []

    def check(what, got, want):
        w = _first_wrong(what, got, want)
        if w is not None and not wrong:
            wrong.append(w)

    pos97 = (torch.arange(COUNT, dtype=torch.int64) % 97).to(torch.float32)
    bpos = torch.arange(BCOUNT, dtype=torch.float32)
    gpos = torch.arange(GCOUNT, dtype=torch.float32)
    tri = float(n * (n - 1) // 2)
    for it in range(ITERS):
        got = hvd.allreduce(pos97 + float(rank + it), op=hvd.Sum, name="fm.ar.%d" % it)
        check("allreduce %d" % it, got, pos97 * n + (tri + n * it))

        root = it % n
        b = bpos + float(it) if rank == root else torch.full((BCOUNT,), -1.0)
        got = hvd.broadcast(b, root, name="fm.bc.%d" % it)
        check("broadcast %d (root %d)" % (it, root), got, bpos + float(it))

        got = hvd.allgather(gpos + float(rank * 10000 + it), name="fm.ag.%d" % it)
        check("allgather %d" % it, got,
              torch.cat([gpos + float(r * 10000 + it) for r in range(n)]))

        # DistributedOptimizer's pattern: every gradient in flight at once, then synchronize.
        grads = [torch.arange(1 + 37 * j, dtype=torch.float32) + float(rank + j + it)
                 for j in range(BATCH)]
        handles = [hvd.allreduce_async_(g, op=hvd.Sum, name="fm.grad.%d" % j)
                   for j, g in enumerate(grads)]
        for j, h in enumerate(handles):
            got = hvd.synchronize(h)
            want = torch.arange(1 + 37 * j, dtype=torch.float32) * n + (tri + n * (j + it))
            check("allreduce_async_ %d.%d" % (it, j), got, want)
            check("allreduce_async_ %d.%d (the tensor itself)" % (it, j), grads[j], want)
    return wrong[0] if wrong else None


def one_case(case, env):
    """Runs one case; returns its verdict's status (0, 3 or 20) after printing the verdict.
    env: the case's settings, put in the environment for hvd.init() to read."""
    tag = "" if case is None else " case %d" % case
    os.environ.update(env or {})
    t0 = time.time()
    try:
        hvd.init()
        rank, n = hvd.rank(), hvd.size()
    except Exception as e:  # init failed: the same verdict as a failed collective
        _say("FAULT_ERR%s rank %s: %s" % (tag, _rank, _one_line(e)))
        return 3
    try:
        wrong = run(rank, n)
    except Exception as e:
        _say("FAULT_ERR%s rank %d: %s" % (tag, rank, _one_line(e)))
        return 3
    if wrong is not None:
        _say("WRONG RESULT%s rank %d: reported as success: %s" % (tag, rank, wrong))
        return 20
    _say("FAULT_OK%s rank %d (%.1f s)" % (tag, rank, time.time() - t0))
    return 0


def main(argv):
    if not argv:
        return one_case(None, None)
    worst = 0
    for k, spec in enumerate(argv):
        parts = spec.split(":", 2)
        if len(parts) != 3 or parts[1] not in ("0", "1"):
            sys.stderr.write("fault_worker: %r: expected TRANSPORT:C:RULE (C: 0 or 1)\n" % spec)
            return 2
        tp, checksum, rule = parts
        st = one_case(k, {"KHOR_TRANSPORT": tp, "KHOR_FAULTS": rule,
                          "KHOR_CHECKSUM": checksum})
        try:
            hvd.shutdown()
        except Exception as e:  # noqa: BLE001 - said, and the next case's init judges
            _say("FAULT_SHUTDOWN case %d rank %s: %s" % (k, _rank, _one_line(e)))
        if st == 20:
            worst = 20
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
