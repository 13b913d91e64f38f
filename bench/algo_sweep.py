#!/usr/bin/python3
"""algo_sweep.py -- every fixed allreduce algorithm and --algo auto in one khor-bench job,
their calls interleaved, and a markdown table of their times and of auto / best fixed.

  bench/algo_sweep.py -n 2 4 8 -b 8 -e 256M -f 2 -R 3

Each repetition is one job per rank count: `khor-bench allreduce --algo ring,tree,rd,hd,auto`
switches the algorithm between calls (khor_comm_set) and runs, at each size, rounds of a
block of calls of every algorithm in turn, so a slow second on a shared machine hits them
alike. Sizes get many iterations up to --small (many short calls average out the
scheduler), fewer up to --split, few above, in three jobs. The table keeps the median over
the repetitions of each algorithm's time, and adds which algorithm auto picked (read from
the jobs' own KHOR_LOG=debug lines, each job calibrating its own model, plus --pick-jobs
jobs that only record it: the most frequent choice, with how many jobs made it when they
disagreed) and that algorithm's median against the best: auto / best also carries
run-to-run noise, picked / best only the quality of the choice. "paired" is the median over
the jobs of auto's time over the best algorithm's time in the same job: the whole job moves
with the machine (the same call took 61 and 99 ms in two jobs), the ratio inside one much
less. --from-csv tabulates the samples of an earlier run instead of running jobs."""
import argparse, csv, os, re, statistics, subprocess, sys, tempfile

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("-n", nargs="+", type=int, default=[2, 4, 8], help="rank counts")
p.add_argument("-b", default="8", help="smallest size")
p.add_argument("-e", default="256M", help="largest size")
p.add_argument("-f", default="2", help="size step factor")
p.add_argument("--small", default="64K", help="sizes up to this get --small-iters")
p.add_argument("--split", default="4M", help="sizes up to this get --mid-iters, above --large-iters")
p.add_argument("--small-iters", default="400")
p.add_argument("--mid-iters", default="60")
p.add_argument("--large-iters", default="8")
p.add_argument("-R", "--repeats", type=int, default=3)
p.add_argument("-B", "--build", default="build")
p.add_argument("--algos", default="ring,tree,rd,hd,auto")
p.add_argument("--extra", default="", help="extra khor-bench flags, e.g. '--transport tcp'")
p.add_argument("--khorrun", default="", help="extra khorrun flags, e.g. '--bind cores'")
p.add_argument("--csv", help="also write every sample (n, repeat, algo, size, time_us) here")
p.add_argument("--from-csv", help="tabulate these samples (a --csv of an earlier run), run no jobs")
p.add_argument("--picks", action="store_true", help="with --from-csv: still run the KHOR_LOG=debug jobs")
p.add_argument("--pick-jobs", type=int, default=0,
               help="extra jobs that only record auto's choice (each calibrates anew)")
a = p.parse_args()

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size(s):
    return int(s[:-1]) * UNITS[s[-1].upper()] if s[-1].upper() in UNITS else int(s)


def auto_picks(stderr):
    """{size: algorithm} auto chose, from rank 0's KHOR_LOG=debug lines (one per power of two;
    forced choices are marked and skipped; a size is filed under its power of two)."""
    out = {}
    for line in stderr.splitlines():
        # the model's choice at a size's first call, then the choice after auto's trials
        m = re.search(r"^\[0\].*DEBUG allreduce (\d+) B on \d+ ranks: (\w+) "
                      r"(\(predicted|after trials)", line)
        if m and int(m.group(1)) > 0:
            out[1 << (int(m.group(1)).bit_length() - 1)] = m.group(2)
    return out


def job(n, lo, hi, iters, warmup):
    """One khor-bench job over sizes lo..hi; {(algo, size): time_us} and auto's picks in it."""
    with tempfile.NamedTemporaryFile(suffix=".csv", delete=False) as f:
        path = f.name
    cmd = [f"{a.build}/khorrun", *a.khorrun.split(), "-np", str(n),
           f"{a.build}/khor-bench", "allreduce",
           "--algo", a.algos, "-b", str(lo), "-e", str(hi), "-f", a.f, "-n", iters,
           "-w", warmup, "-c", "0", "-q", "--csv", path] + a.extra.split()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                       timeout=3600, env=dict(os.environ, KHOR_LOG="debug"))
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-3000:]}")
    out = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            out[(row["algo"], int(row["size"]))] = float(row["time_us"])
    os.unlink(path)
    return out, auto_picks(r.stderr)


def picks(n):
    """{size: algorithm} that auto chooses, from KHOR_LOG=debug (one line per power of two)."""
    cmd = [f"{a.build}/khorrun", *a.khorrun.split(), "-np", str(n),
           f"{a.build}/khor-bench", "allreduce",
           "--algo", "auto", "-b", a.b, "-e", a.e, "-f", a.f, "-n", "1", "-w", "0", "-c", "0",
           ] + a.extra.split()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                       timeout=3600, env=dict(os.environ, KHOR_LOG="debug"))
    return auto_picks(r.stderr)


def paired_ratio(by_job, x, y, sz):
    """Median over the jobs that ran both of x's time / y's time at size sz."""
    tx, ty = by_job.get((x, sz), {}), by_job.get((y, sz), {})
    r = [tx[j] / ty[j] for j in tx if j in ty and ty[j] > 0]
    return statistics.median(r) if r else float("nan")


algos = a.algos.split(",")
fixed = [al for al in algos if al != "auto"]
lo, hi, factor = size(a.b), size(a.e), int(a.f)
# the -f ladder from -b to -e, cut into the three iteration tiers
ladder = [lo]
while ladder[-1] * factor <= hi:
    ladder.append(ladder[-1] * factor)
tiers = [([s for s in ladder if s <= size(a.small)], a.small_iters, "20"),
         ([s for s in ladder if size(a.small) < s <= size(a.split)], a.mid_iters, "3"),
         ([s for s in ladder if s > size(a.split)], a.large_iters, "1")]
samples_out = []
earlier = {}
if a.from_csv:
    with open(a.from_csv) as f:
        for row in csv.DictReader(f):
            earlier.setdefault(int(row["nranks"]), []).append(
                (int(row["repeat"]), row["algo"], int(row["size"]), float(row["time_us"])))
    a.n = sorted(earlier)
    a.repeats = max(rep for rows in earlier.values() for rep, *_ in rows)
print(f"# command: {' '.join(sys.argv)}")
for n in a.n:
    samples = {}
    by_job = {}  # (algo, size) -> {repeat: time}
    for rep, al, sz, t in sorted(earlier.get(n, [])):
        samples.setdefault((al, sz), []).append(t)
        by_job.setdefault((al, sz), {})[rep] = t
        samples_out.append((n, rep, al, sz, t))
    runs = []  # auto's picks: one dict per job that calibrated a model
    for rep in range(a.repeats if not a.from_csv else 0):
        parts = [(sz[0], sz[-1], it, w) for sz, it, w in tiers if sz]
        job_picks = {}
        for plo, phi, iters, warm in parts:
            times, got = job(n, plo, phi, iters, warm)
            job_picks.update({sz: al for sz, al in got.items() if plo <= sz <= phi})
            for key, t in times.items():
                samples.setdefault(key, []).append(t)
                by_job.setdefault(key, {})[rep + 1] = t
                samples_out.append((n, rep + 1, key[0], key[1], t))
            print(f"# n={n} repeat {rep + 1}/{a.repeats}: {plo}..{phi} B done", file=sys.stderr)
        runs.append(job_picks)
    # from a CSV: the build's model now need not be the one that ran then
    if not a.from_csv or a.picks:
        runs += [picks(n) for _ in range(a.pick_jobs)]
    chosen, votes = {}, {}
    for sz in sorted({sz for r in runs for sz in r}):
        got = [r[sz] for r in runs if sz in r]
        chosen[sz] = max(set(got), key=got.count)  # the most frequent choice
        votes[sz] = len(got) - got.count(chosen[sz])
    sizes = sorted({sz for (_, sz) in samples})
    print(f"\n### allreduce float sum, {n} ranks, time in us (median of {a.repeats} jobs, "
          f"algorithms interleaved in each)\n")
    print("| size (B) | " + " | ".join(algos) +
          " | best fixed | auto / best | paired | auto picks | picked / best |")
    print("|---:|" + "---:|" * len(algos) + "---|---:|---:|---|---:|")
    worst = worst_pick = worst_paired = 0.0
    for sz in sizes:
        med = {al: statistics.median(samples[(al, sz)]) for al in algos if (al, sz) in samples}
        best = min((med[al], al) for al in fixed if al in med)
        ratio = med["auto"] / best[0] if "auto" in med else float("nan")
        worst = max(worst, ratio)
        cells = " | ".join(f"{med[al]:.1f}" if al in med else "-" for al in algos)
        paired = paired_ratio(by_job, "auto", best[1], sz)
        worst_paired = max(worst_paired, paired)
        pick = chosen.get(sz, "?")
        pratio = med[pick] / best[0] if pick in med else float("nan")
        if pick in med:
            worst_pick = max(worst_pick, pratio)
        if votes.get(sz):
            pick_cell = f"{pick} ({len(runs) - votes[sz]}/{len(runs)})"
        else:
            pick_cell = pick
        print(f"| {sz} | {cells} | {best[1]} | {ratio:.2f} | {paired:.2f} | {pick_cell} | "
              f"{pratio:.2f} |")
    if "auto" in algos:
        print(f"\nworst auto / best fixed at n = {n}: {worst:.2f} (paired {worst_paired:.2f}); "
              "worst picked / best: " + (f"{worst_pick:.2f}" if chosen else "-"))
    if "ring" in algos and "tree" in algos:
        big = [sz for sz in sizes if sz >= 16 << 20]
        if big:
            print(f"\nring time / tree time at n = {n}, paired (below 1: ring faster): " +
                  ", ".join(f"{sz >> 20} MiB {paired_ratio(by_job, 'ring', 'tree', sz):.2f}"
                            for sz in big))
if a.csv:
    with open(a.csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["nranks", "repeat", "algo", "size", "time_us"])
        w.writerows(samples_out)
