#!/usr/bin/env python3
"""Steady-state training speed with elastic on and off, side by side.

    bench/elastic/steady.py [--rounds 5] [--np 4] [--steps 300] [--khorrun build/khorrun]

Trains bench/elastic/train.py (a small MLP under hvd.elastic.run, committing every step,
no fault) under khorrun as a fixed job and as an elastic one (--min-np/--max-np: the
driver, the plan, KHOR_ELASTIC=1), the two alternating in rounds so that both see the same
machine. A run's step time is the mean over its steps 50 to the end (rank 0's log), so
start-up is left out. Prints each run, the medians and elastic / fixed.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def step_time(log, skip):
    steps = []
    with open(log) as f:
        for line in f:
            w = line.split()
            if w[0] == "step":
                steps.append((int(w[1]), float(w[3])))
    steps = [s for s in steps if s[0] >= skip]
    if len(steps) < 2:
        raise RuntimeError("too few steps logged in %s" % log)
    return (steps[-1][1] - steps[0][1]) / (steps[-1][0] - steps[0][0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--khorrun", default=os.path.join(ROOT, "build", "khorrun"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="khor-steady-")
    log = os.path.join(tmp, "log")
    env = dict(os.environ, BENCH_LOG=log, BENCH_FAULT_STEP="-1", BENCH_STEPS=str(args.steps),
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "bindings", "python"),
                                           os.path.join(ROOT, "bindings", "python",
                                                        "horovod_compat")]),
               KHOR_LIBRARY_PATH=os.path.join(ROOT, "build", "libkhor.so"))
    train = ["/usr/bin/python3", os.path.join(HERE, "train.py")]
    modes = {"fixed": [args.khorrun, "-np", str(args.np)] + train,
             "elastic": [args.khorrun, "-np", str(args.np), "--min-np", str(args.np),
                         "--max-np", str(args.np), "-H", "localhost:%d" % args.np] + train}
    got = {m: [] for m in modes}
    for r in range(1, args.rounds + 1):
        for m, cmd in modes.items():
            if os.path.exists(log):
                os.unlink(log)
            p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, timeout=600)
            if p.returncode != 0:
                print(p.stdout[-2000:])
                return 1
            t = step_time(log, 50)
            got[m].append(t)
            print("round %d %-7s %.1f us/step" % (r, m, t * 1e6), flush=True)
    med = {m: statistics.median(v) for m, v in got.items()}
    print("median: fixed %.1f us/step, elastic %.1f us/step, elastic / fixed %.3f" %
          (med["fixed"] * 1e6, med["elastic"] * 1e6, med["elastic"] / med["fixed"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
