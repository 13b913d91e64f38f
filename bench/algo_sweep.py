#!/usr/bin/python3
"""algo_sweep.py -- khor-bench allreduce with every fixed algorithm and with --algo auto,
interleaved in one run, and a markdown table of their times and of auto / best fixed.

  bench/algo_sweep.py -n 2 4 8 -b 8 -e 256M -f 8 -R 3

Each repetition runs ring, tree, rd, hd and auto one after another (so noise hits them
alike) and the table keeps the median of the repetitions. rd and hd above their useful
range are skipped where they would be slow (rd above --rd-max)."""
import argparse, csv, os, statistics, subprocess, sys, tempfile

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("-n", nargs="+", type=int, default=[2, 4, 8])
p.add_argument("-b", default="8")
p.add_argument("-e", default="256M")
p.add_argument("-f", default="8")
p.add_argument("-i", "--iters", default="20")
p.add_argument("-w", "--warmup", default="3")
p.add_argument("-R", "--repeats", type=int, default=3)
p.add_argument("-B", "--build", default="build")
p.add_argument("--algos", nargs="+", default=["ring", "tree", "rd", "hd", "auto"])
p.add_argument("--rd-max", default="4M", help="largest size measured with rd")
p.add_argument("--extra", default="", help="extra khor-bench flags")
a = p.parse_args()

def size(s):
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * m[s[-1].upper()] if s[-1].upper() in m else int(s)

def run(n, algo):
    with tempfile.NamedTemporaryFile(suffix=".csv", delete=False) as f:
        path = f.name
    e = a.e
    if algo == "rd" and size(a.e) > size(a.rd_max):
        e = a.rd_max
    cmd = [f"{a.build}/khorrun", "-np", str(n), f"{a.build}/khor-bench", "allreduce", "--algo", algo,
           "-b", a.b, "-e", e, "-f", a.f, "-n", a.iters, "-w", a.warmup, "-c", "0", "--csv", path] + a.extra.split()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr[-2000:]}")
    out = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            out[int(row["size"])] = float(row["time_us"])
    os.unlink(path)
    return out

print(f"# command: {' '.join(sys.argv)}")
for n in a.n:
    samples = {al: {} for al in a.algos}
    for rep in range(a.repeats):
        for al in a.algos:
            for sz, t in run(n, al).items():
                samples[al].setdefault(sz, []).append(t)
            print(f"# n={n} repeat {rep + 1}/{a.repeats} {al} done", file=sys.stderr)
    sizes = sorted(samples["auto"]) if "auto" in samples else sorted(samples[a.algos[0]])
    fixed = [al for al in a.algos if al != "auto"]
    print(f"\n### allreduce float sum, {n} ranks, time in us (median of {a.repeats})\n")
    print("| size (B) | " + " | ".join(a.algos) + " | best fixed | auto / best |")
    print("|---:|" + "---:|" * len(a.algos) + "---|---:|")
    for sz in sizes:
        med = {al: statistics.median(samples[al][sz]) for al in a.algos if sz in samples[al]}
        best = min((med[al], al) for al in fixed if al in med)
        ratio = med["auto"] / best[0] if "auto" in med else float("nan")
        cells = " | ".join(f"{med[al]:.1f}" if al in med else "-" for al in a.algos)
        print(f"| {sz} | {cells} | {best[1]} | {ratio:.2f} |")
