#!/usr/bin/env python3
"""Elastic recovery, measured: the time from a worker's loss to the first completed training
step of the next generation, for khor (khorrun's elastic mode, the `horovod` alias) and, in
the same run, real Horovod (horovodrun with Gloo) when it is installed.

    bench/elastic/recovery.py [--trials 20] [--np 4] [--fault kill|stop] [--csv out.csv]
        [--khorrun build/khorrun] [--horovodrun PATH] [--layouts one,two,hosts]

Layouts: "one" = np ranks on localhost (khor starts a fresh worker in the lost slot);
"two" = two pseudo-hosts localhost and 127.0.0.1 (Horovod's own elastic tests' layout: the
lost worker's host is blacklisted and the job goes on at half the size, for both);
"hosts" = one rank on each of np network-namespace hosts over ssh (bench/elastic/
recovery_hosts.sh builds them and passes HOSTS_ADDRS, HOSTS_SSH_CONFIG and HOSTS_CIDR): the
lost worker's host is blacklisted and the job goes on at np - 1. Namespaces share this
machine's clock and files, so the log works as on one host. Horovod is not set up there
(its driver service would have to be reached from inside the namespaces).
Each trial trains bench/elastic/train.py, which kills (or stops) the worker of start rank 1
at step 20; its rank 0 logs the wall-clock time of every completed step. Prints, per
launcher and layout, the median and p95 over the trials, and the ratio khor / Horovod.
Horovod is skipped with a line saying why when horovodrun cannot be found or fails.
"""
import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PY = "/usr/bin/python3"


def recovery_time(log):
    """Seconds from the fault to the first step completed after it at a new generation."""
    fault, steps = None, []
    with open(log) as f:
        for line in f:
            w = line.split()
            if w[0] == "fault":
                fault = float(w[2])
            elif w[0] == "step":
                steps.append((int(w[1]), int(w[2]), float(w[3])))
    if fault is None:
        raise RuntimeError("no fault was recorded in %s" % log)
    after = [t for (_, _, t) in steps if t > fault]
    if not after:
        raise RuntimeError("no step completed after the fault in %s" % log)
    # The first step after the fault completes in the new generation: the old one's steps
    # all need the lost rank, so none of them completes after it.
    return after[0] - fault


def layout_hosts(layout, n):
    if layout == "hosts":
        addrs = os.environ.get("HOSTS_ADDRS", "").split()
        if len(addrs) < n:
            raise SystemExit("layout hosts: needs %d namespace hosts in HOSTS_ADDRS (run "
                             "bench/elastic/recovery_hosts.sh), found %d" % (n, len(addrs)))
        return ["%s:1" % a for a in addrs[:n]]
    if layout == "one":
        return ["localhost:%d" % n]
    return ["localhost:%d" % (n // 2), "127.0.0.1:%d" % (n - n // 2)]


def khor_cmd(args, hosts, env):
    cmd = [args.khorrun, "-np", str(args.np), "--min-np", "1", "--max-np", str(args.np),
           "-H", ",".join(hosts)]
    if "HOSTS_SSH_CONFIG" in os.environ and not hosts[0].startswith(("localhost", "127.")):
        # Remote ranks get only what -x forwards: the bench's variables and the paths.
        cmd += ["--ssh-command", "ssh -F " + os.environ["HOSTS_SSH_CONFIG"],
                "-x", "KHOR_SOCKET_IFNAME=" + os.environ["HOSTS_CIDR"]]
        for k in ("BENCH_LOG", "BENCH_FAULT", "PYTHONUNBUFFERED", "PYTHONPATH",
                  "KHOR_LIBRARY_PATH"):
            cmd += ["-x", "%s=%s" % (k, env[k])]
    return cmd + [PY, os.path.join(HERE, "train.py")]


def horovod_cmd(args, hosts, env):
    return [args.horovodrun, "-np", str(args.np), "--min-np", "1", "--max-np", str(args.np),
            "-H", ",".join(hosts), args.horovod_python, os.path.join(HERE, "train.py")]


def run_trial(cmd, env, log, cap):
    if os.path.exists(log):
        os.unlink(log)
    for f in (log + ".fired",):
        if os.path.exists(f):
            os.unlink(f)
    t0 = time.time()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=cap, text=True)
    if p.returncode != 0:
        raise RuntimeError("exit %d after %.0f s:\n%s" % (p.returncode, time.time() - t0,
                                                        p.stdout[-3000:]))
    return recovery_time(log)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--fault", choices=["kill", "stop"], default="kill")
    ap.add_argument("--layouts", default="one,two")
    ap.add_argument("--khorrun", default=os.path.join(ROOT, "build", "khorrun"))
    ap.add_argument("--horovodrun", default=shutil.which("horovodrun") or
                    "/tmp/hvd-venv/bin/horovodrun")
    ap.add_argument("--horovod-python", default="/tmp/hvd-venv/bin/python")
    ap.add_argument("--csv", default="elastic_recovery.csv")
    ap.add_argument("--cap", type=float, default=180, help="seconds a trial may take")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="khor-elastic-bench-")
    log = os.path.join(tmp, "log")
    base = dict(os.environ, BENCH_LOG=log, BENCH_FAULT=args.fault, PYTHONUNBUFFERED="1")
    khor_env = dict(base, PYTHONPATH=os.pathsep.join(
        [os.path.join(ROOT, "bindings", "python"),
         os.path.join(ROOT, "bindings", "python", "horovod_compat")]),
        KHOR_LIBRARY_PATH=os.path.join(ROOT, "build", "libkhor.so"))
    hvd_env = dict(base)
    hvd_env.pop("PYTHONPATH", None)
    peers = [("khor", khor_cmd, khor_env)]
    if os.access(args.horovodrun, os.X_OK):
        peers.append(("horovod", horovod_cmd, hvd_env))
    else:
        print("horovod: skipped: no horovodrun at %s (pip install horovod==0.28.1 with "
              "HOROVOD_WITH_GLOO=1 HOROVOD_WITH_PYTORCH=1 into a venv)" % args.horovodrun)
    rows, results = [], {}
    for layout in args.layouts.split(","):
        hosts = layout_hosts(layout, args.np)
        for trial in range(1, args.trials + 1):
            for name, make, env in list(peers):
                if name == "horovod" and layout == "hosts":
                    if trial == 1:
                        print("horovod hosts: not run (see the layouts above)")
                    continue
                if name == "horovod" and layout == "one":
                    if trial == 1:
                        print("horovod one: skipped: Horovod blacklists the lost worker's "
                              "host, and one host leaves it nothing to go on with")
                    continue
                try:
                    t = run_trial(make(args, hosts, env), env, log, args.cap)
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    print("%s %s trial %d failed: %s" % (name, layout, trial, e))
                    if name == "horovod":
                        print("horovod: dropped from the rest of the run")
                        peers = [p for p in peers if p[0] != "horovod"]
                    continue
                results.setdefault((name, layout), []).append(t)
                rows.append([name, layout, args.fault, args.np, trial, "%.4f" % t])
                print("%s %s %s trial %d: %.3f s" % (name, layout, args.fault, trial, t),
                      flush=True)
    with open(args.csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["launcher", "layout", "fault", "np", "trial", "recovery_s"])
        w.writerows(rows)
    print("\nlauncher layout fault: median p95 (trials)")
    for (name, layout), ts in sorted(results.items()):
        ts = sorted(ts)
        p95 = ts[min(len(ts) - 1, int(round(0.95 * (len(ts) - 1))))]
        print("%s %s %s: %.3f s %.3f s (%d)" % (name, layout, args.fault,
                                                statistics.median(ts), p95, len(ts)))
    for layout in args.layouts.split(","):
        k, h = results.get(("khor", layout)), results.get(("horovod", layout))
        if k and h:
            print("khor / horovod, %s: %.3f" % (layout, statistics.median(k) /
                                                statistics.median(h)))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
