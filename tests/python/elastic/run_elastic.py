#!/usr/bin/python3
"""End-to-end elastic runs of khor.torch under khorrun's elastic driver (CTest: elastic_*).

  run_elastic.py KHORRUN PYTHON SCENARIO [--horovod-main FILE]

Each scenario starts khorrun on this machine ("localhost" and "127.0.0.1" are two hosts to
the driver, both local), reads the per-epoch lines that rank 0 of the training script
wrote, and checks them:

  kill       -H localhost:3, --min-np 2: start rank 1 kills itself (SIGKILL) in epoch 1;
             the driver starts a fresh worker in its slot, the survivors restore their last
             commit and rejoin, the new worker syncs; 3 ranks in every epoch, the epoch
             after the failure in the second rendezvous, every sample trained on.
  hosts      --host-discovery-script: localhost:2, then 127.0.0.1:2 added in the middle of
             epoch 0, then localhost removed in the middle of epoch 1 (its workers told
             they are out: exit 0); the epochs end at sizes 4, 2, 2 in rendezvous 2, 3, 3,
             rank 0 on 127.0.0.1 in the last; the sampler resharded what was left of each
             epoch, so every sample was trained on once.
  horovod-*  Horovod's own test/integration/data/elastic_torch_main.py, unchanged, through
             the horovod alias, in the scenarios of Horovod's test/integration/elastic_common
             (hosts added and removed; a rank's failure by exception or kill, with a
             discovery script and with fixed hosts; the reset limit). Needs the
             script (--horovod-main, or KHOR_HOROVOD_SRC naming a Horovod checkout) and
             psutil; exit status 77 (skipped) without them.

Exit status 0 when every check passes, 1 with the reasons, 77 when skipped. By hand, from
the tree: KHOR_LIBRARY_PATH=build/libkhor.so tests/python/elastic/run_elastic.py
build/khorrun /usr/bin/python3 kill
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
TRAIN = os.path.join(HERE, "elastic_train.py")
TIMEOUT = 240


def env_for(alias=False):
    env = dict(os.environ)
    py = [os.path.join(TREE, "bindings", "python")]
    if alias:
        py.insert(0, os.path.join(TREE, "bindings", "python", "horovod_compat"))
    env["PYTHONPATH"] = os.pathsep.join(py + [env["PYTHONPATH"]] if env.get("PYTHONPATH")
                                        else py)
    env.setdefault("KHOR_TIMEOUT", "20s")
    env.setdefault("KHOR_HEARTBEAT_INTERVAL", "200ms")   # host changes noticed sooner
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def launch(khorrun, argv, env, what):
    print("run_elastic: %s: %s" % (what, " ".join(argv)), flush=True)
    try:
        p = subprocess.run([khorrun] + argv, env=env, timeout=TIMEOUT,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
        return None, out or ""
    return p.returncode, p.stdout


def read_lines(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class Check:
    def __init__(self, what):
        self.what = what
        self.bad = []

    def eq(self, got, want, label):
        if got != want:
            self.bad.append("%s: %s is %r, want %r" % (self.what, label, got, want))

    def true(self, cond, label):
        if not cond:
            self.bad.append("%s: %s" % (self.what, label))


def discovery_script(d, hosts_file):
    path = os.path.join(d, "discover.sh")
    with open(path, "w") as f:
        f.write("#!/bin/sh\ncat %s\n" % hosts_file)
    os.chmod(path, 0o755)
    return path


def check_train_log(c, log, sizes, rendezvous, samples):
    lines = read_lines(log)
    fails = [x["fail"] for x in lines if "fail" in x]
    c.eq(fails, [], "the script's failures")
    epochs = [x for x in lines if "epoch" in x]
    c.eq([x["epoch"] for x in epochs], list(range(len(sizes))), "epochs logged")
    c.eq([x["size"] for x in epochs], sizes, "sizes")
    c.eq([x["rendezvous"] for x in epochs], rendezvous, "rendezvous")
    # Padding-free sizes: each sample trained on once per epoch, by the work committed.
    c.eq([(x["seen"], x["distinct"]) for x in epochs], [(samples, samples)] * len(epochs),
         "(samples trained on, distinct ones) of each epoch")
    return epochs


def scenario_kill(khorrun, python, d):
    c = Check("kill")
    log, marker = os.path.join(d, "log"), os.path.join(d, "marker")
    rc, out = launch(khorrun, ["-np", "3", "--min-np", "2", "--max-np", "3", "--reset-limit", "2",
                               "-H", "localhost:3", python, TRAIN, "--log", log,
                               "--kill", "1,2,1", "--marker", marker, "--samples", "24"],
                     env_for(), "kill")
    c.eq(rc, 0, "khorrun's exit status")
    c.true(os.path.exists(marker), "start rank 1 never got to kill itself")
    check_train_log(c, log, [3, 3, 3], [1, 2, 2], 24)
    return c, out


def scenario_hosts(khorrun, python, d):
    c = Check("hosts")
    log, hosts = os.path.join(d, "log"), os.path.join(d, "hosts")
    with open(hosts, "w") as f:
        f.write("localhost:2\n")
    sched = {"0,3": "localhost:2,127.0.0.1:2", "1,2": "127.0.0.1:2"}
    rc, out = launch(khorrun, ["-np", "2", "--min-np", "2", "--max-np", "4", "--reset-limit", "3",
                               "--host-discovery-script", discovery_script(d, hosts),
                               python, TRAIN, "--log", log, "--hosts-file", hosts,
                               "--hosts-schedule", json.dumps(sched), "--samples", "48"],
                     env_for(), "hosts")
    c.eq(rc, 0, "khorrun's exit status")
    epochs = check_train_log(c, log, [4, 2, 2], [2, 3, 3], 48)
    if len(epochs) == 3:
        c.eq(epochs[2]["hostname"], "127.0.0.1", "rank 0's host in the last epoch")
    return c, out


# ---- Horovod's elastic_torch_main.py, unchanged ----------------------------------------------

def horovod_discovery(d, logfile, schedule):
    """A discovery script for Horovod's schedule [(epoch or None, [hosts])]: the epoch is
    the number of lines rank 0 has logged so far (as Horovod's test harness does)."""
    path = os.path.join(d, "discover_hvd.sh")
    lines = ["#!/bin/sh", "epoch=0",
             "[ -f %s ] && epoch=$(wc -l < %s | tr -d ' ')" % (logfile, logfile)]
    for i, (epoch, hosts) in enumerate(schedule):
        echo = "; ".join("echo %s" % h for h in hosts)
        if epoch is None:
            lines.append(("else " if i else "") + echo + ("; fi" if i else ""))
        else:
            lines.append(("if" if i == 0 else "elif") + ' [ "$epoch" = "%d" ]; then %s'
                         % (epoch, echo))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.chmod(path, 0o755)
    return path


def horovod_run(khorrun, python, main, d, tag, np_, min_np, max_np, schedule=None,
                hosts=None, exit_schedule=None, exit_mode="exception", reset_limit=3):
    logfile = os.path.join(d, tag + ".log")
    argv = ["-np", str(np_), "--min-np", str(min_np), "--reset-limit", str(reset_limit)]
    if max_np is not None:
        argv += ["--max-np", str(max_np)]
    if hosts:
        argv += ["-H", hosts]
    else:
        argv += ["--host-discovery-script", horovod_discovery(d, logfile, schedule)]
    argv += [python, main, "--logfile", logfile]
    if schedule:
        argv += ["--discovery-schedule", json.dumps(schedule)]
    if exit_schedule:
        argv += ["--exit-schedule", json.dumps(exit_schedule), "--exit-mode", exit_mode]
    rc, out = launch(khorrun, argv, env_for(alias=True), tag)
    return rc, out, read_lines(logfile)


def scenario_horovod_hosts(khorrun, python, main, d):
    c = Check("horovod-hosts")
    sched = [[0, ["localhost:2"]], [1, ["localhost:2", "127.0.0.1:2"]], [None, ["127.0.0.1:2"]]]
    rc, out, res = horovod_run(khorrun, python, main, d, "hvd_hosts", 2, 2, 4, schedule=sched)
    c.eq(rc, 0, "khorrun's exit status")
    c.eq([(x["start_rank"], x["size"], x["hostname"]) for x in res],
         [(0, 2, "localhost"), (0, 4, "localhost"), (2, 2, "127.0.0.1")],
         "(start rank, size, host) of each epoch")
    if len(res) == 3:
        c.eq(res[2]["rendezvous"], 3, "the last epoch's rendezvous")
    return c, out


def scenario_horovod_failure(khorrun, python, main, d, mode):
    c = Check("horovod-failure-" + mode)
    sched = [[None, ["localhost:2", "127.0.0.1:2"]]]
    rc, out, res = horovod_run(khorrun, python, main, d, "hvd_fail_" + mode, 2, 2, 4,
                               schedule=sched, exit_schedule={str((1, 0)): [0]},
                               exit_mode=mode)
    c.eq(rc, 0, "khorrun's exit status")
    c.eq([(x["start_rank"], x["size"], x["rendezvous"]) for x in res],
         [(0, 4, 1), (2, 2, 2), (2, 2, 2)], "(start rank, size, rendezvous) of each epoch")
    return c, out


def scenario_horovod_fixed_hosts(khorrun, python, main, d, mode):
    """Horovod's test_fault_tolerance_without_scaling: fixed hosts (-H, no script, no
    --max-np), start rank 0 fails in epoch 1: its host is blacklisted, the other host's two
    ranks go on."""
    c = Check("horovod-fixed-hosts-" + mode)
    rc, out, res = horovod_run(khorrun, python, main, d, "hvd_fixed_" + mode, 2, 2, None,
                               hosts="localhost:2,127.0.0.1:2",
                               exit_schedule={str((1, 0)): [0]}, exit_mode=mode)
    c.eq(rc, 0, "khorrun's exit status")
    c.eq([(x["start_rank"], x["size"], x["rendezvous"]) for x in res],
         [(0, 4, 1), (2, 2, 2), (2, 2, 2)], "(start rank, size, rendezvous) of each epoch")
    return c, out


def scenario_horovod_reset_limit(khorrun, python, main, d):
    """Horovod's test_reset_limit: a host added, then one removed, is two resets: the job
    fails with Horovod's message at --reset-limit 1 and succeeds at 2."""
    c = Check("horovod-reset-limit")
    sched = [[0, ["localhost:2"]], [1, ["localhost:2", "127.0.0.1:2"]], [None, ["127.0.0.1:2"]]]
    rc, out1, res = horovod_run(khorrun, python, main, d, "hvd_limit1", 2, 2, 4, schedule=sched,
                                reset_limit=1)
    c.true(rc not in (0, None), "khorrun succeeded at --reset-limit 1")
    c.true("Horovod was shutdown because number of resets during elastic job exceeded limit: 1"
           in out1, "Horovod's reset-limit message is missing")
    rc, out2, res = horovod_run(khorrun, python, main, d, "hvd_limit2", 2, 2, 4, schedule=sched,
                                reset_limit=2)
    c.eq(rc, 0, "khorrun's exit status at --reset-limit 2")
    c.eq(len(res), 3, "epochs logged at --reset-limit 2")
    return c, out1 + out2


def horovod_main_path(argv):
    if "--horovod-main" in argv:
        return argv[argv.index("--horovod-main") + 1]
    src = os.environ.get("KHOR_HOROVOD_SRC")
    if src:
        return os.path.join(src, "test", "integration", "data", "elastic_torch_main.py")
    return None


def main(argv):
    if len(argv) < 4:
        print(__doc__)
        return 2
    khorrun, python, scenario = argv[1], argv[2], argv[3]
    usage = subprocess.run([khorrun, "--help"], capture_output=True, text=True)
    if "--min-np" not in usage.stdout + usage.stderr:
        print("run_elastic: skipped: %s has no elastic driver (--min-np)" % khorrun)
        return 77
    if subprocess.run([python, "-c", "import torch"], capture_output=True).returncode:
        print("run_elastic: skipped: %s lacks torch" % python)
        return 77
    d = tempfile.mkdtemp(prefix="khor-elastic-")
    try:
        if scenario == "kill":
            c, out = scenario_kill(khorrun, python, d)
        elif scenario == "hosts":
            c, out = scenario_hosts(khorrun, python, d)
        elif scenario.startswith("horovod-"):
            main_py = horovod_main_path(argv)
            if not main_py or not os.path.exists(main_py):
                print("run_elastic: skipped: Horovod's elastic_torch_main.py not given "
                      "(--horovod-main FILE or KHOR_HOROVOD_SRC=<horovod checkout>)")
                return 77
            if subprocess.run([python, "-c", "import psutil"], capture_output=True).returncode:
                print("run_elastic: skipped: %s lacks psutil (apt-get install python3-psutil)"
                      % python)
                return 77
            if scenario == "horovod-hosts":
                c, out = scenario_horovod_hosts(khorrun, python, main_py, d)
            elif scenario == "horovod-reset-limit":
                c, out = scenario_horovod_reset_limit(khorrun, python, main_py, d)
            elif scenario.startswith("horovod-fixed-hosts-"):
                c, out = scenario_horovod_fixed_hosts(khorrun, python, main_py, d,
                                                      scenario[len("horovod-fixed-hosts-"):])
            else:
                c, out = scenario_horovod_failure(khorrun, python, main_py, d,
                                                  scenario[len("horovod-failure-"):])
        else:
            print("run_elastic: unknown scenario %r" % scenario)
            return 2
        if c.bad:
            print(out)
            print("run_elastic: FAILED\n  " + "\n  ".join(c.bad))
            return 1
        print("run_elastic: %s: ok" % scenario)
        return 0
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
