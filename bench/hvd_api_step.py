#!/usr/bin/python3
"""hvd_api_step.py -- Horovod's torch API as DistributedOptimizer's hooks drive it: every
tensor of a set handed over with allreduce_async_ (one name each, op Average), then every
handle synchronized. The same script runs on khor (the `horovod` alias) and on real Horovod, so
their times compare in one run:

  PYTHONPATH=bindings/python:bindings/python/horovod_compat KHOR_LIBRARY_PATH=build/libkhor.so \\
      build/khorrun -np 2 /usr/bin/python3 bench/hvd_api_step.py
  horovodrun --gloo -np 2 -H localhost:2 /tmp/hvd-venv/bin/python bench/hvd_api_step.py

Sets: small (1000 x 4 KiB float32: a model of many small layers), grouped (the same 1000
handed over in one grouped_allreduce_async_, as DistributedOptimizer(groups=1) does), resnet50 (ResNet-50's 161
gradients, 25.6 M float32, in reverse order as backward makes them) and lone (one 8-byte
allreduce). Each step's time is the slowest rank's (allgathered); printed: the median over
--steps timed steps after --warmup, per step and per tensor. --json FILE writes them.
Exit status: 0, or 1 when a result is wrong (every tensor is checked after the timed steps).
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import horovod
import horovod.torch as hvd

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from resnet50_sizes import from_layout  # noqa: E402


def sets(names):
    out = {}
    for s in names:
        if s in ("small", "grouped"):
            out[s] = [torch.ones(1024) for _ in range(1000)]
        elif s == "resnet50":
            out[s] = [torch.ones(shape) for shape in reversed(from_layout()[0])]
        elif s == "lone":
            out[s] = [torch.ones(2)]
        else:
            raise SystemExit("hvd_api_step: unknown set %r (small, grouped, resnet50, lone)"
                             % s)
    return out


def step(tensors, tag, op=hvd.Average):
    if tag.startswith("grouped"):
        hvd.synchronize(hvd.grouped_allreduce_async_(tensors, name=tag, op=op))
        return
    hs = [hvd.allreduce_async_(t, name="%s.%d" % (tag, i), op=op)
          for i, t in enumerate(tensors)]
    for h in hs:
        hvd.synchronize(h)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default="small,resnet50,lone")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--lone-reps", type=int, default=200,
                    help="lone: allreduces per timed step (the step is their total)")
    ap.add_argument("--json")
    a = ap.parse_args()
    hvd.init()
    impl = "khor" if getattr(horovod, "__khor__", False) else "horovod"
    results = {"impl": impl, "size": hvd.size(), "sets": {}}
    for name, ts in sets(a.sets.split(",")).items():
        reps = a.lone_reps if name == "lone" else 1
        times = []
        for k in range(a.warmup + a.steps):
            t0 = time.perf_counter()
            for _ in range(reps):
                step(ts, name)
            dt = time.perf_counter() - t0
            if k >= a.warmup:
                times.append(dt)
        slowest = hvd.allgather(torch.tensor([times], dtype=torch.float64)).max(0).values
        med = statistics.median(slowest.tolist())
        per = med / (len(ts) * reps)
        results["sets"][name] = {"tensors": len(ts), "reps": reps, "step_s": med,
                                 "per_tensor_us": per * 1e6}
        # The check: one more step, a Sum of each rank's rank + 1.
        for t in ts:
            t.fill_(hvd.rank() + 1.0)
        step(ts, name + ".check", hvd.Sum)
        want = hvd.size() * (hvd.size() + 1) / 2
        bad = sum(1 for t in ts if not torch.all(t == want))
        if hvd.rank() == 0:
            print("%s n=%d %-8s %5d tensors: %9.3f ms per step, %7.2f us per tensor%s"
                  % (impl, hvd.size(), name, len(ts) * reps, med * 1e3, per * 1e6,
                     "" if not bad else "  WRONG: %d tensors" % bad), flush=True)
        if bad:
            results["wrong"] = results.get("wrong", 0) + bad
    if a.json and hvd.rank() == 0:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    hvd.shutdown()
    return 1 if results.get("wrong") else 0


if __name__ == "__main__":
    sys.exit(main())
