#!/usr/bin/python3
"""The elastic soak (not in CI; its numbers are in docs/PERFORMANCE.md, "Elastic soak").

  soak.py KHORRUN PYTHON [--faults 200] [--seed 1] [--keep DIR] [--state-gap]
  (KHOR_LIBRARY_PATH=build/libkhor.so in the environment, as for the matrix)

One long elastic run of tests/elastic/train_matrix.py on this machine: three hosts to the
driver, all here (localhost, 127.0.0.1, 127.0.0.2, two slots each; -np 4 --min-np 2
--max-np 6), with --blacklist-cooldown-range 5 20 so that a blacklisted host comes back and
the job grows again, and KHOR_HEARTBEAT_TIMEOUT=2s. It injects --faults random faults from
outside the workers, by the pids they write into the event log, waiting after each for the
next commit of a later generation than the one it ended (then a random pause of up to
0.3 s, so that faults land anywhere in a step):
  kill        kill -9 of a random worker of the generation that committed last
  kill_rank0  kill -9 of its rank 0
  stop        SIGSTOP of a random worker: the driver must fence it (kill it) by its heartbeat
  exit        SIGUSR1: the worker raises at its next step and exits with status 1
  kill_sync   kill -9 of a worker, then kill -9 of another inside the next generation's
              state sync (which TM_SYNC_PAUSE holds open for 0.2 s)
Then it ends the run (TM_STOP: every rank stops at the same step) and reports: the faults
injected by kind, hangs (a fault with no commit within 30 s after it: 0 wanted), commits
lost (a generation resuming below a step committed before: 0 wanted; and matrix.py's
check), fenced workers still alive, recoveries (fault to that next commit) median and p95,
khorrun's exit status, and the final loss against a fault-free run of as many steps. Exit
status 0 when all of that is as wanted.

The state gap (docs/PERFORMANCE.md): a loss that leaves only workers without the training
state (the last holder killed inside a newcomer's sync; a holder's host blacklisted just as
other hosts came back) used to start the job over from step 0. The job's record of the
state (el/held, docs/ELASTIC.md) now makes such a generation fail with the error "no rank of
generation G holds the training state" (matrix case state_lost). Unless --state-gap, the
soak does not inject those faults, which end its run: kill_sync spares the last holder, and
no fault is injected while a host is coming back (its cooldown about to end, or its
addition not yet committed).
"""
import argparse
import os
import random
import re
import signal
import statistics
import sys
import tempfile
import time

import harness
import matrix

HOSTS = "localhost:2,127.0.0.1:2,127.0.0.2:2"
COOLDOWN = (5, 20)
FLAGS = ["-np", "4", "--min-np", "2", "--max-np", "6", "--blacklist-cooldown-range",
         str(COOLDOWN[0]), str(COOLDOWN[1]), "-H", HOSTS]
COMMIT = 2
HANG = 30
SYNC_PAUSE = 0.2
KINDS = ["kill", "kill_rank0", "stop", "exit", "kill_sync"]


def last_generation(job):
    """(generation, {worker: (pid, rank)}) of the last commit's generation: the ranks that
    logged that commit and still run."""
    evs = job.events()
    commits = [e for e in evs if e["event"] == "commit"]
    if not commits:
        return 0, {}
    last = commits[-1]
    members = {e["worker"]: (e["pid"], e["rank"]) for e in commits
               if e["gen"] == last["gen"] and e["step"] == last["step"]}
    return last["gen"], {w: v for w, v in members.items() if harness.alive(v[0])}


def in_sync(job, gen):
    """{worker: (pid, holds the state, generation)} of the workers inside a sync of a
    generation after gen: they logged "sync" there and not yet "join". A worker holds the
    state once it has joined a generation (its first sync done) before."""
    syncing, joined, holders = {}, set(), set()
    for e in job.events():
        if e["event"] == "join":
            holders.add(e["pid"])
        if e.get("gen", 0) <= gen:
            continue
        key = (e["worker"], e["pid"], e["gen"])
        if e["event"] == "sync":
            syncing[key] = e["pid"]
        elif e["event"] == "join":
            joined.add(key)
    return {k[0]: (p, p in holders, k[2]) for k, p in syncing.items()
            if k not in joined and harness.alive(p)}


def sync_victims(syncing, last_holder):
    """Whom kill_sync may kill: anyone, when last_holder; else not the last worker holding
    the state (a fresh worker still in its first sync does not have it: with every holder
    gone the state would be lost, and the driver cannot tell; see docs/PERFORMANCE.md)."""
    holders = [w for w, (_, has, _) in syncing.items() if has]
    if last_holder or len(holders) > 1:
        return sorted(syncing)
    return sorted(w for w in syncing if w not in holders)


class Returns:
    """When blacklisted hosts come back, from khorrun's lines as they appear ("host H
    blacklisted for N s"), and the host updates it said ("hosts added during generation G")."""

    def __init__(self, job):
        self.job, self.seen, self.back = job, 0, []

    def pending(self, gen):
        """A host comes back now or soon (its cooldown ends within 3.5 s, or ended less than
        2 s ago), or was said to be added in generation gen or later: a fault then could end
        the generation whose fresh workers have not synced yet."""
        out = self.job.output()
        ends = re.findall(r"host \S+ blacklisted for (\d+) s", out)
        now = time.time()
        self.back += [now + int(n) for n in ends[self.seen:]]
        self.seen = len(ends)
        if any(b - 3.5 <= now <= b + 2 for b in self.back):
            return True
        said = [int(g) for g in re.findall(r"hosts \S+ during generation (\d+)", out)]
        return bool(said) and max(said) >= gen


class Soak:
    def __init__(self, job, rnd, state_gap):
        self.job, self.rnd, self.last_holder = job, rnd, state_gap
        self.returns = None if state_gap else Returns(job)
        self.waited = 0.0
        self.kinds = {k: 0 for k in KINDS}
        self.by_kind = {k: [] for k in KINDS}
        self.recoveries, self.hangs, self.stray, self.missed_sync = [], [], [], 0
        self.stopped = []

    def signal(self, kind, worker, pid, sig):
        self.job.note_fault(kind, worker, pid)
        t = time.time()
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return None
        return t

    def settle(self):
        """Waits (at most 60 s) while a host is about to come back (see Returns.pending)."""
        t = time.time()
        self.job.wait(lambda: not self.returns.pending(last_generation(self.job)[0]), 60)
        self.waited += time.time() - t

    def inject(self, kind):
        """One fault; (its time, the generation it ends), or None when there was no
        victim."""
        if self.returns is not None:
            self.settle()
        gen, members = last_generation(self.job)
        if not members:
            return None
        if kind == "kill_rank0":
            victims = [w for w, (_, r) in members.items() if r == 0]
        else:
            victims = sorted(members)
        if not victims:
            return None
        worker = self.rnd.choice(victims)
        pid = members[worker][0]
        sig = {"stop": signal.SIGSTOP, "exit": signal.SIGUSR1}.get(kind, signal.SIGKILL)
        t = self.signal(kind if kind != "kill_sync" else "kill", worker, pid, sig)
        if t is None:
            return None
        if kind == "stop":
            self.stopped.append((pid, t))
        if kind == "kill_sync":
            # The next generation's sync: a second kill while it is under way.
            victims = []
            if self.job.wait(lambda: in_sync(self.job, gen), HANG):
                syncing = in_sync(self.job, gen)
                victims = sync_victims(syncing, self.last_holder)
            if victims:
                w2 = self.rnd.choice(victims)
                t2 = self.signal("kill_sync", w2, syncing[w2][0], signal.SIGKILL)
                if t2 is not None:
                    t, gen = t2, syncing[w2][2]
            else:
                self.missed_sync += 1
        self.kinds[kind] += 1
        return t, gen

    def commits_after(self, t, gen):
        return [e["t"] for e in self.job.events()
                if e["event"] == "commit" and e["t"] > t and e["gen"] > gen]

    def recovered(self, t, gen, bound=HANG):
        """Waits for the first commit of a generation after gen, the one the fault at time t
        ended (an exit takes effect at the next step, a stop once it is fenced); its delay
        from the fault, or None (a hang)."""
        if not self.job.wait(lambda: bool(self.commits_after(t, gen)), bound):
            return None
        return min(self.commits_after(t, gen)) - t

    def check_stopped(self):
        """A stopped worker must be dead (fenced) by the time the job has recovered."""
        for pid, t in list(self.stopped):
            if not harness.alive(pid):
                self.stopped.remove((pid, t))
            elif time.time() - t > HANG:
                self.stray.append(pid)
                self.stopped.remove((pid, t))
                os.kill(pid, signal.SIGKILL)


def resumes(evs):
    """The generations that resumed below a step already committed: (generation, last step
    committed before, step resumed from). Resuming from step 0 is the state lost (no worker
    that held it was left); from another step, commits undone."""
    top, seen, out = 0, set(), []
    for e in sorted(evs, key=lambda e: e["t"]):
        if e["event"] == "commit":
            top = max(top, e["step"])
        elif e["event"] == "join" and e["gen"] not in seen:
            seen.add(e["gen"])
            if e["step"] < top:
                out.append((e["gen"], top, e["step"]))
                top = e["step"]  # counted once: from here the run goes on from there
    return out


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def inject_all(s, n, rnd, why):
    """n faults, one after another, each once the job has recovered from the one before."""
    job, t0 = s.job, time.time()
    for i in range(n):
        if not job.running():
            why.append("khorrun exited (status %s) after %d faults" % (job.rc, i))
            return
        kind = rnd.choice(KINDS)
        got = s.inject(kind)
        if got is None:  # between generations: the next commit has the new one's workers
            job.wait_commit(job.top() + COMMIT, HANG)
            got = s.inject(kind)
        if got is None:
            why.append("fault %d (%s): no worker to inject it into" % (i, kind))
            return
        took = s.recovered(*got)
        if took is None:
            s.hangs.append((i, kind))
            print("soak: fault %d (%s): no commit within %d s" % (i, kind, HANG), flush=True)
            if s.recovered(*got, bound=120) is None:
                why.append("hung after fault %d (%s), for good" % (i, kind))
                return
        else:
            s.recoveries.append(took)
            s.by_kind[kind].append(took)
        s.check_stopped()
        if (i + 1) % 20 == 0:
            print("soak: %d faults in %.0f s, generation %d, step %d" % (
                i + 1, time.time() - t0, last_generation(job)[0], job.top()), flush=True)
        time.sleep(rnd.uniform(0, 0.3))


def report(s, a, argv, tmp, took, why):
    """The numbers, after the run; what is not as wanted goes to why."""
    job = s.job
    out, evs = job.output(), job.events()
    m = re.findall(r"final loss ([0-9.e+-]+) after (\d+) steps", out)
    loss, steps = (float(m[-1][0]), int(m[-1][1])) if m else (None, None)
    lost = []
    # The last step (the one TM_STOP ended the run at) has no commit.
    matrix.check_commits(evs, lost, (steps or job.top()) - 1, COMMIT, exact=False)
    back = resumes(evs)
    restarts = [r for r in back if r[2] == 0]
    base = harness.base_loss(a.khorrun, a.python, tmp, steps, COMMIT) if steps else None
    left = matrix.strays(job.log)
    for pid in left:  # a failed soak leaves nothing behind either
        os.kill(pid, signal.SIGKILL)
    print("\nsoak: %s" % " ".join(argv))
    print("soak: %d faults injected in %.0f s (%s); %d generations, %d steps" % (
        sum(s.kinds.values()), took, ", ".join("%s %d" % kv for kv in s.kinds.items()),
        max((e.get("gen", 0) for e in evs), default=0), steps or 0))
    print("soak: hangs (no commit within %d s of a fault): %d %s" % (HANG, len(s.hangs),
                                                                     s.hangs or ""))
    print("soak: commits lost: %d" % sum((top - at) // COMMIT for _, top, at in back))
    for w in lost[:10]:
        print("soak:   %s" % w)
    for g, top, at in back:
        print("soak:   generation %d resumed from step %d after step %d was committed%s" % (
            g, at, top, ": the state was lost, no worker holding it was left" if at == 0 else
            ""))
    if s.recoveries:
        print("soak: recovery (fault to the next commit): median %.2f s, p95 %.2f s, max %.2f s "
              "over %d faults" % (statistics.median(s.recoveries), pct(s.recoveries, 0.95),
                                  max(s.recoveries), len(s.recoveries)))
        for k, xs in s.by_kind.items():
            if xs:
                print("soak:   %-10s median %.2f s, p95 %.2f s (%d)" % (
                    k, statistics.median(xs), pct(xs, 0.95), len(xs)))
    if s.waited:
        print("soak: waited %.0f s in all for hosts coming back before faults" % s.waited)
    if s.missed_sync:
        print("soak: kill_sync: %d found no sync to kill into" % s.missed_sync)
    print("soak: stopped workers not fenced: %d; processes left: %s" % (len(s.stray),
                                                                        left or "none"))
    print("soak: khorrun exit %s; final loss %s after %s steps, fault-free %s" % (
        job.rc, loss, steps, base))
    if job.rc != 0:
        why.append("khorrun exited %s" % job.rc)
        print(out[-5000:])
    if s.hangs:
        why.append("%d hangs" % len(s.hangs))
    if back:
        why.append("%d resets went back past a commit (%d of them to step 0)" % (
            len(back), len(restarts)))
    elif lost:
        why += lost
    if s.stray or left:
        why.append("workers left running: %s %s" % (s.stray, left))
    if loss is None or base is None or abs(loss - base) > 1e-3 * base:
        why.append("final loss %s, fault-free %s" % (loss, base))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("khorrun")
    ap.add_argument("python")
    ap.add_argument("--faults", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", help="keep the event log and khorrun's output in this directory")
    ap.add_argument("--state-gap", action="store_true",
                    help="faults also where the known gap loses the state: kill_sync of the "
                         "last worker holding it, and any fault while a host comes back")
    a = ap.parse_args()
    rnd = random.Random(a.seed)
    why = []
    with tempfile.TemporaryDirectory(prefix="khor-soak-") as tmp:
        tmp = a.keep or tmp
        os.makedirs(tmp, exist_ok=True)
        log, stop = os.path.join(tmp, "soak.log"), os.path.join(tmp, "stop")
        if os.path.exists(stop):
            os.remove(stop)
        env = dict(os.environ)
        env.update(harness.train_env(log, 10 ** 8, COMMIT, 0.02, {
            "KHOR_HEARTBEAT_TIMEOUT": "2s", "TM_SYNC_PAUSE": str(SYNC_PAUSE), "TM_STOP": stop}))
        argv = [a.khorrun] + FLAGS + [a.python, harness.TRAIN]
        print("soak: %s (%d faults, seed %d)" % (" ".join(argv), a.faults, a.seed), flush=True)
        t0 = time.time()
        job = harness.Job(argv, env, log, os.path.join(tmp, "soak.out"))
        s = Soak(job, rnd, a.state_gap)
        try:
            if job.wait_commit(COMMIT, 60):
                inject_all(s, a.faults, rnd, why)
            else:
                why.append("no first commit within 60 s")
            open(stop, "w").close()
            job.finish(time.time() - job.t0 + 120)
        finally:
            if job.running():
                os.killpg(job.p.pid, signal.SIGKILL)
        report(s, a, argv, tmp, time.time() - t0, why)
    if why:
        print("soak: FAILED:\n  " + "\n  ".join(why))
        return 1
    print("soak: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
