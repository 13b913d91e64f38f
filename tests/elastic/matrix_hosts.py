#!/usr/bin/python3
"""The elastic fault matrix across hosts over ssh (run by matrix_hosts.sh, which builds the
network-namespace hosts and exports what it made: HOSTS_ADDRS, HOSTS_NSS, HOSTS_IFS,
HOSTS_SSHD_PIDS, HOSTS_SSH_CONFIG, HOSTS_CIDR, HOSTS_DIR).

  matrix_hosts.py KHORRUN PYTHON [CASE...]      (every case when none is named)

Each case runs tests/elastic/train_matrix.py under khorrun's elastic driver on one to four
of the hosts, injects its faults from outside while it runs (by the pids the workers log, by
ip link, by killing an sshd), under a hard wall-clock cap, and checks what matrix.py checks:
khorrun's exit status and its lines naming each loss (rank, host, cause), commits that only
move forward with none lost, the final loss of a fault-free run (within 1e-3 of it,
relative), the next commit within a bound after each fault; and that nothing of the job is
left on any host afterwards. Exit status 0 when every case passes, 1 with the reasons.
MATRIX_KEEP=DIR keeps every case's event log and khorrun's output in DIR.
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import harness
import matrix

ADDR = os.environ["HOSTS_ADDRS"].split()
NS = os.environ["HOSTS_NSS"].split()
IFS = os.environ["HOSTS_IFS"].split()
SSHD = [int(p) for p in os.environ["HOSTS_SSHD_PIDS"].split()]
H0, H1, H2, H3 = ADDR[:4]
COMMIT = 2
SLEEP = 0.05
BOUND = 12  # seconds from a fault to the next commit, on a loaded CI machine
FENCE = {"KHOR_HEARTBEAT_TIMEOUT": "2s"}
FENCE_BOUND = 2 + BOUND  # the heartbeat timeout, then as BOUND


def ns_pids(i):
    """Processes in host i's namespace other than its sshd listener."""
    p = subprocess.run(["ip", "netns", "pids", NS[i]], stdout=subprocess.PIPE, text=True)
    return [int(x) for x in p.stdout.split() if int(x) != SSHD[i]]


def leftovers(log):
    """{host: pids} of what is left of the case whose event log is log: every process in the
    hosts' namespaces but their sshd listeners, and its training processes here."""
    out = {}
    for i in range(len(NS)):
        p = [q for q in ns_pids(i) if harness.alive(q)]
        if p:
            out[ADDR[i]] = p
    local = [q for q in matrix.strays(log) if not any(q in v for v in out.values())]
    if local:
        out["here"] = local
    return out


def wait_no_leftovers(log, bound):
    end = time.time() + bound
    while True:
        left = leftovers(log)
        if not left or time.time() >= end:
            return left
        time.sleep(0.1)


def clear_leftovers(log):
    for pids in leftovers(log).values():
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def link(i, up):
    subprocess.run(["ip", "-n", NS[i], "link", "set", "dev", IFS[i], "up" if up else "down"],
                   check=True)


def start_sshd(i):
    """Host i's sshd again, as netns_hosts.sh started it (it kills it with the namespace)."""
    d = os.environ["HOSTS_DIR"]
    p = subprocess.Popen(["ip", "netns", "exec", NS[i], "/usr/sbin/sshd", "-D", "-f",
                          d + "/sshd_config", "-o", "ListenAddress=" + ADDR[i], "-o",
                          "PidFile=%s/sshd%d.pid" % (d, i), "-E", "%s/sshd%d.log" % (d, i)],
                         start_new_session=True)
    SSHD[i] = p.pid
    for _ in range(100):
        try:
            subprocess.run(["timeout", "0.5", "bash", "-c", "exec 3<>/dev/tcp/%s/22" % ADDR[i]],
                           check=True, stderr=subprocess.DEVNULL)
            return
        except subprocess.CalledProcessError:
            time.sleep(0.1)
    raise RuntimeError("sshd of %s did not come back" % NS[i])


class Case:
    """One run: its khorrun flags, extra variables for the ranks, the steps to train."""

    def __init__(self, ctx, name, flags, extra=None, steps=60):
        self.ctx, self.name, self.steps = ctx, name, steps
        self.log = os.path.join(ctx.tmp, name + ".log")
        renv = harness.train_env(self.log, steps, COMMIT, SLEEP, extra)
        argv = [ctx.khorrun, "--ssh-command", "ssh -F " + os.environ["HOSTS_SSH_CONFIG"],
                "-x", "KHOR_SOCKET_IFNAME=" + os.environ["HOSTS_CIDR"]]
        for k, v in sorted(renv.items()):
            argv += ["-x", "%s=%s" % (k, v)]
        argv += flags + [ctx.python, harness.TRAIN]
        env = dict(os.environ)
        env.update(renv)
        print("matrix_hosts: %s: %s" % (name, " ".join(argv)), flush=True)
        self.job = harness.Job(argv, env, self.log, os.path.join(ctx.tmp, name + ".out"))
        self.why = []

    def need(self, ok, what):
        """ok, or the case is failed with what (and goes on to its end and its checks)."""
        if not ok:
            self.why.append(what)
        return ok

    def kill(self, worker, sig=signal.SIGKILL, kind="kill"):
        """Signals worker's process from here; its pid, or None."""
        pid = self.job.workers().get(worker)
        if not self.need(pid is not None, "no running worker %s to signal" % worker):
            return None
        self.job.note_fault(kind, worker, pid)
        os.kill(pid, sig)
        return pid

    def at_commit(self, step):
        return self.need(self.job.wait_commit(step, 30), "no commit of step %d within 30 s "
                         "(last: %d)" % (step, self.job.top()))


def check(c, cap, want_rc, patterns, bound, left_bound=10):
    """matrix.py's checks of a finished case, and nothing of it left on any host."""
    rc = c.job.finish(cap)
    out = c.job.output()
    print(out)
    print("matrix_hosts: %s: exit %s after %.1f s" % (c.name, rc, c.job.took))
    why = c.why
    matrix.check_exit(rc, want_rc, cap, out, patterns, why)
    evs = c.job.events()
    if want_rc == 0:
        matrix.check_commits(evs, why, c.steps, COMMIT, exact=False)
        loss = matrix.final_loss(out)
        base = c.ctx.base(c.steps)
        if loss is None:
            why.append("no final loss printed")
        elif base is None or abs(loss - base) > 1e-3 * base:
            why.append("final loss %.9f, fault-free %s" % (loss, base))
        if bound is not None:
            matrix.check_recovery(evs, bound, why)
    left = wait_no_leftovers(c.log, left_bound)
    if left:
        why.append("left running %d s after the job: %s" % (left_bound, left))
        clear_leftovers(c.log)
    return why


def esc(s):
    return re.escape(s)


def lost_line(rank, host, worker, cause):
    return r"rank %s on %s \(worker %s\) was lost: .*%s" % (rank, esc(host), esc(worker), cause)


def kill_one(ctx, name, rank, host, slot):
    """kill -9 of the worker at host:slot (rank) of a job on three hosts at step 10."""
    c = Case(ctx, name, ["-np", "6", "--min-np", "2", "-H", "%s:2,%s:2,%s:2" % (H0, H1, H2)])
    worker = "%s:%d" % (host, slot)
    if c.at_commit(10):
        c.kill(worker)
    return check(c, 60, 0, [lost_line(rank, host, worker, r"signal 9.*host %s blacklisted" %
                                      esc(host))], BOUND)


def kill_worker(ctx):
    """kill -9 of a worker on one host: the host is blacklisted, its other worker dropped,
    the job goes on on the other two."""
    return kill_one(ctx, "kill_worker", 5, H2, 1)


def kill_rank0(ctx):
    """kill -9 of rank 0: its host goes, rank 0 of the next generation is on another."""
    return kill_one(ctx, "kill_rank0", 0, H0, 0)


def stop_rank(ctx):
    """SIGSTOP of a rank: its heartbeat stalls, khorrun kills it through its host's helper
    (fencing); a SIGCONT after that finds it dead, and it never commits again."""
    c = Case(ctx, "stop_rank", ["-np", "6", "--min-np", "2", "-H",
                                "%s:2,%s:2,%s:2" % (H0, H1, H2)], FENCE)
    pid, fenced = None, None
    if c.at_commit(10):
        pid = c.kill(H1 + ":0", signal.SIGSTOP, "stop")
    if pid is not None and c.need(c.job.wait_out(r"heartbeat stopped", 20),
                                  "no fencing within 20 s of the SIGSTOP"):
        fenced = time.time()
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        c.need(c.job.wait(lambda: not harness.alive(pid), 5),
               "the fenced worker %d still runs 5 s after its fencing" % pid)
    why = check(c, 60, 0, [lost_line(2, H1, H1 + ":0", r"heartbeat stopped.*khorrun killed "
                                     r"it; host %s blacklisted" % esc(H1))], FENCE_BOUND)
    if fenced is not None:
        late = [e for e in c.job.events() if e.get("pid") == pid and e["t"] > fenced]
        if late:
            why.append("the stopped worker went on after its fencing: %s" % late[:3])
    return why


def link_cut(ctx):
    """A host's link goes down mid-training: its ranks' heartbeats stall, the job goes on
    without the host, and ends without waiting for ssh to notice the host is gone (khorrun
    closes the connection of workers that a SIGKILL did not end); once the link is back,
    the helper there finds its session gone and stops what was left."""
    c = Case(ctx, "link_cut", ["-np", "6", "--min-np", "2", "--grace", "1s", "-H",
                               "%s:2,%s:2,%s:2" % (H0, H1, H2)], FENCE)
    if c.at_commit(10):
        c.job.note_fault("link", H2, None)
        link(2, False)
    c.job.wait(lambda: not c.job.running(), 60)
    link(2, True)
    return check(c, 60, 0, [r"rank [45] on %s \(worker %s:[01]\) was lost: its heartbeat" %
                            (esc(H2), esc(H2)), r"%s does not answer: worker %s:[01] did not "
                            r"end" % (esc(H2), esc(H2))], FENCE_BOUND, left_bound=30)


def sshd_killed(ctx):
    """A host's sshd dies mid-training: its running workers keep their ssh session; after a
    loss there, the host comes back from its cooldown, and starting a worker on it fails,
    named with the host and ssh's error, not a hang; the job goes on without it."""
    c = Case(ctx, "sshd_killed", ["-np", "6", "--min-np", "2", "--blacklist-cooldown-range",
                                  "1", "2", "-H", "%s:2,%s:2,%s:2" % (H0, H1, H3)], steps=140)
    if c.at_commit(6):
        os.kill(SSHD[3], signal.SIGKILL)
    if c.at_commit(10):
        c.kill(H3 + ":1")
    c.need(c.job.wait_out(r"worker %s:\d\) was lost: it could not be started there" % esc(H3),
                          30), "no failed start on %s named within 30 s" % H3)
    why = check(c, 90, 0, [lost_line(5, H3, H3 + ":1", r"signal 9.*host %s blacklisted for" %
                                     esc(H3)),
                           r"worker %s:\d\) was lost: it could not be started there: .*"
                           r"Connection refused" % esc(H3)], BOUND)
    start_sshd(3)
    return why


def sshd_killed_one_host(ctx):
    """The same on a job on that one host: a fresh worker cannot start in the lost one's
    slot, and the job ends with the host named, not one failed generation after another."""
    c = Case(ctx, "sshd_killed_one_host", ["-np", "2", "--min-np", "1", "-H", H2 + ":2"])
    if c.at_commit(6):
        os.kill(SSHD[2], signal.SIGKILL)
    if c.at_commit(10):
        c.kill(H2 + ":1")
    why = check(c, 30, 1, [lost_line(1, H2, H2 + ":1", r"it could not be started there: .*"
                                     r"Connection refused; host %s blacklisted" % esc(H2)),
                           r"every host of generation 2 is blacklisted"], None)
    start_sshd(2)
    return why


def write_hosts(path, hosts):
    with open(path + ".new", "w") as f:
        f.write("".join("%s:2\n" % h for h in hosts))
    os.rename(path + ".new", path)


def discovery(ctx):
    """The discovery script's hosts change under the job: one added (it grows), one removed
    (it shrinks), then too few for --min-np (it waits, no deadlock) and one added back (it
    goes on)."""
    hosts = os.path.join(ctx.tmp, "hosts")
    script = os.path.join(ctx.tmp, "discover.sh")
    write_hosts(hosts, [H0, H1])
    with open(script, "w") as f:
        f.write("#!/bin/sh\nexec cat %s\n" % hosts)
    os.chmod(script, 0o755)
    c = Case(ctx, "discovery", ["-np", "4", "--min-np", "4", "--max-np", "6",
                                "--elastic-timeout", "30", "--host-discovery-script", script],
             steps=140)

    def at_size(n, host, bound=30):
        return c.need(c.job.wait(lambda: any(
            e["event"] == "commit" and e["size"] == n and e["worker"].startswith(host + ":")
            for e in c.job.events()), bound), "no commit at size %d with %s within %d s" %
            (n, host, bound))

    if c.at_commit(6):
        write_hosts(hosts, [H0, H1, H2])
    if at_size(6, H2):
        write_hosts(hosts, [H0, H2])
    if at_size(4, H2):
        write_hosts(hosts, [H0])
    if c.need(c.job.wait_out(r"waits for 4 slots", 30), "no wait for --min-np slots"):
        time.sleep(1)
        held = c.job.top()
        time.sleep(1)
        c.need(c.job.top() == held, "commits went on below --min-np (%d, then %d)" %
               (held, c.job.top()))
        # The survivors were told "removed" and the new generation has fresh workers:
        # they must sync together (a mismatch would hang until KHOR_TIMEOUT, 20 s).
        write_hosts(hosts, [H0, H3])
        at_size(4, H3, BOUND)
    return check(c, 90, 0, [r"hosts added during generation 1", r"hosts removed during "
                            r"generation 2", r"generation \d waits for 4 slots"], None)


CASES = {f.__name__: f for f in (kill_worker, kill_rank0, stop_rank, link_cut, sshd_killed,
                                 sshd_killed_one_host, discovery)}


class Ctx:
    def __init__(self, khorrun, python, tmp):
        self.khorrun, self.python, self.tmp = khorrun, python, tmp
        self._base = {}

    def base(self, steps):
        if steps not in self._base:
            self._base[steps] = harness.base_loss(self.khorrun, self.python, self.tmp, steps,
                                                  COMMIT)
        return self._base[steps]


def main():
    khorrun, python = sys.argv[1:3]
    names = sys.argv[3:] or list(CASES)
    failed = []
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="khor-matrix-hosts-") as tmp:
        # MATRIX_KEEP=DIR keeps each case's log and output there, to look at afterwards.
        tmp = os.environ.get("MATRIX_KEEP") or tmp
        ctx = Ctx(khorrun, python, tmp)
        for name in names:
            t = time.time()
            why = CASES[name](ctx)
            if why:
                failed.append(name)
                print("matrix_hosts: %s FAILED:\n  %s" % (name, "\n  ".join(why)), flush=True)
            else:
                print("matrix_hosts: %s passed (%.1f s)" % (name, time.time() - t), flush=True)
    print("matrix_hosts: %d of %d cases passed in %.1f s%s" % (
        len(names) - len(failed), len(names), time.time() - t0,
        "; failed: " + " ".join(failed) if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
