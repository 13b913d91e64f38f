#!/usr/bin/python3
"""The elastic fault matrix on this machine (CTest: elastic_matrix_*).

  matrix.py KHORRUN PYTHON CASE

Each case runs tests/elastic/train_matrix.py under khorrun's elastic driver with one or
more self-injected faults, under a hard wall-clock cap, and checks:
  - khorrun's exit status, and its own line naming the loss (rank, host, cause);
  - every worker's commits only move forward, by one commit's worth of steps at a time,
    and together they cover every commit of the run: none lost;
  - a run that ends well ends with the loss of a fault-free run of the same seed (1e-3);
  - recovery within its bound: from the fault to the next commit.
Hosts: "localhost" and "127.0.0.1" are two hosts to the driver, both on this machine.
Exit status 0 when every check passes, 1 with the reasons.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(os.path.dirname(HERE))
TRAIN = os.path.join(HERE, "train_matrix.py")
STEPS, COMMIT = 40, 2
CAP = 90

# name: (khorrun flags, faults, extra env, expected exit status, stderr patterns,
#        recovery bound in seconds or None)
ONE = ["-np", "4", "--min-np", "2", "--max-np", "4", "-H", "localhost:4"]
TWO = ["-np", "4", "--min-np", "2", "--max-np", "4", "-H", "localhost:2,127.0.0.1:2"]
CASES = {
    "none": (ONE, [], {}, 0, [], None),
    "kill_worker": (ONE, ["kill@localhost:2@10"], {}, 0,
                    [r"rank 2 on localhost \(worker localhost:2\) was lost.*signal 9"], 10),
    "kill_rank0": (ONE, ["kill@localhost:0@10"], {}, 0,
                   [r"rank 0 on localhost \(worker localhost:0\) was lost.*signal 9"], 10),
    "exit_worker": (ONE, ["exit@localhost:3@10"], {}, 0,
                    [r"rank 3 on localhost \(worker localhost:3\) was lost.*status 1"], 10),
    "stop_worker": (ONE, ["stop@localhost:1@10"], {"KHOR_HEARTBEAT_TIMEOUT": "2s"}, 0,
                    [r"rank 1 on localhost \(worker localhost:1\).*heartbeat"], 2 + 10),
    "kill_in_sync": (ONE, ["kill@localhost:2@10", "kill_sync@localhost:1@10"], {}, 0,
                     [r"worker localhost:2\) was lost", r"worker localhost:1\) was lost"], 20),
    "kill_twice": (ONE, ["kill@localhost:1@6", "kill@localhost:3@14"], {}, 0,
                   [r"worker localhost:1\) was lost", r"worker localhost:3\) was lost"], 10),
    "reset_limit": (ONE + ["--reset-limit", "1"], ["kill@localhost:1@6", "kill@localhost:3@14"],
                    {}, 3, [r"number of resets during elastic job exceeded limit: 1"], None),
    "all_fail": (ONE, ["all_exit@*@10"], {}, 1, [r"was lost.*status 1"], None),
    "host_blacklisted": (TWO, ["kill@localhost:0@10"], {}, 0,
                         [r"worker localhost:0\) was lost.*signal 9.*host localhost blacklisted"],
                         10),
    "every_host_blacklisted": (TWO, ["exit@localhost:0@10", "exit@127.0.0.1:1@10"], {}, 1,
                               [r"every host.*blacklisted"], None),
    # The last holder of the state lost before the generation that has a fresh worker in
    # it gets to its first collective: the next generation has only workers that never
    # held or saw the state; the job's record (el/held) says it existed, so the job fails
    # rather than start over from step 0.
    "state_lost": (["-np", "2", "--min-np", "1", "--max-np", "2", "-H", "localhost:2"],
                   ["kill@localhost:1@10", "kill_reset@localhost:0@10"], {}, 1,
                   [r"no rank of generation \d+ holds the training state"], None),
    "min_np_never": (["-np", "4", "--min-np", "4", "--max-np", "4", "-H",
                      "localhost:2,127.0.0.1:2", "--elastic-timeout", "3"],
                     ["kill@localhost:1@10"], {}, 1, [r"min-np|--min-np|slots"], None),
}


def run(khorrun, python, flags, faults, extra, log):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(TREE, "bindings", "python")
    env.update(TM_LOG=log, TM_FAULT=",".join(faults), TM_STEPS=str(STEPS),
               TM_COMMIT=str(COMMIT), PYTHONDONTWRITEBYTECODE="1", KHOR_TIMEOUT="20s")
    env.update(extra)
    argv = [khorrun] + flags + [python, TRAIN]
    print("matrix: %s  (TM_FAULT=%s)" % (" ".join(argv), env["TM_FAULT"]), flush=True)
    t0 = time.time()
    try:
        p = subprocess.run(argv, env=env, timeout=CAP, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        return p.returncode, p.stdout, time.time() - t0
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
        return None, out or "", time.time() - t0


def events(log):
    if not os.path.exists(log):
        return []
    with open(log) as f:
        return [json.loads(line) for line in f if line.strip()]


def final_loss(out):
    m = re.findall(r"final loss ([0-9.e+-]+) after (\d+) steps", out)
    return float(m[-1][0]) if m else None


def check_commits(evs, why, steps=STEPS, commit=COMMIT, exact=True):
    """Commits only move forward and none is lost. A logged commit means every rank of its
    generation saved that step (the commit's allreduce returned), so no reset may go back
    past it: each worker process's commits rise (when exact, by one commit's steps at a
    time: faults injected at a step's start never fall between a save and its commit), no
    commit is logged below one logged before it, and every commit step was saved."""
    by_worker = {}
    seen = set()
    top = 0
    for e in sorted(evs, key=lambda e: e["t"]):
        if e["event"] == "save":
            seen.add(e["step"])
        if e["event"] != "commit":
            continue
        who = e["worker"] + "#" + str(e.get("pid", ""))
        seen.add(e["step"])
        done = by_worker.setdefault(who, [])
        if done and (e["step"] - done[-1] != commit if exact else e["step"] <= done[-1]):
            why.append("worker %s committed step %d after step %d" % (who, e["step"], done[-1]))
        if e["step"] < top:
            why.append("worker %s committed step %d after step %d was committed: a commit "
                       "was lost" % (who, e["step"], top))
        done.append(e["step"])
        top = max(top, e["step"])
    want = set(range(commit, steps + 1, commit))
    if not want <= seen:
        why.append("commits lost: %s" % sorted(want - seen))


def check_recovery(evs, bound, why):
    faults = [e for e in evs if e["event"] == "fault"]
    for f in faults:
        after = [e["t"] for e in evs if e["event"] == "commit" and e["t"] > f["t"] and
                 e["step"] > f["step"]]
        if not after:
            why.append("no commit after the fault at %.3f" % f["t"])
            continue
        took = after[0] - f["t"]
        print("matrix: %s on %s at step %d: next commit %.2f s later" %
              (f["kind"], f["worker"], f["step"], took))
        if took > bound:
            why.append("recovery took %.1f s, more than %d s" % (took, bound))


def check_exit(rc, want_rc, cap, out, patterns, why):
    """khorrun's exit status (None: still running after cap s) and its lines naming what
    happened (regular expressions)."""
    if rc is None:
        why.append("hung: still running after %d s" % cap)
    elif rc != want_rc:
        why.append("exit status %s, want %d" % (rc, want_rc))
    for pat in patterns:
        if not re.search(pat, out):
            why.append("no line matching %r" % pat)


def strays(log):
    """Pids of this case's training processes still running (those whose TM_LOG is its
    log: other cases may run beside it)."""
    p = subprocess.run(["pgrep", "-f", TRAIN], stdout=subprocess.PIPE, text=True)
    mine = ("TM_LOG=" + log).encode()
    out = []
    for pid in p.stdout.split():
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                if mine in f.read().split(b"\0"):
                    out.append(int(pid))
        except OSError:
            pass  # gone meanwhile
    return out


def baseline(khorrun, python, tmp):
    """The fault-free run's final loss, run once for all the cases of one build and one
    training script (kept in the temporary directory, keyed by khorrun, libkhor and the
    script)."""
    import hashlib
    h = hashlib.sha256()
    for f in (khorrun, TRAIN, os.environ.get("KHOR_LIBRARY_PATH", TRAIN)):
        with open(f, "rb") as fh:
            h.update(fh.read())
    h.update(("%d %d" % (STEPS, COMMIT)).encode())
    cache = os.path.join(tempfile.gettempdir(), "khor-matrix-base-%s" % h.hexdigest()[:16])
    if os.path.exists(cache):
        with open(cache) as f:
            return float(f.read())
    rc, out, _ = run(khorrun, python, ONE, [], {}, os.path.join(tmp, "base.log"))
    loss = final_loss(out)
    if rc != 0 or loss is None:
        print(out)
        print("matrix: the fault-free run failed (%s)" % rc)
        return None
    with open(cache + ".tmp", "w") as f:
        f.write(repr(loss))
    os.replace(cache + ".tmp", cache)
    return loss


def main():
    khorrun, python, case = sys.argv[1:4]
    flags, faults, extra, want_rc, patterns, bound = CASES[case]
    why = []
    with tempfile.TemporaryDirectory(prefix="khor-matrix-") as tmp:
        base_loss = None
        if want_rc == 0 and case != "none":
            base_loss = baseline(khorrun, python, tmp)
            if base_loss is None:
                return 1
        log = os.path.join(tmp, "case.log")
        rc, out, took = run(khorrun, python, flags, faults, extra, log)
        print(out)
        print("matrix: %s: exit %s after %.1f s" % (case, rc, took))
        check_exit(rc, want_rc, CAP, out, patterns, why)
        evs = events(log)
        if want_rc == 0:
            check_commits(evs, why)
            loss = final_loss(out)
            if loss is None:
                why.append("no final loss printed")
            elif base_loss is not None and abs(loss - base_loss) > 1e-3:
                why.append("final loss %.6f, fault-free %.6f" % (loss, base_loss))
            if bound is not None:
                check_recovery(evs, bound, why)
        leftover = strays(log)
        if leftover:
            why.append("processes left running: %s" % leftover)
    if why:
        print("matrix: %s FAILED:\n  %s" % (case, "\n  ".join(why)))
        return 1
    print("matrix: %s passed" % case)
    return 0


if __name__ == "__main__":
    sys.exit(main())
