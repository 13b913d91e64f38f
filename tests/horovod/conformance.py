#!/usr/bin/python3
"""Horovod's own test suite against khor's `horovod` alias, and against real Horovod in the
same run, as a user moving a script would try it.

    tests/horovod/conformance.py --horovod-src DIR [--suite test_torch | --test-file F]
        [--np 2,4] [--mode file,each] [--peers khor,horovod] [--timeout 120]
        [--file-timeout 1800] [-k EXPR] [--json OUT] [--khorrun build/khorrun]
        [--python /usr/bin/python3] [--library build/libkhor.so]
        [--tf-library build/libkhor_tf.so] [--env KEY=VALUE ...] [--horovodrun PATH]
        [--horovod-python PATH]

For Horovod's TensorFlow tests (--suite test_tensorflow or test_tensorflow2_keras, or
--test-file test/parallel/test_tensorflow.py), give --python the interpreter libkhor_tf.so
was built for (the TF venv) and --peers khor: real Horovod's TF extension is not built here.

DIR is a Horovod checkout (not part of this repository: fetch one); its
test/parallel/<suite>.py runs unchanged, from its own folder, so that its `common` helpers
are found as in Horovod's CI. Modes:
  file  one job runs the whole file (what a user does first); a test that never ends is
        "hung", and so is every test after it, which never ran;
  each  one job per test, each with --timeout seconds, so that a hang costs one test.
Each rank's pytest writes its outcomes as it goes (conformance_plugin.py); a test passed
when it passed on every rank, skipped when it was skipped and failed nowhere, failed when
it failed on any rank, hung when a rank never finished it within the time.
Peers: khor (khorrun, the alias on PYTHONPATH) and horovod (horovodrun --gloo from a Python
where Horovod is installed: skipped with a line when --horovodrun is not there).
Prints a table of counts per peer, np and mode, and the tests that real Horovod passes and
khor does not. Exit status 0 when khor passes every test Horovod passes in every cell
measured (or when only khor ran and nothing hung or failed), 1 otherwise, 2 on bad usage.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


LIBRARY = os.path.join(ROOT, "build", "libkhor.so")
TF_LIBRARY = os.path.join(ROOT, "build", "libkhor_tf.so")


def khor_env(args):
    py = os.path.join(ROOT, "bindings", "python")
    env = {"PYTHONPATH": os.pathsep.join([HERE, py, os.path.join(py, "horovod_compat")]),
           "KHOR_LIBRARY_PATH": os.path.abspath(args.library)}
    if os.path.exists(args.tf_library):
        # khor.tensorflow's ops; TensorFlow's start-up chatter kept out of the logs.
        env.update(KHOR_TF_LIBRARY_PATH=os.path.abspath(args.tf_library),
                   TF_CPP_MIN_LOG_LEVEL="3")
    return env


def launch_cmd(args, peer, np, pytest_args):
    extra = ["%s" % kv for kv in args.env]
    if peer == "khor":
        env = dict(khor_env(args), **dict(kv.split("=", 1) for kv in args.env))
        return [args.khorrun, "-np", str(np), "env"] + \
            ["%s=%s" % kv for kv in sorted(env.items())] + \
            [args.python, "-m", "pytest"] + pytest_args
    return [args.horovodrun, "--gloo", "-np", str(np), "-H", "localhost:%d" % np,
            "env", "PYTHONPATH=" + HERE] + extra + [args.horovod_python, "-m", "pytest"] + \
        pytest_args


def run_job(cmd, cwd, out_dir, timeout):
    """Runs one launcher job in a process group of its own; returns (exit status or None when
    it ran past timeout, the tail of its output)."""
    env = dict(os.environ, CONFORMANCE_OUT=out_dir, PYTHONDONTWRITEBYTECODE="1",
               PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)
    log = os.path.join(out_dir, "job.log")
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT,
                             start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(timeout=10)
                    break
                except subprocess.TimeoutExpired:
                    pass
    with open(log, errors="replace") as f:
        return rc, f.read()[-4000:]


def read_ranks(out_dir, np):
    """{rank: {test: outcome or "started"}} and {test: why} from the ranks' JSON lines."""
    per, why = {}, {}
    for r in range(np):
        seen = per.setdefault(r, {})
        path = os.path.join(out_dir, "rank%d.jsonl" % r)
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec["event"] == "start":
                    seen[rec["test"]] = "started"
                else:
                    seen[rec["test"]] = rec["outcome"]
                    if "why" in rec:
                        why.setdefault(rec["test"], "rank %d: %s" % (r, rec["why"]))
    return per, why


def combine(test, per, np):
    outs = [per.get(r, {}).get(test) for r in range(np)]
    if any(o == "failed" for o in outs):
        return "failed"
    if any(o in (None, "started") for o in outs):
        return "hung"
    if any(o == "skipped" for o in outs):
        return "skipped"
    return "passed"


def collect(args, test_file, cwd):
    env = dict(os.environ, **khor_env(args))
    env.update(kv.split("=", 1) for kv in args.env)
    p = subprocess.run([args.python, "-m", "pytest", "--collect-only", "-q", "-p",
                        "no:cacheprovider", os.path.basename(test_file)] + (["-k", args.k] if args.k else []),
                       cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=300)
    # Test ids start with the file's name (TensorFlow's start-up lines also hold "::").
    first = os.path.basename(test_file) + "::"
    ids = [l.strip() for l in p.stdout.splitlines() if l.startswith(first)]
    if not ids:
        raise SystemExit("conformance: collecting %s found no tests:\n%s" %
                         (test_file, p.stdout[-3000:]))
    return ids


def run_cell(args, peer, np, mode, test_file, ids, tmp):
    """{test id: outcome} for one peer, np and mode, and {test id: why}."""
    cwd = os.path.dirname(test_file)
    base = ["-q", "-p", "no:cacheprovider", "-p", "conformance_plugin"]
    results, whys = {}, {}
    if mode == "file":
        out = tempfile.mkdtemp(prefix="file-", dir=tmp)
        t0 = time.time()
        rc, _ = run_job(launch_cmd(args, peer, np, base + [os.path.basename(test_file)] +
                                      (["-k", args.k] if args.k else [])),
                           cwd, out, args.file_timeout)
        per, whys = read_ranks(out, np)
        for t in ids:
            results[t] = combine(nodeid_of(t, per), per, np)
        print("  %s np=%d file: exit %s after %.0f s" % (peer, np, "timeout" if rc is None
                                                          else rc, time.time() - t0),
              flush=True)
        return results, whys
    for i, t in enumerate(ids, 1):
        out = tempfile.mkdtemp(prefix="each-", dir=tmp)
        rc, tail = run_job(launch_cmd(args, peer, np, base + [t]), cwd, out, args.timeout)
        per, why = read_ranks(out, np)
        results[t] = combine(nodeid_of(t, per), per, np)
        if why:
            whys[t] = next(iter(why.values()))
        elif results[t] == "hung" and rc is not None:
            whys[t] = "the job ended (exit %s) before every rank finished the test: %s" % (
                rc, tail[-1500:])
        print("  %s np=%d each %d/%d %s: %s" % (peer, np, i, len(ids), t.split("::")[-1],
                                               results[t]), flush=True)
    return results, whys


def nodeid_of(t, per):
    """The ranks' node id for collected id t (pytest names the file as it was given)."""
    name = t.split("::", 1)[1]
    for seen in per.values():
        for k in seen:
            if k.endswith("::" + name):
                return k
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--horovod-src", required=True)
    ap.add_argument("--suite", default="test_torch",
                    help="test/parallel/<suite>.py of --horovod-src")
    ap.add_argument("--test-file", default=None,
                    help="a test file instead of --suite (relative to --horovod-src, or "
                    "absolute); it runs from its own folder")
    ap.add_argument("--np", default="2")
    ap.add_argument("--mode", default="file,each")
    ap.add_argument("--peers", default="khor,horovod")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--file-timeout", type=float, default=1800)
    ap.add_argument("-k", default=None)
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="set in every rank's environment (and when collecting), e.g. "
                    "TF_USE_LEGACY_KERAS=1; repeatable")
    ap.add_argument("--json", default=None)
    ap.add_argument("--khorrun", default=os.path.join(ROOT, "build", "khorrun"))
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--library", default=LIBRARY, help="the libkhor.so the alias loads")
    ap.add_argument("--tf-library", default=TF_LIBRARY,
                    help="the libkhor_tf.so khor.tensorflow loads (passed when it exists)")
    ap.add_argument("--horovodrun", default=shutil.which("horovodrun") or
                    "/tmp/hvd-venv/bin/horovodrun")
    ap.add_argument("--horovod-python", default="/tmp/hvd-venv/bin/python")
    args = ap.parse_args()

    if args.test_file:
        test_file = os.path.abspath(os.path.join(args.horovod_src, args.test_file))
    else:
        test_file = os.path.abspath(os.path.join(args.horovod_src, "test", "parallel",
                                                 args.suite + ".py"))
    if not os.path.exists(test_file):
        print("conformance: no %s (is --horovod-src a Horovod checkout?)" % test_file)
        return 2
    peers = args.peers.split(",")
    if "horovod" in peers and not os.access(args.horovodrun, os.X_OK):
        print("horovod: skipped: no horovodrun at %s (pip install horovod==0.28.1 with "
              "HOROVOD_WITH_GLOO=1 HOROVOD_WITH_PYTORCH=1 into a venv)" % args.horovodrun)
        peers.remove("horovod")
    ids = collect(args, test_file, os.path.dirname(test_file))
    print("conformance: %d tests in %s" % (len(ids), test_file), flush=True)
    tmp = tempfile.mkdtemp(prefix="khor-conformance-")
    cells = {}
    for np in [int(n) for n in args.np.split(",")]:
        for mode in args.mode.split(","):
            for peer in peers:
                cells[(peer, np, mode)] = run_cell(args, peer, np, mode, test_file, ids, tmp)
    shutil.rmtree(tmp, ignore_errors=True)

    print("\npeer np mode: passed failed skipped hung (of %d)" % len(ids))
    for (peer, np, mode), (res, _) in sorted(cells.items()):
        c = {k: sum(1 for v in res.values() if v == k) for k in
             ("passed", "failed", "skipped", "hung")}
        print("%s %d %s: %d %d %d %d" % (peer, np, mode, c["passed"], c["failed"],
                                         c["skipped"], c["hung"]))
    bad = False
    for (peer, np, mode), (res, whys) in sorted(cells.items()):
        if peer != "khor":
            continue
        ref = cells.get(("horovod", np, mode))
        if ref:
            short = [t for t in ids if ref[0][t] == "passed" and res[t] != "passed"]
            label = "Horovod passes, khor does not"
        else:
            short = [t for t in ids if res[t] in ("failed", "hung")]
            label = "failed or hung (no Horovod in this run)"
        if short:
            bad = True
            print("\nkhor np=%d %s: %s (%d):" % (np, mode, label, len(short)))
            for t in short:
                w = whys.get(t, "").strip().splitlines()
                e = [l for l in w if l.startswith("E ")] or w
                print("  %s: %s%s" % (t.split("::")[-1], res[t],
                                      (" -- " + e[-1][:200]) if e else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"%s %d %s" % k: v[0] for k, v in cells.items()}, f, indent=1,
                      sort_keys=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
