"""One run of tests/elastic/train_matrix.py under khorrun, watched from outside: for the tests
that inject faults by pid while it runs (matrix_hosts.py, soak.py).

The workers log their events (join, sync, save, commit, end; each with the worker id, pid,
rank, generation and time) to a JSON-lines file; a Job reads it as it grows, so a test can
wait for a commit, find a worker's pid, inject a fault and log it there too (event "fault",
with the last commit's step), and matrix.py's checks read the same file afterwards.
"""
import json
import os
import re
import signal
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(os.path.dirname(HERE))
TRAIN = os.path.join(HERE, "train_matrix.py")


def train_env(log, steps, commit, sleep, extra=None):
    """The workers' variables (for -x on other hosts too): the training run's and khor's."""
    env = {"PYTHONPATH": os.path.join(TREE, "bindings", "python"),
           "KHOR_LIBRARY_PATH": os.environ.get("KHOR_LIBRARY_PATH", ""),
           "PYTHONDONTWRITEBYTECODE": "1", "TM_LOG": log, "TM_STEPS": str(steps),
           "TM_COMMIT": str(commit), "TM_STEP_SLEEP": str(sleep), "KHOR_TIMEOUT": "20s"}
    env.update(extra or {})
    return env


def alive(pid):
    """pid is a process that has not ended (a zombie counts as ended)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class Job:
    """khorrun ARGV... in its own session, its stdout and stderr together in out_path."""

    def __init__(self, argv, env, log, out_path):
        self.log, self.out_path = log, out_path
        self._evs, self._buf, self._off = [], "", 0
        self.rc = None
        open(log, "w").close()  # a log of an earlier run in the same place is not this one's
        with open(out_path, "w") as out:
            self.p = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        self.t0 = time.time()

    def events(self):
        """Every event logged so far (a line still being written waits for the next call)."""
        try:
            with open(self.log) as f:
                f.seek(self._off)
                chunk = f.read()
                self._off = f.tell()
        except FileNotFoundError:
            return self._evs
        self._buf += chunk
        *lines, self._buf = self._buf.split("\n")
        self._evs.extend(json.loads(line) for line in lines if line.strip())
        return self._evs

    def output(self):
        with open(self.out_path, errors="replace") as f:
            return f.read()

    def top(self):
        """The last step committed (0: none yet)."""
        return max((e["step"] for e in self.events() if e["event"] == "commit"), default=0)

    def running(self):
        if self.rc is None:
            self.rc = self.p.poll()
        return self.rc is None

    def wait(self, cond, timeout):
        """Polls cond() until it is true (True), khorrun has exited or timeout s have passed
        (False)."""
        end = time.time() + timeout
        while True:
            if cond():
                return True
            if not self.running() or time.time() >= end:
                return bool(cond())
            time.sleep(0.05)

    def wait_commit(self, step, timeout):
        return self.wait(lambda: self.top() >= step, timeout)

    def wait_out(self, pattern, timeout):
        return self.wait(lambda: re.search(pattern, self.output()) is not None, timeout)

    def workers(self):
        """{worker id: pid} of the workers that joined and are still running."""
        live = {}
        for e in self.events():
            if e["event"] == "join":
                live[e["worker"]] = e["pid"]
        return {w: p for w, p in live.items() if alive(p)}

    def note_fault(self, kind, worker, pid):
        """Logs a fault injected from outside, with the step last committed."""
        e = dict(event="fault", kind=kind, worker=worker, pid=pid, step=self.top(),
                 t=time.time())
        with open(self.log, "a") as f:
            f.write(json.dumps(e) + "\n")

    def finish(self, cap):
        """khorrun's exit status, or None when it was still running cap s after it
        started: then its process group is killed."""
        left = max(0.0, self.t0 + cap - time.time())
        try:
            self.rc = self.p.wait(timeout=left)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()
            self.rc = None
        self.took = time.time() - self.t0
        return self.rc


def base_loss(khorrun, python, tmp, steps, commit):
    """The final loss of a fault-free run of `steps` steps (it does not depend on the number
    of ranks, hosts or step time), or None with the output printed."""
    log = os.path.join(tmp, "base.log")
    env = dict(os.environ)
    env.update(train_env(log, steps, commit, 0))
    p = subprocess.run([khorrun, "-np", "2", python, TRAIN], env=env, timeout=120,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    m = re.findall(r"final loss ([0-9.e+-]+) after (\d+) steps", p.stdout)
    if p.returncode != 0 or not m:
        print(p.stdout)
        print("the fault-free run failed (exit %d)" % p.returncode)
        return None
    return float(m[-1][0])
