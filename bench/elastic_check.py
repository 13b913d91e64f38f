#!/usr/bin/python3
"""elastic_check.py -- what state.check_host_updates() costs when no host changed: the one
3-int allreduce (through the engine) that state.commit() adds to save().

  khorrun -np 4 /usr/bin/python3 bench/elastic_check.py
  khorrun -np 4 --min-np 4 --max-np 4 -H localhost:4 /usr/bin/python3 bench/elastic_check.py

(PYTHONPATH=bindings/python and KHOR_LIBRARY_PATH=build/libkhor.so from the tree.) A fixed
job or an elastic one: the call is the same. Every rank runs --warmup calls, then
--rounds rounds of --calls calls, a barrier between rounds; a round's time is the slowest
rank's, per call. Rank 0 prints the median, the minimum and the maximum of the rounds in
microseconds, with the job's size and whether it is elastic; --json writes them to a file.
For scale, the same rounds of a 4-byte hvd-style allreduce of the same kind (allreduce-1)
and of nothing at all (loop) are timed alongside.
"""

import argparse
import json
import statistics
import sys
import time

import khor
import khor._core as core
import khor.elastic as el


def rounds(fn, n_rounds, calls):
    out = []
    for _ in range(n_rounds):
        khor.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        dt = (time.perf_counter() - t0) / calls * 1e6
        out.append(max(el.broadcast_object(dt, k) for k in range(khor.size())))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    khor.init()
    st = el.ObjectState(step=0)
    modes = {
        "check_host_updates": st.check_host_updates,
        "allreduce-1": lambda: core.allreduce_ints([0], core.Max, "bench.one"),
        "loop": lambda: None,
    }
    for fn in modes.values():
        for _ in range(a.warmup):
            fn()
    res = {}
    for name, fn in modes.items():
        us = rounds(fn, a.rounds, a.calls)
        res[name] = {"median_us": statistics.median(us), "min_us": min(us), "max_us": max(us)}
    if khor.rank() == 0:
        print("elastic_check: n=%d elastic=%s rounds=%d calls=%d"
              % (khor.size(), core.is_elastic(), a.rounds, a.calls))
        for name, v in res.items():
            print("  %-20s median %8.1f us  min %8.1f  max %8.1f"
                  % (name, v["median_us"], v["min_us"], v["max_us"]))
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"size": khor.size(), "elastic": core.is_elastic(),
                           "results": res}, f, indent=1)
    khor.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
