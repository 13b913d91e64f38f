"""The fault matrix's training run (tests/elastic/matrix.py), under khorrun's elastic mode.

Full-batch least squares: every step's gradient is a sum over the whole data set, split over
the ranks there are, so the loss curve is the same at every size and after every reset (up to
the summation order). The state (step, weights) is committed every COMMIT steps and each
worker logs one JSON line per event, with its pid, for the test to check that commits only
move forward and that none is lost: "save" when the state is copied, "commit" once
state.commit() has returned (its allreduce done, so every rank of the generation has saved
that step), "sync" when a sync begins (it then waits TM_SYNC_PAUSE seconds, default 0, so
that a test injecting faults from outside can kill a worker inside it: matrix_hosts.py,
soak.py). A fault is injected by the worker itself, once per job, from
TM_FAULT = "KIND@WORKER_ID@STEP,..." (KIND: kill, exit, stop, kill_sync; WORKER_ID * = all):
 kill      SIGKILL itself at that step            exit   raise (exit status 1)
 stop      SIGSTOP itself (the driver must fence it: no heartbeat)
 kill_sync SIGKILL itself inside the next state.sync() after that step
 kill_reset SIGKILL itself in the next reset after that step, once init has joined the new
           generation and before its first collective (a reset callback)
From outside: SIGUSR1 makes the worker raise (exit status 1) at its next step; once the file
TM_STOP names exists, every rank ends the run at the same step (the flag travels in the
step's allreduce), which the final line names.
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
from khor import _core

STEPS = int(os.environ.get("TM_STEPS", "40"))
COMMIT = int(os.environ.get("TM_COMMIT", "2"))
STEP_SLEEP = float(os.environ.get("TM_STEP_SLEEP", "0.02"))
SYNC_PAUSE = float(os.environ.get("TM_SYNC_PAUSE", "0"))
STOP = os.environ.get("TM_STOP")
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
              gen=_core.generation(), t=time.time())
    with open(LOG, "a") as f:
        f.write(json.dumps(kw) + "\n")


class State(elastic.ObjectState):
    def sync(self):
        log("sync", step=self.step)
        for i, kind, who, at in FAULTS:
            if kind == "kill_sync" and WORKER == who and self.step >= at and fire_once(i):
                log("fault", kind=kind, step=self.step)
                os.kill(os.getpid(), signal.SIGKILL)
        if SYNC_PAUSE > 0:
            time.sleep(SYNC_PAUSE)
        super().sync()

    def save(self):
        super().save()
        if self.step > 0:
            log("save", step=self.step)


EXIT_ASKED = []
signal.signal(signal.SIGUSR1, lambda sig, frame: EXIT_ASKED.append(sig))


def step_fault(step):
    if EXIT_ASKED:
        raise RuntimeError("asked to exit 1 (SIGUSR1) at step %d on %s" % (step, WORKER))
    for i, kind, who, at in FAULTS:
        if step != at or kind in ("kill_sync", "kill_reset") or (who != WORKER and who != "*"):
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
    stop = 1.0 if STOP and os.path.exists(STOP) else 0.0
    out = np.concatenate([2.0 * X[idx].T @ r / N, [float(r @ r) / N, stop]])
    return khor.allreduce(out, op=khor.Sum, name="grad")


@elastic.run
def train(state):
    log("join", step=state.step)
    while state.step < STEPS:
        step_fault(state.step)
        g = loss_and_grad(state.w)
        state.w = state.w - 0.05 * g[:-2]
        state.loss = float(g[-2])
        state.step += 1
        if g[-1] > 0:
            break
        time.sleep(STEP_SLEEP)
        if state.step % COMMIT == 0:
            state.commit()
            log("commit", step=state.step)
    return state.loss


khor.init()
state = State(step=0, w=np.zeros(D), loss=0.0)


def reset_fault():
    for i, kind, who, at in FAULTS:
        if kind == "kill_reset" and WORKER == who and state.step >= at and fire_once(i):
            log("fault", kind=kind, step=state.step)
            os.kill(os.getpid(), signal.SIGKILL)


state.register_reset_callbacks([reset_fault])
final = train(state)
w = state.w
full = float(np.mean((X @ w - y) ** 2))
if khor.rank() == 0:
    print("final loss %.9f after %d steps at size %d" % (full, state.step, khor.size()),
          flush=True)
log("end", step=state.step, loss=full)
khor.shutdown()
