#!/usr/bin/env python3
"""An example of examples/tensorflow end to end, as CTest runs it:

    run_examples.py KHORRUN PYTHON EXAMPLE [--np 1,2,4] [--expect 95] [--spread 1]

runs EXAMPLE under `KHORRUN -np N PYTHON` for each N, every rank in a working directory of
its own, and checks that each run prints a test accuracy of at least --expect percent, that
the accuracies across N lie within --spread points of each other, and that rank 0 wrote
checkpoint files and no other rank wrote anything. Exits 77 (CTest's skip) with one line
when PYTHON lacks tensorflow or scikit-learn. PYTHONPATH must name khor's bindings/python
and bindings/python/horovod_compat (the examples import horovod.tensorflow[.keras]).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time


def files_under(d):
    out = []
    for root, _, names in os.walk(d):
        out += [os.path.relpath(os.path.join(root, n), d) for n in names]
    return sorted(out)


def run_one(args, n, top):
    """One khorrun job of n ranks: (accuracy in percent, seconds, files rank 0 wrote)."""
    for r in range(n):
        os.makedirs(os.path.join(top, "rank%d" % r))
    # each rank changes into its own directory, so what it writes shows who wrote it
    script = 'cd "$0/rank$KHOR_RANK" && exec "$1" "$2" --expect-accuracy "$3"'
    cmd = [args.khorrun, "-np", str(n), "sh", "-c", script, top, args.python,
           os.path.abspath(args.example), str(args.expect)]
    start = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=args.timeout)
    took = time.time() - start
    name = os.path.basename(args.example)
    if p.returncode != 0:
        sys.stdout.write(p.stdout[-6000:])
        sys.exit("run_examples: %s at np %d failed (exit status %d); its output is above"
                 % (name, n, p.returncode))
    acc = re.findall(r"^(?:\[0\] )?test accuracy: ([0-9.]+)", p.stdout, re.M)
    if len(acc) != 1:
        sys.stdout.write(p.stdout[-6000:])
        sys.exit("run_examples: %s at np %d printed %d 'test accuracy:' lines, not 1 (from "
                 "rank 0)" % (name, n, len(acc)))
    written = files_under(os.path.join(top, "rank0"))
    if not written:
        sys.exit("run_examples: %s at np %d: rank 0 wrote no checkpoint" % (name, n))
    for r in range(1, n):
        other = files_under(os.path.join(top, "rank%d" % r))
        if other:
            sys.exit("run_examples: %s at np %d: rank %d wrote %s; only rank 0 may write "
                     "checkpoints" % (name, n, r, ", ".join(other[:5])))
    return float(acc[0]) * 100, took, len(written)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("khorrun")
    p.add_argument("python")
    p.add_argument("example")
    p.add_argument("--np", default="1,2,4")
    p.add_argument("--expect", type=float, default=95.0)
    p.add_argument("--spread", type=float, default=1.0)
    p.add_argument("--timeout", type=float, default=180.0, help="per run, seconds")
    args = p.parse_args()
    probe = subprocess.run([args.python, "-c", "import tensorflow, sklearn"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if probe.returncode != 0:
        print("run_examples: skipped: %s lacks tensorflow or scikit-learn (pip install "
              "tensorflow-cpu scikit-learn into it)" % args.python)
        return 77
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    name = os.path.basename(args.example)
    results = []
    for n in [int(x) for x in args.np.split(",")]:
        top = tempfile.mkdtemp(prefix="khor-tf-example-")
        try:
            acc, took, nfiles = run_one(args, n, top)
        finally:
            shutil.rmtree(top, ignore_errors=True)
        print("run_examples: %s np %d: test accuracy %.2f %% in %.1f s; rank 0 wrote %d "
              "checkpoint file(s), the other ranks none" % (name, n, acc, took, nfiles))
        sys.stdout.flush()
        results.append((n, acc))
    accs = [a for _, a in results]
    spread = max(accs) - min(accs)
    if spread > args.spread:
        sys.exit("run_examples: %s: test accuracies %s differ by %.2f points across np, more "
                 "than %.2f" % (name, ", ".join("np %d %.2f %%" % r for r in results),
                                spread, args.spread))
    print("run_examples: %s ok: %s (spread %.2f points)"
          % (name, ", ".join("np %d %.2f %%" % r for r in results), spread))
    return 0


if __name__ == "__main__":
    sys.exit(main())
