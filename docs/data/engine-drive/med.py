#!/usr/bin/env python3
"""Medians of ab.sh's runs, and per-round ratios new/base: python3 med.py [DIR]."""
import glob, json, os, statistics, sys

d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
rows = {
    "lone 8 B engine (us)": lambda j: j["latency"]["engine_8b_us"],
    "lone 8 B direct (us)": lambda j: j["latency"]["direct_8b_us"],
    "lone engine / direct": lambda j: j["latency"]["engine_over_direct_8b"],
    "tiny 64 x 8 B step (us)": lambda j: j["latency"]["engine_tiny_step_us"],
    "small engine step (ms)": lambda j: j["sets"][0]["rows"][0]["step_ms"],
    "small flat (ms)": lambda j: j["sets"][0]["rows"][1]["step_ms"],
    "small engine / flat": lambda j: j["sets"][0]["engine_step_over_flat"],
}
for t in ("shm", "tcp"):
    runs = {b: sorted(glob.glob(f"{d}/{t}-{b}-*.json")) for b in ("base", "new")}
    if not runs["new"]:
        continue
    print(f"== {t}: {len(runs['new'])} rounds")
    for name, f in rows.items():
        v = {b: [f(json.load(open(p))) for p in runs[b]] for b in runs}
        ratios = [n / b for n, b in zip(v["new"], v["base"]) if b]
        print(f"  {name:26s} base {statistics.median(v['base']):9.2f}  new "
              f"{statistics.median(v['new']):9.2f}  new/base per round "
              + " ".join(f"{r:.2f}" for r in ratios)
              + f"  (median {statistics.median(ratios):.2f})")
