"""The fault matrix's training run (tests/elastic/matrix.py), under khorrun's elastic mode.

Full-batch least squares: every step's gradient is a sum over the whole data set, split over
the ranks there are, so the loss curve is the same at every size and after every reset (up to
the summation order). The state (step, weights) is committed every COMMIT steps; each commit
is logged as one JSON line per worker, for the test to check that commits only move forward
and that none is lost. A fault is injected by the worker itself, once per job, from
TM_FAULT = "KIND@WORKER_ID@STEP,..." (KIND: kill, exit, stop, kill_sync; WORKER_ID * = all):
 kill      SIGKILL itself at that step            exit   raise (exit status 1)
 stop      SIGSTOP itself (the driver must fence it: no heartbeat)
 kill_sync SIGKILL itself inside the next state.sync() after that step
Only numpy and khor: no framework, so each run starts in a fraction of a second.
"""
import json
import os
import signal
import sys
import time

import numpy as np

import khor
import khor.elastic as elastic

STEPS = int(os.environ.get("TM_STEPS", "40"))
COMMIT = int(os.environ.get("TM_COMMIT", "2"))
STEP_SLEEP = float(os.environ.get("TM_STEP_SLEEP", "0.02"))
LOG = os.environ["TM_LOG"]
WORKER = os.environ.get("KHOR_WORKER_ID", "?")

rng = np.random.default_rng(0)
N, D = 512, 16
X = rng.standard_normal((N, D))
y = X @ rng.standard_normal(D) + 0.01 * rng.standard_normal(N)

FAULTS = []
for spec in filter(None, os.environ.get("TM_FAULT", "").split(",")):
    kind, who, at = spec.split("@")
    FAULTS.append((len(FAULTS), kind, who, int(at)))


def fire_once(index):
    """True the first time in the job for fault index (a worker started in a lost one's
    slot has the same id, and must not repeat the fault)."""
    marker = "%s.fired.%d.%s" % (LOG, index, WORKER if FAULTS[index][2] == "*" else "")
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def log(event, **kw):
    kw.update(event=event, worker=WORKER, pid=os.getpid(), rank=khor.rank(), size=khor.size(),
              t=time.time())
    with open(LOG, "a") as f:
        f.write(json.dumps(kw) + "\n")


class State(elastic.ObjectState):
    def sync(self):
        for i, kind, who, at in FAULTS:
            if kind == "kill_sync" and WORKER == who and self.step >= at and fire_once(i):
                log("fault", kind=kind, step=self.step)
                os.kill(os.getpid(), signal.SIGKILL)
        super().sync()


def step_fault(step):
    for i, kind, who, at in FAULTS:
        if step != at or kind == "kill_sync" or (who != WORKER and who != "*"):
            continue
        if not fire_once(i):
            continue
        log("fault", kind=kind, step=step)
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif kind in ("exit", "all_exit"):
            raise RuntimeError("fault injected at step %d on %s" % (step, WORKER))


def loss_and_grad(w):
    idx = np.arange(khor.rank(), N, khor.size())
    r = X[idx] @ w - y[idx]
    out = np.concatenate([2.0 * X[idx].T @ r / N, [float(r @ r) / N]])
    return khor.allreduce(out, op=khor.Sum, name="grad")


@elastic.run
def train(state):
    log("join", step=state.step)
    while state.step < STEPS:
        step_fault(state.step)
        g = loss_and_grad(state.w)
        state.w = state.w - 0.05 * g[:-1]
        state.loss = float(g[-1])
        state.step += 1
        time.sleep(STEP_SLEEP)
        if state.step % COMMIT == 0:
            state.commit()
            log("commit", step=state.step)
    return state.loss


khor.init()
state = State(step=0, w=np.zeros(D), loss=0.0)
final = train(state)
w = state.w
full = float(np.mean((X @ w - y) ** 2))
if khor.rank() == 0:
    print("final loss %.9f after %d steps at size %d" % (full, state.step, khor.size()),
          flush=True)
log("end", step=state.step, loss=full)
khor.shutdown()
